"""The foundation: C++-defined ops called from Python in eager (CPU, meta, FakeTensorMode), under
torch.compile(fullgraph=True) and torch.export, with mutation, and the command line."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import opreg
from conftest import DEVICES, requires_cuda


def scale_add(x, y, alpha=1.0):
    return torch.ops.opreg_example.scale_add(x, y, alpha)


def test_ops_are_callable_through_torch_ops():
    assert "opreg_example::scale_add" in [op.name for op in opreg.describe_ops()]
    schema = str(torch.ops.opreg_example.scale_add.default._schema)
    assert schema == "opreg_example::scale_add(Tensor x, Tensor y, float alpha=1.) -> Tensor"


def test_cpu_kernel_serves_what_it_accepts_and_declines_the_rest():
    x, y = torch.randn(1031), torch.randn(1031)
    with opreg.trace() as t:
        fast = scale_add(x, y, 0.25)
        slow = scale_add(x.double(), y.double(), 0.25)
        broadcast = scale_add(x[:1], y, 0.25)
        strided = scale_add(x[::2], y[::2], 0.25)
    assert t.impls() == ["kernel:cpu_loop"] + ["fallback(declined by kernel:cpu_loop)"] * 3
    torch.testing.assert_close(fast, x + 0.25 * y, rtol=0, atol=0)
    torch.testing.assert_close(slow, x.double() + 0.25 * y.double())
    torch.testing.assert_close(broadcast, x[:1] + 0.25 * y)
    torch.testing.assert_close(strided, x[::2] + 0.25 * y[::2])


def test_fallback_serves_ops_without_a_kernel_for_the_device():
    x = torch.randn(4, 5)
    with opreg.trace() as t:
        out = torch.ops.opreg_test.npu_only(x)
    assert t.impls() == ["fallback"]
    assert torch.equal(out, x)


def test_meta_and_fake_tensors_use_the_fake():
    x = torch.empty(3, 1, device="meta")
    y = torch.empty(1, 4, device="meta", dtype=torch.float64)
    with opreg.trace() as t:
        out = scale_add(x, y)
    assert t.impls() == ["fake"]
    assert out.shape == (3, 4) and out.dtype == torch.float64 and out.is_meta
    with FakeTensorMode() as mode:
        fx = mode.from_tensor(torch.randn(2, 3).t())
        out = scale_add(fx, fx)
    real = scale_add(torch.randn(2, 3).t(), torch.randn(2, 3).t())
    assert out.shape == real.shape and out.stride() == real.stride()


def test_without_a_fake_the_fallback_runs_on_meta():
    with opreg.trace() as t:
        out = torch.ops.opreg_test.affine(torch.empty(2, 7, device="meta"), 2.0, 1.0)
    assert out.shape == (2, 7)
    assert t.impls() == ["fallback(meta)"]
    assert opreg.describe_op("opreg_test::affine").fake is opreg.FakeSource.FALLBACK_ON_META


def test_fallback_that_cannot_run_on_meta_asks_for_a_fake():
    with pytest.raises(NotImplementedError, match="opreg_test::normalize_by_max: has no fake"):
        torch.ops.opreg_test.normalize_by_max(torch.empty(3, device="meta"))


def test_torch_compile_fullgraph_matches_eager():
    def f(x, y):
        return scale_add(x, y, 0.5).sin() + torch.ops.opreg_test.affine(x, 3.0, -1.0)

    x, y = torch.randn(64), torch.randn(64)
    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(x, y), f(x, y))


def test_torch_compile_with_dynamic_shapes():
    compiled = torch.compile(lambda x, y: scale_add(x, y, 2.0) * 2, fullgraph=True, dynamic=True)
    for n in (5, 17, 33):
        x, y = torch.randn(n, 3), torch.randn(n, 3)
        torch.testing.assert_close(compiled(x, y), (x + 2.0 * y) * 2)


def test_mutation_is_honoured_by_functionalization():
    def f(x):
        torch.ops.opreg_test.scale_(x, 3.0)
        return x + 1

    eager_x, compiled_x = torch.randn(8), None
    compiled_x = eager_x.clone()
    expected = f(eager_x)
    got = torch.compile(f, fullgraph=True)(compiled_x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(compiled_x, eager_x)


def test_torch_export_keeps_the_op():
    class Module(torch.nn.Module):
        def forward(self, x, y):
            return scale_add(x, y, 0.5)

    x, y = torch.randn(4, 4), torch.randn(4, 4)
    exported = torch.export.export(Module(), (x, y))
    targets = [str(node.target) for node in exported.graph.nodes if node.op == "call_function"]
    assert "opreg_example.scale_add.default" in targets
    torch.testing.assert_close(exported.module()(x, y), x + 0.5 * y)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_passes(device):
    x = torch.randn(5, 6, device=device)
    y = torch.randn(5, 6, device=device)
    torch.library.opcheck(torch.ops.opreg_example.scale_add.default, (x, y, 0.5))
    torch.library.opcheck(torch.ops.opreg_example.scale_add.default, (x.t(), y.t()[:1], 2.0))
    torch.library.opcheck(torch.ops.opreg_test.affine.default, (x, 2.0, 1.0))
    torch.library.opcheck(torch.ops.opreg_test.scale_.default, (x.clone(), 2.0))


def test_wrong_dtype_names_op_argument_expected_and_given():
    with pytest.raises(
        TypeError,
        match=r"opreg_example::scale_add: argument 'y' has dtype Int, "
        r"expected one of: Float, Double, Half, BFloat16",
    ):
        scale_add(torch.randn(3), torch.ones(3, dtype=torch.int32))


def test_a_call_across_devices_gets_atens_answer():
    # As for torch.library's ops: the Meta key wins dispatch and the op's fake (x + alpha * y)
    # meets ATen's device check; no kernel is asked.
    with pytest.raises(RuntimeError, match="not on the expected device"):
        scale_add(torch.randn(3), torch.empty(3, device="meta"))


def test_wrong_arity_is_an_error_naming_the_op():
    with pytest.raises((TypeError, RuntimeError), match="scale_add"):
        torch.ops.opreg_example.scale_add(torch.randn(3))


def test_late_device_type_reaches_earlier_ops():
    before = {s.device_type for s in opreg.describe_op("opreg_test::follows_registry").kernels}
    assert "privateuseone" not in before
    assert opreg.register_accelerated_device_type(" PrivateUseOne ") == "privateuseone"
    kernels = {
        s.device_type: s.describe()
        for s in opreg.describe_op("opreg_test::follows_registry").kernels
    }
    assert kernels["privateuseone"] == "kernel:accel"
    assert "privateuseone" in opreg.accelerated_device_types()


def test_info_lists_each_device_type_and_skipped_kernels(test_ops_library):
    out = subprocess.run(
        [sys.executable, "-m", "opreg", "info", "--examples", "--load", str(test_ops_library)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "opreg_example::scale_add" in out
    assert "cpu:      kernel:cpu_loop" in out
    assert "npu:      skipped: this PyTorch build does not know the device type 'npu'" in out
    assert "fake:     explicit" in out


def test_demo_shows_which_implementation_ran():
    out = subprocess.run(
        [sys.executable, "-m", "opreg", "demo"], check=True, capture_output=True, text=True
    ).stdout
    assert "kernel:cpu_loop" in out and "fallback(declined by kernel:cpu_loop)" in out
    assert "False" not in out


@requires_cuda
def test_cuda_kernel_serves_cuda_and_declines_mixed_dtypes():
    x, y = torch.randn(4097, device="cuda"), torch.randn(4097, device="cuda")
    with opreg.trace() as t:
        out = scale_add(x, y, 0.5)
        mixed = scale_add(x, y.double(), 0.5)
        cpu = scale_add(x.cpu().double(), y.cpu().double(), 0.5)
    assert t.impls() == [
        "kernel:fused",
        "fallback(declined by kernel:fused)",
        "fallback(declined by kernel:cpu_loop)",
    ]
    assert [r.device for r in t.records] == ["cuda:0", "cuda:0", "cpu"]
    torch.testing.assert_close(out, x + 0.5 * y)
    torch.testing.assert_close(mixed, x + 0.5 * y.double())
    torch.testing.assert_close(cpu, (x + 0.5 * y).double().cpu())
