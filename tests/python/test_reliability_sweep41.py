"""Regression tests for the forty-first adversarial sweep's findings and the earlier ones fixed
with them (reports kept outside the repository), beside the earlier sweeps' files."""

from __future__ import annotations

import torch

import opreg


def test_a_call_that_read_no_dispatch_keys_still_takes_the_ops_backward():
    # Sweep 39 b19-2: while a replace on another thread registered the op's schema anew, a call
    # read none of its arguments' dispatch keys and skipped autograd: the gradient came from the
    # fallback's ops (5) instead of the op's backward (7). A redispatch with no keys makes the call
    # that race makes.
    opreg.register_triton_op(
        fake_fn=None,
        triton_fn=None,
        name="sweep41::no_keys",
        schema="(Tensor x) -> Tensor",
        backward=lambda ctx, grad: grad * 7,
        setup_context=lambda ctx, inputs, output: None,
    )(lambda x: x * 5)
    x = torch.ones(2, requires_grad=True)
    no_keys = torch._C.DispatchKeySet(torch._C.DispatchKey.Undefined)
    y = torch.ops.sweep41.no_keys.default.redispatch(no_keys, x)
    y.sum().backward()
    assert y.tolist() == [5.0, 5.0]
    assert x.grad.tolist() == [7.0, 7.0]
    with torch.no_grad():
        assert torch.ops.sweep41.no_keys.default.redispatch(no_keys, x).tolist() == [5.0, 5.0]
