"""Edges found by the second adversarial sweep: declarations that were accepted and then misread
(defaults of the wrong type, text after a NUL, conflicting keywords, device names where device
types belong), outputs that escaped the alias check, arguments that reached Python pieces in the
wrong form, vmap's randomness='same', and mistakes that surfaced as pybind's or Python's own
errors instead of a message naming the op."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import torch

import opreg
from opreg import _C


def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def empty_like(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def define(name: str, fn=twice, **options):
    options.setdefault("fake_fn", empty_like)
    options.setdefault("schema", "(Tensor x) -> Tensor")
    return opreg.register_vmap_op(fn, name=name, **options)


def assert_not_defined(name: str) -> None:
    with pytest.raises(ValueError):
        opreg.describe_op(name)


# ---- schemas ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ("(Tensor x, int a=1.5) -> Tensor", r"argument 'a' has the default 1\.5.*expected a int"),
        (
            "(Tensor x, bool flag=1) -> Tensor",
            r"'flag' has the default 1.*expected a bool",
        ),
        ("(Tensor x, str s=1) -> Tensor", r"argument 's' has the default 1.*expected a str"),
        ("(Tensor x, int a=None) -> Tensor", r"argument 'a' has the default None"),
    ],
)
def test_a_default_of_the_wrong_type_is_refused(schema, words):
    with pytest.raises(ValueError, match=words):
        define(
            "edges::bad_default",
            lambda x, *rest: x * 2,
            fake_fn=lambda x, *rest: torch.empty_like(x),
            schema=schema,
        )
    assert_not_defined("edges::bad_default")


def test_defaults_of_the_right_type_are_kept():
    def scaled(x, a: int = 2, alpha: float = 1, flag: bool = False, dtype=None):
        return x * a * alpha

    op = define(
        "edges::good_default",
        scaled,
        fake_fn=lambda x, a=2, alpha=1.0, flag=False, dtype=None: torch.empty_like(x),
        schema="(Tensor x, int a=2, float alpha=1, bool flag=False, ScalarType? dtype=None) "
        "-> Tensor",
    )
    assert torch.equal(op(torch.ones(2)), torch.full((2,), 2.0))


def test_text_after_a_nul_in_the_schema_is_refused():
    with pytest.raises(ValueError, match="NUL character at position"):
        define("edges::nul", schema="(Tensor x) -> Tensor\x00junk")
    assert_not_defined("edges::nul")


def test_a_schema_parse_error_carries_no_cpp_backtrace():
    with pytest.raises(ValueError) as error:
        define("edges::unparsed", schema="(Tensor x, Tensr y) -> Tensor")
    message = str(error.value)
    assert "edges::unparsed" in message and "Tensr" in message
    assert "frame #" not in message and "Exception raised from" not in message
    assert_not_defined("edges::unparsed")


def test_a_name_with_an_overload_is_refused_before_the_schema_is_read():
    # An op is defined by its name alone (the seventh sweep: 'ns::op.overload' defined one).
    with pytest.raises(ValueError, match=r"'ovd\.default' is not an identifier"):
        define("edges::ovd.default")
    assert_not_defined("edges::ovd")


# ---- keywords and names -------------------------------------------------------------------------


def test_a_name_that_is_not_a_string_names_the_keyword():
    with pytest.raises(TypeError, match=r"name must be a string like 'ns::op', got 5"):
        define(5)


def test_a_non_ascii_name_is_refused_before_the_schema_is_read():
    with pytest.raises(ValueError, match="non-ASCII"):
        define("edges::caf\u00e9")


def test_a_callable_object_without_a_name_asks_for_one():
    class Scale:
        def __call__(self, x):
            return x * 3

    with pytest.raises(TypeError, match=r"has no __name__ .*pass name="):
        opreg.register_vmap_op(Scale(), fake_fn=empty_like, schema="(Tensor x) -> Tensor")
    op = define("edges::callable_object", Scale(), schema="(Tensor x) -> Tensor")
    assert torch.equal(op(torch.ones(2)), torch.full((2,), 3.0))


def test_decorating_something_that_is_not_callable_says_so():
    with pytest.raises(TypeError, match="must be callable, got int"):
        opreg.register_vmap_op(fake_fn=empty_like)(5)


@pytest.mark.parametrize(
    ("types", "error", "words"),
    [
        ("cuda:0", ValueError, r"'cuda:0' is a device; name its type \('cuda'\)"),
        ("", ValueError, "'' is not a device type name"),
        (["cuda", 5], TypeError, "expected device type names like 'cuda', got 5"),
        (5, TypeError, "must be a device type or a list of them, got 5"),
    ],
)
def test_triton_device_types_take_device_types(types, error, words):
    with pytest.raises(error, match=r"edges::types': triton_device_types.*" + words):
        opreg.register_triton_op(
            name="edges::types", fake_fn=empty_like, triton_fn=twice, triton_device_types=types
        )(twice)
    assert_not_defined("edges::types")


def test_a_flag_and_its_alias_together_are_refused():
    with pytest.raises(TypeError, match="vmap_loop is another name for vmap_per_example_loop"):
        define("edges::alias", vmap_loop=True, vmap_per_example_loop=False)
    assert_not_defined("edges::alias")


def test_setup_context_without_backward_is_refused():
    with pytest.raises(ValueError, match="setup_context is given without backward"):
        define("edges::setup", setup_context=lambda ctx, inputs, output: None)
    assert_not_defined("edges::setup")


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"replace": "yes"}, "replace must be True or False, got 'yes'"),
        ({"dtypes": {5: [torch.float32]}}, "dtypes must map argument names"),
    ],
)
def test_keywords_of_the_wrong_type_name_the_keyword(options, words):
    with pytest.raises(TypeError, match=words):
        define("edges::kw", **options)
    assert_not_defined("edges::kw")


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"backward": lambda: None}, r"backward is called as backward\(ctx, grad0\)"),
        (
            {"backward": lambda ctx, g: g, "setup_context": lambda ctx: None},
            r"setup_context is called as setup_context\(ctx, inputs, output\)",
        ),
        ({"vmap": lambda info: None}, r"vmap is called as vmap\(info, in_dims, x\)"),
    ],
)
def test_autograd_and_vmap_pieces_that_cannot_be_called_are_refused_at_definition(options, words):
    with pytest.raises(TypeError, match=words):
        define("edges::sig", **options)
    assert_not_defined("edges::sig")


def test_two_dtype_rules_for_one_argument_are_refused():
    builder = _C.OpBuilder("edges::dtypes2(Tensor x) -> Tensor")
    builder.fallback(twice)
    builder.dtypes("x", [torch.float32])
    builder.dtypes("x", [torch.float64])
    with pytest.raises(ValueError, match="dtypes\\(\\) is given twice for argument 'x'"):
        _C.define_all([builder], {})
    assert_not_defined("edges::dtypes2")


# ---- outputs ------------------------------------------------------------------------------------


def test_a_tensor_list_output_aliasing_an_input_is_refused():
    op = define(
        "edges::list_alias",
        lambda x: [x, x * 2],
        fake_fn=lambda x: [torch.empty_like(x), torch.empty_like(x)],
        schema="(Tensor x) -> Tensor[]",
    )
    with pytest.raises(RuntimeError, match="edges::list_alias: the fallback returned output 0 "):
        op(torch.ones(2))


def test_an_optional_tensor_output_aliasing_an_input_is_refused():
    op = define(
        "edges::optional_alias",
        lambda x: x,
        fake_fn=lambda x: torch.empty_like(x),
        schema="(Tensor x) -> Tensor?",
    )
    with pytest.raises(RuntimeError, match="sharing memory with an input"):
        op(torch.ones(2))
    fresh = define(
        "edges::optional_fresh",
        lambda x: None,
        fake_fn=lambda x: None,
        schema="(Tensor x) -> Tensor?",
    )
    assert fresh(torch.ones(2)) is None


def test_a_tensor_list_input_aliased_by_an_output_is_refused():
    op = define(
        "edges::list_input",
        lambda xs: xs[1],
        fake_fn=lambda xs: torch.empty_like(xs[1]),
        schema="(Tensor[] xs) -> Tensor",
    )
    with pytest.raises(RuntimeError, match="sharing memory with an input"):
        op([torch.ones(2), torch.ones(2)])


def test_a_value_returned_for_a_schema_that_returns_nothing_is_refused():
    op = define("edges::nothing", fake_fn=lambda x: None, schema="(Tensor x) -> ()")
    with pytest.raises(TypeError, match=r"edges::nothing: the fallback returned .*expected None"):
        op(torch.ones(2))


def test_a_python_fake_returning_its_input_is_refused():
    op = define("edges::fake_alias", fake_fn=lambda x: x)
    with pytest.raises(RuntimeError, match="'edges::fake_alias': its fake returned output 0 sha"):
        op(torch.ones(2, device="meta"))


# ---- arguments ----------------------------------------------------------------------------------


def test_scalar_type_layout_and_memory_format_reach_python_as_torch_objects():
    seen = {}

    def convert(x, dtype, layout, memory_format, maybe_dtype=None):
        seen.update(dtype=dtype, layout=layout, memory_format=memory_format, maybe=maybe_dtype)
        return x.to(dtype).clone()

    op = define(
        "edges::dtype_arg",
        convert,
        fake_fn=lambda x, dtype, layout, memory_format, maybe_dtype=None: x.to(dtype).clone(),
        schema="(Tensor x, ScalarType dtype, Layout layout, MemoryFormat memory_format, "
        "ScalarType? maybe_dtype=None) -> Tensor",
    )
    out = op(torch.ones(2), torch.float64, torch.strided, torch.contiguous_format, torch.int32)
    assert out.dtype == torch.float64
    assert seen == {
        "dtype": torch.float64,
        "layout": torch.strided,
        "memory_format": torch.contiguous_format,
        "maybe": torch.int32,
    }
    op(torch.ones(2), torch.float16, torch.strided, torch.preserve_format)
    assert seen["maybe"] is None and seen["dtype"] is torch.float16


def test_call_fallback_refuses_extra_and_mistyped_arguments():
    define("edges::fallback_args")
    with pytest.raises(TypeError, match="edges::fallback_args: 2 positional arguments given"):
        _C.call_fallback("edges::fallback_args", [torch.ones(2), torch.ones(2)], {})
    with pytest.raises(TypeError, match="argument 'x' is a <class 'str'>, expected Tensor"):
        _C.call_fallback("edges::fallback_args", ["no"], {})
    with pytest.raises(TypeError, match="unexpected keyword argument 'y'"):
        _C.call_fallback("edges::fallback_args", [torch.ones(2)], {"y": 1})


# ---- what Python pieces return ------------------------------------------------------------------


@pytest.mark.parametrize("answer", ["yes", [True], torch.tensor(True), 1])
def test_an_accepts_that_does_not_return_a_bool_names_the_kernel(answer):
    op = opreg.register_triton_op(
        name="edges::accepts",
        fake_fn=empty_like,
        triton_fn=twice,
        triton_device_types=["cpu"],
        triton_accepts=lambda x: answer,
        replace=True,
    )(twice)
    with pytest.raises(TypeError, match="edges::accepts: the accepts of kernel 'triton' returned"):
        op(torch.ones(2))


@pytest.mark.parametrize(
    ("result", "words"),
    [
        (lambda x: (x * 2, "zero"), "its vmap rule returned out_dims 'zero'"),
        (lambda x: (x * 2, ("zero",)), "out_dims holds a <class 'str'>"),
        (lambda x: (x * 2, 1.5), "its vmap rule returned out_dims 1.5"),
        (lambda x: ("text", 0), "the vmap rule returned a <class 'str'> among its outputs"),
        (lambda x: None, r"vmap rule must return \(outputs, out_dims\), got NoneType"),
    ],
)
def test_a_vmap_rule_returning_the_wrong_things_names_the_op(result, words):
    op = define(
        "edges::rule", vmap=lambda info, in_dims, x: result(x.movedim(in_dims[0], 0)), replace=True
    )
    with pytest.raises(TypeError, match="edges::rule.*" + words):
        torch.vmap(op)(torch.ones(3, 2))


def test_a_boxed_vmap_rule_returning_the_wrong_things_names_the_op():
    builder = _C.OpBuilder("edges::boxed_rule(Tensor x) -> Tensor")
    builder.fallback(twice)
    builder.vmap(lambda batch_size, randomness, in_dims, args: None)
    _C.define_all([builder], {})
    with pytest.raises(
        TypeError, match=r"edges::boxed_rule: the vmap rule returned a <class 'NoneType'>"
    ):
        torch.vmap(torch.ops.edges.boxed_rule)(torch.ones(3, 2))


# ---- vmap randomness ----------------------------------------------------------------------------


def random_op(name: str, **options):
    return define(name, lambda x: torch.rand_like(x) + x, random=True, **options)


@pytest.mark.parametrize("batch_polymorphic", [False, True])
def test_vmap_randomness_same_draws_the_same_numbers_for_every_example(batch_polymorphic):
    op = random_op(f"edges::random_{int(batch_polymorphic)}", batch_polymorphic=batch_polymorphic)
    same = torch.vmap(op, randomness="same")(torch.zeros(4, 3))
    assert all(torch.equal(same[0], row) for row in same[1:])
    different = torch.vmap(op, randomness="different")(torch.zeros(4, 3))
    assert not torch.equal(different[0], different[1])
    with pytest.raises(RuntimeError, match="randomness='error'"):
        torch.vmap(op)(torch.zeros(4, 3))


def test_vmap_randomness_same_matches_torch_for_the_same_seed():
    op = random_op("edges::random_seeded")
    torch.manual_seed(7)
    ours = torch.vmap(op, randomness="same")(torch.zeros(4, 3))
    torch.manual_seed(7)
    theirs = torch.vmap(lambda x: torch.rand_like(x) + x, randomness="same")(torch.zeros(4, 3))
    assert torch.equal(ours, theirs)


# ---- public functions given the wrong types -----------------------------------------------------


@pytest.mark.parametrize("function", [opreg.describe_op, opreg.kernel_status])
def test_functions_taking_an_op_name_refuse_other_types_by_name(function):
    with pytest.raises(
        TypeError, match=rf"opreg.{function.__name__}: expected an op name .*got int"
    ):
        function(5)


# ---- opcheck ------------------------------------------------------------------------------------


def test_opcheck_refuses_an_empty_list_of_samples():
    op = define("edges::opcheck_empty")
    with pytest.raises(ValueError, match="edges::opcheck_empty: samples= is empty"):
        opreg.opcheck(op, samples=[])


def test_opcheck_checks_the_gradients_of_a_random_op_with_fixed_draws():
    op = define(
        "edges::noisy",
        lambda x: x * torch.rand_like(x),
        random=True,
        backward=None,
    )
    report = opreg.opcheck(op, checks=["gradients"], samples=[(torch.randn(5),)])
    assert report.rows and not report.failures, report


def test_opcheck_still_fails_a_random_op_with_a_wrong_backward():
    op = define(
        "edges::noisy_wrong",
        lambda x: x * torch.rand_like(x),
        random=True,
        backward=lambda ctx, grad: grad * 3,
        setup_context=lambda ctx, inputs, output: None,
    )
    report = opreg.opcheck(
        op, checks=["gradients"], samples=[(torch.randn(5),)], raise_on_failure=False
    )
    assert report.failures and "Jacobian mismatch" in report.failures[0].message, report


def test_a_schema_cannot_be_inferred_from_a_callable_object():
    class Scale:
        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            return x * 5

    with pytest.raises(ValueError, match=r"edges::inferred': no schema= given.*Scale object"):
        opreg.register_triton_op(fake_fn=None, triton_fn=None, name="edges::inferred")(Scale())
    assert_not_defined("edges::inferred")


@pytest.mark.parametrize(
    ("schema", "value", "what"),
    [
        ("(Tensor x, ScalarType d) -> Tensor", 99, "ScalarType"),
        ("(Tensor x, ScalarType d) -> Tensor", -1, "ScalarType"),
        ("(Tensor x, ScalarType? d=None) -> Tensor", 1000, "ScalarType"),
        ("(Tensor x, Layout d) -> Tensor", 99, "Layout"),
        ("(Tensor x, MemoryFormat d) -> Tensor", 99, "MemoryFormat"),
    ],
)
def test_an_enum_argument_out_of_range_is_an_error_not_a_crash(schema, value, what):
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch, opreg\n"
            "op = opreg.register_triton_op(fake_fn=None, triton_fn=None, name='edges::enum', "
            f"schema={schema!r})(lambda x, d=None: x.clone())\n"
            "try:\n"
            f"    op(torch.ones(2), {value})\n"
            "except ValueError as error:\n"
            "    print(error)\n",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert f"edges::enum: argument 'd' is {value}, which is not a {what}" in result.stdout


def test_optional_tensor_lists_take_part_in_the_device_and_alias_checks():
    op = define(
        "edges::optional_list",
        lambda xs: [None, xs[1]],
        fake_fn=lambda xs: [None, torch.empty_like(xs[1])],
        schema="(Tensor?[] xs) -> Tensor?[]",
    )
    with pytest.raises(RuntimeError, match="optional_list: the fallback returned output 0 sh"):
        op([None, torch.ones(2)])


def test_an_explicit_backward_with_a_tensor_list_output_is_refused():
    with pytest.raises(ValueError, match=r"output 0 is a Tensor\[\], and an explicit backward"):
        define(
            "edges::list_backward",
            lambda x: [x * 2],
            fake_fn=lambda x: [torch.empty_like(x)],
            schema="(Tensor x) -> Tensor[]",
            backward=lambda ctx, grad: grad,
        )
    assert_not_defined("edges::list_backward")


def test_setup_context_and_vmap_rules_see_dtypes_as_torch_objects():
    seen = {}

    def setup_context(ctx, inputs, output):
        seen["setup_context"] = inputs[1]

    def rule(info, in_dims, x, dtype):
        seen["vmap"] = dtype
        return x.movedim(in_dims[0], 0).to(dtype) * 2, 0

    op = define(
        "edges::dtype_pieces",
        lambda x, dtype: x.to(dtype) * 2,
        fake_fn=lambda x, dtype: torch.empty_like(x, dtype=dtype),
        schema="(Tensor x, ScalarType dtype) -> Tensor",
        backward=lambda ctx, grad: (grad * 2, None),
        setup_context=setup_context,
        vmap=rule,
    )
    x = torch.ones(3, 2, requires_grad=True)
    op(x, torch.float64).sum().backward()
    torch.vmap(op, in_dims=(0, None))(torch.ones(3, 2), torch.float64)
    assert seen == {"setup_context": torch.float64, "vmap": torch.float64}


def test_forward_and_backward_come_from_one_definition_while_replaces_race():
    def declare(factor):
        return opreg.register_triton_op(
            fake_fn=None,
            triton_fn=None,
            name="edges::racing",
            schema="(Tensor x) -> Tensor",
            replace=True,
            backward=lambda ctx, grad: grad * factor,
            setup_context=lambda ctx, inputs, output: None,
        )(lambda x: x * factor)

    declare(2.0)
    mismatches, stop = [], threading.Event()

    def call_and_differentiate():
        while not stop.is_set() and not mismatches:
            x = torch.ones(4, requires_grad=True)
            y = torch.ops.edges.racing(x)
            y.sum().backward()
            if x.grad[0].item() != y[0].item():  # d(x * f)/dx = f = y[0] at x = 1
                mismatches.append((y[0].item(), x.grad[0].item()))

    threads = [threading.Thread(target=call_and_differentiate) for _ in range(2)]
    for thread in threads:
        thread.start()
    for i in range(200):
        declare(3.0 if i % 2 == 0 else 2.0)
    stop.set()
    for thread in threads:
        thread.join()
    assert not mismatches, f"forward and backward of different definitions: {mismatches[:3]}"


def test_a_random_op_with_a_vmap_fn_refuses_randomness_same():
    op = define(
        "edges::random_vmap_fn",
        lambda x: torch.rand_like(x) + x,
        random=True,
        vmap_fn=lambda x: torch.rand_like(x) + x,
        fake_vmap_fn=lambda x: torch.empty_like(x),
    )
    with pytest.raises(RuntimeError, match="randomness='same' cannot be honoured"):
        torch.vmap(op, randomness="same")(torch.zeros(4, 3))
    different = torch.vmap(op, randomness="different")(torch.zeros(4, 3))
    assert not torch.equal(different[0], different[1])


def test_a_batch_polymorphic_op_that_drops_the_batch_dim_is_told_its_promise():
    op = define("edges::not_polymorphic", lambda x: x.sum(), batch_polymorphic=True)
    with pytest.raises(RuntimeError, match=r"batch-polymorphic call gave out_dim 0 .* first dim"):
        torch.vmap(op)(torch.randn(3, 4))
