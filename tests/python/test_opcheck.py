"""opreg.opcheck: every shipped op and every well-behaved test op passes; each kind of broken op
is caught, with a message naming the check, the op, the device and the sample."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

import opreg
from conftest import DEVICES, REPO, TEST_OPS_LIBRARY

WELL_BEHAVED = [
    "opreg::fused_add",
    "opreg::philox_uniform",
    "opreg::philox_normal",
    "opreg_example::scale_add",
    "opreg_test::affine",
    "opreg_test::scale_",
    "opreg_test::square",
    "opreg_test::square_backward",
    "opreg_test::exp",
    "opreg_test::rowsum",
    "opreg_test::noisy",
    "opreg_test::npu_only",
    "opreg_test::follows_registry",
    "opreg_test::refuses_grad",
]


def op_of(name: str) -> torch._ops.OpOverload:
    namespace, op_name = name.split("::")
    return getattr(getattr(torch.ops, namespace), op_name).default


@pytest.mark.parametrize("name", WELL_BEHAVED)
def test_well_behaved_ops_pass(name):
    report = opreg.opcheck(op_of(name), devices=DEVICES)
    assert report.rows and not report.failures
    assert {r.check for r in report.rows} == set(opreg._opcheck.CHECKS)
    assert {r.device for r in report.rows} == set(DEVICES)


def test_explicit_samples_and_report_text():
    x = torch.randn(4, 5)
    report = opreg.opcheck(
        torch.ops.opreg.fused_add,
        [(x, x), opreg.Sample((x, x[:1]))],
        devices=["cpu"],
        checks=["kernel_vs_fallback", "fake_vs_real"],
    )
    assert len(report.rows) == 4
    assert "kernel_vs_fallback   cpu" in str(report)


def expect_failure(op, check, sample_fragment="", **kwargs):
    with pytest.raises(opreg.OpcheckError) as failure:
        opreg.opcheck(op, devices=["cpu"], **kwargs)
    text = str(failure.value)
    name = op._schema.name
    assert f"{check} failed for {name} on cpu, sample '{sample_fragment}" in text, text
    return text


def test_wrong_fake_shape_is_caught():
    @opreg.register_vmap_op(
        fake_fn=lambda x: x.new_empty(x.shape[0] + 1, *x.shape[1:]), name="opcheck_bad::fake_shape"
    )
    def op(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    text = expect_failure(op, "fake_vs_real", checks=["fake_vs_real"])
    assert "the fake's shape is" in text


def test_wrong_fake_strides_are_caught():
    @opreg.register_vmap_op(
        fake_fn=lambda x: x.new_empty(x.shape[::-1]).t(), name="opcheck_bad::fake_strides"
    )
    def op(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).contiguous()

    text = expect_failure(op, "fake_vs_real", "odd 5x7", checks=["fake_vs_real"])
    assert "the fake's strides are (1, 5), the real ones (7, 1)" in text


def test_kernel_off_by_one_ulp_is_caught_when_bitwise_is_declared():
    def kernel(x):
        out = x * 2
        return torch.nextafter(out, torch.full_like(out, float("inf")))

    @opreg.register_triton_op(
        fake_fn=lambda x: torch.empty_like(x),
        triton_fn=kernel,
        triton_device_types="cpu",
        bitwise=True,
        name="opcheck_bad::ulp",
    )
    def op(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    if not opreg.has_triton():
        pytest.skip("the Python front registers triton_fn only when Triton works")
    text = expect_failure(op, "kernel_vs_fallback", "size 1", checks=["kernel_vs_fallback"])
    assert "not bitwise equal to the fallback's (the op declares bitwise)" in text


def test_wrong_backward_is_caught():
    @opreg.register_vmap_op(
        fake_fn=lambda x: torch.empty_like(x),
        name="opcheck_bad::backward",
        backward=lambda ctx, grad: 2 * grad,
    )
    def op(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    text = expect_failure(op, "gradients", "size 1", checks=["gradients"])
    assert "gradcheck" in text


def test_wrong_vmap_rule_is_caught():
    @opreg.register_vmap_op(
        fake_fn=lambda x: torch.empty_like(x),
        name="opcheck_bad::vmap",
        vmap=lambda info, in_dims, x: (x.movedim(in_dims[0], 0) * 3, 0),
    )
    def op(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    text = expect_failure(op, "vmap", "size 1", checks=["vmap"])
    assert "vmap depth 1" in text and "differ from a loop of single calls" in text


def test_undeclared_mutation_is_caught():
    @opreg.register_vmap_op(fake_fn=lambda x: torch.empty_like(x), name="opcheck_bad::mutation")
    def op(x: torch.Tensor) -> torch.Tensor:
        x.add_(1)  # mutates x without mutates_args
        return x.clone()

    text = expect_failure(op, "torch_opcheck", "size 1", checks=["torch_opcheck"])
    assert "test_schema" in text


def test_compile_mismatch_is_caught(monkeypatch):
    # triton_fn is plain Python here, so the compile-time decomposition may run it on CPU.
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)

    @opreg.register_triton_op(
        fake_fn=lambda x: torch.empty_like(x),
        triton_fn=lambda x: x + 2,
        triton_device_types="cpu",
        triton_accepts=lambda x: False,
        traceable=True,
        name="opcheck_bad::compile",
    )
    def op(x: torch.Tensor) -> torch.Tensor:
        return x + 1  # eager: the kernel declines; compile: the decomposition runs x + 2

    if not opreg.has_triton():
        pytest.skip("needs the Python front's Triton path")
    text = expect_failure(op, "compile", "size 1", checks=["compile"])
    assert "differs from eager" in text


def test_command_line_reports_each_op():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "opreg",
            "check",
            "--load",
            str(TEST_OPS_LIBRARY),
            "opreg_test::affine",
            "opreg_test::wrong_backward_shape",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    passed = re.search(r"opreg_test::affine: (\d+)/(\d+) checks passed", result.stdout)
    assert passed and passed[1] == passed[2] and int(passed[1]) >= 60, result.stdout
    assert (
        "FAIL gradients cpu" in result.stdout
        and "backward's gradient for input 'x'" in result.stdout
    )
    assert "[2/2]" in result.stderr  # the progress line


def test_gradients_check_is_skipped_with_a_reason_for_integer_outputs():
    @opreg.register_vmap_op(
        fake_fn=lambda x: torch.empty_like(x, dtype=torch.int64), name="opcheck_ok::positive"
    )
    def op(x: torch.Tensor) -> torch.Tensor:
        return (x > 0).long()

    report = opreg.opcheck(op, devices=["cpu"], checks=["gradients"])
    assert report.rows and not report.failures
    assert {r.message for r in report.rows} == {
        "no floating outputs (nothing to differentiate): skipped"
    }


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "opreg", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["check", "nosuch::op"], "no opreg op named 'nosuch::op'"),
        (["check", "fused_add"], "'fused_add' is not a qualified op name (namespace::name)"),
        (["check", "opreg::fused_add.nosuch"], "'opreg::fused_add' has no overload 'nosuch'"),
        (["check", "--load", "/nonexistent/libops.so", "opreg::fused_add"], "libops.so"),
        (["info", "--load", "/nonexistent/libops.so"], "libops.so"),
    ],
)
def test_command_line_rejects_bad_input_in_one_line(args, message):
    result = run_cli(*args)
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"python -m opreg {args[0]}: "), lines
    assert message in lines[0], lines


def test_command_line_names_each_op_of_a_library_that_fails_to_load():
    # Seventh sweep: only the message's first line was printed, which names no op.
    library = TEST_OPS_LIBRARY.parent / "libopreg_failing_bad_schema.so"
    result = run_cli("info", "--load", str(library))
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("python -m opreg info: "), result.stderr
    assert "opreg_failing::bad: opreg: op 'opreg_failing::bad': cannot parse schema" in (
        result.stderr
    )


def test_command_line_usage_names_every_command():
    usage = run_cli("--help").stdout
    for command in ("info", "check", "demo", "cmake-dir", "example-source"):
        assert command in usage.split("\n\n")[1], usage  # the description line


@pytest.mark.parametrize(
    ("name", "check", "message"),
    [
        ("opreg_test::wrong_backward_arity", "gradients", "backward returned 1 gradients"),
        ("opreg_test::wrong_backward_shape", "gradients", "backward's gradient for input 'x'"),
        ("opreg_test::bad_vmap_rule", "vmap", "the vmap rule returned 2 outputs, expected 1"),
        ("opreg_test::normalize_by_max", "fake_vs_real", "UnsupportedOperatorException"),
        ("opreg_test::normalize_by_max_looped", "compile", ""),
    ],
)
def test_broken_cpp_test_ops_are_caught(name, check, message):
    """The C++ test ops that break a promise on purpose fail the check that covers it."""
    with pytest.raises(opreg.OpcheckError) as failure:
        opreg.opcheck(op_of(name), devices=["cpu"], checks=[check])
    assert f"{check} failed for {name} on cpu" in str(failure.value)
    assert message in str(failure.value)


# ---- ops returning ints, ops without tensor arguments, devices, samples ----


# On the CPU the CUDA graph and stream checks are skipped for every op.
OFF_CUDA = {(check, "needs a CUDA device: skipped") for check in ("cuda_graph", "stream")}


def test_ops_returning_int_compare_the_value_and_skip_vmap_and_compile_with_the_reason():
    @opreg.register_vmap_op(fake_fn=lambda x: x.shape[0], name="opcheck_ok::length")
    def op(x: torch.Tensor) -> int:
        return x.shape[0]

    report = opreg.opcheck(op, devices=["cpu"])
    skipped = {(r.check, r.message) for r in report.rows if r.skipped}
    assert skipped - OFF_CUDA == {
        ("vmap", "returns int: torch.vmap maps only functions of tensors: skipped"),
        (
            "compile",
            "returns int: Dynamo cannot put a custom op's non-tensor outputs in a full graph: "
            "skipped",
        ),
        ("gradients", "no floating outputs (nothing to differentiate): skipped"),
    }
    assert "skip" in str(report)


def test_ops_returning_symint_are_checked_like_int():
    @opreg.register_vmap_op(
        fake_fn=lambda x: x.shape[0], name="opcheck_ok::sym_length", schema="(Tensor x) -> SymInt"
    )
    def op(x):
        return x.shape[0]

    report = opreg.opcheck(op, devices=["cpu"])
    skipped = {r.check for r in report.rows if r.skipped}
    assert skipped - {"cuda_graph", "stream"} == {"vmap", "compile", "gradients"}


def test_a_kernel_returning_another_int_than_the_fallback_fails():
    if not opreg.has_triton():
        pytest.skip("the Python front registers triton_fn only when Triton works")

    @opreg.register_triton_op(
        fake_fn=lambda x: x.shape[0],
        triton_fn=lambda x: x.shape[0] + 1,
        triton_device_types="cpu",
        name="opcheck_bad::int_kernel",
    )
    def op(x: torch.Tensor) -> int:
        return x.shape[0]

    text = expect_failure(op, "kernel_vs_fallback", "size 0", checks=["kernel_vs_fallback"])
    assert "output 0 is 1, the fallback's 0" in text


def test_ops_without_tensor_arguments_get_one_sample_per_int_value():
    @opreg.register_vmap_op(fake_fn=lambda n, scale: torch.empty(n), name="opcheck_ok::make")
    def op(n: int, scale: float) -> torch.Tensor:
        return torch.arange(n, dtype=torch.float32) * scale

    report = opreg.opcheck(op, devices=["cpu"])
    assert sorted({r.sample for r in report.rows}) == ["ints = 0", "ints = 1", "ints = 5"]
    assert [s.args for s in opreg._opcheck.generate_samples(op, "cpu")] == [
        (0, 0.75),
        (1, 0.75),
        (5, 0.75),
    ]
    on_cuda = opreg.opcheck(op, devices=["cuda:0"]).rows
    assert on_cuda and all(r.skipped and r.sample == "-" for r in on_cuda)


def test_devices_that_are_not_devices_are_value_errors():
    with pytest.raises(ValueError, match=r"devices: 'bogus' is not a device \(expected names"):
        opreg.opcheck(torch.ops.opreg.fused_add, devices=["bogus"])
    with pytest.raises(ValueError, match="devices: 'cuda:x' is not a device"):
        opreg.opcheck(torch.ops.opreg.fused_add, devices=["cuda:x"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip on machines without CUDA")
def test_cuda_without_a_gpu_is_skipped_with_the_reason():
    report = opreg.opcheck(torch.ops.opreg.fused_add, devices=["cpu", "cuda"])
    cuda = [r for r in report.rows if r.device == "cuda"]
    assert {r.check for r in cuda} == set(opreg._opcheck.CHECKS)
    assert all(r.skipped and r.passed for r in cuda)
    assert {r.message for r in cuda} == {
        "no cuda device (torch.cuda.is_available() is False): skipped"
    }
    assert any(r.device == "cpu" and not r.skipped for r in report.rows)


@pytest.mark.parametrize(
    ("samples", "message"),
    [
        ([5], "samples[0] must be an opreg.Sample or a tuple of arguments, got int 5"),
        ([(torch.ones(2),)], "samples[0] lacks arguments ['y']"),
        ([(torch.ones(2),) * 3], "samples[0] gives 3 positional arguments, the op takes 2 (x, y)"),
        ([opreg.Sample((torch.ones(2),), {"z": 1})], "samples[0] names no argument ['z']"),
    ],
)
def test_samples_that_do_not_fit_the_schema_are_type_errors(samples, message):
    with pytest.raises(TypeError) as error:
        opreg.opcheck(torch.ops.opreg.fused_add, samples, devices=["cpu"])
    assert f"opreg.opcheck: opreg::fused_add: {message}" in str(error.value)


# ---- one tolerance rule, read from the C++ core ----

TOLERANCES = {  # docs/opcheck.md and tests/cpp/test_testing.cpp state the same numbers
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (8e-3, 1.6e-2),
    torch.float32: (1e-5, 1.3e-6),
    torch.float64: (1e-7, 1e-7),
    torch.int64: (0.0, 0.0),
    torch.bool: (0.0, 0.0),
}


def test_python_reads_the_cpp_tolerance_table_and_the_docs_state_it():
    from opreg import _C

    docs = (REPO / "docs" / "opcheck.md").read_text()
    row = re.compile(r"^\| (\w+) \| ([\d.e-]+) \| ([\d.e-]+) \|$", re.MULTILINE)
    documented = {getattr(torch, n): (float(a), float(r)) for n, a, r in row.findall(docs)}
    assert documented == {d: t for d, t in TOLERANCES.items() if d.is_floating_point}
    for dtype, (atol, rtol) in TOLERANCES.items():
        assert _C.testing_tolerance(dtype) == (atol, rtol)
        assert opreg._opcheck._tolerance(dtype, bitwise=False) == (atol, rtol)
        assert opreg._opcheck._tolerance(dtype, bitwise=True) == (0.0, 0.0)


def test_kernel_vs_fallback_applies_the_tolerance_of_the_dtype():
    # The same op and numbers as tests/cpp/test_testing.cpp: allowed for 200.0f is
    # 1e-5 + 1.3e-6 * 200 = 2.7e-4.
    if not opreg.has_triton():
        pytest.skip("the Python front registers triton_fn only when Triton works")

    @opreg.register_triton_op(
        fake_fn=lambda x, offset: torch.empty_like(x),
        triton_fn=lambda x, offset: x * 2 + offset,
        triton_device_types="cpu",
        name="opcheck_tol::offset",
    )
    def op(x: torch.Tensor, offset: float) -> torch.Tensor:
        return x * 2

    x = torch.full((5,), 100.0)
    check = dict(devices=["cpu"], checks=["kernel_vs_fallback"])
    assert not opreg.opcheck(op, [(x, 1e-4)], **check).failures
    with pytest.raises(opreg.OpcheckError) as error:
        opreg.opcheck(op, [(x, 5e-4)], **check)
    assert "more than atol 1e-05 + rtol 1.3e-06 * |fallback| (torch.float32)" in str(error.value)
    with pytest.raises(opreg.OpcheckError, match="has NaN at other positions than the fallback's"):
        opreg.opcheck(op, [(x, float("nan"))], **check)


def test_integer_outputs_must_equal_the_fallbacks():
    if not opreg.has_triton():
        pytest.skip("the Python front registers triton_fn only when Triton works")

    @opreg.register_triton_op(
        fake_fn=lambda x: torch.empty_like(x),
        triton_fn=lambda x: x * 2 + 1,
        triton_device_types="cpu",
        name="opcheck_tol::off_by_one_int",
    )
    def op(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    x = torch.full((3,), 2**40, dtype=torch.int64)
    with pytest.raises(opreg.OpcheckError) as error:
        opreg.opcheck(op, [(x,)], devices=["cpu"], checks=["kernel_vs_fallback"])
    assert "output 0 (torch.int64) is not equal to the fallback's" in str(error.value)


def test_the_gradients_check_fails_a_backward_wrong_only_for_negative_grad_outputs():
    # Seventh sweep: with grad_outputs all positive (gradcheck's fast mode, and the comparison
    # against the fallback summing the outputs) a backward taking grad.abs() passed.
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    op = opreg.register_triton_op(
        fake_fn=lambda x: torch.empty_like(x),
        triton_fn=None,
        name="opcheck_sweep7::abs_backward",
        setup_context=lambda ctx, inputs, output: None,
        backward=lambda ctx, grad: grad.abs() * 2,
    )(twice)
    report = opreg.opcheck(op, devices=["cpu"], raise_on_failure=False)
    failed = [row for row in report.failures if row.check == "gradients"]
    assert failed and "differ from the fallback's" in failed[0].message
