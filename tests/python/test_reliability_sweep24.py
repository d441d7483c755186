"""Regression tests for the twenty-fourth adversarial sweep's findings (reports kept outside the
repository), beside the earlier sweeps' files."""

from __future__ import annotations

import re

import pytest
import torch
from torch import Tensor

import opreg
from opreg._registry import _C

# ---- A-F1: a vmap rule's outputs of every type that holds no tensor --------------------------

rule_output = {"value": None}


def op_returning(tag: str, out_type: str):
    op = opreg.custom_op(
        f"opreg_sweep24::{tag}", mutates_args=(), schema=f"(Tensor x) -> (Tensor, {out_type})"
    )(lambda x: (x.clone(), rule_output["value"]))
    op.register_vmap(lambda info, in_dims, x: ((x.clone(), rule_output["value"]), (0, None)))
    return op


@pytest.mark.parametrize(
    ("tag", "out_type", "value"),
    [
        ("ints_tensor", "int[]", torch.tensor([3, 4])),
        ("ints_int", "int[]", 3),
        ("floats", "float[]", 1.5),
        ("bools", "bool[]", torch.tensor([True, False])),
        ("symints", "SymInt[]", 3),
        ("scalar_none", "Scalar", None),
        ("scalar_tensor", "Scalar", torch.tensor([2.0, 3.0])),
        ("string_int", "str", 1),
        ("string_none", "str", None),
    ],
)
def test_a_vmap_rule_output_of_the_wrong_type_is_refused_as_the_fallbacks_is(tag, out_type, value):
    # torch.vmap returned these values as they came, where the fallback's were refused.
    op = op_returning(tag, out_type)
    rule_output["value"] = value
    with pytest.raises(TypeError, match=f"opreg_sweep24::{tag}: the fallback returned"):
        op(torch.ones(3))
    with pytest.raises(
        TypeError, match=f"opreg_sweep24::{tag}: the vmap rule returned .* output 1"
    ):
        torch.vmap(op, out_dims=(0, None))(torch.ones(2, 3))


@pytest.mark.parametrize(
    ("tag", "out_type", "value"),
    [("string_ok", "str", "s"), ("complex_ok", "Scalar", 1 + 2j), ("ints_ok", "int[]", [1, 2])],
)
def test_a_vmap_rule_may_return_what_the_fallback_may(tag, out_type, value):
    # A str, and a complex for a Scalar, were refused from a rule.
    op = op_returning(tag, out_type)
    rule_output["value"] = value
    assert op(torch.ones(3))[1] == value
    tensor, other = torch.vmap(op, out_dims=(0, None))(torch.ones(2, 3))
    assert other == value
    torch.testing.assert_close(tensor, torch.ones(2, 3))


def test_a_vmap_rule_int_beyond_64_bits_says_so():
    op = op_returning("huge", "int")
    rule_output["value"] = 2**70
    with pytest.raises(
        ValueError, match="the vmap rule returned 1180591620717411303424 for output"
    ):
        torch.vmap(op, out_dims=(0, None))(torch.ones(2, 3))


# ---- A-F2, A-F6: Dict and tuple types --------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "what"),
    [
        ("(Tensor x, Dict(str, float) y) -> Tensor", "argument 'y' has type Dict(str, float)"),
        ("(Tensor x, *, Dict(str, Tensor) y) -> Tensor", "argument 'y' has type Dict(str, Tensor)"),
        ("(Tensor x) -> Dict(str, Tensor)", "output '0' has type Dict(str, Tensor)"),
        ("(Tensor x) -> ((Tensor, Tensor))", "output '0' has type (Tensor, Tensor)"),
        ("(Tensor x, (int, int) y) -> Tensor", "argument 'y' has type (int, int)"),
    ],
)
def test_dict_and_tuple_types_are_refused_naming_the_argument(schema, what):
    # A Dict argument met functorch's internal assert under vmap, grad and jvp; a tuple output's
    # tensors escaped the no-alias check, so the fallback could hand back its input.
    kind = "Dict" if "Dict" in what else "tuple"
    with pytest.raises(ValueError, match=re.escape(what) + ", and "):
        opreg.register_triton_op(
            name="opreg_sweep24::container", schema=schema, fake_fn=None, triton_fn=None
        )(lambda x, y=None: x)
    with pytest.raises(ValueError, match=f"opreg ops take no {kind} type"):
        opreg.custom_op("opreg_sweep24::container", mutates_args=(), schema=schema)(
            lambda x, y=None: x
        )
    assert not _C.is_defined("opreg_sweep24::container")


# ---- A-F3: a companion's name after its op is undefined ---------------------------------------


def define_owner():
    """An op with a vmap_fn, whose companion is opreg_sweep24::owner_vmap."""
    opreg.register_vmap_op(
        lambda x: x * 2,
        fake_fn=lambda x: torch.empty_like(x),
        vmap_fn=lambda x: x * 3,
        fake_vmap_fn=lambda x: torch.empty_like(x),
        name="opreg_sweep24::owner",
        schema="(Tensor x) -> Tensor",
    )


def test_a_companion_name_is_free_once_its_op_is_undefined():
    define_owner()
    _C.undefine("opreg_sweep24::owner")
    assert not _C.is_defined("opreg_sweep24::owner_vmap")
    # It was refused: "torch.vmap of 'opreg_sweep24::owner' calls it".
    op = opreg.register_triton_op(
        name="opreg_sweep24::owner_vmap",
        schema="(Tensor x) -> Tensor",
        fake_fn=None,
        triton_fn=None,
    )(lambda x: x + 1)
    torch.testing.assert_close(op(torch.ones(2)), torch.full((2,), 2.0))
    # The owner defined again with vmap_fn would take it over: refused, the user's op kept.
    with pytest.raises(ValueError, match="owner_vmap"):
        define_owner()
    torch.testing.assert_close(op(torch.ones(2)), torch.full((2,), 2.0))


# ---- A-F4: opcheck's vmap check of a Tensor?[] holding None ------------------------------------


def test_opcheck_vmaps_an_optional_tensor_list_holding_none():
    op = opreg.register_triton_op(
        name="opreg_sweep24::sum_present",
        schema="(Tensor?[] xs) -> Tensor",
        fake_fn=lambda xs: torch.empty_like(next(t for t in xs if t is not None)),
        triton_fn=None,
    )(lambda xs: sum(t for t in xs if t is not None) * 1.0)
    report = opreg.opcheck(op, [([torch.ones(2), None, torch.ones(2)],)], raise_on_failure=False)
    vmap_rows = [row for row in report.rows if row.check == "vmap"]
    assert vmap_rows and all(row.passed for row in vmap_rows), [r.message for r in vmap_rows]


# ---- A-F5: a backward's arity where an output is a number -------------------------------------


def test_a_backward_of_the_wrong_arity_is_refused_when_an_output_is_a_number():
    @opreg.custom_op("opreg_sweep24::with_count", mutates_args=())
    def with_count(x: Tensor) -> tuple[Tensor, int]:
        return x * 2, 1

    # It was accepted, and the first backward failed with Python's bare TypeError.
    with pytest.raises(TypeError, match=r"backward is called as backward\(ctx, grad0, grad1\)"):
        with_count.register_autograd(lambda ctx, grad: grad * 2)
    with pytest.raises(TypeError, match=r"backward is called as backward\(ctx, grad0, grad1\)"):
        opreg.register_triton_op(
            name="opreg_sweep24::with_count_front",
            schema="(Tensor x) -> (Tensor, int)",
            fake_fn=None,
            triton_fn=None,
            backward=lambda ctx, grad: grad * 2,
        )(lambda x: (x * 2, 1))
    with_count.register_autograd(lambda ctx, grad, count_grad: (grad * 2,))
    x = torch.ones(3, requires_grad=True)
    with_count(x)[0].sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))


# ---- A-F7: vmap_out_dims without vmap_fn -------------------------------------------------------


@pytest.mark.parametrize("out_dims", [1, (0,), None])
def test_vmap_out_dims_without_vmap_fn_is_refused(out_dims):
    # It was accepted and ignored, where fake_vmap_fn and vmap_wrap_inputs are refused.
    with pytest.raises(ValueError, match=r"vmap_out_dims=.* is given without vmap_fn"):
        opreg.register_vmap_op(
            lambda x: x * 2,
            fake_fn=lambda x: torch.empty_like(x),
            name="opreg_sweep24::out_dims_alone",
            schema="(Tensor x) -> Tensor",
            vmap_out_dims=out_dims,
        )
    assert not _C.is_defined("opreg_sweep24::out_dims_alone")


# ---- B-F4: an AotLaunch kernel name that is not ASCII ------------------------------------------


@pytest.mark.parametrize(
    ("kernel", "shown"), [("é", "'é'"), ("ü_kernel", "'ü_kernel'"), ("a\tb", "'a\\x09b'")]
)
def test_a_kernel_name_that_is_no_identifier_is_shown_as_given(kernel, shown):
    # c10::printQuotedString wrote each UTF-8 byte as a signed octal escape: "\0)+\/.)" for 'é'.
    with pytest.raises(ValueError, match=f"aot_kernel names kernel {re.escape(shown)}, which"):
        opreg.register_triton_op(
            fake_fn=None,
            triton_fn=None,
            name="opreg_sweep24::unicode_aot_name",
            schema="(Tensor x) -> Tensor",
            aot=opreg.AotLaunch(kernel, ["1"], ["x"], "like:x"),
        )(lambda x: x * 2)


# ---- the 25th sweep: A-F1 (Tensor[][]) and A-F3 (a backward's arity with a number list) --------


@pytest.mark.parametrize(
    "schema",
    ["(Tensor[][] xs) -> Tensor", "(Tensor x) -> Tensor[][]", "(Tensor?[][] xs) -> Tensor"],
)
def test_a_list_of_tensor_lists_is_refused(schema):
    # Its tensors escaped torch.func (zero tangents), autograd policies and the alias check.
    with pytest.raises(ValueError, match="opreg ops take no list of tensor lists type"):
        opreg.custom_op("opreg_sweep25::nested", mutates_args=(), schema=schema)(lambda x: x)
    assert not _C.is_defined("opreg_sweep25::nested")


@pytest.mark.parametrize("numbers", ["int[]", "float[]"])
def test_a_backward_of_the_wrong_arity_is_refused_when_an_output_is_a_number_list(numbers):
    op = opreg.custom_op(
        f"opreg_sweep25::with_{numbers[:-2]}s",
        mutates_args=(),
        schema=f"(Tensor x) -> (Tensor, {numbers})",
    )(lambda x: (x * 2, [1]))
    with pytest.raises(TypeError, match=r"backward is called as backward\(ctx, grad0, grad1\)"):
        op.register_autograd(lambda ctx, grad: grad * 2)


@pytest.mark.parametrize(
    ("enum", "bad"), [("ScalarType", 999), ("Layout", 99), ("MemoryFormat", 99)]
)
def test_a_vmap_rule_enum_output_out_of_range_is_refused(enum, bad):
    # The 25th sweep's A-F4: the fallback's 999 was refused, a rule's was returned as it came.
    op = opreg.custom_op(
        f"opreg_sweep25::enum_{enum}", mutates_args=(), schema=f"(Tensor x) -> (Tensor, {enum})"
    )(lambda x: (x.clone(), bad))
    op.register_vmap(lambda info, in_dims, x: ((x.clone(), bad), (0, None)))
    with pytest.raises(
        TypeError, match=f"the vmap rule returned a Int for output 1, declared {enum}"
    ):
        torch.vmap(op, out_dims=(0, None))(torch.ones(2, 3))


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ("(Tensor x, Tensor[] y=[]) -> Tensor", "lists are only supported for float, int"),
        ("(Tensor x, float y=inf) -> Tensor", "invalid numeric default value"),
    ],
)
def test_custom_op_says_why_a_schema_cannot_be_parsed(schema, why):
    # The 25th sweep's A-F6: the message ended in "': " (torch's starts with a newline).
    with pytest.raises(ValueError, match=rf"cannot parse schema .*': {why}"):
        opreg.custom_op("opreg_sweep25::parse", mutates_args=(), schema=schema)(lambda x, y: x)


@pytest.mark.parametrize(
    "schema",
    [
        "(Tensor x, Future(int) f) -> Tensor",
        "(Tensor x, Await(int) a) -> Tensor",
        "(Tensor x, Stream s) -> Tensor",
        "(Tensor x) -> Union(Tensor, int)",
        "(Tensor x, int[][] n) -> Tensor",
    ],
)
def test_types_opreg_cannot_check_are_refused(schema):
    # The 25th sweep's B-F1..F3: a Future given None crashed the process, a Union output escaped
    # the alias check, a Stream took an int.
    with pytest.raises(ValueError, match=r"has type .*, and opreg ops take no such type"):
        opreg.custom_op("opreg_sweep25::unchecked", mutates_args=(), schema=schema)(
            lambda x, y=0: x
        )
    assert not _C.is_defined("opreg_sweep25::unchecked")


def test_the_types_opreg_checks_are_accepted():
    schema = (
        "(Tensor x, Tensor? w, Tensor[] xs, Tensor?[] ys, int n, SymInt s, float f, bool b, str t,"
        " Scalar c, ScalarType d, Layout l, MemoryFormat m, Device v, Generator? g, int[] ns,"
        " float[]? fs, complex z) -> Tensor"
    )
    op = opreg.custom_op("opreg_sweep25::all_kinds", mutates_args=(), schema=schema)(
        lambda x, *rest: x * 2
    )
    assert op._opoverload is not None
