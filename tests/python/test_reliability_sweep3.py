"""Edges found by the third adversarial sweep (555 probes against 586cbb7): mistakes whose message
named no op or argument (opcheck's own arguments, torch.library-style registrations checked only
when called, device names where device types belong, a reused trace block), and an old op handle
that could re-register pieces over a newer definition."""

from __future__ import annotations

import pytest
import torch

import opreg


def define(name: str, **options):
    options.setdefault("schema", "(Tensor x) -> Tensor")
    factor = options.pop("factor", 2)
    return opreg.register_triton_op(fake_fn=None, triton_fn=None, name=name, **options)(
        lambda x: x * factor
    )


# ---- opcheck's own arguments -------------------------------------------------------------------


@pytest.fixture(scope="module")
def twice():
    return define("sweep3_test::twice")


def test_opcheck_samples_of_the_wrong_type(twice):
    with pytest.raises(TypeError, match=r"samples must be a list of opreg\.Sample .* got int"):
        opreg.opcheck(twice, 5)


def test_opcheck_devices_of_the_wrong_type(twice):
    with pytest.raises(TypeError, match="devices must be a device name or a list of them"):
        opreg.opcheck(twice, devices=5)


def test_a_sample_whose_args_are_not_a_tuple():
    with pytest.raises(TypeError, match=r"args must be a tuple .* got Tensor \(one argument x"):
        opreg.Sample(torch.ones(3))
    with pytest.raises(TypeError, match="kwargs must be a dict of the op's keyword arguments"):
        opreg.Sample((torch.ones(3),), 5)
    assert opreg.Sample([torch.ones(1)]).args[0].shape == (1,)  # a list is taken as a tuple


def test_opcheck_refuses_meta_samples_naming_the_op(twice):
    with pytest.raises(ValueError, match="sweep3_test::twice: samples\\[0\\] holds meta tensors"):
        opreg.opcheck(twice, [opreg.Sample((torch.ones(3, device="meta"),))])


# ---- device types ------------------------------------------------------------------------------


@pytest.mark.parametrize("register", [opreg.register_triton_device_type,
                                      opreg.register_accelerated_device_type])  # fmt: skip
def test_a_device_is_not_a_device_type(register):
    before = opreg.triton_device_types()
    with pytest.raises(ValueError, match=r"'cuda:1' is a device; name its type \('cuda'\)"):
        register("cuda:1")
    with pytest.raises(ValueError, match="'n pu' is not a device type name"):
        register("n pu")
    assert opreg.triton_device_types() == before


# ---- trace -------------------------------------------------------------------------------------


def test_a_trace_block_used_twice_says_so():
    block = opreg.trace()
    with block as first:
        torch.ops.opreg.fused_add(torch.ones(2), torch.ones(2))
    with (
        pytest.raises(RuntimeError, match="this trace was already used for a with block"),
        block,
    ):
        pass
    assert first.impls("opreg::fused_add") == ["fallback"]


# ---- vmap --------------------------------------------------------------------------------------


def test_vmap_of_an_argument_of_a_refused_dtype_gets_the_dtype_message_alone():
    op = define("sweep3_test::float_only", dtypes={"x": [torch.float32]})
    with pytest.raises(TypeError) as error:
        torch.vmap(op)(torch.ones(3, 2, dtype=torch.float64))
    assert str(error.value).startswith("sweep3_test::float_only: argument 'x' has dtype Double")
    assert torch.equal(torch.vmap(op)(torch.ones(3, 2)), torch.full((3, 2), 2.0))


# ---- the torch.library front: pieces checked when registered -----------------------------------


def doubled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@pytest.mark.parametrize(
    "name", ["sweep3_test::has space", "sweep3_test::1abc", "sweep3_test::a-b"]
)
def test_custom_op_names_a_bad_name(name):
    with pytest.raises(ValueError, match="is not an identifier"):
        opreg.custom_op(name, doubled, mutates_args=())


def test_custom_op_checks_fn_against_an_explicit_schema():
    with pytest.raises(TypeError, match="sweep3_test::explicit': fn cannot be called with"):
        opreg.custom_op(
            "sweep3_test::explicit",
            doubled,
            mutates_args=(),
            schema="(Tensor x, Tensor y) -> Tensor",
        )


@pytest.fixture
def lib_op(request):
    return opreg.custom_op(f"sweep3_test::{request.node.name[:40]}", doubled, mutates_args=())


def test_register_fake_checks_the_signature(lib_op):
    with pytest.raises(TypeError, match="register_fake's fn cannot be called with"):
        lib_op.register_fake(lambda x, y: torch.empty_like(x))


def test_register_autograd_checks_backward_and_setup_context(lib_op):
    with pytest.raises(TypeError, match=r"backward is called as backward\(ctx, grad0\)"):
        lib_op.register_autograd(lambda: 1)
    with pytest.raises(TypeError, match=r"setup_context is called as setup_context\(ctx, inputs"):
        lib_op.register_autograd(lambda ctx, g: g, setup_context=lambda ctx: None)
    lib_op.register_autograd(lambda ctx, g: g * 2, setup_context=lambda ctx, inputs, output: None)
    x = torch.ones(2, requires_grad=True)
    lib_op(x).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]


def test_register_vmap_checks_the_rule(lib_op):
    with pytest.raises(
        TypeError, match=r"register_vmap's func is called as .*\(info, in_dims, x\)"
    ):
        lib_op.register_vmap(lambda x: x)


@pytest.mark.parametrize("device_type", ["cuda:0", ""])
def test_register_kernel_refuses_what_is_not_a_device_type(lib_op, device_type):
    with pytest.raises(ValueError, match="register_kernel"):
        lib_op.register_kernel(device_type, lambda x: x * 7)


def test_an_old_handle_cannot_redefine_an_op_replaced_since():
    old = opreg.custom_op("sweep3_test::replaced", doubled, mutates_args=())
    define("sweep3_test::replaced", replace=True, factor=3)
    with pytest.raises(RuntimeError, match="it was defined again since this object defined it"):
        old.register_fake(lambda x: torch.empty_like(x))
    assert torch.ops.sweep3_test.replaced(torch.ones(1)).item() == 3.0


def test_mutates_args_that_contradict_the_schema_are_refused():
    def add_(x, y):
        x.add_(y)

    with pytest.raises(ValueError, match=r"mutates_args names \['x'\], but the schema marks"):
        opreg.register_triton_op(
            fake_fn=None,
            triton_fn=None,
            name="sweep3_test::mutates",
            schema="(Tensor x, Tensor y) -> ()",
            mutates_args=("x",),
        )(add_)


def test_torch_form_opcheck_arguments(lib_op):
    sample = opreg.Sample((torch.ones(3),))
    with pytest.raises(TypeError, match=r"\(chosen by raise_exception=\) takes args as one tuple"):
        opreg.opcheck(lib_op, [sample], raise_exception=False)
    with pytest.raises(ValueError, match="atol must be a number >= 0, got -1"):
        opreg.opcheck(lib_op, (torch.ones(3),), atol=-1, rtol=1e-5)


# ---- schema text that torch's parser reports in its own terms ----------------------------------


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ("(Tensor x, int a=99999999999999999999) -> Tensor", "a number in it is out of range"),
        (
            "(Tensor x, float f=1e999) -> Tensor",
            r"a number in it is out of range \(.*; a float default must be 0",
        ),
        (
            "(Tensor x, float f=-1e-999) -> Tensor",
            r"a number in it is out of range \(.*; a float default must be 0",
        ),
        (
            '(Tensor x, float[] a=["a"]) -> Tensor',
            "a list default holds a value that is not a double",
        ),
        (
            "(Tensor x, bool[2] a=[1, 0]) -> Tensor",
            "a list default holds a value that is not a bool",
        ),
    ],
)
@pytest.mark.parametrize("front", ["register_triton_op", "custom_op"])
def test_schema_parse_errors_name_the_op_and_say_what_is_wrong(schema, why, front):
    with pytest.raises(ValueError, match=f"sweep3_test::parse': cannot parse schema .*: {why}"):
        if front == "custom_op":
            opreg.custom_op("sweep3_test::parse", lambda x, a: x, mutates_args=(), schema=schema)
        else:
            define("sweep3_test::parse", schema=schema)


def test_a_list_output_with_a_none_element_names_the_element():
    op = opreg.register_triton_op(
        fake_fn=None, triton_fn=None, name="sweep3_test::list_none", schema="(Tensor x) -> Tensor[]"
    )(lambda x: [x * 2, None])
    with pytest.raises(TypeError, match="output 0 \\(its element 1 is <class 'NoneType'>\\)"):
        op(torch.ones(1))


def test_vmap_of_a_tensor_list_op_with_a_rule_gives_the_rule_the_list_batched_as_a_whole():
    op = opreg.register_triton_op(
        fake_fn=None,
        triton_fn=None,
        name="sweep3_test::list_rule",
        schema="(Tensor[] xs) -> Tensor",
        vmap=lambda info, in_dims, xs: (xs[0] + xs[1], 0),
    )(lambda xs: xs[0] + xs[1])
    x = torch.randn(3, 2)
    torch.testing.assert_close(torch.vmap(lambda a: op([a, a]))(x), 2 * x)
