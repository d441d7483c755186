"""Regression tests for the sweeps' findings left open until 2026-12-02, and the thirteenth
sweep's."""

from __future__ import annotations

import pytest
import torch

import opreg


def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_opcheck_names_the_op_when_its_registered_samples_function_raises():
    # The samples function's own error came out alone: which op's samples failed was not said.
    op = opreg.register_vmap_op(fake_fn=torch.empty_like, name="leftovers_samples_raise")(twice)

    def samples(device):
        raise KeyError("no such dataset")

    opreg.register_samples(op, samples)
    with pytest.raises(
        RuntimeError,
        match=r"leftovers_samples_raise: its registered samples function raised on cpu: "
        r"KeyError: 'no such dataset'",
    ) as raised:
        opreg.opcheck(op, devices=["cpu"])
    assert isinstance(raised.value.__cause__, KeyError)

    def lazy_samples(device):  # a generator fails while opcheck reads it
        yield (torch.randn(3),)
        raise ValueError("ran out")

    opreg.register_samples(op, lazy_samples)
    with pytest.raises(RuntimeError, match=r"raised on cpu: ValueError: ran out"):
        opreg.opcheck(op, devices=["cpu"])
    opreg.register_samples(op, lambda device: [(torch.randn(3, device=device),)])
    opreg.opcheck(op, devices=["cpu"], checks=["kernel_vs_fallback"])
