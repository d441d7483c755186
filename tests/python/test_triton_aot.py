"""Triton kernels compiled ahead of time and launched from C++: the compiler's output (variants,
metadata, parameter layout; no GPU needed), and, on a GPU, launches compared with PyTorch on odd
sizes, misaligned pointers, side streams, CUDA graphs, threads, a second device and a kernel that
needs more than 48 KB of shared memory."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
import torch

import opreg
from conftest import REPO, requires_cuda

SPEC = REPO / "tests" / "kernel_sources" / "triton_kernels.toml"


def manifest(bundle, name):
    return json.loads((bundle / f"{name}.json").read_text())


def test_variants_cover_the_jit_specializations_most_specialized_first(aot_bundle):
    m = manifest(aot_bundle, "opreg_test_strided_add")
    assert [p["name"] for p in m["params"]] == ["x_ptr", "y_ptr", "out_ptr", "n", "stride"]
    for arch in (80, 90):
        kinds = [
            sorted(a["kind"] for a in v["assumptions"]) for v in m["variants"] if v["arch"] == arch
        ]
        assert kinds[0] == sorted(["aligned16"] * 3 + ["div16"] * 2)
        assert kinds[-1] == []  # the generic variant is last, so some variant always fits
        assert [len(k) for k in kinds] == sorted((len(k) for k in kinds), reverse=True)
        assert sum("equals1" in k for k in kinds) == 4  # stride == 1, with every other choice


def test_parameter_layout_matches_what_the_launcher_packs(aot_bundle):
    m = manifest(aot_bundle, "opreg_test_strided_add")
    sizes = {"*fp32": 8, "i32": 4}
    for variant in m["variants"]:
        dropped = {
            m["params"][a["param"]]["name"]
            for a in variant["assumptions"]
            if a["kind"] == "equals1"
        }
        expected = [sizes[p["type"]] for p in m["params"] if p["name"] not in dropped] + [8, 8]
        assert variant["param_sizes"] == expected, variant
    scale = manifest(aot_bundle, "opreg_test_scale")
    assert scale["variants"][0]["param_sizes"] == [8, 8, 8, 4, 8, 8]  # i64 n, fp32 factor


def test_metadata_of_a_kernel_with_more_than_48kb_of_shared_memory(aot_bundle):
    m = manifest(aot_bundle, "opreg_test_matmul_big_smem")
    assert {v["arch"] for v in m["variants"]} == {80, 90}
    for variant in m["variants"]:
        assert variant["shared"] > 48 * 1024
        assert variant["num_warps"] == 8 and variant["num_ctas"] == 1
        assert variant["global_scratch_size"] == 0
        assert variant["entry"] == "matmul_kernel"


def test_unchanged_kernels_are_not_recompiled(aot_bundle, tmp_path):
    command = [
        sys.executable,
        "-m",
        "opreg.aot",
        str(SPEC),
        "--out",
        str(tmp_path),
        "--cache",
        str(REPO / "build" / "aot-test-cache"),
    ]
    lines = subprocess.run(command, check=True, capture_output=True, text=True).stdout.splitlines()
    assert lines and all(line.endswith("(cached)") for line in lines)
    assert (tmp_path / "index.txt").read_text().split() == [
        "opreg_test_strided_add.json",
        "opreg_test_scale.json",
        "opreg_test_matmul_big_smem.json",
    ]


def test_spec_errors_name_the_kernel(tmp_path):
    spec = tmp_path / "bad.toml"
    spec.write_text(f'''
[[kernel]]
name = "bad"
source = "{REPO / "tests" / "kernel_sources" / "triton_kernels.py"}:scale_kernel"
signature = {{ x_ptr = "*fp32", out_ptr = "*fp32", n = "i64" }}
constexprs = {{ BLOCK = 512 }}
''')
    result = subprocess.run(
        [sys.executable, "-m", "opreg.aot", str(spec), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert "kernel bad: arguments ['factor'] need a type" in result.stderr


def test_registered_kernels_are_listed(aot_bundle):
    names = {k["name"] for k in opreg.triton_kernels()}
    assert {"opreg_test_scale", "opreg_fused_add_f32"} <= names


def test_cpu_tensors_are_declined_with_a_reason(aot_bundle):
    kernel = opreg.AotKernel("opreg_test_scale")
    x = torch.randn(8)
    assert "argument 'x_ptr' is on cpu, not CUDA" in kernel.variant_for(x, x, 8, 2.0)
    with pytest.raises(RuntimeError, match="cannot launch Triton kernel 'opreg_test_scale'"):
        kernel[(1,)](x, x, 8, 2.0)
    with pytest.raises(RuntimeError, match="it takes 4 arguments, 2 were given"):
        kernel[(1,)](x, x)
    with pytest.raises(TypeError, match=r"argument 'n' \(i64\) is a str; expected a tensor"):
        kernel[(1,)](x, x, "8", 2.0)
    # A float's bits are never packed as an integer parameter (an int for a float converts).
    assert "argument 'n' must be an integer (i64), got a float" in kernel.variant_for(x, x, 8.0, 2)


def test_unknown_kernel_names_are_errors():
    with pytest.raises(
        RuntimeError, match="no ahead-of-time binaries are registered for the Triton kernel 'nope'"
    ):
        opreg.AotKernel("nope")[(1,)](torch.randn(1))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU driver")
def test_without_a_driver_kernels_are_unavailable_and_ops_fall_back(aot_bundle):
    ok, why = opreg.AotKernel("opreg_test_scale").available_on(0)
    assert not ok and "libcuda" in why


# ---- on a GPU --------------------------------------------------------------------------------


@requires_cuda
@pytest.mark.parametrize("n", [0, 1, 17, 1023, 2**20 + 3])
def test_launch_matches_pytorch_on_odd_sizes(aot_bundle, n):
    kernel = opreg.AotKernel("opreg_test_scale")
    x = torch.randn(n, device="cuda")
    out = torch.full_like(x, float("nan"))
    kernel[(max(1, -(-n // 512)),)](x, out, n, 2.5)
    torch.testing.assert_close(out, x * 2.5, rtol=0, atol=0)


@requires_cuda
def test_specialized_variants_are_chosen_by_the_arguments(aot_bundle):
    kernel = opreg.AotKernel("opreg_test_strided_add")
    base = torch.randn(4097, device="cuda")
    x, y = base[:4096], base[:4096].clone()
    assert kernel.variant_for(x, y, x, 4096, 32).startswith(
        "sm_90 [x_ptr:aligned16, y_ptr:aligned16, out_ptr:aligned16, n:div16, stride:div16]"
    )
    assert kernel.variant_for(x, y, x, 4096, 2).startswith(
        "sm_90 [x_ptr:aligned16, y_ptr:aligned16, out_ptr:aligned16, n:div16]"
    )
    assert "stride:equals1" in kernel.variant_for(x, y, x, 4096, 1)
    misaligned = base[1:4097]
    assert "x_ptr:aligned16" not in kernel.variant_for(misaligned, y, y, 4096, 1)
    for stride in (1, 2, 3):
        for xs in (x, misaligned):
            count = 4096 // stride
            out = torch.full((count,), float("nan"), device="cuda")
            kernel[(-(-count // 256),)](xs, y, out, count, stride)
            torch.testing.assert_close(
                out, xs[::stride][:count] + y[::stride][:count], rtol=0, atol=0
            )


@requires_cuda
def test_fused_add_kernel_on_cuda_and_fallback_elsewhere():
    for n in (0, 1, 17, 1023, 2**20 + 3):
        for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            x = torch.randn(n, device="cuda").to(dtype)
            y = torch.randn(n, device="cuda").to(dtype)
            with opreg.trace() as t:
                out = torch.ops.opreg.fused_add(x, y)
            assert t.impls() == ["kernel:triton_aot"], (n, dtype)
            torch.testing.assert_close(out, x + y, rtol=0, atol=0)
    x = torch.randn(1025, device="cuda")
    with opreg.trace() as t:
        torch.testing.assert_close(torch.ops.opreg.fused_add(x[1:], x[:-1]), x[1:] + x[:-1])
        torch.ops.opreg.fused_add(x, x.double())  # mixed dtypes: declined
    assert t.impls() == ["kernel:triton_aot", "fallback(declined by kernel:triton_aot)"]


@requires_cuda
def test_side_stream_and_cuda_graph_capture():
    x, y = torch.randn(10000, device="cuda"), torch.randn(10000, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = torch.ops.opreg.fused_add(x, y)
    side.synchronize()
    torch.testing.assert_close(out, x + y)

    graph = torch.cuda.CUDAGraph()
    static_x, static_y = x.clone(), y.clone()
    torch.ops.opreg.fused_add(static_x, static_y)  # load the module before capture
    with torch.cuda.graph(graph):
        static_out = torch.ops.opreg.fused_add(static_x, static_y)
    static_x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static_out, static_x + static_y)


@requires_cuda
def test_threads_launching_at_once():
    errors = []

    def work(seed):
        try:
            generator = torch.Generator(device="cuda").manual_seed(seed)
            for _ in range(50):
                x = torch.randn(4099, device="cuda", generator=generator)
                y = torch.randn(4099, device="cuda", generator=generator)
                torch.testing.assert_close(torch.ops.opreg.fused_add(x, y), x + y)
        except Exception as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


@requires_cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second CUDA device")
def test_second_device():
    x = torch.randn(5000, device="cuda:1")
    with opreg.trace() as t:
        out = torch.ops.opreg.fused_add(x, x)
    assert t.records[0].device == "cuda:1" and t.impls() == ["kernel:triton_aot"]
    torch.testing.assert_close(out, 2 * x)


@requires_cuda
def test_kernel_with_more_than_48kb_of_shared_memory(aot_bundle):
    kernel = opreg.AotKernel("opreg_test_matmul_big_smem")
    m, n, k = 300, 200, 256
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    c = torch.empty(m, n, device="cuda", dtype=torch.float16)
    kernel[(-(-m // 128), -(-n // 128))](a, b, c, m, n, k)
    expected = a.double() @ b.double()
    assert (c.double() - expected).abs().max() <= 2 * (
        (a @ b).double() - expected
    ).abs().max() + 1e-2


@requires_cuda
def test_grid_outside_cuda_limits_is_an_error(aot_bundle):
    x = torch.randn(4, device="cuda")
    with pytest.raises(ValueError, match="grid \\(1, 70000, 1\\) is outside CUDA's limits"):
        opreg.AotKernel("opreg_test_scale")[(1, 70000)](x, x, 4, 1.0)


@requires_cuda
def test_failed_cuda_call_names_kernel_and_cuda_error(aot_bundle, tmp_path):
    # Whole cubins whose entry is not there: the loader cannot know (a cubin that is not one is
    # refused when the bundle loads), the driver says so.
    m = manifest(aot_bundle, "opreg_test_scale")
    m["kernel"] = "opreg_test_corrupt"
    for variant in m["variants"]:
        variant["entry"] = "no_such_entry"
        (tmp_path / variant["file"]).write_bytes((aot_bundle / variant["file"]).read_bytes())
    (tmp_path / "corrupt.json").write_text(json.dumps(m))
    (tmp_path / "index.txt").write_text("corrupt.json\n")
    opreg.load_triton_bundle(tmp_path)
    x = torch.randn(4, device="cuda")
    with pytest.raises(
        RuntimeError,
        match=r"Triton kernel 'opreg_test_corrupt' \(sm_90.*finding "
        r"the entry on cuda:0 failed: CUDA_ERROR_",
    ):
        opreg.AotKernel("opreg_test_corrupt")[(1,)](x, x, 4, 1.0)


# ---- kernels attached by declaration (opreg.AotLaunch / .aot_kernel) --------------------------

ADD_LAUNCH = opreg.AotLaunch(
    "opreg_fused_add_f32", ("cdiv(numel(x), 1024)",), ("x", "y", "out0", "numel(x)"), "like:x"
)


def test_launcher_checks_the_pointee_dtype(aot_bundle):
    x = torch.randn(8, dtype=torch.float64)
    why = opreg.AotKernel("opreg_test_scale").variant_for(x, x, 8, 2.0)
    assert why == "none: argument 'x_ptr' is Double, the kernel takes *fp32"


def test_declared_launch_errors_name_the_op_and_the_expression():
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x

    bad = opreg.AotLaunch("k", ("cdiv(numel(z), 4)",), ("x",), "like:x")
    with pytest.raises(
        ValueError,
        match=r"aot_decl::bad: aot_kernel grid: cannot read "
        r"'cdiv\(numel\(z\), 4\)': no argument named 'z' \(the op has: x\)",
    ):
        opreg.register_triton_op(
            fake_fn=lambda x: x, triton_fn=None, aot=bad, name="aot_decl::bad"
        )(fn)
    wrong_outputs = opreg.AotLaunch("k", ("1",), ("x",), "same")
    with pytest.raises(ValueError, match="outputs must be 'fake' or 'like:<argument>', got 'same'"):
        opreg.register_triton_op(
            fake_fn=lambda x: x, triton_fn=None, aot=wrong_outputs, name="aot_decl::bad_outputs"
        )(fn)


def test_declared_launch_with_a_python_fake_needs_like_outputs():
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x

    with pytest.raises(ValueError, match="outputs='fake' reads the op's C\\+\\+ fake"):
        opreg.register_triton_op(
            fake_fn=lambda x: torch.empty_like(x),
            triton_fn=None,
            aot=opreg.AotLaunch("k", ("1",), ("x",), "fake"),
            name="aot_decl::python_fake",
        )(fn)


def test_declared_launch_declines_what_it_cannot_run():
    @opreg.register_triton_op(
        fake_fn=lambda x, y: torch.empty_like(x),
        triton_fn=None,
        aot=ADD_LAUNCH,
        triton_device_types="cpu",
        name="aot_decl::cpu",
    )
    def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y

    x = torch.randn(100)
    with opreg.trace() as t:
        torch.testing.assert_close(add(x, x), 2 * x)
    assert t.impls()[0] == "fallback(declined by kernel:triton_aot)"
    assert opreg.kernel_status("aot_decl::cpu") == "AOT kernel opreg_fused_add_f32 (C++ launcher)"


@requires_cuda
def test_declared_launch_runs_in_cpp_and_declines_other_dtypes():
    @opreg.register_triton_op(
        fake_fn=lambda x, y: torch.empty_like(x),
        triton_fn=None,
        aot=ADD_LAUNCH,
        name="aot_decl::cuda",
    )
    def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y

    for n in (0, 1, 1023, 2**20 + 3):
        x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        with opreg.trace() as t:
            out = add(x, y)
        assert t.impls() == ["kernel:triton_aot"]
        torch.testing.assert_close(out, x + y, rtol=0, atol=0)
    x64 = torch.randn(10, device="cuda", dtype=torch.float64)
    with opreg.trace() as t:
        torch.testing.assert_close(add(x64, x64), 2 * x64)
    assert t.impls()[0] == "fallback(declined by kernel:triton_aot)"
