"""Sweep 49's findings, each a probe in a fresh interpreter where it could crash: a Python piece's
exception whose str() fails (one raising another such, or any at the recursion limit) reaches the
caller as itself, and register_triton_op takes the function as its first argument."""

from __future__ import annotations

import pytest
import torch

import opreg
from conftest import run_with_test_ops

_RAISES_UNPRINTABLE = """
import sys, torch, opreg

class Unprintable(Exception):
    def __str__(self):
        raise Unprintable()

def boom(*args, **kwargs):
    raise Unprintable()

piece, x = sys.argv[1], torch.ones(2, 2)
given = dict(fake_fn=torch.empty_like, name="sweep49::unprintable", schema="(Tensor x) -> Tensor")
call = lambda: torch.ops.sweep49.unprintable(x)
if piece == "fallback":
    fallback = boom
else:
    fallback = lambda x: x * 2
if piece == "fake":
    given["fake_fn"] = boom
    call = lambda: torch.ops.sweep49.unprintable(x.to("meta"))
elif piece == "setup_context":
    given.update(backward=lambda ctx, grad: grad, setup_context=boom)
    call = lambda: torch.ops.sweep49.unprintable(x.clone().requires_grad_())
elif piece == "vmap rule":
    given["vmap"] = boom
    call = lambda: torch.vmap(torch.ops.sweep49.unprintable)(x)
elif piece == "vmap_fn":
    given.update(vmap_fn=boom, fake_vmap_fn=torch.empty_like)
    call = lambda: torch.vmap(torch.ops.sweep49.unprintable)(x)
elif piece in ("triton_accepts", "triton_fn"):
    given.update(triton_device_types="cpu", triton_fn=lambda x: x * 2)
    given[piece] = boom
if piece.startswith("triton"):
    opreg.register_triton_op(fallback, **given)
else:
    opreg.register_vmap_op(fallback, **given)
try:
    call()
    print("no error")
except Unprintable:
    print("raised Unprintable")
"""


@pytest.mark.parametrize(
    "piece",
    ["fallback", "fake", "setup_context", "vmap rule", "vmap_fn", "triton_accepts", "triton_fn"],
)
def test_an_exception_whose_str_fails_reaches_the_caller_as_itself(piece):
    # Sweep 49 A x01: opreg read the message of a Python piece's error (pybind11 formats it when
    # asked), and pybind11 recursed without end on one whose str() raised another: a segfault.
    result = run_with_test_ops(_RAISES_UNPRINTABLE, args=(piece,))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "raised Unprintable", result.stdout + result.stderr[-2000:]


_RECURSES = """
import sys, threading, torch, opreg

x = torch.ones(2)
opreg.register_vmap_op(
    lambda x: torch.ops.sweep49.recurses(x),
    fake_fn=torch.empty_like,
    name="sweep49::recurses",
    schema="(Tensor x) -> Tensor",
)

def nested(depth):
    return torch.ops.sweep49.recurses(x) if depth == 0 else nested(depth - 1)

def run(depth):
    try:
        nested(depth)
        print("returned")
    except RecursionError:
        print("RecursionError")

for depth in range(8):
    run(depth)
    thread = threading.Thread(target=run, args=(depth,))
    thread.start()
    thread.join()
"""


def test_a_fallback_calling_its_own_op_ends_in_a_recursion_error():
    # Sweep 49 A x02: at the recursion limit str() of the RecursionError fails, and the process
    # died for one base depth in four, on the main thread and on others.
    result = run_with_test_ops(_RECURSES)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["RecursionError"] * 16, result.stdout


_DEBUG_FAKE = """
import torch, opreg

class Unprintable(Exception):
    def __str__(self):
        raise Unprintable()

def fake(x):
    raise Unprintable()

opreg.register_vmap_op(
    lambda x: x * 2, fake_fn=fake, name="sweep49::debug_fake", schema="(Tensor x) -> Tensor"
)
try:
    torch.ops.sweep49.debug_fake(torch.ones(2))
except RuntimeError as error:
    print(error)
"""


def test_opreg_debug_says_a_fake_whose_error_cannot_be_printed_failed(monkeypatch):
    monkeypatch.setenv("OPREG_DEBUG", "1")
    result = run_with_test_ops(_DEBUG_FAKE)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        "sweep49::debug_fake: the fallback ran, but the op's fake failed on meta copies of the "
        "call's arguments: Unprintable: <str() failed>"
    ) in result.stdout, result.stdout


def _doubled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_register_triton_op_takes_the_function_as_its_first_argument():
    # Sweep 49 A e01: called so with every keyword given, it was said to be "used bare, without
    # its keywords"; register_vmap_op takes that form, and so does it now.
    op = opreg.register_triton_op(
        _doubled, fake_fn=torch.empty_like, triton_fn=None, name="sweep49::function_form"
    )
    assert torch.equal(op(torch.ones(3)), torch.full((3,), 2.0))
    assert torch.ops.sweep49.function_form.default is op
    with pytest.raises(TypeError) as raised:
        opreg.register_triton_op(_doubled, fake_fn=None, name="sweep49::half_given")
    assert str(raised.value).startswith(
        "opreg: op 'sweep49::half_given': register_triton_op needs the keyword argument "
        "triton_fn (None for none)"
    ), str(raised.value)
    assert not hasattr(torch.ops.sweep49, "half_given")
