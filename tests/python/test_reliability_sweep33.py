"""Regression tests for the thirty-third adversarial sweep's findings (reports kept outside the
repository), beside the earlier sweeps' files."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import opreg


@pytest.mark.parametrize(
    ("output", "value", "error", "message"),
    [
        ("float", 10**400, ValueError, "returned 1000.* for output 0, which a double cannot hold"),
        ("Scalar", 2**70, ValueError, "returned 1180.* for output 0, which a 64-bit int cannot"),
        (
            "int[]",
            [1, 2**63],
            ValueError,
            "returned 9223372036854775808 as element 1 of output 0, which a 64-bit int cannot",
        ),
        ("ScalarType", "float32", TypeError, "expected ScalarType \\(the schema's return type"),
        ("Layout", "strided", TypeError, "expected Layout \\(the schema's return type"),
    ],
)
def test_a_non_tensor_output_that_does_not_fit_says_why(output, value, error, message):
    # A-F3: an int too large for the C++ value was said to be of the wrong type ("returned int,
    # expected float"); A-F4: a ScalarType or Layout output was said to expect an int.
    name = f"sweep33::misfit_{output.strip('[]').lower()}"
    op = opreg.custom_op(name, lambda x: value, mutates_args=(), schema=f"(Tensor x) -> {output}")
    with pytest.raises(error, match=f"{name}: .*{message}"):
        op(torch.ones(1))


def test_a_fakes_output_that_does_not_fit_says_why():
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = opreg.custom_op(
        "sweep33::fake_misfit", lambda x: 1.0, mutates_args=(), schema="(Tensor x) -> float"
    )
    op.register_fake(lambda x: 10**400)
    with (
        FakeTensorMode(),
        pytest.raises(ValueError, match=r"its fake returned 1000.*, which a double cannot hold"),
    ):
        op(torch.empty(1))


def test_opcheck_while_other_threads_run_compiled_code():
    # B-F3: opcheck's compile row called torch._dynamo.reset(), which dropped the compiled code
    # other threads were running: the process died (SIGSEGV) within seconds. A subprocess, so that
    # a crash fails the test.
    script = textwrap.dedent(
        """
        import threading, time
        import torch, opreg

        op = opreg.custom_op("sweep33::compiled_twice", lambda x: x * 2, mutates_args=(),
                             schema="(Tensor x) -> Tensor")
        op.register_fake(lambda x: torch.empty_like(x))
        stop = threading.Event()
        wrong = []

        def caller(backend):
            compiled = torch.compile(lambda x: op(x) + 1, backend=backend)
            while not stop.is_set():
                x = torch.randn(3)
                if not torch.equal(compiled(x), x * 2 + 1):
                    wrong.append(backend)

        threads = [threading.Thread(target=caller, args=(b,)) for b in ("eager", "aot_eager")]
        for thread in threads:
            thread.start()
        sample = opreg.Sample((torch.randn(4),))
        checks = 0
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            report = opreg.opcheck(op, [sample], checks=["compile"], raise_on_failure=False)
            assert not report.failures, report.failures
            checks += 1
        stop.set()
        for thread in threads:
            thread.join()
        print("checks", checks, "wrong", len(wrong))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "wrong 0" in result.stdout, result.stdout


RACE = """
import os, sys, threading, time
import torch, opreg

def define(k, replace, schema):
    return opreg.register_triton_op(
        fake_fn=lambda x, *rest: torch.empty_like(x), triton_fn=None, name="sweep33::raced",
        schema=schema, replace=replace)(lambda x, *rest: x + k)

schemas = ["(Tensor x) -> Tensor", sys.argv[1]]
define(1, False, schemas[0])
stop = threading.Event()
errors, calls = [], [0]

def replace():
    i = 0
    while not stop.is_set():
        define(1 + i % 2, True, schemas[i % 2])
        i += 1
        time.sleep(0.0002)

def call(device):
    while not stop.is_set():
        try:
            torch.ops.sweep33.raced(torch.ones(3, device=device))
        except RuntimeError as error:
            if "raced a replace" not in str(error) and "called with" not in str(error):
                errors.append(str(error)[:300])
        calls[0] += 1

threads = [threading.Thread(target=replace)] + [
    threading.Thread(target=call, args=(d,)) for d in ("meta", "meta", "cpu")]
for thread in threads:
    thread.start()
time.sleep(float(sys.argv[2]))
stop.set()
for thread in threads:
    thread.join()
print("calls", calls[0], "errors", len(errors), errors[:1])
"""


@pytest.mark.parametrize(
    ("schema", "debug"),
    [
        ("(Tensor x) -> Tensor", "0"),
        ("(Tensor x) -> Tensor", "1"),
        ("(Tensor x, int k=2) -> Tensor", "1"),
    ],
    ids=["meta", "debug", "debug_schema_change"],
)
def test_calls_on_meta_tensors_while_the_op_is_replaced(schema, debug):
    # A-F1: torch's Meta kernel for a Python fake, registered for each definition, was freed by a
    # replace while a call on meta tensors ran it: PyTorch's internal assert on the Python object
    # ("interpreter == pyinterpreter_"), and with OPREG_DEBUG=1, whose checks call the fake on
    # meta copies, segfaults (a schema change among the replaces: PyTorch read before the stack).
    result = subprocess.run(
        [sys.executable, "-c", RACE, schema, "5"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OPREG_DEBUG": debug},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "errors 0 " in result.stdout, result.stdout


def test_a_sample_label_with_a_lone_surrogate_is_refused():
    # A-F5: accepted; a failing check's report then could not be printed (UnicodeEncodeError).
    with pytest.raises(ValueError, match=r"opreg.Sample: label 'a\\ud800' holds a lone surrogate"):
        opreg.Sample((torch.ones(1),), label="a\ud800")


def test_a_meta_kernel_beside_a_fake_is_refused():
    # A-F6: register_kernel("meta") on an op with a fake was accepted and never ran (opreg's one
    # fake serves meta tensors too); without a fake it is the fake, and a later fake replaces it.
    op = opreg.custom_op(
        "sweep33::meta_kernel",
        lambda x: x.sum(0, keepdim=True),
        mutates_args=(),
        schema="(Tensor x) -> Tensor",
    )
    op.register_kernel("meta")(lambda x: x.new_empty(1, x.shape[1]))
    assert op(torch.empty(4, 3, device="meta")).shape == (1, 3)
    op.register_fake(lambda x: x.new_empty(1, x.shape[1]))
    with pytest.raises(
        ValueError, match="sweep33::meta_kernel: register_kernel\\('meta'\\): the op"
    ):
        op.register_kernel("meta")(lambda x: x.new_empty(9, 9))
    assert op(torch.empty(4, 3, device="meta")).shape == (1, 3)


def test_nested_outputs_under_opreg_debug_and_in_the_gradients_row():
    # Sweep 34 A-F3: OPREG_DEBUG's comparison with the fake met PyTorch's "NestedTensorImpl
    # doesn't support sizes" on a plain call; A-F4: so did opcheck's gradients row.
    script = textwrap.dedent(
        """
        import torch, opreg
        op = opreg.custom_op("sweep34::nested", mutates_args=(), schema="(Tensor x) -> Tensor")(
            lambda x: torch.nested.nested_tensor([x, x[:1]]))
        op.register_fake(lambda x: torch.empty_like(x))
        print("values", op(torch.ones(3)).unbind()[1].tolist())
        report = opreg.opcheck(op, [opreg.Sample((torch.ones(3, requires_grad=True),))],
                               checks=["gradients"], raise_on_failure=False)
        print("gradients", [(r.skipped, r.message) for r in report.rows])
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OPREG_DEBUG": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "values [1.0]" in result.stdout, result.stdout
    assert "a nested output, which torch.autograd.gradcheck does not take" in result.stdout


def test_an_op_that_returns_a_nested_tensor_and_has_no_fake_says_no_fake_can_help():
    # Sweep 34 A-F2: the "has no fake" message quoted PyTorch's internal assert about nested
    # storage on meta and advised a fake, which PyTorch cannot make nested either.
    op = opreg.custom_op(
        "sweep34::nested_no_fake",
        lambda x: torch.nested.nested_tensor([x, x[:1]]),
        mutates_args=(),
        schema="(Tensor x) -> Tensor",
    )
    assert op(torch.ones(3)).unbind()[1].tolist() == [1.0]
    plainly = "which PyTorch cannot make on meta tensors or under FakeTensorMode"
    with pytest.raises(NotImplementedError, match=f"sweep34::nested_no_fake: .*{plainly}"):
        op(torch.ones(3, device="meta"))
    report = opreg.opcheck(
        op,
        [(torch.ones(3),)],
        checks=["torch_opcheck", "fake_vs_real", "compile"],
        raise_on_failure=False,
    )
    for row in report.rows:
        assert not row.passed, row
        assert row.message.startswith("sweep34::nested_no_fake returns a nested tensor"), row
        assert "INTERNAL ASSERT" not in row.message
