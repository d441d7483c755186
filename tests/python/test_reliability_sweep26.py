"""Regression tests for the twenty-sixth adversarial sweep's findings (reports kept outside the
repository), beside the earlier sweeps' files."""

from __future__ import annotations

import pytest
import torch

import opreg

# ---- A-F1: opcheck compared a kernel's outputs with the fallback's, not what they wrote ------


def writing_op(tag: str, kernel_factor: float, returns: str = "()"):
    def fallback(x, y):
        x.add_(y)
        return x if returns != "()" else None

    def kernel(x, y):
        x.add_(y * kernel_factor)
        return x if returns != "()" else None

    return opreg.register_triton_op(
        fake_fn=lambda x, y: x if returns != "()" else None,
        triton_fn=kernel,
        triton_device_types="cpu",
        name=f"opreg_sweep26::{tag}",
        schema=f"(Tensor(a!) x, Tensor y) -> {returns}",
    )(fallback)


@pytest.mark.parametrize("kernel_factor", [2.0, 0.0])  # a wrong write, and no write at all
def test_opcheck_compares_what_a_kernel_writes_with_what_the_fallback_writes(kernel_factor):
    op = writing_op(f"writes_{int(kernel_factor)}", kernel_factor)
    with pytest.raises(opreg.OpcheckError, match=r"argument 'x' \(written\) differs from"):
        opreg.opcheck(op, devices=["cpu"], checks=["kernel_vs_fallback"])


def test_opcheck_passes_a_kernel_that_writes_what_the_fallback_writes():
    op = writing_op("writes_right", 1.0, returns="Tensor(a!)")
    report = opreg.opcheck(op, devices=["cpu"], checks=["kernel_vs_fallback"])
    assert report.rows and all(row.passed for row in report.rows)


# ---- A-F2: opcheck with no devices checked nothing and passed -----------------------------------


def test_opcheck_refuses_an_empty_list_of_devices():
    op = opreg.register_triton_op(
        fake_fn=lambda x: torch.empty(1),
        triton_fn=None,
        name="opreg_sweep26::bad_fake",
        schema="(Tensor x) -> Tensor",
    )(lambda x: x * 2)
    with pytest.raises(ValueError, match="devices= is empty, so nothing would be checked"):
        opreg.opcheck(op, devices=[])
