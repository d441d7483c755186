"""Regression tests for what the adversarial sweep 48 found (see issue 13's notes): a new
custom_op interrupted once the core published it, and a vmap rule's out_dims past 64 bits."""

from __future__ import annotations

import pytest
import torch

import opreg
from conftest import run_with_test_ops

_INTERRUPTED_CUSTOM_OP = """
import sys, torch, opreg

API = getattr(opreg, sys.argv[1])
OPREG_DIR = opreg.__file__.rsplit("/", 1)[0]


def doubled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def hook(frame, event, arg):  # once the core published it: in the record of its pieces
    if frame.f_code.co_filename.startswith(OPREG_DIR) and frame.f_code.co_name == "_record":
        sys.settrace(None)
        raise KeyboardInterrupt
    return hook


sys.settrace(hook)
try:
    API("interrupted::new", mutates_args=())(doubled)
except KeyboardInterrupt:
    print("interrupted")
finally:
    sys.settrace(None)
op = API("interrupted::new", mutates_args=())(doubled)  # refused: "defined outside custom_op"
op.register_fake(lambda x: torch.empty_like(x))
print(op(torch.ones(2)).tolist(), tuple(op(torch.empty(3, device="meta")).shape))
"""


@pytest.mark.parametrize("api", ["custom_op", "triton_op"])
def test_a_new_custom_op_interrupted_once_published_keeps_its_name(api):
    # Sweep 48 A-F2: the op stayed defined, and every later custom_op of its name was refused as
    # "already defined by opreg outside opreg.custom_op".
    done = run_with_test_ops(_INTERRUPTED_CUSTOM_OP, timeout=300, args=(api,))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["interrupted", "[2.0, 2.0] (3,)"], done.stdout


def test_a_vmap_rules_out_dims_past_64_bits_is_named():
    # Sweep 48 B-Y1: pybind11's "Unable to cast Python instance of type <class 'int'>", said as
    # if the rule had thrown.
    op = opreg.register_vmap_op(
        lambda x: x * 2,
        fake_fn=torch.empty_like,
        vmap=lambda info, in_dims, x: (x * 2, 2**70),
        name="sweep48::big_out_dims",
        schema="(Tensor x) -> Tensor",
        replace=True,
    )
    with pytest.raises(ValueError) as raised:
        torch.vmap(op)(torch.ones(3, 2))
    assert str(raised.value).startswith(
        "sweep48::big_out_dims: the vmap rule's out_dims holds an int past 64 bits"
    ), str(raised.value)
