"""Regression tests for the thirty-seventh adversarial sweep's findings (reports kept outside the
repository), beside the earlier sweeps' files."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import opreg


def test_a_vmap_rule_must_view_the_tensor_list_its_output_is_declared_a_view_of():
    # Sweep 37 A-F4: for (Tensor(a)[] xs, Tensor y) -> Tensor(a) a rule returning a view of y (or a
    # clone) was accepted, and an in-place change through the output under vmap reached y, or
    # nothing, where eager calls change xs.
    def first(xs, y):
        return xs[0].view(-1)

    def rule(view_of):
        def vmap(info, dims, xs, y):
            batched = view_of(xs, y).movedim(0, 0)
            return batched.reshape(batched.shape[0], -1), 0

        return vmap

    cases = {
        "of_y": lambda xs, y: y,
        "clone": lambda xs, y: xs[0].clone(),
        "of_xs": lambda xs, y: xs[0],
    }
    ops = {
        name: opreg.register_triton_op(
            schema="(Tensor(a)[] xs, Tensor y) -> Tensor(a)",
            fake_fn=first,
            triton_fn=None,
            name=f"sweep37::list_view_{name}",
            vmap=rule(view_of),
        )(first)
        for name, view_of in cases.items()
    }
    for name in ("of_y", "clone"):
        x, y = torch.ones(3, 2), torch.ones(3, 2)
        with pytest.raises(
            RuntimeError,
            match=f"sweep37::list_view_{name}: the vmap rule returned output 0 sharing memory "
            "with none of 'xs', but the schema",
        ):
            torch.vmap(lambda xs, y, op=ops[name]: op(xs, y).mul_(5), in_dims=([0], 0))([x], y)
        assert x.sum().item() == y.sum().item() == 6.0
    x, y = torch.ones(3, 2), torch.ones(3, 2)
    torch.vmap(lambda xs, y: ops["of_xs"](xs, y).mul_(5), in_dims=([0], 0))([x], y)
    assert (x.sum().item(), y.sum().item()) == (30.0, 6.0)

    def clones(xs):
        return [x.view(-1) for x in xs]

    listed = opreg.register_triton_op(
        schema="(Tensor(a)[] xs) -> Tensor(a)[]",
        fake_fn=clones,
        triton_fn=None,
        name="sweep37::list_of_clones",
        vmap=lambda info, dims, xs: ([x.clone() for x in xs], [0] * len(xs)),
    )(clones)
    with pytest.raises(RuntimeError, match="sweep37::list_of_clones: the vmap rule returned"):
        torch.vmap(lambda xs: listed(xs)[0].mul_(5), in_dims=([0],))([torch.ones(3, 2)])


def test_a_fork_while_compiled_code_waits_to_be_dropped_leaves_the_child_dropping_it(tmp_path):
    # Sweep 37 A-F3: the child inherited the parent's note that a thread of its own would drop
    # compiled code, without that thread: its replaces never dropped compiled code again, and its
    # compiled calls ran the old definition with no error.
    script = tmp_path / "fork_while_dropping.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, threading, time, torch, opreg

            def define(k):
                return opreg.register_triton_op(
                    schema="(Tensor x) -> Tensor", fake_fn=lambda x: torch.empty_like(x),
                    triton_fn=lambda x: x * k, triton_device_types="cpu", traceable=True,
                    name="sweep37::scaled", replace=True)(lambda x: x * k)

            op = define(2)

            @torch.compile(backend="aot_eager")
            def slow(x):
                y = op(x) + 0
                torch._dynamo.graph_break()
                time.sleep(3)
                return y

            slow(torch.ones(2))
            busy = threading.Thread(target=slow, args=(torch.ones(2),))
            busy.start()
            time.sleep(0.5)
            # A replace that stops waiting for the compiled call (Note [Replacing under compiled
            # calls]) leaves the drop to a thread of opreg's, which the child must not inherit.
            opreg._registry._COMPILE_WAIT_S = 0.5
            define(3)
            assert any(t.name.startswith("opreg: forget") for t in threading.enumerate())
            pid = os.fork()
            if pid == 0:
                compiled = torch.compile(lambda x: op(x) + 0, backend="aot_eager")
                compiled(torch.ones(2))
                define(5)
                os._exit(0 if compiled(torch.ones(2)).tolist() == [5.0, 5.0] else 3)
            _, status = os.waitpid(pid, 0)
            print("child exit code", os.waitstatus_to_exitcode(status))
            busy.join()
            """
        )
    )
    # CUDA cannot be used in a child forked after the parent used it (Dynamo reads its RNG state).
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert "child exit code 0" in result.stdout, result.stdout + result.stderr[-3000:]


def test_a_device_type_or_dtypes_name_holding_a_nul_or_a_lone_surrogate_is_named_whole():
    # Sweep 37 A-F5: the message stopped at the NUL ("'a"), and a lone surrogate met pybind11's
    # "incompatible function arguments" although a str was given.
    with pytest.raises(ValueError, match=r"'a\\x00b' is not a device type name like 'cuda'"):
        opreg.register_accelerated_device_type("a\x00b")
    with pytest.raises(ValueError, match="holds a lone surrogate, which is no character"):
        opreg.register_accelerated_device_type("\udc80")
    with pytest.raises(ValueError, match=r"dtypes\(\) names argument 'x\\x00y', which the schema"):
        opreg.register_triton_op(
            schema="(Tensor x) -> Tensor",
            fake_fn=lambda x: x.clone(),
            triton_fn=None,
            name="sweep37::nul_dtypes",
            dtypes={"x\x00y": [torch.float32]},
        )(lambda x: x * 2)
    assert "sweep37::nul_dtypes" not in [r.name for r in opreg.describe_ops()]


def test_opcheck_passes_a_right_view_of_a_tensor_list_element_saying_what_it_skips():
    # Sweep 37 A-F6: PyTorch's schema check reads no Tensor(a)[] element's alias set and failed
    # the op ("Argument xs is not defined to alias output but was aliasing").
    def first(xs):
        return xs[0].view(-1)

    op = opreg.register_triton_op(
        schema="(Tensor(a)[] xs) -> Tensor(a)", fake_fn=first, triton_fn=None, name="sweep37::first"
    )(first)
    report = opreg.opcheck(op, [([torch.ones(2, 3)],)], checks=["torch_opcheck"], devices=["cpu"])
    (row,) = report.rows
    assert row.passed, row.message
    assert "test_schema: PyTorch's schema check reads no Tensor(a)[] element" in row.message
    assert "so opreg checks the writes alone" in row.message
    wrong = opreg.register_triton_op(
        schema="(Tensor(a)[] xs) -> Tensor(a)",
        fake_fn=lambda xs: torch.empty(3),  # a wrong fake is still caught
        triton_fn=None,
        name="sweep37::first_wrong_fake",
    )(first)
    report = opreg.opcheck(
        wrong,
        [([torch.ones(2, 3)],)],
        checks=["torch_opcheck"],
        devices=["cpu"],
        raise_on_failure=False,
    )
    assert not report.rows[0].passed


def test_a_kernel_of_an_op_without_tensor_arguments_is_refused_from_python():
    # Sweep 37 B-F2: the kernel never ran (the dispatcher picks a device's kernel by the tensor
    # arguments), yet kernel_status said it served.
    with pytest.raises(ValueError, match="sweep37::made: kernel 'triton' would never run"):
        opreg.register_triton_op(
            schema="(int n) -> Tensor",
            fake_fn=lambda n: torch.empty(n),
            triton_fn=lambda n: torch.ones(n),
            triton_device_types="cpu",
            name="sweep37::made",
        )(lambda n: torch.zeros(n))
    assert "sweep37::made" not in [r.name for r in opreg.describe_ops()]


def test_an_aot_kernel_given_keywords_says_its_arguments_are_positional():
    # Sweep 37 B-F7: Python's error named a lambda of AotKernel.__getitem__.
    kernel = opreg.AotKernel("sweep37_no_such_kernel")
    with pytest.raises(
        TypeError, match=r"opreg\.AotKernel 'sweep37_no_such_kernel': arguments are"
    ):
        kernel[(1,)](torch.ones(1), n=4)


def test_opcheck_still_finds_an_undeclared_write_of_an_op_viewing_a_tensor_list_element():
    # Sweep 38 A-F1: with PyTorch's schema check left out for such ops (sweep 37 A-F6), an op that
    # wrote an argument without declaring it passed opcheck; and the check was left out for an op
    # whose output views a plain argument beside a written list.
    def first_and_write(xs, y):
        y.add_(1.0)
        return xs[0].view(-1)

    op = opreg.register_triton_op(
        schema="(Tensor(a)[] xs, Tensor y) -> Tensor(a)",
        fake_fn=lambda xs, y: xs[0].view(-1),
        triton_fn=None,
        name="sweep38::writes_y",
    )(first_and_write)
    sample = [([torch.randn(3)], torch.randn(3))]
    (row,) = opreg.opcheck(
        op, sample, checks=["torch_opcheck"], devices=["cpu"], raise_on_failure=False
    ).rows
    assert not row.passed
    assert "test_schema: Argument y is not defined as mutable but was mutated" in row.message

    def write_z(xs, y, z):
        for x in xs:
            x.add_(1)
        z.mul_(2)
        return y.view(-1)

    beside = opreg.register_triton_op(
        schema="(Tensor(a!)[] xs, Tensor(b) y, Tensor z) -> Tensor(b)",
        fake_fn=lambda xs, y, z: y.view(-1),
        triton_fn=None,
        name="sweep38::writes_z",
        mutates_args=("xs",),
    )(write_z)
    sample = [([torch.randn(3)], torch.randn(3), torch.randn(3))]
    (row,) = opreg.opcheck(
        beside, sample, checks=["torch_opcheck"], devices=["cpu"], raise_on_failure=False
    ).rows
    assert not row.passed
    assert "Argument z is not defined as mutable but was mutated" in row.message
    assert "opreg checks the writes alone" not in row.message  # PyTorch's own check ran


def test_an_aot_kernel_name_holding_a_lone_surrogate_is_named():
    # Sweep 38 A-F3: pybind11's "incompatible constructor arguments" came, for a str.
    with pytest.raises(ValueError, match=r"opreg\.AotKernel: name 'k\\udc80' holds a lone"):
        opreg.AotKernel("k\udc80")


def test_opcheck_says_a_fallback_outside_autograd_leaves_the_backward_to_gradcheck():
    # Sweep 38 A-F2: a right backward of a numpy fallback failed the gradients row, "the op's
    # gradients differ from the fallback's": the fallback's missing gradient was taken for zeros.
    def numpy_sin(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.sin(x.detach().numpy()))

    op = opreg.custom_op("sweep38::numpy_sin", numpy_sin, mutates_args=())
    op.register_fake(lambda x: torch.empty_like(x))
    op.register_autograd(
        lambda ctx, g: g * ctx.saved_tensors[0].cos(),
        setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]),
    )
    (row,) = opreg.opcheck(op, [(torch.randn(4),)], checks=["gradients"], devices=["cpu"]).rows
    assert row.passed and "the fallback's outputs are not connected to its inputs" in row.message
    assert "gradcheck checked it" in row.message

    wrong = opreg.custom_op("sweep38::numpy_sin_wrong_backward", numpy_sin, mutates_args=())
    wrong.register_fake(lambda x: torch.empty_like(x))
    wrong.register_autograd(
        lambda ctx, g: g * 2,
        setup_context=lambda ctx, inputs, output: None,
    )
    report = opreg.opcheck(
        wrong, [(torch.randn(4),)], checks=["gradients"], devices=["cpu"], raise_on_failure=False
    )
    assert not report.rows[0].passed and "gradcheck" in report.rows[0].message


def test_a_cpp_thread_replacing_a_python_op_while_python_waits_for_it_holding_the_gil(
    test_ops_library,
):
    # Sweep 38 B-F1: the C++ thread freed the replaced Python definition, which took the GIL,
    # held by the Python thread waiting for it (ctypes.PyDLL here, an extension joining a worker
    # in general): both waited forever.
    script = textwrap.dedent(
        """
        import ctypes, os, torch, opreg
        opreg.register_triton_op(fake_fn=None, triton_fn=None, name="sweep38::replaced_by_cpp",
                                 schema="(Tensor x) -> Tensor")(lambda x: x + 100)
        opreg.load_library(os.environ["OPREG_TEST_OPS"])
        library = ctypes.PyDLL(os.environ["OPREG_TEST_OPS"])  # calls keep the GIL
        assert library.opreg_test_replace_on_a_thread(b"sweep38::replaced_by_cpp") == 0
        print("now", torch.ops.sweep38.replaced_by_cpp(torch.zeros(1)).item())
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OPREG_TEST_OPS": str(test_ops_library)},
    )
    assert "now 4.0" in result.stdout, result.stderr[-3000:]
