"""Regression tests for the fifteenth sweep's findings: calls without a tensor under
FakeTensorMode, an op's Python pieces after a definition made from C++, torch.ops' handles after a
schema change, and vmap's randomness for an op called without a tensor."""

from __future__ import annotations

import ctypes

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import opreg
from conftest import TEST_OPS_LIBRARY


def define(name, fallback, schema, **options):
    options.setdefault("fake_fn", None)
    return opreg.register_triton_op(triton_fn=None, name=name, schema=schema, **options)(fallback)


def arange(n):
    return torch.arange(n, dtype=torch.float32)


def test_a_fake_made_from_python_refuses_calls_once_cpp_undefined_the_op():
    # W2: the fake, kept in Python, went on giving results under FakeTensorMode after
    # opreg::undefine, which eager and compile refuse.
    no_tensor = define("stale15::no_tensor", arange, "(int n) -> Tensor")
    with_fake = define(
        "stale15::with_fake", torch.sin, "(Tensor x) -> Tensor", fake_fn=torch.empty_like
    )
    undefine = ctypes.CDLL(str(TEST_OPS_LIBRARY)).opreg_test_undefine
    for name, call in (
        (b"stale15::no_tensor", lambda m: no_tensor(3)),
        (b"stale15::with_fake", lambda m: with_fake(m.from_tensor(torch.ones(2)))),
    ):
        with FakeTensorMode() as mode:
            assert call(mode).shape[0] in (2, 3)
        assert undefine(name) == 0
        with (
            pytest.raises(RuntimeError, match=f"{name.decode()}: the op is not defined now"),
            FakeTensorMode() as mode,
        ):
            call(mode)


def test_a_definition_made_from_cpp_behind_python_takes_over_fake_tensor_mode():
    # The Python op's fake stayed in force after C++ replaced the op outside a library load
    # (as W1 was within one): FakeTensorMode gave the old definition's shape.
    op = define("stale15::replaced", arange, "(int n) -> Tensor")
    with FakeTensorMode():
        assert op(3).shape == (3,)
    assert ctypes.CDLL(str(TEST_OPS_LIBRARY)).opreg_test_replace_arange(b"stale15::replaced") == 0
    assert op(3).tolist() == [0.0, 1.0, 2.0, 3.0]  # the C++ fallback: n + 1 numbers
    with FakeTensorMode():
        assert op(3).shape == (4,)
    assert torch.compile(lambda x: op(3) + x, backend="aot_eager")(torch.zeros(1)).shape == (4,)
    assert "the fallback serves every device" in opreg.kernel_status("stale15::replaced")


def test_a_handle_kept_across_a_schema_change_follows_it_under_fake_tensor_mode():
    # W3: after FakeTensorMode had run the op, a replace with a tensor argument left PyTorch's
    # dispatcher handing the mode the first handle, with the old schema: "Failed to normalize".
    op = define("handle15::a", arange, "(int n) -> Tensor")
    with FakeTensorMode():
        op(3)
    new = define(
        "handle15::a", lambda x, n: x.repeat(n), "(Tensor x, int n) -> Tensor", replace=True
    )
    assert new is op and str(op._schema) == "handle15::a(Tensor x, int n) -> Tensor"
    assert op(torch.ones(2), 3).shape == (6,)
    with FakeTensorMode() as mode:
        assert op(mode.from_tensor(torch.ones(2)), 3).shape == (6,)


def test_compile_after_a_replace_that_makes_the_op_mutating_functionalizes_it():
    # A compile before the replace left functionalization reading the old, functional schema:
    # the mutating op was refused for "alias annotations", or its mutation lost.
    op = define(
        "handle15::mutating",
        torch.add,
        "(Tensor x, Tensor y) -> Tensor",
        fake_fn=lambda x, y: torch.empty_like(x),
    )
    assert (
        torch.compile(lambda x: op(x, x) * 2, backend="aot_eager")(torch.ones(3)).tolist()
        == [4.0] * 3
    )

    def add_into(x, y):
        x.add_(y)

    define(
        "handle15::mutating",
        add_into,
        "(Tensor(a!) x, Tensor y) -> ()",
        fake_fn=lambda x, y: None,
        mutates_args=("x",),
        replace=True,
    )

    def f(x):
        y = x.clone()
        op(y, x)
        return y * 2

    for backend in ("aot_eager", "inductor"):
        assert torch.compile(f, backend=backend)(torch.ones(3)).tolist() == [4.0] * 3


@pytest.mark.parametrize("name", ["arange", "arange_faked", "sum_or_zeros"])
def test_cpp_ops_called_without_a_tensor_trace_under_fake_tensor_mode(name):
    # U1: FakeTensorMode took them for factories and passed device='meta' ("expected at most 1
    # argument(s) but received 2"), a C++ .fake() or not; an empty Tensor[] found no device.
    op = getattr(torch.ops.opreg_test, name)
    args = ([], 4) if name == "sum_or_zeros" else (4,)
    expected = op(*args)
    with FakeTensorMode():
        fake = op(*args)
    assert (fake.shape, fake.dtype, fake.device) == (
        expected.shape,
        expected.dtype,
        expected.device,
    )
    compiled = torch.compile(lambda x: op(*args) + x, backend="aot_eager")(torch.zeros(1))
    assert torch.equal(compiled, expected)
    with FakeTensorMode() as mode:  # with a tensor, the usual path
        assert torch.ops.opreg_test.sum_or_zeros([mode.from_tensor(torch.ones(2))], 4).shape == (2,)


def test_python_ops_given_no_tensor_for_optional_or_list_arguments_trace():
    # U2: a Tensor? given None, or an empty Tensor[], without a fake: "Could not find common
    # device" under FakeTensorMode and compile.
    optional = define(
        "notensor15::optional",
        lambda x, n: torch.zeros(n) if x is None else x * n,
        "(Tensor? x, int n) -> Tensor",
    )
    listed = define(
        "notensor15::listed",
        lambda xs, n: torch.stack(xs).sum(0) if xs else torch.ones(n),
        "(Tensor[] xs, int n) -> Tensor",
    )
    with FakeTensorMode() as mode:
        assert optional(None, 3).shape == (3,)
        assert optional(mode.from_tensor(torch.ones(2)), 3).shape == (2,)
        assert listed([], 5).shape == (5,)
    compiled = torch.compile(lambda y: optional(None, 3) + listed([], 3) + y)
    assert compiled(torch.zeros(1)).tolist() == [1.0, 1.0, 1.0]


def test_a_random_op_called_without_a_tensor_draws_per_example_under_vmap():
    # W4: randomness='different' gave every example the same numbers.
    op = define("random15::draw", lambda n: torch.rand(n), "(int n) -> Tensor", random=True)
    different = torch.vmap(lambda x: op(3) + x, randomness="different")(torch.zeros(4, 3))
    assert len({tuple(row) for row in different.tolist()}) == 4
    same = torch.vmap(lambda x: op(3) + x, randomness="same")(torch.zeros(4, 3))
    assert len({tuple(row) for row in same.tolist()}) == 1
    nested = torch.vmap(
        torch.vmap(lambda x: op(2) + x, randomness="different"), randomness="different"
    )(torch.zeros(2, 3, 2))
    assert len({tuple(row) for row in nested.reshape(-1, 2).tolist()}) == 6

    several = define(
        "random15::several",
        lambda n: (torch.rand(n), [torch.rand(2), torch.rand(1)], n),
        "(int n) -> (Tensor, Tensor[], int)",
        random=True,
    )
    firsts = torch.vmap(lambda x: several(3)[1][0] + x, randomness="different")(torch.zeros(5, 2))
    assert firsts.shape == (5, 2) and len({tuple(row) for row in firsts.tolist()}) == 5

    ragged = define(
        "random15::ragged",
        lambda n: torch.rand(int(torch.randint(1, 1000, ()))),
        "(int n) -> Tensor",
        random=True,
    )
    with pytest.raises(
        RuntimeError,
        match=r"random15::ragged: under vmap with "
        r"randomness='different', output 0 has shape \[\d+\] for one example",
    ):
        torch.vmap(lambda x: ragged(3).sum() + x, randomness="different")(torch.zeros(8))


def test_an_exception_object_raised_again_gets_its_note_once():
    # One ValueError object re-raised by a fallback gained one more identical note per call.
    error = ValueError("kept")

    def fallback(x):
        raise error

    op = define("note15::again", fallback, "(Tensor x) -> Tensor", fake_fn=torch.empty_like)
    for _ in range(3):
        with pytest.raises(ValueError, match="kept") as raised:
            op(torch.ones(1))
    assert raised.value.__notes__ == ["opreg: raised in the fallback of note15::again"]
