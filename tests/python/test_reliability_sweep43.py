"""Regression tests for what the adversarial sweeps 43 and 44 found (see issue 13's notes): a
tensor escaped from torch.vmap, and a vmap_fn's wrong outputs said of the piece the user wrote."""

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


def _op_with_vmap_fn(name, vmap_fn, out_dims=0):
    opreg.register_vmap_op(
        fake_fn=lambda x: torch.empty_like(x),
        vmap_fn=vmap_fn,
        fake_vmap_fn=lambda x: torch.empty_like(x),
        name=f"sweep43::{name}",
        schema="(Tensor x) -> Tensor",
        vmap_out_dims=out_dims,
        replace=True,
    )(lambda x: x * 2)
    return getattr(torch.ops.sweep43, name)


@pytest.mark.parametrize(
    ("name", "vmap_fn", "out_dims", "message"),
    [
        # Sweep 43 A-F3: said of "the vmap rule", which the op does not have.
        (
            "fewer",
            lambda x: x[:1] * 100,
            0,
            "sweep43::fewer: its vmap_fn returned output 0 with 1 entries along dim 0 (its "
            "vmap_out_dims), expected the batch size 3",
        ),
        (
            "summed",
            lambda x: x.sum(0),
            0,
            "sweep43::summed: its vmap_fn returned output 0 with 2 entries along dim 0 (its "
            "vmap_out_dims), expected the batch size 3",
        ),
        # Sweep 44 B-F1: said of "<op>_vmap: the fallback" (its companion's) or "the vmap rule".
        (
            "none",
            lambda x: None,
            0,
            "sweep43::none_vmap: the vmap_fn of sweep43::none returned None for output 0",
        ),
        (
            "meta",
            lambda x: torch.empty_like(x, device="meta"),
            0,
            "sweep43::meta_vmap: the vmap_fn of sweep43::meta returned output 0 on meta",
        ),
        (
            "alias",
            lambda x: x,
            0,
            "sweep43::alias_vmap: the vmap_fn of sweep43::alias returned output 0 sharing memory "
            "with an input",
        ),
        (
            "dim",
            lambda x: x * 2,
            5,
            "sweep43::dim: its vmap_out_dims gives dim 5 for output 0, which its vmap_fn "
            "returned with 2 dims",
        ),
    ],
)
def test_a_vmap_fns_wrong_output_is_said_of_its_vmap_fn(name, vmap_fn, out_dims, message):
    op = _op_with_vmap_fn(name, vmap_fn, out_dims)
    with pytest.raises((RuntimeError, TypeError)) as raised:
        torch.vmap(op)(torch.ones(3, 2))
    assert str(raised.value).startswith(message)
    assert torch.equal(op(torch.ones(2)), torch.full((2,), 2.0))
