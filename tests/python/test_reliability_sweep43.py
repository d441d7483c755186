"""Regression tests for what the adversarial sweep 43 found (see issue 13's notes): a tensor
escaped from torch.vmap, and a vmap_fn's wrong batch size said of the piece the user wrote."""

from __future__ import annotations

import pytest
import torch

import opreg


def test_a_tensor_escaped_from_vmap_is_refused_naming_the_op():
    # Sweep 43 B-F3: a BatchedTensor kept from inside torch.vmap reached opreg's internal assert
    # ("vmap kernel without a vmap layer ... please report a bug to PyTorch").
    kept = []

    def keep(x):
        kept.append(x)
        return x * 1

    torch.vmap(keep)(torch.ones(3, 2))
    with pytest.raises(RuntimeError) as raised:
        torch.ops.opreg.fused_add(kept[0], kept[0])
    message = str(raised.value)
    assert (
        "opreg::fused_add: called with a tensor batched by torch.vmap outside any vmap" in message
    )
    assert "INTERNAL ASSERT" not in message
    x = torch.arange(4.0)
    assert torch.equal(torch.ops.opreg.fused_add(x, x), x + x)


@pytest.mark.parametrize("wrong", ["fewer", "summed"])
def test_a_vmap_fns_wrong_batch_size_is_said_of_its_vmap_fn(wrong):
    # Sweep 43 A-F3: said of "the vmap rule", which the op does not have.
    vmap_fn = (lambda x: x[:1] * 100) if wrong == "fewer" else (lambda x: x.sum(0))
    opreg.register_vmap_op(
        fake_fn=lambda x: torch.empty_like(x),
        vmap_fn=vmap_fn,
        fake_vmap_fn=lambda x: torch.empty_like(x),
        name=f"sweep43::bad_batch_{wrong}",
        schema="(Tensor x) -> Tensor",
        replace=True,
    )(lambda x: x * 2)
    op = getattr(torch.ops.sweep43, f"bad_batch_{wrong}")
    expected = 1 if wrong == "fewer" else 2
    with pytest.raises(RuntimeError) as raised:
        torch.vmap(op)(torch.ones(3, 2))
    assert str(raised.value).startswith(
        f"sweep43::bad_batch_{wrong}: its vmap_fn returned output 0 with {expected} entries "
        "along dim 0 (its vmap_out_dims), expected the batch size 3"
    )
    assert torch.equal(op(torch.ones(2)), torch.full((2,), 2.0))
