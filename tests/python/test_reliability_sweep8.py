"""Regression tests for the eighth adversarial sweep's findings (against 408de2c) and the ninth's
(against a4cc46b): a fallback computed outside autograd (numpy, .detach()) gave silently wrong
gradients under the default autograd policy (now a warning, once per op: it cannot be told from
a constant output, which must keep working); outputs sharing memory with each other were accepted
(eager and torch.compile then disagreed); a failed library load did not put back an op its
initializers had undefined, and an undefine of an unknown op there terminated the process; a
Python op undefined from C++ could not be defined again with its vmap_fn; opcheck refused correct
ops (dtypes outside its table, float32-only ops in its float64 gradcheck, (Tensor, int) outputs);
names torch.ops cannot reach; the AOT compiler's tracebacks for a long kernel name and a source
that exits on import; a negative constant AotLaunch grid."""

from __future__ import annotations

import ctypes
import itertools
import re
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch
from test_reliability import assert_survived, load_failing_library, run_probe

import opreg
from conftest import TEST_OPS_LIBRARY

_names = itertools.count()


def fresh(stem: str) -> str:
    return f"sweep8::{stem}{next(_names)}"


def empty(x):
    return torch.empty_like(x)


# ---- S8-01: a fallback computed outside autograd ---------------------------------------------


def numpy_sin_op():
    def numpy_sin(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.sin(x.detach().cpu().numpy()))

    return opreg.register_vmap_op(numpy_sin, fake_fn=empty, name=fresh("numpy_sin"))


def test_a_gradient_through_a_fallback_computed_outside_autograd_warns_naming_the_op():
    op = numpy_sin_op()
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    out = op(x)
    torch.testing.assert_close(out.detach(), torch.sin(x.detach()))
    # The op's term was silently left out of x.grad: it still is (opreg cannot tell numpy from
    # a constant), but it says so, once per op.
    with pytest.warns(UserWarning, match=r"numpy_sin\d+: a gradient reached output 0, which is "
                      r"not connected to its inputs.*give the op a backward"):  # fmt: skip
        (out.sum() + x.sum()).backward()
    torch.testing.assert_close(x.grad, torch.ones(3, dtype=torch.float64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per op
        op(x).sum().backward()


def test_forward_mode_through_a_fallback_computed_outside_autograd_warns_naming_the_op(capfd):
    def detached_sin(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x.detach())

    op = opreg.register_vmap_op(detached_sin, fake_fn=empty, name=fresh("detached_sin"))
    x, t = torch.randn(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    capfd.readouterr()
    _, tangent = torch.func.jvp(op, (x,), (t,))  # was silent: a zero tangent
    torch.testing.assert_close(tangent, torch.zeros(3, dtype=torch.float64))
    # A call through torch.ops gets C++'s warning handler, which writes to stderr, as for
    # PyTorch's own ops' warnings.
    assert re.search(
        r"detached_sin\d+: an input has a forward-mode tangent, but output 0 is not connected",
        capfd.readouterr().err,
    )


def test_outputs_that_do_not_depend_on_an_input_give_it_a_zero_gradient():
    # Correct programs stay correct: a constant output, an input the op does not use.
    def ones(x: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(x)

    def second(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return y * 2

    constant = opreg.register_vmap_op(ones, fake_fn=empty, name=fresh("ones"))
    unused = opreg.register_vmap_op(
        second, fake_fn=lambda x, y: torch.empty_like(y), name=fresh("unused")
    )
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    with pytest.warns(UserWarning, match="do not depend on the inputs"):
        (constant(x).sum() + (x * 3).sum()).backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 3.0, dtype=torch.float64))
    x.grad = None
    with pytest.warns(UserWarning, match="do not depend on the inputs"):
        (unused(x, torch.ones(3, dtype=torch.float64)).sum() + x.sum()).backward()
    torch.testing.assert_close(x.grad, torch.ones(3, dtype=torch.float64))


def test_a_tensor_list_output_computed_outside_autograd_warns_too():
    def numpy_pair(x: torch.Tensor) -> list[torch.Tensor]:
        y = torch.from_numpy(np.sin(x.detach().numpy()))
        return [y, y * 2]

    op = opreg.register_vmap_op(
        numpy_pair,
        fake_fn=lambda x: [torch.empty_like(x), torch.empty_like(x)],
        name=fresh("numpy_pair"),
        schema="(Tensor x) -> Tensor[]",
    )
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    first, second = op(x)
    assert first.requires_grad and second.requires_grad
    with pytest.warns(UserWarning, match="a gradient reached output 0"):
        (second.sum() + x.sum()).backward()


def test_a_fallback_with_one_connected_output_keeps_its_constant_ones():
    def sin_and_count(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.sin(x), torch.full((1,), float(x.numel()))

    op = opreg.register_vmap_op(
        sin_and_count,
        fake_fn=lambda x: (torch.empty_like(x), x.new_empty(1)),
        name=fresh("sin_and_count"),
    )
    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    y, count = op(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (y.sum() + count.sum()).backward()
        _, tangent = torch.func.jvp(lambda a: op(a)[0], (x.detach(),), (torch.ones(4).double(),))
    torch.testing.assert_close(x.grad, torch.cos(x.detach()))
    torch.testing.assert_close(tangent, torch.cos(x.detach()))


def test_a_fallback_computed_outside_autograd_under_the_none_policy_is_refused_nowhere():
    def numpy_sin(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.sin(x.detach().numpy()))

    op = opreg.register_vmap_op(numpy_sin, fake_fn=empty, name=fresh("none"), autograd="none")
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert not op(x).requires_grad  # declared: its outputs have no gradient


# ---- S8-02: outputs sharing memory with each other --------------------------------------------


def test_outputs_sharing_memory_with_each_other_are_refused():
    def twice_the_same(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x + 1
        return y, y

    op = opreg.register_vmap_op(
        twice_the_same,
        fake_fn=lambda x: (torch.empty_like(x), torch.empty_like(x)),
        name=fresh("two"),
    )
    with pytest.raises(RuntimeError, match=r"the fallback returned outputs 0 and 1 sharing "
                       r"memory, but the schema .* declares no alias"):  # fmt: skip
        op(torch.ones(2))

    def views(x: torch.Tensor) -> list[torch.Tensor]:
        y = x * 2
        return [y[:1], y[1:]]

    listed = opreg.register_vmap_op(
        views,
        fake_fn=lambda x: [x.new_empty(1), x.new_empty(x.shape[0] - 1)],
        name=fresh("listed"),
        schema="(Tensor x) -> Tensor[]",
    )
    with pytest.raises(RuntimeError, match="returned two tensors in output 0 sharing memory"):
        listed(torch.ones(3))


def test_a_fake_returning_one_tensor_twice_is_refused():
    def apart(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + 1, x + 2

    def same(x):
        y = torch.empty_like(x)
        return y, y

    op = opreg.register_vmap_op(apart, fake_fn=same, name=fresh("fake_same"))
    torch.testing.assert_close(op(torch.ones(2))[1], torch.full((2,), 3.0))
    with pytest.raises(RuntimeError, match=r"its fake returned outputs 0 and 1 sharing memory"):
        op(torch.ones(2, device="meta"))


def test_outputs_declared_as_aliases_of_one_input_are_accepted():
    def both(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x.mul_(2)
        return x, x

    op = opreg.register_vmap_op(
        both,
        fake_fn=lambda x: (x, x),
        name=fresh("aliases"),
        schema="(Tensor(a!) x) -> (Tensor(a!), Tensor(a!))",
    )
    x = torch.ones(2)
    first, second = op(x)
    assert first.data_ptr() == second.data_ptr() == x.data_ptr()


# ---- S8-03 and S8-04: undefine ---------------------------------------------------------------


def undefine(test_ops_library, name: str) -> None:
    """opreg::undefine through the test library (the Python front has none)."""
    hook = ctypes.CDLL(str(test_ops_library)).opreg_test_undefine
    hook.argtypes = [ctypes.c_char_p]
    assert hook(name.encode()) == 0


def test_an_op_undefined_from_cpp_is_defined_again_with_its_vmap_fn(test_ops_library):
    name = fresh("undefined")

    def define(factor: float, **flags):
        return opreg.register_vmap_op(
            lambda x: x * factor,
            fake_fn=empty,
            name=name,
            schema="(Tensor x) -> Tensor",
            vmap_fn=lambda x: x * factor,
            fake_vmap_fn=empty,
            **flags,
        )

    define(2.0)
    undefine(test_ops_library, name)
    # Its companion goes with it (ninth sweep S9-07: '<name>_vmap' stayed callable).
    companion = getattr(torch.ops.sweep8, name.split("::")[1] + "_vmap")
    with pytest.raises(RuntimeError, match=f"{name}_vmap: the op is not defined now"):
        companion(torch.ones(2, 3))
    assert f"{name}_vmap" not in {op.name for op in opreg.describe_ops()}
    op = define(3.0)  # was: '<name>_vmap: an op of this name is already defined'
    x = torch.ones(2, 3)
    torch.testing.assert_close(op(x), torch.full((2, 3), 3.0))
    torch.testing.assert_close(torch.vmap(op)(x), torch.full((2, 3), 3.0))
    with pytest.raises(ValueError, match="an op of this name is already defined"):
        define(4.0)  # the op itself is defined now: replace=True is still needed


def test_a_failed_load_puts_back_an_op_its_initializers_undefined():
    output = load_failing_library(
        "undefine_then_fail",
        then="""
        print("fused_add:", torch.ops.opreg.fused_add(torch.ones(2), torch.ones(2)).tolist())
        """,
    )
    assert "opreg_failing::bad: opreg: op 'opreg_failing::bad': cannot parse schema" in output
    assert "fused_add: [2.0, 2.0]" in output  # was: 'opreg::fused_add: the op is not defined now'


def test_an_undefine_of_an_unknown_op_during_a_load_is_a_load_error():
    # It threw out of the library's static initializer: the process terminated.
    output = load_failing_library("undefine_unknown")
    assert (
        "opreg_failing::never_defined: opreg: cannot undefine 'opreg_failing::never_defined'"
        in (output)
    )


# ---- S8-05 to S8-07: opcheck and correct ops --------------------------------------------------


@pytest.mark.parametrize(
    "dtypes",
    [[torch.uint8], [torch.int8, torch.int16], [torch.complex64], [torch.float32, torch.uint8]],
    ids=str,
)
def test_opcheck_passes_a_correct_op_of_any_declared_dtype(dtypes):
    # uint8, int8, complex64: IndexError inside opcheck; [float32, uint8]: uint8 never sampled.
    def double_it(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    op = opreg.register_vmap_op(
        double_it, fake_fn=empty, name=fresh("dtypes"), dtypes={"x": dtypes}
    )
    report = opreg.opcheck(op, devices=["cpu"])
    assert not report.failures
    sampled = {row.sample.rsplit(" ", 1)[1] for row in report.rows}
    assert sampled == {str(d).removeprefix("torch.") for d in dtypes}


def test_opcheck_checks_the_gradients_of_a_float32_only_op_without_float64():
    def sine(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x)

    op = opreg.register_vmap_op(
        sine, fake_fn=empty, name=fresh("f32"), dtypes={"x": [torch.float32]}
    )
    report = opreg.opcheck(op, devices=["cpu"], checks=["gradients"])
    assert not report.failures, str(report)
    assert {row.message for row in report.rows if not row.skipped} == {
        "gradcheck skipped: 'x' does not take float64"
    }

    def wrong_backward(ctx, grad):
        return grad * 2  # d sin = cos: the comparison with the fallback's gradients catches it

    wrong = opreg.register_vmap_op(
        sine,
        fake_fn=empty,
        name=fresh("f32_wrong"),
        dtypes={"x": [torch.float32]},
        backward=wrong_backward,
    )
    with pytest.raises(opreg.OpcheckError, match="the op's gradients differ from the fallback's"):
        opreg.opcheck(wrong, devices=["cpu"], checks=["gradients"])


def test_opcheck_passes_an_op_returning_a_tensor_and_an_int():
    def plus_one_and_three(x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return x + 1, 3

    op = opreg.register_vmap_op(
        plus_one_and_three,
        fake_fn=lambda x: (torch.empty_like(x), 3),
        name=fresh("tensor_int"),
        schema="(Tensor x) -> (Tensor, int)",
    )
    report = opreg.opcheck(op, devices=["cpu"], checks=["gradients"])
    assert not report.failures, str(report)


# ---- S8-08 and S8-09: the AOT compiler's one-line errors --------------------------------------

_SPEC = """
[[kernel]]
name = "{name}"
source = "{source}"
signature = {{ x_ptr = "*fp32", n = "i32" }}
constexprs = {{ BLOCK = 64 }}
targets = ["sm_90"]
configs = [{{ num_warps = 4 }}]
"""

_KERNEL = """
import triton
from triton import language as tl
{before}
@triton.jit
def kernel(x_ptr, n, BLOCK: tl.constexpr):
    pass
"""


def compile_spec(tmp_path, name: str, before: str = "") -> subprocess.CompletedProcess:
    (tmp_path / "kernel.py").write_text(_KERNEL.format(before=before))
    (tmp_path / "spec.toml").write_text(_SPEC.format(name=name, source="kernel.py:kernel"))
    return subprocess.run(
        [sys.executable, "-m", "opreg.aot", str(tmp_path / "spec.toml"), "--out",
         str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip


def one_line_error(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("python -m opreg.aot: error: ")
    return lines[0]


def test_a_kernel_name_too_long_for_a_file_name_is_refused_in_one_line(tmp_path):
    error = one_line_error(compile_spec(tmp_path, "k" * 300))
    assert "'name' must be at most 128 characters (it names files), got '300 characters'" in error


@pytest.mark.parametrize("raised", ["SystemExit(3)", "KeyboardInterrupt", "GeneratorExit"])
def test_a_kernel_source_that_exits_on_import_is_named_in_one_line(tmp_path, raised):
    # SystemExit: it exited with the source's own status, printing nothing; the others printed a
    # traceback (ninth sweep).
    error = one_line_error(compile_spec(tmp_path, "exits", before=f"raise {raised}"))
    assert "kernel.py failed: " in error and raised.split("(")[0] in error


def test_the_undefine_hook_refuses_an_unknown_op_and_the_process_goes_on():
    # The hook the tests above use: a refusal is a return code and a message, not an abort.
    result = run_probe(
        textwrap.dedent(
            f"""
            import ctypes, torch, opreg
            opreg.load_library({str(TEST_OPS_LIBRARY)!r})
            hook = ctypes.CDLL({str(TEST_OPS_LIBRARY)!r}).opreg_test_undefine
            hook.argtypes = [ctypes.c_char_p]
            print("refused:", hook(b"sweep8::never_defined"))
            print(torch.ops.opreg.fused_add(torch.ones(2), torch.ones(2)).tolist())
            """
        )
    )
    assert_survived(result)
    assert "refused: 1" in result.stdout and "[2.0, 2.0]" in result.stdout
    assert "cannot undefine 'sweep8::never_defined'" in result.stderr


# ---- S8-10 and S8-12: names torch.ops cannot reach, a negative grid ----------------------------


@pytest.mark.parametrize(
    ("name", "owner"),
    [
        ("sweep8_names::name", "torch.ops.sweep8_names.name"),
        ("sweep8_names::_dir", "torch.ops.sweep8_names._dir"),
        ("load_library::op", "torch.ops.load_library"),
        ("sweep8_names::__doc__", "torch.ops.sweep8_names.__doc__"),
        ("sweep8_names::__origin__", "torch.ops.sweep8_names.__origin__"),
        ("higher_order::op", "torch.ops.higher_order"),  # ninth sweep: defined, then raised
    ],
)
def test_a_name_torch_ops_cannot_reach_is_refused_before_anything_is_defined(name, owner):
    # 'ns::name' raised AttributeError ('str' object has no attribute 'default') after the op
    # was defined, so a retry was refused as a second definition.
    for define in (
        lambda: opreg.register_vmap_op(
            lambda x: x * 2, fake_fn=empty, name=name, schema="(Tensor x) -> Tensor"
        ),
        lambda: opreg.custom_op(
            name, lambda x: x * 2, mutates_args=(), schema="(Tensor x) -> Tensor"
        ),
    ):
        with pytest.raises(ValueError, match=rf"{owner} is (an attribute of )?PyTorch's own"):
            define()
    assert name not in {op.name for op in opreg.describe_ops()}


# cdiv of a constant is a constant (ninth sweep S9-09: 'cdiv(-1, 1)' was accepted).
@pytest.mark.parametrize(
    "grid", ["-1", "2147483648", "cdiv(-1, 1)", "cdiv(cdiv(4294967296, 1), 2)"]
)
def test_a_constant_grid_out_of_range_is_refused_at_definition(grid):
    message = rf"aot_kernel grid: cannot read '{re.escape(grid)}': a grid dimension is a count"
    with pytest.raises(ValueError, match=message + r" of programs, from 0 to 2\^31 - 1"):
        opreg.register_triton_op(
            fake_fn=empty,
            triton_fn=None,
            aot=opreg.AotLaunch("sweep8_no_such_kernel", (grid,), ("x", "out0"), outputs="like:x"),
            name=fresh("grid"),
        )(twice)


@pytest.mark.parametrize(
    ("grid", "axis"), [(("1", "65536"), "y"), (("1", "1", "cdiv(200000, 2)"), "z")]
)
def test_a_constant_grid_over_cudas_limit_along_y_or_z_is_refused_at_definition(grid, axis):
    # Eleventh sweep: a y grid of 200000 was accepted, and refused only at the launch.
    with pytest.raises(ValueError, match=rf"programs along {axis}, and CUDA allows at most 65535"):
        opreg.register_triton_op(
            fake_fn=empty,
            triton_fn=None,
            aot=opreg.AotLaunch("sweep8_no_such_kernel", grid, ("x", "out0"), outputs="like:x"),
            name=fresh("grid_yz"),
        )(twice)


def test_an_aot_launch_naming_no_kernel_is_refused_at_definition():
    # Twelfth run: AotLaunch("") was accepted, and the fallback served every call.
    with pytest.raises(ValueError, match="aot_kernel names no kernel"):
        opreg.register_triton_op(
            fake_fn=empty,
            triton_fn=None,
            aot=opreg.AotLaunch("", ("1",), ("x", "out0"), outputs="like:x"),
            name=fresh("no_kernel"),
        )(twice)


def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


# ---- ninth sweep: a library undefining a Python op; opcheck and complex or unsigned ops --------


def test_a_library_that_undefines_a_python_op_loads_and_takes_its_python_pieces_along():
    # The load succeeded, then load_library raised "no op named ... is defined by opreg".
    library = TEST_OPS_LIBRARY.parent / "libopreg_failing_undefine_named.so"
    result = run_probe(
        textwrap.dedent(
            f"""
            import os, torch, opreg
            os.environ["OPREG_UNDEFINE_NAME"] = "sweep9_py::op"
            op = opreg.register_vmap_op(lambda x: x * 2, fake_fn=lambda x: torch.empty_like(x),
                                        name="sweep9_py::op", schema="(Tensor x) -> Tensor")
            opreg.load_library({str(library)!r})
            try:
                torch.ops.sweep9_py.op(torch.ones(2))
            except RuntimeError as error:
                print("undefined:", error)
            again = opreg.register_vmap_op(lambda x: x * 3, fake_fn=lambda x: torch.empty_like(x),
                                           name="sweep9_py::op", schema="(Tensor x) -> Tensor")
            print("again:", again(torch.ones(2)).tolist())
            """
        )
    )
    assert_survived(result)
    assert "undefined: sweep9_py::op: the op is not defined now" in result.stdout
    assert "again: [3.0, 3.0]" in result.stdout


def test_opcheck_compares_complex_values_whole():
    # A vmap_fn that conjugates passed: the comparison took the real parts alone.
    def double_it(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    op = opreg.register_vmap_op(
        double_it,
        fake_fn=empty,
        name=fresh("complex"),
        dtypes={"x": [torch.complex64]},
        vmap_fn=lambda x: torch.conj_physical(x * 2),
        fake_vmap_fn=empty,
    )
    with pytest.raises(opreg.OpcheckError, match="vmap failed"):
        opreg.opcheck(op, devices=["cpu"], checks=["vmap"])


def test_opcheck_checks_the_gradients_of_a_complex_op():
    # Complex inputs were left out of the gradients check: a conjugation error passed (S9-05).
    def square(x: torch.Tensor) -> torch.Tensor:
        return x * x

    def save_input(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    def define(backward, what):
        return opreg.register_vmap_op(
            square,
            fake_fn=empty,
            name=fresh(what),
            dtypes={"x": [torch.complex64, torch.complex128]},
            backward=backward,
            setup_context=save_input,
        )

    right = define(lambda ctx, grad: grad * 2 * ctx.saved_tensors[0].conj(), "complex_right")
    report = opreg.opcheck(right, devices=["cpu"], checks=["gradients"])
    assert not report.failures, str(report)
    assert [row for row in report.rows if not row.skipped], str(report)

    wrong = define(lambda ctx, grad: grad * 2 * ctx.saved_tensors[0], "complex_wrong")
    with pytest.raises(opreg.OpcheckError, match="gradcheck"):
        opreg.opcheck(wrong, devices=["cpu"], checks=["gradients"])


def test_opcheck_compares_the_gradients_of_a_complex64_only_op():
    def square(x: torch.Tensor) -> torch.Tensor:
        return x * x

    def wrong_backward(ctx, grad):
        return grad * 2 * ctx.saved_tensors[0]  # the conjugate is missing

    op = opreg.register_vmap_op(
        square,
        fake_fn=empty,
        name=fresh("complex64_wrong"),
        dtypes={"x": [torch.complex64]},
        backward=wrong_backward,
        setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]),
    )
    with pytest.raises(opreg.OpcheckError, match="the op's gradients differ from the fallback's"):
        opreg.opcheck(op, devices=["cpu"], checks=["gradients"])


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64], ids=str)
def test_opcheck_passes_a_correct_op_of_an_unsigned_dtype(dtype):
    # Its own vmap check added to these, which have no add on the CPU.
    def copy(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    op = opreg.register_vmap_op(copy, fake_fn=empty, name=fresh("unsigned"), dtypes={"x": [dtype]})
    assert not opreg.opcheck(op, devices=["cpu"], checks=["kernel_vs_fallback", "vmap"]).failures


def test_dunder_names_torch_ops_reaches_are_still_taken():
    # The ninth sweep's reviewer: '__foo' is an identifier torch.ops reaches; it was refused.
    for name in ("sweep8_dunder::__foo", "sweep8_dunder::__bar__"):
        op = opreg.register_vmap_op(
            lambda x: x * 2, fake_fn=empty, name=name, schema="(Tensor x) -> Tensor"
        )
        torch.testing.assert_close(op(torch.ones(2)), torch.full((2,), 2.0))


def test_opcheck_passes_a_correct_float8_op():
    def copy(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    op = opreg.register_vmap_op(
        copy, fake_fn=empty, name=fresh("float8"), dtypes={"x": [torch.float8_e4m3fn]}
    )
    # vmap drew its batch with randn_like, which has no float8 kernel
    assert not opreg.opcheck(op, devices=["cpu"], checks=["kernel_vs_fallback", "vmap"]).failures


def test_a_gradient_reaching_two_disconnected_outputs_names_both():
    def numpy_pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.from_numpy(np.sin(x.detach().numpy()))
        return y, y * 2

    op = opreg.register_vmap_op(
        numpy_pair,
        fake_fn=lambda x: (torch.empty_like(x), torch.empty_like(x)),
        name=fresh("numpy_two"),
    )
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    _, second = op(x)
    with pytest.warns(
        UserWarning, match="a gradient reached outputs 0, 1, which are not connected"
    ):
        (second.sum() + x.sum()).backward()


def test_a_declared_alias_computed_outside_autograd_warns_at_the_call(capfd):
    # Ninth sweep S9-13: a declared alias was left out of the check, and its gradient was
    # silently missing. It must stay the tensor the fallback returned (no node), so the warning
    # comes at the call; torch's own detach has this schema, so it is no error.
    def detached_view(x: torch.Tensor) -> torch.Tensor:
        return x.detach().view(-1)

    op = opreg.register_vmap_op(
        detached_view,
        fake_fn=lambda x: x.view(-1),
        name=fresh("alias_detached"),
        schema="(Tensor(a) x) -> Tensor(a)",
    )
    x = torch.randn(2, 3, requires_grad=True)
    capfd.readouterr()
    y = op(x)  # through torch.ops: C++'s warning handler, which writes to stderr
    assert "an input requires grad, but output 0 is not connected" in capfd.readouterr().err
    assert y.data_ptr() == x.data_ptr()  # still the fallback's own alias

    def view(x: torch.Tensor) -> torch.Tensor:
        return x.view(-1)

    connected = opreg.register_vmap_op(
        view, fake_fn=view, name=fresh("alias_view"), schema="(Tensor(a) x) -> Tensor(a)"
    )
    connected(x).sum().backward()
    assert "not connected" not in capfd.readouterr().err
    torch.testing.assert_close(x.grad, torch.ones(2, 3))
