"""Regression tests for the thirty-ninth adversarial sweep's findings (reports kept outside the
repository), beside the earlier sweeps' files."""

from __future__ import annotations

import numpy as np
import torch

import opreg
from conftest import run_with_test_ops


def test_a_cpp_thread_changing_only_an_ops_tags_keeps_python_callers_safe(test_ops_library):
    # Sweep 39 B-F1: a replace keeping the schema's text but changing its tags (or the module of its
    # Python fake) registers the schema anew, yet was not counted a schema change: from a thread
    # without the GIL it freed the schema under Python's callers (INTERNAL ASSERT, segfaults).
    result = run_with_test_ops(
        """
        import ctypes, os, time, torch, opreg
        opreg.load_library(os.environ["OPREG_TEST_OPS"])
        library = ctypes.CDLL(os.environ["OPREG_TEST_OPS"])
        library.opreg_test_stop_replacing.restype = ctypes.c_int64
        library.opreg_test_start_toggling_tags(b"sweep39::tagged")
        x, calls, errors = torch.ones(2), 0, {}
        try:
            while not hasattr(torch.ops.sweep39, "tagged"):
                time.sleep(0.001)
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                try:
                    assert torch.ops.sweep39.tagged(x).tolist() == [3.0, 3.0]
                    calls += 1
                except Exception as error:
                    errors[str(error)[:200]] = errors.get(str(error)[:200], 0) + 1
        finally:
            replaces = library.opreg_test_stop_replacing()
        print("calls", calls, "replaces", replaces, "errors", errors)
        """,
        test_ops_library,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    words = result.stdout.split()
    assert int(words[1]) > 0 and int(words[3]) > 0, result.stdout
    assert result.stdout.rstrip().endswith("errors {}"), result.stdout[-3000:]


def test_a_python_thread_that_released_the_gil_replaces_a_python_op_without_waiting(
    test_ops_library,
):
    # Sweep 39 B-F2: the sweep 38 fix handed the replaced Python definition to Python's main thread
    # only from a thread without a Python thread state; a Python thread that released the GIL
    # (ctypes.CDLL) waited for it forever while the thread holding it waited for the replace.
    result = run_with_test_ops(
        """
        import ctypes, os, threading, torch, opreg
        opreg.register_triton_op(fake_fn=None, triton_fn=None, name="sweep39::replaced_by_thread",
                                 schema="(Tensor x) -> Tensor")(lambda x: x + 100)
        opreg.load_library(os.environ["OPREG_TEST_OPS"])
        releasing = ctypes.CDLL(os.environ["OPREG_TEST_OPS"])
        holding = ctypes.PyDLL(os.environ["OPREG_TEST_OPS"])
        replacer = threading.Thread(target=releasing.opreg_test_replace_here,
                                    args=(b"sweep39::replaced_by_thread",))
        replacer.start()
        print("ended", holding.opreg_test_wait_for_replace(60000))
        replacer.join()
        print("now", torch.ops.sweep39.replaced_by_thread(torch.zeros(1)).item())
        """,
        test_ops_library,
    )
    assert "ended 1" in result.stdout and "now 4.0" in result.stdout, result.stderr[-3000:]


def test_opcheck_leaves_an_input_the_fallback_reaches_outside_autograd_to_gradcheck():
    # Sweep 39 A-F3: the sweep 38 fix covered a fallback with no input connected; with x through
    # torch and y through numpy, y's missing gradient was taken for zeros and a right backward
    # failed ("the op's gradients differ from the fallback's: tensor input #1's by up to 0.231").
    def mixed(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.sin() + torch.from_numpy(np.cos(y.detach().numpy()))

    def setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        return grad * x.cos(), -grad * y.sin()

    op = opreg.custom_op("sweep39::mixed", mixed, mutates_args=())
    op.register_fake(lambda x, y: torch.empty_like(x))
    op.register_autograd(backward, setup_context=setup)
    sample = [(torch.randn(4), torch.randn(4))]
    (row,) = opreg.opcheck(op, sample, checks=["gradients"], devices=["cpu"]).rows
    assert row.passed, row.message
    assert "not connected to tensor input #1" in row.message and "gradcheck checked" in row.message

    # A wrong backward for y is still caught, by gradcheck.
    def wrong_for_y(ctx, grad):
        x, _ = ctx.saved_tensors
        return grad * x.cos(), grad * 2

    wrong = opreg.custom_op("sweep39::mixed_wrong_y", mixed, mutates_args=())
    wrong.register_fake(lambda x, y: torch.empty_like(x))
    wrong.register_autograd(wrong_for_y, setup_context=setup)
    report = opreg.opcheck(
        wrong, sample, checks=["gradients"], devices=["cpu"], raise_on_failure=False
    )
    assert not report.rows[0].passed and "gradcheck" in report.rows[0].message


def test_a_definition_inside_another_that_would_reregister_a_schema_without_the_gil_is_refused(
    test_ops_library,
):
    # Sweep 40 B-F1: a kernel factory's replace (a definition inside another, which holds opreg's
    # lock and cannot wait for the GIL) registered a schema anew under Python's callers
    # (segfaults, heap-use-after-free). Refused without the GIL; made with it.
    result = run_with_test_ops(
        """
        import ctypes, os, torch, opreg
        opreg.load_library(os.environ["OPREG_TEST_OPS"])
        releasing = ctypes.CDLL(os.environ["OPREG_TEST_OPS"])
        holding = ctypes.PyDLL(os.environ["OPREG_TEST_OPS"])
        # As registered (torch.ops' handle follows a C++ definition at the next load only).
        registered_tags = lambda name: torch._C._get_operation_overload(name, "")[2]
        assert releasing.opreg_test_replace_inside_a_definition(b"sweep40::inner", 0) == 0
        print("unchanged", releasing.opreg_test_replace_inside_a_definition(b"sweep40::inner", 1))
        print("tagged", torch.Tag.cudagraph_unsafe in registered_tags("sweep40::inner"))
        print("with the GIL", holding.opreg_test_replace_inside_a_definition(b"sweep40::inner", 1))
        print("tagged", torch.Tag.cudagraph_unsafe in registered_tags("sweep40::inner"))
        print("value", torch.ops.sweep40.inner(torch.ones(1)).item())
        """,
        test_ops_library,
    )
    lines = result.stdout.splitlines()
    assert lines == [
        "unchanged 1",
        "tagged False",
        "with the GIL 0",
        "tagged True",
        "value 3.0",
    ], result.stdout + result.stderr[-3000:]
    assert "sweep40::inner: a definition made inside another (by a kernel factory)" in result.stderr
