"""Regression tests for the Python-front findings of the fifth adversarial sweep: a direct
definition of an op's vmap_fn companion (`<name>_vmap`) changing the op's vmap, replace=True on
an op overwriting an unrelated op named `<name>_vmap`, custom_op's device_types taking a device
('cuda:0'), a trace block exited without being entered and Trace.impls of a non-name, and
register_triton_op keywords that were mistyped or contradicted each other and were ignored."""

from __future__ import annotations

import pytest
import torch
from torch import vmap

import opreg


def empty(x):
    return torch.empty_like(x)


def times2(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def plus100(x: torch.Tensor) -> torch.Tensor:
    return x + 100


def report_of(name: str) -> tuple:
    report = opreg.describe_op(name)
    return (report.schema, report.kernels, report.fake, report.autograd, report.vmap, report.origin)


def with_vmap_fn(name: str, *, replace: bool = False, scale: float = 2.0):
    def fallback(x: torch.Tensor) -> torch.Tensor:
        return x * scale

    return opreg.register_triton_op(
        fake_fn=empty,
        triton_fn=None,
        vmap_fn=lambda x: x * scale,
        fake_vmap_fn=empty,
        name=name,
        replace=replace,
    )(fallback)


# ---- 1. a companion defined on its own would change its op's vmap ---------------------------


@pytest.mark.parametrize("front", ["register_triton_op", "register_vmap_op"])
def test_a_companion_cannot_be_replaced_on_its_own(front):
    name = f"sweep5f_{front}::f"
    op = with_vmap_fn(name)
    before = report_of(name), report_of(name + "_vmap")
    keywords = {"triton_fn": None} if front == "register_triton_op" else {}
    with pytest.raises(
        ValueError,
        match=rf"'{name}_vmap' is the vmap_fn companion of '{name}'.*replace '{name}' instead",
    ):
        getattr(opreg, front)(fake_fn=empty, name=name + "_vmap", replace=True, **keywords)(plus100)
    assert (report_of(name), report_of(name + "_vmap")) == before
    x = torch.ones(3, 2)
    torch.testing.assert_close(vmap(op)(x), x * 2)
    torch.testing.assert_close(getattr(torch.ops, f"sweep5f_{front}").f_vmap(x), x * 2)


@pytest.mark.parametrize("api", ["custom_op", "triton_op"])
def test_a_companion_cannot_be_taken_by_the_torch_library_front(api):
    name = f"sweep5f_{api}::f"
    op = with_vmap_fn(name)
    before = report_of(name + "_vmap")
    with pytest.raises(
        ValueError,
        match=rf"opreg.{api}: op '{name}_vmap' is the vmap_fn companion of '{name}'.*"
        rf"replace '{name}' instead",
    ):
        getattr(opreg, api)(name + "_vmap", plus100, mutates_args=())
    assert report_of(name + "_vmap") == before
    torch.testing.assert_close(vmap(op)(torch.ones(3, 2)), torch.full((3, 2), 2.0))


def test_replacing_the_op_replaces_its_companion_and_keeps_working():
    name = "sweep5f::again"
    with_vmap_fn(name)
    op = with_vmap_fn(name, replace=True, scale=3.0)
    torch.testing.assert_close(vmap(op)(torch.ones(3, 2)), torch.full((3, 2), 3.0))
    op = with_vmap_fn(name, replace=True, scale=4.0)
    torch.testing.assert_close(vmap(vmap(op))(torch.ones(2, 3, 2)), torch.full((2, 3, 2), 4.0))


def test_a_companion_its_op_no_longer_uses_is_an_op_of_its_own():
    name = "sweep5f::dropped"
    with_vmap_fn(name)
    opreg.register_triton_op(fake_fn=empty, triton_fn=None, name=name, replace=True)(times2)
    # The op's vmap no longer calls the companion: defining that name changes nothing else.
    mine = opreg.register_triton_op(
        fake_fn=empty, triton_fn=None, name=name + "_vmap", replace=True
    )(plus100)
    torch.testing.assert_close(mine(torch.ones(2)), torch.full((2,), 101.0))
    # ...and from then on the op's vmap_fn may not overwrite it.
    with pytest.raises(ValueError, match=rf"'{name}_vmap' is an op of its own"):
        with_vmap_fn(name, replace=True)
    torch.testing.assert_close(mine(torch.ones(2)), torch.full((2,), 101.0))


# ---- 2. replace=True with vmap_fn would overwrite an unrelated `<name>_vmap` -----------------


@pytest.mark.parametrize("replace", [True, False])
def test_vmap_fn_does_not_overwrite_an_op_of_its_own(replace):
    name = f"sweep5f_own{int(replace)}::h"
    mine = opreg.register_triton_op(fake_fn=None, triton_fn=None, name=name + "_vmap")(plus100)
    if replace:
        opreg.register_triton_op(fake_fn=empty, triton_fn=None, name=name)(times2)
    before = report_of(name + "_vmap")
    reports = [r.name for r in opreg.describe_ops()]
    with pytest.raises(
        ValueError,
        match=rf"op '{name}': its vmap_fn is served by a companion op named '{name}_vmap', but "
        rf"'{name}_vmap' is an op of its own, not the companion of '{name}'",
    ):
        with_vmap_fn(name, replace=replace)
    assert report_of(name + "_vmap") == before
    assert [r.name for r in opreg.describe_ops()] == reports  # no op left behind
    torch.testing.assert_close(mine(torch.ones(2)), torch.full((2,), 101.0))
    if replace:  # the op keeps its earlier definition (no vmap_fn)
        assert opreg.describe_op(name).vmap is opreg.VmapSupport.FALLBACK


def test_vmap_fn_does_not_overwrite_a_custom_op_named_like_its_companion():
    name = "sweep5f_custom::h"
    mine = opreg.custom_op(name + "_vmap", plus100, mutates_args=())
    with pytest.raises(ValueError, match=rf"'{name}_vmap' is an op of its own"):
        with_vmap_fn(name, replace=True)
    torch.testing.assert_close(mine(torch.ones(2)), torch.full((2,), 101.0))
    mine.register_fake(empty)  # the custom_op object still holds the current definition


# ---- 3. device_types names types, in every front --------------------------------------------


@pytest.mark.parametrize("types", ["cuda:0", ["cpu", "cuda:1"]])
def test_custom_op_refuses_a_device_for_device_types(types):
    name = f"sweep5f_dev{len(types)}::dev"
    with pytest.raises(
        ValueError,
        match=rf"op '{name}': custom_op's device_types: 'cuda:\d' is a device; "
        r"name its type \('cuda'\)",
    ):
        opreg.custom_op(name, times2, mutates_args=(), device_types=types)
    with pytest.raises(ValueError, match="not a device type name"):
        opreg.custom_op(name, mutates_args=(), device_types="cu da")
    assert name not in [r.name for r in opreg.describe_ops()]
    op = opreg.custom_op(name, times2, mutates_args=(), device_types=["cpu", "CUDA"])
    torch.testing.assert_close(op(torch.ones(2)), torch.full((2,), 2.0))


def test_register_triton_op_checks_evox_device_types():
    with pytest.raises(ValueError, match=r"op 'sweep5f::evox_dev': device_types: 'cuda:0' is a"):
        opreg.register_triton_op(
            fake_fn=empty, triton_fn=None, name="sweep5f::evox_dev", device_types="cuda:0"
        )(times2)
    opreg.register_triton_op(
        fake_fn=empty, triton_fn=None, name="sweep5f::evox_dev", device_types=["cpu", "cuda"]
    )(times2)


# ---- 4. trace blocks --------------------------------------------------------------------------


def test_a_trace_exited_without_entering_says_so():
    block = opreg.trace()
    with pytest.raises(RuntimeError, match=r"opreg.trace\(\): __exit__ .* not entered"):
        block.__exit__(None, None, None)
    with block as t:
        pass
    assert t.impls() == []
    with pytest.raises(RuntimeError, match="already exited"):
        block.__exit__(None, None, None)


@pytest.mark.parametrize("bad", [5, torch.ops.aten.add.default, ["a::b"]])
def test_trace_impls_refuses_what_is_not_an_op_name(bad):
    op = _define("sweep5f::traced", replace=True)
    with opreg.trace() as t:
        op(torch.ones(2))
    with pytest.raises(TypeError, match=r"impls\(op\) takes an op name like 'namespace::name'"):
        t.impls(bad)
    with pytest.raises(ValueError, match="'traced' has no namespace"):
        t.impls("traced")
    assert t.impls("sweep5f::traced") == ["fallback"]
    assert t.impls("sweep5f::other") == []


# ---- 5. keywords that were mistyped or contradicted each other --------------------------------


def _define(name, **keywords):
    return opreg.register_triton_op(fake_fn=empty, triton_fn=None, name=name, **keywords)(times2)


@pytest.mark.parametrize(
    ("keywords", "error", "message"),
    [
        (dict(traceable="yes"), TypeError, r"traceable must be True, False or None.*'yes'"),
        (dict(traceable=1), TypeError, r"traceable must be True, False or None.*got 1"),
        (dict(fake_vmap_fn=empty), ValueError, "fake_vmap_fn is given without vmap_fn"),
        (
            dict(vmap_wrap_inputs=lambda info, in_dims, *args: args),
            ValueError,
            "vmap_wrap_inputs is given without vmap_fn",
        ),
        (
            dict(backward=lambda ctx, grad: grad, autograd="none"),
            ValueError,
            r"autograd='none' declares outputs without gradients, but a backward is given",
        ),
        (
            dict(vmap=lambda info, in_dims, x: (x * 2, 0), batch_polymorphic=True),
            ValueError,
            r"vmap \(a rule\) and batch_polymorphic=True are both given",
        ),
        (
            dict(vmap=lambda info, in_dims, x: (x * 2, 0), vmap_per_example_loop=True),
            ValueError,
            r"vmap \(a rule\) and vmap_per_example_loop=True are both given",
        ),
        (
            dict(vmap=lambda info, in_dims, x: (x * 2, 0), vmap_loop=True),
            ValueError,
            r"vmap \(a rule\) and vmap_loop=True are both given",
        ),
        (
            dict(vmap_fn=lambda x: x * 2, fake_vmap_fn=empty, batch_polymorphic=True),
            ValueError,
            r"vmap_fn and batch_polymorphic=True are both given",
        ),
    ],
)
def test_contradictory_or_mistyped_keywords_are_refused(keywords, error, message):
    name = "sweep5f::keywords"
    with pytest.raises(error, match=rf"op '{name}': {message}"):
        _define(name, **keywords)
    assert name not in [r.name for r in opreg.describe_ops()]
    assert name + "_vmap" not in [r.name for r in opreg.describe_ops()]


def test_the_keywords_alone_still_work():
    x = torch.ones(3, 2)
    op = _define("sweep5f::rule", vmap=lambda info, in_dims, x: (x * 2, 0))
    torch.testing.assert_close(vmap(op)(x), x * 2)
    op = _define("sweep5f::polymorphic", batch_polymorphic=True, traceable=False)
    torch.testing.assert_close(vmap(op)(x), x * 2)
    op = _define("sweep5f::no_grad", autograd="none", traceable=None, vmap_per_example_loop=False)
    assert not op(x.requires_grad_()).requires_grad
