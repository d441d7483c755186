"""Regression tests for the nineteenth sweep's findings on vmap's per-example loops (the C++ loop
of vmap_loop ops and of grad through vmap, and the Python loop of vmap_fn ops with a backward)."""

from __future__ import annotations

import math
from typing import Optional

import pytest
import torch

import opreg


def _loop_op(name, schema, fallback, fake):
    return opreg.register_vmap_op(fake_fn=fake, name=name, schema=schema, vmap_loop=True)(fallback)


# ---- B-F2, A-F7: list lengths and NaN outputs across examples ------------------------------


def test_loop_refuses_list_lengths_that_differ_when_the_first_example_s_is_empty():
    op = _loop_op(
        "sw19v::lengths",
        "(Tensor x) -> Tensor[]",
        lambda x: [x * i for i in range(int(x.sum().item()) % 3)],
        lambda x: [],
    )
    with pytest.raises(
        RuntimeError,
        match=r"sw19v::lengths: output 0 .*0 tensors for example 0 and 1 for example 1",
    ):
        torch.vmap(op)(torch.tensor([[3.0, 0.0], [1.0, 0.0], [2.0, 0.0]]))


def test_grad_loop_keeps_a_float_output_that_is_nan_in_every_example():
    op = opreg.register_vmap_op(
        fake_fn=lambda x: (torch.empty_like(x), 0.0),
        name="sw19v::nan",
        schema="(Tensor x) -> (Tensor, float)",
        backward=lambda ctx, g, *rest: g * 7,
    )(lambda x: (x * 2, float("nan")))
    out, number = torch.vmap(op, out_dims=(0, None))(torch.ones(3, 2, requires_grad=True))
    assert math.isnan(number)
    assert out.shape == (3, 2)


# ---- A-F17, B-F3: outputs whose shapes differ between examples --------------------------------


def test_loop_refuses_outputs_of_differing_shapes_naming_the_op_and_the_output():
    op = _loop_op(
        "sw19v::ragged",
        "(Tensor x) -> (Tensor, Tensor)",
        lambda x: (x * 1, x[: int(x[0].item())].clone()),
        lambda x: (torch.empty_like(x), torch.empty_like(x)),
    )
    with pytest.raises(
        RuntimeError,
        match=r"sw19v::ragged: output 1 has shape \[1\] for example 0 and \[2\] for example 1",
    ):
        torch.vmap(op)(torch.tensor([[1.0, 5.0, 6.0], [2.0, 5.0, 6.0]]))


def test_loop_refuses_list_elements_of_differing_shapes_naming_the_op_and_the_element():
    op = _loop_op(
        "sw19v::ragged_list",
        "(Tensor x) -> Tensor[]",
        lambda x: [x * 1, x[: int(x[0].item())].clone()],
        lambda x: [torch.empty_like(x), torch.empty_like(x)],
    )
    with pytest.raises(
        RuntimeError,
        match=r"sw19v::ragged_list: output 0 element 1 has shape \[1\] for example 0 and \[2\] "
        r"for example 1",
    ):
        torch.vmap(op)(torch.tensor([[1.0, 5.0, 6.0], [2.0, 5.0, 6.0]]))


def test_grad_loop_refuses_outputs_of_differing_shapes_naming_the_op():
    op = opreg.custom_op(
        "sw19v::ragged_grad",
        lambda x: x[: int(x[0].item())].clone(),
        mutates_args=(),
        schema="(Tensor x) -> Tensor",
    )
    op.register_autograd(lambda ctx, g: None, setup_context=lambda ctx, inputs, output: None)
    x = torch.tensor([[1.0, 5.0, 6.0], [2.0, 5.0, 6.0]], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"sw19v::ragged_grad: output 0 has shape \[1\]"):
        torch.vmap(torch.ops.sw19v.ragged_grad)(x)


# ---- A-F14: Tensor?[] outputs of the loop ------------------------------------------------------


def test_loop_stacks_optional_tensor_list_outputs():
    op = _loop_op(
        "sw19v::opt_list",
        "(Tensor x) -> Tensor?[]",
        lambda x: [x * 2, x * 3],
        lambda x: [torch.empty_like(x), torch.empty_like(x)],
    )
    x = torch.randn(4, 3)
    first, second = torch.vmap(op)(x)
    torch.testing.assert_close(first, x * 2)
    torch.testing.assert_close(second, x * 3)


# ---- A-F2: the Python loop's non-tensor outputs ---------------------------------------------


def _vmap_fn_op(name, schema, fallback, fake):
    return opreg.register_vmap_op(
        fake_fn=fake,
        name=name,
        schema=schema,
        backward=lambda ctx, g, *rest: g * 7,
        vmap_fn=fallback,
        fake_vmap_fn=fake,
    )(fallback)


def test_python_loop_refuses_a_none_output_that_differs_between_examples():
    op = _vmap_fn_op(
        "sw19v::vf_none",
        "(Tensor x) -> (Tensor, Tensor?)",
        lambda x: (x * 2, x * 3 if bool((x > 0).all()) else None),
        lambda x: (torch.empty_like(x), torch.empty_like(x)),
    )
    x = torch.tensor([[-1.0, -1.0], [1.0, 1.0]], requires_grad=True)
    with pytest.raises(
        RuntimeError, match=r"sw19v::vf_none: output 1 \(None\) differs between examples"
    ):
        torch.vmap(op, out_dims=(0, None))(x)
    with pytest.raises(RuntimeError, match=r"sw19v::vf_none: output 1 is a tensor for some"):
        torch.vmap(op, out_dims=(0, None))(x.flip(0))


def test_python_loop_keeps_equal_numbers_and_refuses_differing_ones():
    op = _vmap_fn_op(
        "sw19v::vf_int",
        "(Tensor x) -> (Tensor, int)",
        lambda x: (x * 2, int(x.sum().item()) if x.dim() == 1 else 0),
        lambda x: (torch.empty_like(x), 0),
    )
    same = torch.ones(3, 2, requires_grad=True)
    assert torch.vmap(op, out_dims=(0, None))(same)[1] == 2
    differ = torch.tensor([[1.0, 1.0], [2.0, 2.0]], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"sw19v::vf_int: output 1 \(int\) differs"):
        torch.vmap(op, out_dims=(0, None))(differ)


# ---- A-F12: in_dims of a Tensor[]? argument --------------------------------------------------


def test_a_rule_gets_one_in_dim_per_tensor_of_an_optional_tensor_list():
    seen = []

    def f(x: torch.Tensor, ys: Optional[list[torch.Tensor]]) -> torch.Tensor:  # noqa: UP045
        return x * 2

    def rule(info, in_dims, x, ys):
        seen.append(in_dims)
        return x.movedim(in_dims[0], 0) * 2, 0

    op = opreg.custom_op(
        "sw19v::opt_tl", mutates_args=(), schema="(Tensor x, Tensor[]? ys) -> Tensor"
    )(f)
    op.register_vmap(rule)
    torch.vmap(op, in_dims=(0, 0))(torch.ones(4, 3), [torch.ones(4, 3), torch.ones(4, 3)])
    torch.vmap(op, in_dims=(0, None))(torch.ones(4, 3), None)
    assert seen == [(0, [0, 0]), (0, None)]


# ---- A-F3: a batch of no examples keeps the graph --------------------------------------------


@pytest.mark.parametrize("with_backward", [False, True])
def test_loop_over_no_examples_keeps_the_graph(with_backward):
    extra = {"backward": lambda ctx, g: g * 7} if with_backward else {}
    op = opreg.register_vmap_op(
        fake_fn=lambda x: torch.empty_like(x),
        name=f"sw19v::empty{int(with_backward)}",
        schema="(Tensor x) -> Tensor",
        vmap_loop=True,
        **extra,
    )(lambda x: x * 2)
    x = torch.randn(0, 3, requires_grad=True)
    out = torch.vmap(op)(x)
    assert out.shape == (0, 3)
    assert out.requires_grad
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert grad.shape == (0, 3)


# ---- A-F6: declared view outputs are refused where the examples are stacked ------------------


def test_loop_refuses_a_declared_view_output():
    op = _loop_op(
        "sw19v::view_loop",
        "(Tensor(a) x) -> Tensor(a)",
        lambda x: x.view(x.shape),
        lambda x: x.view(x.shape),
    )
    with pytest.raises(
        RuntimeError, match=r"sw19v::view_loop: .*declares output 0 a view of an input"
    ):
        torch.vmap(lambda t: op(t).mul_(2))(torch.ones(4, 3))


def test_python_loop_refuses_a_declared_view_output():
    op = _vmap_fn_op(
        "sw19v::view_vf",
        "(Tensor(a) x) -> Tensor(a)",
        lambda x: x.view(x.shape),
        lambda x: x.view(x.shape),
    )
    x = torch.ones(4, 3, requires_grad=True) * 1
    with pytest.raises(
        RuntimeError, match=r"sw19v::view_vf: .*declares output 0 a view of an input"
    ):
        torch.vmap(lambda t: op(t).mul_(2))(x)
