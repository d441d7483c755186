"""Regression tests for the twenty-third adversarial sweep's findings (reports kept outside the
repository), beside the earlier sweeps' files."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch
import torch.func as F
from torch import Tensor

import opreg
from conftest import TEST_OPS_LIBRARY
from opreg._registry import _C

# ---- A-F1: functorch's grad of a grad through an explicit backward --------------------------


@opreg.register_triton_op(
    fake_fn=lambda x, k: torch.empty_like(x),
    triton_fn=None,
    name="opreg_sweep23::scale",
    setup_context=lambda ctx, inputs, output: setattr(ctx, "k", inputs[1]),
    backward=lambda ctx, grad: (grad * ctx.k, None),
)
def scale(x: torch.Tensor, k: float) -> torch.Tensor:
    return x * k


@opreg.custom_op("opreg_sweep23::scale_custom", mutates_args=())
def scale_custom(x: torch.Tensor, k: float) -> torch.Tensor:
    return x * k


scale_custom.register_fake(lambda x, k: torch.empty_like(x))
scale_custom.register_autograd(
    lambda ctx, grad: (grad * ctx.k, None),
    setup_context=lambda ctx, inputs, output: setattr(ctx, "k", inputs[1]),
)

SCALES = {
    "register_triton_op": lambda b: scale(b, 3.0),
    "custom_op": lambda b: scale_custom(b, 3.0),
    "C++ backward": lambda b: torch.ops.opreg.fused_add(b, 2.0 * b),  # 3 b
}


@pytest.mark.parametrize("front", SCALES)
def test_a_grad_of_a_grad_differentiates_the_op_again(front):
    # The forward ran with grad mode off below the inner grad's node, so the outer grad saw a
    # constant: zeros for the second derivative, from F.grad(F.grad), jacrev(jacrev), hessian.
    op = SCALES[front]

    def f(b):
        return (op(b) ** 2).sum()  # 9 b^2: the second derivative is 18

    x = torch.randn(3, dtype=torch.float64)
    torch.testing.assert_close(F.grad(f)(x), 18 * x)
    torch.testing.assert_close(F.grad(lambda a: F.grad(f)(a).sum())(x), torch.full_like(x, 18))
    torch.testing.assert_close(F.jacrev(F.jacrev(f))(x), 18 * torch.eye(3, dtype=x.dtype))
    torch.testing.assert_close(F.hessian(f)(x), 18 * torch.eye(3, dtype=x.dtype))
    # torch.autograd over functorch's grad: the op is recorded below the grad layer too.
    a = x.clone().requires_grad_()
    (second,) = torch.autograd.grad(F.grad(f)(a).sum(), a)
    torch.testing.assert_close(second, torch.full_like(x, 18))


def test_a_forward_under_no_grad_inside_a_grad_is_still_not_recorded_outside():
    # Entered with grad mode off, the outer code records nothing: the forward keeps that mode.
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        inner = F.grad(lambda b: (scale(b, 3.0) ** 2).sum())(x)
    torch.testing.assert_close(inner, 18 * x.detach())
    assert not inner.requires_grad


# ---- B-F1: a vmap rule's outputs that are no tensors -----------------------------------------


@opreg.custom_op("opreg_sweep23::with_count", mutates_args=())
def with_count(x: Tensor) -> tuple[Tensor, int, float, bool]:
    return x.clone(), 1, 0.5, True


# What the rule returns for the outputs after the tensor, by case.
RULE_RETURNS = {
    "int": (2.5, 0.5, True),
    "bool": (1, 0.5, torch.ones(2)),
    "float_as_int": (3, 2, False),
}
rule_case = {"now": "int"}


@with_count.register_vmap
def _(info, in_dims, x):
    count, fraction, flag = RULE_RETURNS[rule_case["now"]]
    return (x.clone(), count, fraction, flag), (in_dims[0], None, None, None)


@pytest.mark.parametrize(
    ("case", "said"),
    [
        (
            "int",
            "the vmap rule returned <class 'float'> for output 1, expected int",
        ),
        (
            "bool",
            "the vmap rule returned <class 'torch.Tensor'> for output 3, expected bool",
        ),
    ],
)
def test_a_vmap_rule_s_number_outputs_are_of_the_declared_type(case, said):
    # A float for an int output came back as the float, a tensor for a bool as the tensor.
    rule_case["now"] = case
    with pytest.raises(TypeError, match=f"opreg_sweep23::with_count: {said}"):
        torch.vmap(with_count, out_dims=(0, None, None, None))(torch.randn(2, 3))


def test_a_vmap_rule_may_give_an_int_for_a_float_output():
    rule_case["now"] = "float_as_int"
    _, count, fraction, flag = torch.vmap(with_count, out_dims=(0, None, None, None))(
        torch.randn(2, 3)
    )
    assert (count, flag) == (3, False)
    assert type(fraction) is float and fraction == 2.0


# ---- B-F3: an AotLaunch kernel name no bundle can hold ---------------------------------------


@pytest.mark.parametrize("kernel", ["opreg_fused_add_f32\x00junk", "not-an identifier!"])
def test_an_aot_launch_of_a_name_no_bundle_can_hold_is_refused(kernel):
    # The op was defined and fell back on every call, for ever.
    def add(x: Tensor, y: Tensor) -> Tensor:
        return x + y

    with pytest.raises(ValueError, match="which no bundle can hold: kernel names are C identif"):
        opreg.register_triton_op(
            fake_fn=None,
            triton_fn=None,
            name="opreg_sweep23::bad_aot_name",
            aot=opreg.AotLaunch(kernel, ["1"], ["x", "y"], "like:x"),
        )(add)
    assert not _C.is_defined("opreg_sweep23::bad_aot_name")


# ---- B-F5: --out onto the spec ---------------------------------------------------------------


@pytest.mark.parametrize("spec_name", ["index.txt", "neg.json"])
def test_the_bundle_does_not_take_the_place_of_the_spec(tmp_path, spec_name):
    # The compiler wrote index.txt (or <kernel>.json) over the spec and exited 0.
    (tmp_path / "k.py").write_text("import triton\n")
    spec = tmp_path / spec_name
    spec.write_text(
        'targets = ["sm_80"]\n[[kernel]]\nname = "neg"\nsource = "k.py:neg"\n'
        'signature = { x_ptr = "*fp32", out_ptr = "*fp32" }\nconstexprs = { BLOCK = 128 }\n'
    )
    before = spec.read_text()
    result = subprocess.run(
        [sys.executable, "-m", "opreg.aot", spec_name, "--out", ".", "--quiet"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stderr
    assert f"--out '.': the bundle's {spec_name} would take the place of the spec" in (
        result.stderr
    )
    assert spec.read_text() == before


# ---- A-F3: register_autograd with a keyword-only tensor --------------------------------------


def test_register_autograd_refuses_a_keyword_only_tensor():
    # The backward's gradients were padded with None for it: a tensor that required grad got
    # none (zeros under torch.func.grad), silently.
    @opreg.custom_op("opreg_sweep23::keyword_tensor", mutates_args=())
    def keyword_tensor(x: Tensor, *, y: Tensor) -> Tensor:
        return x * 2 + y

    keyword_tensor.register_fake(lambda x, *, y: torch.empty_like(x))
    with pytest.raises(
        ValueError,
        match="opreg_sweep23::keyword_tensor: register_autograd: argument 'y' is a keyword-only "
        "Tensor, and the backward gives gradients to positional inputs only",
    ):
        keyword_tensor.register_autograd(lambda ctx, grad: 2 * grad)
    x = torch.ones(2)
    torch.testing.assert_close(keyword_tensor(x, y=x), 3 * x)  # the op is as it was


# ---- B-F6: loading a library again after one of its ops was undefined ------------------------


def test_loading_a_library_again_says_which_of_its_ops_it_cannot_define_again():
    # The second load succeeded and defined nothing: the library was open already, so its
    # initializers did not run. In a subprocess: this process's test ops stay defined.
    code = f"""
import opreg, torch
from opreg._registry import _C
library = {str(TEST_OPS_LIBRARY)!r}
opreg.load_library(library)
opreg.load_library(library)  # every op still defined: nothing to say
_C.undefine("opreg_test::affine")
for attempt in range(2):
    try:
        opreg.load_library(library)
    except ValueError as error:
        print("refused:", error)
print("affine defined:", _C.is_defined("opreg_test::affine"))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    expected = (
        f"refused: opreg::load_library: '{TEST_OPS_LIBRARY}' is loaded already, so its static "
        "initializers do not run again, and ops it defined were undefined since: "
        "opreg_test::affine; they stay undefined"
    )
    assert result.stdout.count(expected) == 2, result.stdout
    assert "affine defined: False" in result.stdout


# ---- B-F8: an op without a fake under FakeTensorMode and torch.compile ----------------------


def exception_chain(error: BaseException) -> list[str]:
    messages = []
    while error is not None:
        messages.append(f"{type(error).__name__}: {error}")
        error = error.__cause__ or error.__context__
    return messages


def test_the_no_fake_advice_reaches_fake_tensor_mode_and_compile_errors():
    # PyTorch turns the meta kernel's NotImplementedError into its own exception; opreg's reason
    # and advice stay in the chain that a traceback prints.
    from torch._subclasses.fake_tensor import FakeTensorMode, UnsupportedOperatorException

    op = torch.ops.opreg_test.normalize_by_max
    advice = "opreg_test::normalize_by_max: has no fake, and its fallback failed on meta tensors"
    with pytest.raises(UnsupportedOperatorException) as faked, FakeTensorMode():
        op(torch.randn(3))
    assert any(advice in message for message in exception_chain(faked.value))
    with pytest.raises(Exception, match="does not support running with fake tensors") as compiled:
        torch.compile(lambda x: op(x) * 2, fullgraph=True, backend="eager")(torch.randn(3))
    assert any(advice in message for message in exception_chain(compiled.value))


# ---- A-F2: opreg::undefine of a vmap_fn companion on its own --------------------------------


def test_a_companion_is_not_undefined_without_its_op():
    # It was undefined, and every later vmap of the op said to call it again (23rd sweep, A-F2).
    @opreg.register_vmap_op(
        fake_fn=lambda x: torch.empty_like(x),
        vmap_fn=lambda x: x * 3,
        fake_vmap_fn=lambda x: torch.empty_like(x),
        name="opreg_sweep23::with_companion",
        schema="(Tensor x) -> Tensor",
    )
    def with_companion(x: Tensor) -> Tensor:
        return x * 2

    op = torch.ops.opreg_sweep23.with_companion.default
    with pytest.raises(
        ValueError,
        match=r"cannot undefine 'opreg_sweep23::with_companion_vmap' on its own: it is part of "
        r"'opreg_sweep23::with_companion'",
    ):
        _C.undefine("opreg_sweep23::with_companion_vmap")
    torch.testing.assert_close(torch.vmap(op)(torch.ones(3, 2)), torch.full((3, 2), 3.0))
    # Defined again without vmap_fn, the op drops its companion; undefining the op takes any part.
    opreg.register_vmap_op(
        fake_fn=lambda x: torch.empty_like(x),
        name="opreg_sweep23::with_companion",
        schema="(Tensor x) -> Tensor",
        replace=True,
    )(lambda x: x * 2)
    assert not _C.is_defined("opreg_sweep23::with_companion_vmap")
    torch.testing.assert_close(torch.vmap(op)(torch.ones(3, 2)), torch.full((3, 2), 2.0))
    _C.undefine("opreg_sweep23::with_companion")


# ---- A-F4: a schema with Any --------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "what"),
    [
        ("(Tensor x, Any y) -> Tensor", "argument 'y' has type Any"),
        ("(Tensor x, Any[] y) -> Tensor", "argument 'y' has type Any[]"),
        ("(Tensor x, Any? y=None) -> Tensor", "argument 'y' has type Any?"),
        ("(Tensor x) -> Any", "output '0' has type Any"),
    ],
)
def test_a_schema_with_any_is_refused_naming_the_argument(schema, what):
    # Calls failed with the tracer's and functorch's messages (an internal assert under vmap),
    # which named no op (23rd sweep, A-F4).
    with pytest.raises(
        ValueError, match=rf"opreg_sweep23::any: {re.escape(what)}, and opreg ops take no Any type"
    ):
        opreg.register_triton_op(
            name="opreg_sweep23::any",
            schema=schema,
            fake_fn=lambda x, y=None: torch.empty_like(x),
            triton_fn=None,
        )(lambda x, y=None: x * 2)
    assert not _C.is_defined("opreg_sweep23::any")
