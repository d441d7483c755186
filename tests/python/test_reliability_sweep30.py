"""Regression tests for the thirtieth adversarial sweep's findings (reports kept outside the
repository), beside the earlier sweeps' files."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import opreg


def test_opcheck_generates_a_valid_value_for_an_enum_argument():
    # A-F1: a MemoryFormat argument (whose type reads as int) was given 5, which is none, and a
    # correct op failed 60 of its 80 checks.
    @opreg.custom_op(
        "sweep30::formatted", mutates_args=(), schema="(Tensor x, MemoryFormat m) -> Tensor"
    )
    def formatted(x, m):
        return x.clone()

    report = opreg.opcheck(formatted, raise_on_failure=False)
    assert not report.failures, report.failures[0]
    assert any(r.passed and not r.skipped for r in report.rows)


def test_a_fakes_list_output_of_a_declared_length_is_checked():
    # A-F2: a fake returning 3 numbers for an int[2] output was taken, and compiled code that
    # used them made a tensor of the wrong shape.
    @opreg.custom_op("sweep30::shape2", mutates_args=(), schema="(Tensor x) -> int[2]")
    def shape2(x):
        return [x.shape[0], 2]

    shape2.register_fake(lambda x: [x.shape[0], 2, 1])
    assert shape2(torch.ones(4)) == [4, 2]
    with (
        FakeTensorMode() as mode,
        pytest.raises(ValueError, match=r"3 elements for output 0, expected 2"),
    ):
        shape2(mode.from_tensor(torch.ones(4)))


@pytest.mark.parametrize(
    ("schema", "real", "fake", "error", "message"),
    [
        (
            "(Tensor x) -> int",
            3,
            "3",
            TypeError,
            "returned <class 'str'> for output 0, expected int",
        ),
        ("(Tensor x) -> int[]", [1, 2], [1, "2"], TypeError, r"\(its element 1 is <class 'str'>\)"),
        ("(Tensor x) -> str", "a", "a\ud800", ValueError, "str for output 0 that is not UTF-8"),
        ("(Tensor x) -> float", 1.5, None, TypeError, "returned a Tensor for output 0, expected"),
    ],
)
def test_a_fakes_non_tensor_output_of_a_wrong_type_names_the_op(schema, real, fake, error, message):
    # A-F3: torch's conversion refused it with pybind11's "Unable to cast Python instance of type
    # <class 'str'> to C++ type '?'", naming neither the op nor the output.
    name = f"sweep30::wrong_fake_{abs(hash(schema))}"
    op = opreg.custom_op(name, mutates_args=(), schema=schema)(lambda x: real)
    op.register_fake(lambda x: torch.tensor(1.5) if fake is None else fake)
    mode = FakeTensorMode()
    with mode, pytest.raises(error, match=f"{name}: its fake .*{message}"):
        op(mode.from_tensor(torch.ones(3)))


def test_a_fakes_symbolic_int_output_is_not_specialized():
    # The check above converts plain values only: a SymInt would be pinned to one value.
    @opreg.custom_op("sweep30::nonzero_count", mutates_args=(), schema="(Tensor x) -> SymInt")
    def nonzero_count(x):
        return int(x.count_nonzero())

    nonzero_count.register_fake(lambda x: torch.library.get_ctx().new_dynamic_size())

    class Ones(torch.nn.Module):
        def forward(self, x):
            return torch.ones(nonzero_count(x))

    exported = torch.export.export(Ones(), (torch.ones(3),)).module()
    assert exported(torch.tensor([1.0, 0.0, 2.0])).shape == (2,)


@pytest.mark.parametrize("schema", ["(Tensor x) -> str[]?", "(Tensor x) -> str?[]"])
def test_a_lone_surrogate_in_an_optional_str_list_is_named(schema):
    # A-F4 and B-F1: str[]? said "returned list, expected str[]?", str?[] said its element was
    # a str (which that list holds).
    name = "sweep30::words_" + ("optional_list" if schema.endswith("?") else "optional_str")
    op = opreg.custom_op(name, mutates_args=(), schema=schema)(
        lambda x: ["ok", None if schema.endswith("?[]") else "b", "a\udcff"]
    )
    with pytest.raises(
        TypeError, match=r"its element 2 is a str that is not UTF-8: 'a\\udcff' holds a lone"
    ):
        op(torch.ones(1))


@pytest.mark.parametrize(
    "schema", ["(Tensor x) -> str[]", "(Tensor x) -> (Tensor, str)", "(Tensor x) -> str?"]
)
def test_opcheck_passes_a_correct_op_with_str_outputs(schema):
    # A-F5: torch's opcheck row failed with AOTAutograd's "Expected code to be unreachable", and
    # the compile row with Dynamo's "torch.* op returned non-Tensor", for a correct op.
    def fn(x):
        return {"str[]": ["a"], "(Tensor, str)": (x.clone(), "a"), "str?": "a"}[schema[14:]]

    op = opreg.custom_op(f"sweep30::str_out_{len(schema)}", mutates_args=(), schema=schema)(fn)
    op.register_fake(fn)
    report = opreg.opcheck(op, raise_on_failure=False)
    assert not report.failures, report.failures[0]
    torch_rows = [r for r in report.rows if r.check == "torch_opcheck"]
    assert torch_rows and all(r.passed and not r.skipped for r in torch_rows)
    assert "test_aot_dispatch_dynamic skipped" in torch_rows[0].message
    assert all(r.skipped for r in report.rows if r.check == "compile")


def test_a_lone_surrogate_in_an_op_name_or_path_is_named():
    # A-F6: pybind11's "incompatible function arguments" for describe_op and kernel_status, a
    # bare UnicodeEncodeError for load_library.
    for function in (opreg.describe_op, opreg.kernel_status):
        with pytest.raises(ValueError, match=r"'ns::a\\ud800' holds a lone surrogate"):
            function("ns::a\ud800")
    with pytest.raises(ValueError, match=r"load_library: 'path' '/tmp/a\\ud800.so' holds a lone"):
        opreg.load_library("/tmp/a\ud800.so")


def test_a_complex_gradient_for_a_real_input_names_the_op():
    # A-F7: torch's engine check ("Expected isFloatingType(grad.scalar_type()) || ...") reached
    # the user without the op's name.
    def sin(x: torch.Tensor) -> torch.Tensor:
        return x.sin()

    op = opreg.register_triton_op(
        fake_fn=torch.empty_like,
        triton_fn=None,
        name="sweep30::complex_grad",
        setup_context=lambda ctx, inputs, output: None,
        backward=lambda ctx, grad: grad.to(torch.complex128),
    )(sin)
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    with pytest.raises(
        RuntimeError,
        match=r"sweep30::complex_grad: backward's gradient for input 'x' is ComplexDouble, which "
        r"cannot stand for the input's Double; return a real gradient",
    ):
        op(x).sum().backward()
