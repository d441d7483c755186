"""Regression tests for the findings of the fifth adversarial sweep (against b2e49ed) in the C++
core: vmap of a batch-polymorphic op whose arguments have different ranks (paired the batch with
a row: wrong numbers), a CPU + meta call whose fake returned a CPU tensor (uninitialised memory
handed out as a result), and opreg::load_library called from a library's static initializers
when the inner library fails (the process aborted)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import opreg
from conftest import TEST_OPS_LIBRARY

# ---- vmap of batch-polymorphic ops with arguments of different ranks ---------------------------


@pytest.mark.parametrize(
    ("x", "y", "in_dims"),
    [
        (torch.randn(3), torch.randn(3, 3), (0, 0)),
        (torch.randn(5, 1), torch.randn(5, 4, 1), (0, 0)),
        (torch.randn(5, 3), torch.tensor(2.0), (0, None)),
        (torch.randn(5, 3), torch.randn(2, 3), (0, None)),
        (torch.randn(4), torch.randn(2, 5, 4), (None, 1)),
    ],
    ids=["ranks-1-2", "ranks-1-2-sized", "0-dim-unbatched", "unbatched-of-higher-rank", "dim-1"],
)
def test_vmap_of_a_batch_polymorphic_op_broadcasts_as_per_example_calls(x, y, in_dims):
    want = torch.vmap(torch.add, in_dims=in_dims)(x, y)
    with opreg.trace() as trace:
        got = torch.vmap(torch.ops.opreg.fused_add, in_dims=in_dims)(x, y)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert "vmap:fallback" in trace.impls() and "vmap:batch-polymorphic" not in trace.impls()


def test_vmap_of_a_batch_polymorphic_op_with_arguments_of_one_rank_stays_one_call():
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    with opreg.trace() as trace:
        got = torch.vmap(torch.ops.opreg.fused_add)(x, y)
    torch.testing.assert_close(got, x + y, rtol=0, atol=0)
    assert trace.impls()[0] == "vmap:batch-polymorphic"


def test_vmap_of_the_example_op_with_an_unbatched_argument_of_another_rank():
    x, y = torch.randn(3), torch.randn(3, 3)
    got = torch.vmap(torch.ops.opreg_example.scale_add, in_dims=(0, 0, None))(x, y, 0.5)
    torch.testing.assert_close(got, torch.vmap(lambda a, b: a + 0.5 * b)(x, y))


# ---- a CPU + meta call ------------------------------------------------------------------------


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


def test_a_fake_returning_a_real_tensor_for_a_meta_call_is_refused():
    @opreg.register_triton_op(
        fake_fn=lambda x, y: torch.empty_like(x), triton_fn=None, name="sweep5_meta::mix"
    )
    def mix(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y

    with pytest.raises(RuntimeError) as refused:
        mix(torch.ones(3), torch.ones(3, device="meta"))
    message = str(refused.value)
    assert message.startswith("sweep5_meta::mix: the fake failed on a call with tensors on"), (
        message
    )
    assert "its fake returned output 0 on cpu " in message
    assert "for a call with a meta tensor among its arguments" in message
    # A fake that returns meta tensors for such a call still serves it, as torch.library's does.
    opreg.register_triton_op(
        fake_fn=lambda x, y: torch.empty_like(y),
        triton_fn=None,
        name="sweep5_meta::mix",
        replace=True,
    )(add)
    assert torch.ops.sweep5_meta.mix(torch.ones(3), torch.ones(3, device="meta")).is_meta


@pytest.mark.parametrize(
    "call",
    [
        lambda: torch.ops.opreg.lowrank_delta_output(
            torch.randn(2, 3, 5), torch.arange(2, device="meta"), 2, 4, 0.1
        ),
        lambda: torch.ops.opreg.lowrank_gradient(
            torch.randn(3), torch.arange(3, device="meta"), 2, 4, 5, 0.1
        ),
    ],
    ids=["lowrank_delta_output", "lowrank_gradient"],
)
def test_shipped_ops_refuse_a_cpu_and_meta_call(call):
    with pytest.raises(RuntimeError, match="must be meta tensors"):
        call()


# ---- load_library from a library's static initializers ----------------------------------------


def test_a_failing_load_inside_another_librarys_load_fails_the_outer_load_whole():
    outer = TEST_OPS_LIBRARY.parent / "libopreg_failing_nested_load.so"
    inner = TEST_OPS_LIBRARY.parent / "libopreg_failing_bad_schema.so"
    code = f"""
        import opreg
        try:
            opreg.load_library({str(outer)!r})
        except ValueError as error:
            print("raised:", error)
        names = [r.name for r in opreg.describe_ops() if r.name.startswith("opreg_failing::")]
        print("defined:", names)
        """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "OPREG_NESTED_LIBRARY": str(inner)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"raised: opreg::load_library: '{outer}' defines ops that failed (1)" in result.stdout
    assert f"opreg::load_library('{inner}'): opreg::load_library: '{inner}'" in result.stdout
    assert "defined: []" in result.stdout, result.stdout


# ---- opcheck of the shipped ops ---------------------------------------------------------------


def test_python_m_opreg_check_passes_on_every_shipped_op():
    result = subprocess.run(
        [sys.executable, "-m", "opreg", "check"], capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for name in (
        "fused_add",
        "philox_uniform",
        "philox_normal",
        "lowrank_delta_output",
        "lowrank_gradient",
    ):
        assert f"opreg::{name}: " in result.stdout, result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_registered_samples_serve_opcheck_and_are_checked():
    @opreg.register_vmap_op(fake_fn=lambda x, w: x.new_empty(x.shape[0]), name="sweep5_samples::mv")
    def mv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x @ w

    opreg.register_samples(
        mv, lambda device: [(torch.randn(4, 3, device=device), torch.randn(3, device=device))]
    )
    report = opreg.opcheck(mv, devices=["cpu"], checks=["kernel_vs_fallback", "fake_vs_real"])
    assert {r.sample for r in report.rows} == {"#0"} and not report.failures
    with pytest.raises(TypeError, match=r"opreg.register_samples: op must be an op .*got str"):
        opreg.register_samples("sweep5_samples::mv", lambda device: [])
    with pytest.raises(TypeError, match="sweep5_samples::mv: samples must be a function"):
        opreg.register_samples(mv, [(torch.randn(4, 3), torch.randn(3))])
    opreg.register_samples(mv, lambda device: [])
    with pytest.raises(
        ValueError, match="sweep5_samples::mv: its registered samples function gave"
    ):
        opreg.opcheck(mv, devices=["cpu"])
