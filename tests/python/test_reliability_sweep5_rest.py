"""Regression tests for the fifth adversarial sweep's findings fixed after its first round: the
functions given to custom_op's register_kernel and to triton_op(fallback=) were not checked
against the schema until their first call, and opcheck's keyword arguments of the wrong type
failed deep inside it ('int' object is not callable); under Triton's interpreter, a triton_op with
no reference ran its Triton function as the reference for vmap (which failed: 'Cannot access
storage of BatchedTensorImpl') and for autograd (the output silently did not require grad)."""

from __future__ import annotations

import itertools
import os

import pytest
import torch
from test_library_compat import add_kernel_interpretable as add_kernel

import opreg
import triton

_names = itertools.count()


def scale_op():
    name = f"sweep5r::scale{next(_names)}"

    @opreg.custom_op(name, mutates_args=())
    def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
        return x * factor

    return scale


def served(op) -> dict:
    return {k.device_type: k.describe() for k in opreg.describe_op(op._qualname).kernels}


def test_register_kernel_refuses_a_function_that_cannot_take_the_arguments():
    scale = scale_op()
    before = served(scale)
    with pytest.raises(
        TypeError,
        match=rf"op '{scale._qualname}': register_kernel's fn cannot be called with the "
        r"schema's arguments \(x, factor\)",
    ):
        scale.register_kernel("cuda", lambda x: x)
    with pytest.raises(TypeError, match="register_kernel's fn cannot be called"):
        opreg.register_kernel(scale, "cpu", lambda x, factor, extra: x)
    assert served(scale) == before  # nothing registered, the reference still serves
    assert torch.equal(scale(torch.ones(3), 2.0), torch.full((3,), 2.0))


def test_register_kernel_takes_functions_that_fit():
    scale = scale_op()
    scale.register_kernel("cuda", lambda x, factor, *rest: x * factor)
    scale.register_kernel("cpu", lambda *args, **kwargs: args[0] * args[1] + 1)
    assert served(scale)["cuda"] == "kernel:register_kernel"
    assert torch.equal(scale(torch.ones(2), 3.0), torch.full((2,), 4.0))


def test_triton_op_refuses_a_fallback_that_cannot_take_the_arguments():
    name = f"sweep5r::tri{next(_names)}"

    def fn(x: torch.Tensor, n: int) -> torch.Tensor:
        return x + n

    with pytest.raises(
        TypeError,
        match=rf"op '{name}': triton_op's fallback cannot be called with the schema's "
        r"arguments \(x, n\)",
    ):
        opreg.triton_op(name, mutates_args=(), fallback=lambda x: x)(fn)
    with pytest.raises(ValueError, match=f"no op named '{name}'"):
        opreg.describe_op(name)  # the failed definition left nothing behind


@pytest.mark.parametrize(
    ("keywords", "error", "message"),
    [
        ({"progress": 5}, TypeError, "progress must be a function taking one str"),
        ({"raise_on_failure": "no"}, TypeError, "raise_on_failure must be a bool, got str"),
        ({"checks": 5}, TypeError, "checks must be a check's name or a list of them"),
        ({"checks": ["fake_vs_real", 3]}, ValueError, r"unknown checks \[3\]"),
    ],
)
def test_opcheck_keywords_of_the_wrong_kind_are_named(keywords, error, message):
    with pytest.raises(error, match=rf"opreg.opcheck: opreg::fused_add: {message}"):
        opreg.opcheck(torch.ops.opreg.fused_add, **keywords)


def test_opcheck_progress_gets_each_step():
    lines = []
    report = opreg.opcheck(
        torch.ops.opreg.fused_add, devices=["cpu"], checks=["fake_vs_real"], progress=lines.append
    )
    assert report.rows and lines
    assert all(line.startswith("opreg::fused_add cpu ") for line in lines)


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="runs Triton's interpreter on CPU"
)
def test_an_interpreted_triton_op_without_reference_is_no_reference_for_vmap_or_autograd():
    name = f"sweep5r::interpreted{next(_names)}"

    @opreg.triton_op(name, mutates_args=())
    def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        grid = (triton.cdiv(x.numel(), 64),)
        opreg.wrap_triton(add_kernel)[grid](x, y, out, x.numel(), BLOCK_SIZE=64)
        return out

    x, y = torch.randn(4, 5), torch.randn(4, 5)
    torch.testing.assert_close(add(x, y), x + y)
    with opreg.trace() as calls:
        torch.testing.assert_close(torch.vmap(add)(x, y), x + y)
    assert "vmap:per-example loop" in calls.impls(name)
    with pytest.raises(RuntimeError, match=rf"{name}: an input requires grad, but the op has no"):
        add(x.requires_grad_(), y)

    @add.register_kernel("cpu")  # a reference: autograd and vmap go through its ATen ops
    def _(x, y):
        return x + y

    x.grad = None
    add(x, y).sum().backward()
    torch.testing.assert_close(x.grad, torch.ones_like(x))
