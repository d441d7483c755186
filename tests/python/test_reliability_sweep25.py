"""Regression tests for the twenty-fifth adversarial sweep's findings left open when it ended
(reports kept outside the repository); its other findings are in test_reliability_sweep24.py."""

from __future__ import annotations

import os

import pytest
import torch
from test_reliability_aot import assert_one_line_error, run_aot, scale_spec

import opreg
from opreg._registry import _C

# ---- A-F2: vmap where the only batched tensors are in a Tensor[]? ---------------------------


def list_sum(tag: str):
    @opreg.custom_op(
        f"opreg_sweep25::{tag}", mutates_args=(), schema="(Tensor x, Tensor[]? ys) -> Tensor"
    )
    def op(x, ys):
        total = x.clone()
        for y in ys or []:
            total = total + y
        return total

    return op


def only_in_list(tag: str):
    return opreg.custom_op(
        f"opreg_sweep25::{tag}", mutates_args=(), schema="(Tensor[]? ys) -> Tensor"
    )(lambda ys: ys[0] * ys[1])


def test_vmap_over_tensors_only_in_an_optional_list_runs_the_fallback_per_example():
    # PyTorch's dispatcher takes no keys from a Tensor[]?, so the call missed vmap's batching
    # kernel and met functorch's internal assert.
    op = list_sum("fallback")
    x, ys = torch.randn(3), [torch.randn(4, 3), torch.randn(4, 3)]
    assert torch.equal(torch.vmap(lambda ys: op(x, ys))(ys), x + ys[0] + ys[1])
    alone = only_in_list("alone")
    assert torch.equal(torch.vmap(alone)(ys), ys[0] * ys[1])


def test_vmap_over_tensors_only_in_an_optional_list_reaches_the_rule():
    op = list_sum("rule")
    seen = []

    def rule(info, in_dims, x, ys):
        seen.append(in_dims)
        return x + ys[0] + ys[1], 0

    op.register_vmap(rule)
    x, ys = torch.randn(3), [torch.randn(4, 3), torch.randn(4, 3)]
    assert torch.equal(torch.vmap(lambda ys: op(x, ys))(ys), x + ys[0] + ys[1])
    assert seen == [(None, [0, 0])]


def test_opcheck_vmaps_an_op_whose_only_tensors_are_in_an_optional_list():
    opreg.opcheck(only_in_list("checked"), [([torch.randn(3), torch.randn(3)],)])


def test_a_random_op_batched_only_in_an_optional_list_is_refused_clearly():
    op = opreg.register_vmap_op(
        fake_fn=lambda ys: torch.empty_like(ys[0]),
        name="opreg_sweep25::noisy",
        schema="(Tensor[]? ys) -> Tensor",
        random=True,
    )(lambda ys: ys[0] + torch.rand_like(ys[0]))
    with pytest.raises(RuntimeError, match="random op's batched tensors must not all be in a"):
        torch.vmap(op, randomness="different")([torch.randn(4, 3)])


# ---- A-F7, A-F8: keywords that would never be used are refused at definition -----------------


def test_triton_accepts_without_triton_fn_is_refused():
    with pytest.raises(ValueError, match="triton_accepts is given but no triton_fn"):
        opreg.register_triton_op(
            fake_fn=None,
            triton_fn=None,
            name="opreg_sweep25::accepts",
            schema="(Tensor x) -> Tensor",
            triton_accepts=lambda x: True,
        )(lambda x: x * 2)
    assert not _C.is_defined("opreg_sweep25::accepts")


def test_triton_device_types_without_a_kernel_is_refused():
    with pytest.raises(ValueError, match=r"triton_device_types=.cuda. is given without triton_fn"):
        opreg.register_triton_op(
            fake_fn=None,
            triton_fn=None,
            name="opreg_sweep25::types",
            schema="(Tensor x) -> Tensor",
            triton_device_types="cuda",
        )(lambda x: x * 2)
    assert not _C.is_defined("opreg_sweep25::types")


@pytest.mark.parametrize("out_dims", [True, (0, False)])
def test_a_bool_for_vmap_out_dims_is_refused_at_definition(out_dims):
    with pytest.raises(TypeError, match="vmap_out_dims must be an int, None or a sequence"):
        opreg.register_vmap_op(
            fake_fn=lambda x: torch.empty_like(x),
            name="opreg_sweep25::out_dims",
            schema="(Tensor x) -> Tensor",
            vmap_fn=lambda x: x * 2,
            fake_vmap_fn=lambda x: torch.empty_like(x),
            vmap_out_dims=out_dims,
        )(lambda x: x * 2)


# ---- A-F9: opcheck on meta tensors checks nothing --------------------------------------------


def test_opcheck_refuses_the_meta_device():
    with pytest.raises(ValueError, match="devices: 'meta' holds no values to compare"):
        opreg.opcheck(list_sum("meta"), [(torch.randn(3), None)], devices=["cpu", "meta"])


# ---- A-F10: a name with a NUL was read up to it by C++ ----------------------------------------


@pytest.mark.parametrize("function", ["describe_op", "kernel_status"])
def test_a_name_with_a_nul_is_no_name_of_an_op(function):
    list_sum("named")
    with pytest.raises(ValueError, match="holds a NUL character"):
        getattr(opreg, function)("opreg_sweep25::named\0tail")


# ---- B-F7: a FIFO named as a kernel source ----------------------------------------------------


def test_a_fifo_as_kernel_source_is_named_as_such(tmp_path):
    os.mkfifo(tmp_path / "kernels.py")
    spec = scale_spec(source=f'"{tmp_path / "kernels.py"}:scale_kernel"')
    assert_one_line_error(run_aot(spec, tmp_path), "kernels.py is not a regular file")


# ---- A-F5: torch.library's registrations of an opreg op went past opreg ---------------------


def test_torch_library_registrations_add_pieces_to_an_opreg_custom_op():
    # They overrode the op in the dispatcher, where a later opreg definition did not take them
    # back; now the custom_op takes each piece, as its own methods do.
    op = list_sum("pieces")
    x = torch.ones(2, requires_grad=True)
    torch.library.register_kernel("opreg_sweep25::pieces", "cpu", lambda x, ys: x * 3)
    torch.library.register_autograd("opreg_sweep25::pieces", lambda ctx, g: (g * 5, None))
    out = op(x, None)
    out.sum().backward()
    assert out.tolist() == [3.0, 3.0] and x.grad.tolist() == [5.0, 5.0]
    torch.library.register_fake("opreg_sweep25::pieces", lambda x, ys: torch.empty_like(x))
    assert torch.compile(op, fullgraph=True)(torch.ones(2), None).tolist() == [3.0, 3.0]
    op.register_kernel("cpu", lambda x, ys: x * 4)  # a later piece from opreg serves the calls
    assert op(torch.ones(2), None).tolist() == [4.0, 4.0]


@pytest.mark.parametrize(
    ("api", "arguments"),
    [
        ("register_kernel", ("cpu", lambda x: x * 3)),
        ("register_fake", (lambda x: torch.empty_like(x),)),
        ("register_autograd", (lambda ctx, g: g * 5,)),
        ("register_vmap", (lambda info, in_dims, x: (x * 3, 0),)),
        ("register_autocast", ("cpu", torch.float16)),
    ],
)
@pytest.mark.parametrize("owner", ["register_triton_op", "shipped"])
def test_torch_library_registrations_of_other_opreg_ops_are_refused(api, arguments, owner):
    if owner == "shipped":
        name, op = "opreg::fused_add", torch.ops.opreg.fused_add.default
        if api in ("register_kernel", "register_fake", "register_vmap"):
            arguments = (*arguments[:-1], lambda *a: a[0])
        sample = (torch.ones(2), torch.ones(2))
    else:
        name = f"opreg_sweep25::refuses_{api}"
        op = opreg.register_triton_op(
            fake_fn=torch.empty_like, triton_fn=None, name=name, schema="(Tensor x) -> Tensor"
        )(lambda x: x + 1)
        sample = (torch.ones(2),)
    before = op(*sample)
    with pytest.raises(ValueError, match=f"torch.library.{api}: op '{name}'"):
        getattr(torch.library, api)(name, *arguments)
    assert torch.equal(op(*sample), before)
    assert torch.equal(torch.vmap(op)(*(s.expand(3, 2) for s in sample))[0], before)


def test_torch_library_register_torch_dispatch_still_serves_an_opreg_op():
    op = opreg.register_triton_op(
        fake_fn=torch.empty_like,
        triton_fn=None,
        name="opreg_sweep25::dispatch_rule",
        schema="(Tensor x) -> Tensor",
    )(lambda x: x + 1)

    class Mode(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    torch.library.register_torch_dispatch(
        "opreg_sweep25::dispatch_rule", Mode, lambda mode, func, types, args, kwargs: args[0] * 7
    )
    with Mode():
        assert op(torch.ones(2)).tolist() == [7.0, 7.0]
    assert op(torch.ones(2)).tolist() == [2.0, 2.0]
