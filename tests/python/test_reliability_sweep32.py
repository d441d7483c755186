"""Regression tests for the thirty-second adversarial sweep's findings (reports kept outside the
repository), beside the earlier sweeps' files."""

from __future__ import annotations

import pytest
import torch

import opreg

SURROGATE = "\ud800"


def _plus_one(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@pytest.mark.parametrize(
    ("define", "message"),
    [
        (
            lambda: opreg.custom_op(
                "sweep32::str_default",
                mutates_args=(),
                schema=f"(Tensor x, str m='a{SURROGATE}') -> Tensor",
            )(lambda x, m: x + 1),
            "op 'sweep32::str_default': schema .* holds a lone surrogate",
        ),
        (
            lambda: opreg.register_vmap_op(
                fake_fn=None,
                name="sweep32::vmap_default",
                schema=f"(Tensor x, str m='{SURROGATE}') -> Tensor",
            )(lambda x, m: x),
            "op 'sweep32::vmap_default': schema .* holds a lone surrogate",
        ),
        (
            lambda: opreg.register_triton_op(
                fake_fn=torch.empty_like,
                triton_fn=None,
                name="sweep32::dtypes_key",
                dtypes={f"x{SURROGATE}": [torch.float32]},
            )(_plus_one),
            r"op 'sweep32::dtypes_key': dtypes= argument name 'x\\ud800' holds a lone surrogate",
        ),
        (
            lambda: opreg.AotLaunch(kernel=f"k{SURROGATE}", grid=("1",), arguments=("x",)),
            r"opreg.AotLaunch: field 'kernel' 'k\\ud800' holds a lone surrogate",
        ),
        (
            lambda: opreg.AotLaunch(kernel="k", grid=(f"1{SURROGATE}",), arguments=("x",)),
            r"opreg.AotLaunch: field 'grid' '1\\ud800' holds a lone surrogate",
        ),
    ],
)
def test_a_lone_surrogate_given_to_the_builder_is_named(define, message):
    # A-F3: pybind11's "incompatible function arguments" or "Unable to cast ... to C++ type '?'".
    with pytest.raises(ValueError, match=message):
        define()
    assert not [r.name for r in opreg.describe_ops() if r.name.startswith("sweep32::")]


@pytest.mark.parametrize("schema", ["(Tensor x) -> str", "(Tensor x) -> (Tensor, Device)"])
def test_a_fakes_symbolic_number_for_an_output_of_another_type_is_named(schema):
    # A-F4: a SymInt skipped the output check, and torch's conversion said "Unable to cast Python
    # instance of type <class 'torch.SymInt'> to C++ type '?'".
    name = "sweep32::sym_" + ("str" if schema.endswith("str") else "device")
    op = opreg.custom_op(name, mutates_args=(), schema=schema)(
        lambda x: "a" if schema.endswith("str") else (x.clone(), x.device)
    )
    op.register_fake(
        lambda x: x.shape[0] if schema.endswith("str") else (torch.empty_like(x), x.shape[0])
    )
    index = 0 if schema.endswith("str") else 1
    with pytest.raises(
        Exception, match=rf"{name}: its fake returned a SymInt for output {index}, expected"
    ):
        torch.compile(op, backend="eager", dynamic=True, fullgraph=True)(torch.ones(3))


def test_opcheck_from_two_threads_runs_one_at_a_time():
    # A-F10: two threads' opchecks compiled at once, which PyTorch does not support: 9 to 11
    # false failures, and later compiles in the process failed too.
    import threading

    @opreg.custom_op("sweep32::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    twice.register_fake(torch.empty_like)
    reports = []
    threads = [
        threading.Thread(
            target=lambda: reports.append(opreg.opcheck(twice, raise_on_failure=False))
        )
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(reports) == 2
    for report in reports:
        assert not report.failures, report.failures[0]
    assert not opreg.opcheck(twice, raise_on_failure=False).failures


def test_an_integer_gradient_for_a_complex_input_names_the_op():
    # B-F10: torch's engine check ("Expected isFloatingType(grad.scalar_type()) || ...").
    op = opreg.register_triton_op(
        fake_fn=torch.empty_like,
        triton_fn=None,
        name="sweep32::integer_grad",
        setup_context=lambda ctx, inputs, output: None,
        backward=lambda ctx, grad: torch.ones(grad.shape, dtype=torch.int64),
    )(_plus_one)
    x = torch.ones(2, dtype=torch.complex64, requires_grad=True)
    with pytest.raises(
        RuntimeError,
        match=r"sweep32::integer_grad: backward's gradient for input 'x' is Long, which cannot "
        r"stand for the input's ComplexFloat; return a floating or complex gradient",
    ):
        op(x).sum().abs().backward()


def test_compiled_autograd_over_a_disconnected_output_names_the_op():
    # B-F8: "compiled_args not implemented: DisconnectedOutput" and C++ frames.
    import torch._dynamo.compiled_autograd as compiled_autograd

    @opreg.custom_op("sweep32::constant", mutates_args=())
    def op(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(x.detach().numpy() + 1)  # outside autograd

    x = torch.ones(2, requires_grad=True)
    with (
        pytest.raises(NotImplementedError) as error,
        compiled_autograd._enable(torch.compile(backend="eager")),
    ):
        op(x).sum().backward()
    assert str(error.value).startswith(
        "sweep32::constant: torch's compiled autograd cannot trace this opreg op's backward"
    )


def test_opcheck_names_the_list_output_of_another_length():
    # A-F8: "2 outputs, the fallback gives 1" for an op with one str[] output.
    if not opreg.has_triton():
        pytest.skip("the Python front registers triton_fn only when Triton works")

    @opreg.register_triton_op(
        fake_fn=lambda x: ["a"],
        triton_fn=lambda x: ["a", "b"],
        triton_device_types="cpu",
        name="sweep32::words",
        schema="(Tensor x) -> str[]",
    )
    def words(x):
        return ["a"]

    report = opreg.opcheck(
        words,
        [(torch.ones(1),)],
        devices=["cpu"],
        checks=["kernel_vs_fallback"],
        raise_on_failure=False,
    )
    assert report.failures[0].message == "output 0 has 2 values, the fallback's 1"


def test_opcheck_runs_the_kernel_on_the_samples_own_layout():
    # B-F1: kernel_vs_fallback ran on contiguous copies, so a kernel that reads strides wrongly
    # passed on a strided sample.
    if not opreg.has_triton():
        pytest.skip("the Python front registers triton_fn only when Triton works")

    @opreg.register_triton_op(
        fake_fn=torch.empty_like,
        triton_fn=lambda x: x.as_strided(x.shape, (1,)) * 2,
        triton_device_types="cpu",
        name="sweep32::dense_only",
    )
    def dense_only(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    check = dict(devices=["cpu"], checks=["kernel_vs_fallback"], raise_on_failure=False)
    assert not opreg.opcheck(dense_only, [(torch.arange(4.0),)], **check).failures
    strided = torch.arange(8.0)[::2]
    (row,) = opreg.opcheck(dense_only, [(strided,)], **check).failures
    assert "output 0 differs from the fallback's" in row.message
    assert torch.equal(strided, torch.arange(8.0)[::2])


@pytest.mark.parametrize(
    ("schema", "value", "message"),
    [
        ("(Tensor x) -> bool", None, r"returned None \(<class 'NoneType'>\) for output 0"),
        ("(Tensor x) -> bool", 0.5, r"returned 0.5 \(<class 'float'>\) for output 0"),
        ("(Tensor x) -> bool[]", [True, 1j], r"returned 1j \(<class 'complex'>\) as an element of"),
        ("(Tensor x) -> bool?", 0.0, r"returned 0.0 \(<class 'float'>\) for output 0"),
    ],
)
def test_a_bool_output_must_be_a_bool(schema, value, message):
    # B-F6: pybind11's bool caster took None as False and 0.5 or 1j as True, silently.
    name = f"sweep32::not_bool_{abs(hash((schema, repr(value))))}"
    op = opreg.custom_op(name, mutates_args=(), schema=schema)(lambda x: value)
    with pytest.raises(TypeError, match=f"{name}: the fallback {message}"):
        op(torch.zeros(1))


def test_bool_outputs_of_bools_numpy_bools_and_tensors_pass():
    import numpy

    op = opreg.custom_op("sweep32::bools", mutates_args=(), schema="(Tensor x) -> (bool, bool[])")(
        lambda x: (numpy.bool_(True), [False, x.any()])
    )
    assert op(torch.zeros(1)) == (True, [False, False])


@pytest.mark.parametrize("how", ["needs", "opens with dlopen"])
def test_a_library_a_load_brought_in_and_written_again_is_refused(test_ops_library, tmp_path, how):
    # B-F2: a library a load brought in (one the loaded library needs, or opens with a plain
    # dlopen) had no record of its file: written again in place, a load of its path reported
    # success and defined none of the new file's ops.
    import os
    import subprocess
    import sys
    import textwrap

    from test_reliability import PYTHONPATH_SETUP, assert_survived

    def scripted(name: str) -> str:
        return str(test_ops_library.parent / f"libopreg_scripted_{name}.so")

    outer, inner = ("needy", "dep") if how == "needs" else ("a", "c")
    inner_path = tmp_path / f"libopreg_scripted_{inner}.so"
    outer_path = tmp_path / f"libopreg_scripted_{outer}.so"
    script = "def:outer:1" + ("" if how == "needs" else f";dlopen:{inner_path}")
    code = textwrap.dedent(
        f"""
        import os, shutil, time
        os.environ["OPREG_SCRIPT_{outer}"] = {script!r}
        os.environ["OPREG_SCRIPT_{inner}"] = "def:inner:2"
        import opreg
        shutil.copy({scripted(inner)!r}, {str(inner_path)!r})
        shutil.copy({scripted(outer)!r}, {str(outer_path)!r})
        opreg.load_library({str(outer_path)!r})
        time.sleep(0.01)
        os.utime({str(inner_path)!r})  # written again, in place
        try:
            opreg.load_library({str(inner_path)!r})
            print("loaded")
        except ValueError as error:
            print("refused:", error)
        """
    )
    result = subprocess.run(  # the dynamic loader finds the needed library in LD_LIBRARY_PATH
        [sys.executable, "-c", PYTHONPATH_SETUP + code],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "LD_LIBRARY_PATH": str(tmp_path)},
    )
    assert_survived(result)
    assert (
        f"refused: opreg::load_library: cannot load '{inner_path}': a library was loaded from "
        "that path earlier in this process, from another file than the one there now"
    ) in result.stdout, result.stdout


def test_opcheck_passes_an_op_whose_output_does_not_depend_on_its_input():
    # B-F12: the gradients row met "element 0 of tensors does not require grad": the fallback's
    # side of the comparison was called outside autograd, and nothing reached its output.
    @opreg.custom_op("sweep32::constant_ones", mutates_args=())
    def constant_ones(x: torch.Tensor) -> torch.Tensor:
        return torch.ones(3, dtype=x.dtype, device=x.device)

    with pytest.warns(UserWarning, match="not connected to its inputs"):
        report = opreg.opcheck(
            constant_ones, [(torch.zeros(2),)], devices=["cpu"], checks=["gradients"]
        )
    assert all(r.passed for r in report.rows)


def test_opcheck_compares_quantized_outputs_by_value():
    # B-F9: "Creation of quantized tensor requires quantized dtype like torch.quint8".
    if not opreg.has_triton():
        pytest.skip("the Python front registers triton_fn only when Triton works")

    @opreg.register_triton_op(
        fake_fn=None,
        triton_fn=lambda x: torch.quantize_per_tensor(x + 1, 0.1, 0, torch.quint8),
        triton_device_types="cpu",
        name="sweep32::quantized",
    )
    def quantized(x: torch.Tensor) -> torch.Tensor:
        return torch.quantize_per_tensor(x, 0.1, 0, torch.quint8)

    report = opreg.opcheck(
        quantized,
        [(torch.ones(2),)],
        devices=["cpu"],
        checks=["kernel_vs_fallback"],
        raise_on_failure=False,
    )
    assert "output 0 differs from the fallback's by up to 1" in report.failures[0].message


def test_a_cpp_c10_error_of_bytes_that_are_not_utf8_keeps_its_type_and_message(test_ops_library):
    # B-F13: a C++ fallback's TORCH_CHECK_VALUE with a 0xfe byte reached Python as a bare
    # UnicodeDecodeError ("can't decode byte 0xfe"): the op's message was lost.
    with pytest.raises(ValueError, match=r"bad \\xfe value"):
        torch.ops.opreg_test.throws_bytes(torch.ones(2))


def test_opcheck_shows_the_first_element_apart_where_a_value_is_infinite():
    # A-F8: a complex output of inf+1j against the fallback's inf+0j was said to differ "by up to
    # 0, more than atol" (the difference is NaN there).
    def fallback(x: torch.Tensor) -> torch.Tensor:
        return torch.complex(x.real * float("inf"), x.real * 0)

    def kernel(x: torch.Tensor) -> torch.Tensor:
        return torch.complex(x.real * float("inf"), x.real)

    op = opreg.register_triton_op(
        fake_fn=None, triton_fn=kernel, triton_device_types="cpu", name="sweep32::inf_complex"
    )(fallback)
    sample = opreg.Sample((torch.tensor([0.0, 2.0], dtype=torch.complex64),))
    report = opreg.opcheck(op, [sample], checks=["kernel_vs_fallback"], raise_on_failure=False)
    [failure] = report.failures
    assert "output 0 at index [1] is (inf+2j), the fallback's (inf+0j)" in failure.message


def test_opcheck_compares_nested_outputs_component_by_component():
    # Nested outputs met "NestedTensorImpl doesn't support sizes" in kernel_vs_fallback.
    def fallback(x: torch.Tensor) -> torch.Tensor:
        return torch.nested.nested_tensor([x, x[:1]])

    def kernel(x: torch.Tensor) -> torch.Tensor:
        return torch.nested.nested_tensor([x, x[:1] * 2])

    def check(name, kernel):
        op = opreg.register_triton_op(
            fake_fn=None, triton_fn=kernel, triton_device_types="cpu", name=f"sweep32::{name}"
        )(fallback)
        sample = opreg.Sample((torch.ones(3),))
        return opreg.opcheck(op, [sample], checks=["kernel_vs_fallback"], raise_on_failure=False)

    assert not check("nested_same", fallback).failures
    [failure] = check("nested_apart", kernel).failures
    assert "output 0 component 1 differs from the fallback's by up to 1" in failure.message
    [failure] = check("nested_fewer", lambda x: torch.nested.nested_tensor([x])).failures
    assert "output 0 has 1 components, the fallback's 2" in failure.message
