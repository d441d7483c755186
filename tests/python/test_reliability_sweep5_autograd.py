"""Regression test for a finding of the fifth adversarial sweep in autograd: an op returning a
float and an integer tensor could not have an explicit backward (defined with one gradient per
output, it was called with one per differentiable output)."""

from __future__ import annotations

import torch

import opreg


def test_a_backward_gets_one_gradient_per_output_none_for_integer_outputs():
    seen = []

    def backward(ctx, grad_value, grad_sign):
        seen.append(grad_sign)
        return grad_value * 2

    @opreg.register_triton_op(
        fake_fn=lambda x: (torch.empty_like(x), torch.empty_like(x, dtype=torch.long)),
        triton_fn=None,
        name="sweep5_autograd::with_sign",
        backward=backward,
    )
    def with_sign(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, (x > 0).long()

    x = torch.randn(3, requires_grad=True)
    value, sign = with_sign(x)
    assert not sign.requires_grad
    value.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))
    assert seen == [None]
