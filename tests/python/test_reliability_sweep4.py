"""Regression tests for the findings of the fourth adversarial sweep (against 8ca904a): an old
op object adding a torch_dispatch rule to a newer definition, custom_op silently replacing an op
that register_triton_op had replaced, OPREG_DEBUG not comparing Tensor[] outputs with the fake,
a hexadecimal int default read as 0, and a CPU + meta call blamed on a missing fake."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import opreg


class PassThrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_an_old_op_object_cannot_add_a_torch_dispatch_rule_to_a_newer_definition():
    def times2(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    def times3(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    old = opreg.custom_op("sweep4::stale_rule", times2, mutates_args=())
    new = opreg.custom_op("sweep4::stale_rule", times3, mutates_args=())
    with pytest.raises(RuntimeError, match=r"sweep4::stale_rule.*defined again since this object"):
        old.register_torch_dispatch(PassThrough, lambda mode, func, types, args, kwargs: None)
    with PassThrough():
        torch.testing.assert_close(
            torch.ops.sweep4.stale_rule(torch.ones(2)), torch.full((2,), 3.0)
        )
    new.register_torch_dispatch(
        PassThrough, lambda mode, func, types, args, kwargs: torch.full((2,), 7.0)
    )
    with PassThrough():
        torch.testing.assert_close(
            torch.ops.sweep4.stale_rule(torch.ones(2)), torch.full((2,), 7.0)
        )


def test_custom_op_does_not_replace_an_op_that_register_triton_op_replaced():
    def times2(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    def times9(x: torch.Tensor) -> torch.Tensor:
        return x * 9

    opreg.custom_op("sweep4::taken", times2, mutates_args=())
    opreg.register_triton_op(
        fake_fn=None,
        triton_fn=None,
        name="sweep4::taken",
        schema="(Tensor x) -> Tensor",
        replace=True,
    )(lambda x: x * 5)
    with pytest.raises(ValueError, match="sweep4::taken' is already defined by opreg outside"):
        opreg.custom_op("sweep4::taken", times9, mutates_args=())
    torch.testing.assert_close(torch.ops.sweep4.taken(torch.ones(2)), torch.full((2,), 5.0))


@pytest.mark.parametrize(
    "schema",
    [
        "(Tensor x, int a=0x10) -> Tensor",
        "(Tensor x, int[] a=[1, 0x10]) -> Tensor",
        "(Tensor x, int a=-0x1) -> Tensor",
    ],
)
def test_a_prefixed_int_default_is_refused_not_read_as_zero(schema):
    with pytest.raises(ValueError, match="is not a decimal number"):
        opreg.register_triton_op(fake_fn=None, triton_fn=None, name="sweep4::hex", schema=schema)(
            lambda x, a: x.clone()
        )
    with pytest.raises(ValueError, match="is not a decimal number"):
        opreg.custom_op(
            "sweep4::hex_custom", lambda x, a: x.clone(), mutates_args=(), schema=schema
        )
    for name in ("sweep4::hex", "sweep4::hex_custom"):  # nothing left behind
        with pytest.raises(ValueError):
            opreg.describe_op(name)


def test_a_decimal_default_and_a_name_with_0x_still_parse():
    op = opreg.register_triton_op(
        fake_fn=None,
        triton_fn=None,
        name="sweep4::decimal",
        schema="(Tensor x0xa, int a=10, float b=0.5) -> Tensor",
    )(lambda x0xa, a, b: x0xa * a * b)
    torch.testing.assert_close(op(torch.ones(1)), torch.full((1,), 5.0))


def test_opreg_debug_compares_tensor_list_outputs_with_the_fake():
    code = textwrap.dedent(
        """
        import os
        os.environ["OPREG_DEBUG"] = "1"
        import torch, opreg

        def define(name, fake):
            return opreg.register_triton_op(
                fake_fn=fake, triton_fn=None, name=name, schema="(Tensor x) -> Tensor[]"
            )(lambda x: [x * 2, x * 3])

        x = torch.ones(2)
        right = lambda x: [torch.empty_like(x), torch.empty_like(x)]  # two tensors, not one twice
        assert len(define("sweep4::right", right)(x)) == 2
        empty = torch.empty_like
        for name, fake, expected in [
            ("sweep4::short", lambda x: [empty(x)], "with 2 tensors, but the op's fake gives 1"),
            ("sweep4::shape", lambda x: [empty(x), x.new_empty(5)], "element 1 of shape [2]"),
            ("sweep4::dtype", lambda x: [empty(x), empty(x, dtype=torch.int64)], "and dtype Long"),
        ]:
            try:
                define(name, fake)(x)
            except RuntimeError as error:
                assert expected in str(error) and name in str(error), str(error)
            else:
                raise AssertionError(name + ": the lying fake was not caught")
        print("checked")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and "checked" in result.stdout, result.stderr[-3000:]


def test_a_cpu_and_meta_call_is_not_blamed_on_a_missing_fake():
    with pytest.raises(RuntimeError) as error:
        torch.ops.opreg.fused_add(torch.ones(3), torch.ones(3, device="meta"))
    message = str(error.value)
    assert "no fake" not in message and "give the op a fake" not in message, message
    assert (
        "opreg::fused_add: the fallback on meta tensors failed on a call with tensors on several"
        in message
    )
    assert "At:" not in message
    assert "Tensor on device meta is not on the expected device cpu" in message
