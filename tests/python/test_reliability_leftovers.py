"""Regression tests for the sweeps' findings left open until 2026-12-02, and the thirteenth
sweep's."""

from __future__ import annotations

import pytest
import torch
from test_reliability import assert_survived, run_probe

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


# ---- thirteenth sweep ------------------------------------------------------------------------


def test_an_op_called_from_a_finalizer_at_exit_raises_instead_of_aborting():
    # Garbage collected at exit ran a __del__ calling the op; its Python fallback ran while
    # PyTorch's Python objects were torn down, and PyTorch aborted on an internal assert (11 runs
    # in 11). torch.library's ops are gone by then; opreg's stay, and refuse Python pieces.
    result = run_probe(
        """
        import gc, torch, opreg
        opreg.register_vmap_op(
            lambda x: x + 1, fake_fn=torch.empty_like, name="exit13::inner",
            schema="(Tensor x) -> Tensor",
        )
        class Cycle:
            def __del__(self):
                torch.ops.exit13.inner(torch.zeros(1))
        print("in time", torch.ops.exit13.inner(torch.zeros(1)))
        gc.disable()  # the cycle is collected at exit, not before
        a, b = Cycle(), Cycle()
        a.other, b.other = b, a
        del a, b
        """
    )
    assert_survived(result)
    assert "in time tensor([1.])" in result.stdout
    assert result.stderr.count("Exception ignored in") == 2, result.stderr
    assert (
        "exit13::inner: the fallback, written in Python, cannot run: the Python interpreter is "
        "exiting" in result.stderr
    )
