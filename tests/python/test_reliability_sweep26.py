"""Regression tests for the twenty-sixth adversarial sweep's findings (reports kept outside the
repository), beside the earlier sweeps' files."""

from __future__ import annotations

import shutil

import pytest
import torch
from test_reliability import assert_survived, run_probe

import opreg
from conftest import TEST_OPS_LIBRARY

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


# ---- B-F1: opreg.load_library looked a bare name up in the working directory ----------------


def test_a_bare_library_name_is_looked_up_as_the_core_documents(tmp_path):
    # Python checked Path(name).is_file() first: a name only on LD_LIBRARY_PATH was "not found",
    # and a file of that name in the working directory was loaded instead.
    listed, cwd = tmp_path / "listed", tmp_path / "cwd"
    listed.mkdir()
    cwd.mkdir()
    shutil.copy(TEST_OPS_LIBRARY, listed / "libopreg_probe26.so")
    (cwd / "libopreg_probe26.so").write_bytes(b"not a library")
    (cwd / "libopreg_only_here.so").write_bytes(b"not a library")
    result = run_probe(
        f"""
        import os
        os.environ["LD_LIBRARY_PATH"] = {str(listed)!r}
        os.chdir({str(cwd)!r})
        import opreg
        opreg.load_library("libopreg_probe26.so")
        print("loaded:", [r.origin for r in opreg.describe_ops() if "probe26" in r.origin][:1])
        try:
            opreg.load_library("libopreg_only_here.so")
        except FileNotFoundError as error:
            print("only here:", error)
        """
    )
    assert_survived(result)
    assert f"loaded: ['{listed}/libopreg_probe26.so" in result.stdout, result.stdout
    assert "only here: opreg.load_library: no library named 'libopreg_only_here.so' in" in (
        result.stdout
    )


# ---- opreg.trace() recorded C++ fakes but not fakes written in Python -------------------------


def test_a_python_fake_is_traced_as_a_cpp_fake_is():
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = opreg.register_triton_op(
        fake_fn=lambda x: torch.empty_like(x),
        triton_fn=None,
        name="opreg_sweep26::traced_fake",
        schema="(Tensor x) -> Tensor",
    )(lambda x: x * 2)
    with opreg.trace() as trace, FakeTensorMode() as mode:
        op(mode.from_tensor(torch.ones(2)))
    with opreg.trace() as on_meta:
        op(torch.ones(2, device="meta"))
    assert trace.records == [("opreg_sweep26::traced_fake", "fake", "cpu")]
    assert on_meta.records == [("opreg_sweep26::traced_fake", "fake", "meta")]
