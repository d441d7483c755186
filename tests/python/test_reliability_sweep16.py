"""Regression tests for the sixteenth sweep's findings in the Python front (those of the C++ core
are in tests/cpp/test_reliability.cpp, those of loading in test_reliability.py, those of the AOT
tools in test_reliability_aot.py)."""

from __future__ import annotations

import os

import pytest
import torch
from test_reliability import assert_survived, run_probe

import opreg


def test_debug_checks_of_calls_without_a_tensor_do_not_recurse():
    # OPREG_DEBUG=1 compared such a call with the fake by calling the op again "on meta": with no
    # tensor to make meta, that reached this very check again, without end (a segfault).
    os.environ["OPREG_DEBUG"] = "1"
    try:
        result = run_probe(
            """
            import torch, opreg
            def define(name, schema, fallback, fake=None):
                return opreg.register_triton_op(
                    fake_fn=fake, triton_fn=None, name=name, schema=schema)(fallback)
            arange = define("debug16::arange", "(int n) -> Tensor",
                            lambda n: torch.arange(n).float(), lambda n: torch.empty(n))
            count = define("debug16::count", "(int n) -> int", lambda n: n + 1)
            maybe = define("debug16::maybe", "(int n, Tensor? y=None) -> Tensor",
                           lambda n, y: torch.zeros(n) if y is None else y * n)
            stacked = define("debug16::stacked", "(Tensor[] xs) -> Tensor",
                             lambda xs: torch.stack(xs).sum(0))
            print(arange(3).tolist(), count(3), maybe(2).tolist(), maybe(2, torch.ones(1)).tolist(),
                  stacked([torch.ones(2), torch.ones(2)]).tolist())
            wrong = define("debug16::wrong", "(Tensor x) -> Tensor", lambda x: x * 2,
                           lambda x: x.new_empty(3))
            try:
                wrong(torch.ones(2))
            except RuntimeError as error:
                print("refused:", error)
            """
        )
    finally:
        del os.environ["OPREG_DEBUG"]
    assert_survived(result)
    assert "[0.0, 1.0, 2.0] 4 [0.0, 0.0] [2.0] [2.0, 2.0]" in result.stdout
    assert "refused: OPREG_DEBUG: debug16::wrong: the fallback returned output 0 of shape [2]" in (
        result.stdout
    )


def test_a_path_too_long_to_read_names_load_library():
    with pytest.raises(
        OSError,
        match=r"opreg.load_library: cannot read the path '/tmp/a+.*"
        r"File name too long",
    ):
        opreg.load_library("/tmp/" + "a" * 5000 + ".so")


def test_a_batch_polymorphic_op_returning_a_tensor_list_keeps_one_batch_dim():
    # Each element came back with the batch twice ((3, 3, 2) for (3, 2)), its gradient 3x.

    op = opreg.register_triton_op(
        fake_fn=None,
        triton_fn=None,
        name="vmap16::listed",
        schema="(Tensor x) -> (Tensor, Tensor[])",
        batch_polymorphic=True,
    )(lambda x: (x + 1, [x * 2, x * 3]))
    x = torch.arange(6.0).reshape(3, 2)
    first, listed = torch.vmap(op)(x)
    assert torch.equal(first, x + 1)
    assert [t.shape for t in listed] == [(3, 2), (3, 2)]
    assert torch.equal(listed[0], x * 2) and torch.equal(listed[1], x * 3)
    nested = torch.vmap(torch.vmap(op))(torch.ones(2, 3, 2))[1]
    assert [t.shape for t in nested] == [(2, 3, 2), (2, 3, 2)]
    grad = x.clone().requires_grad_()
    torch.vmap(op)(grad)[1][0].sum().backward()
    assert torch.equal(grad.grad, torch.full((3, 2), 2.0))


def test_dtypes_are_checked_when_a_vmap_rule_serves_the_call():

    op = opreg.register_triton_op(
        fake_fn=None,
        triton_fn=None,
        name="vmap16::typed",
        schema="(Tensor x) -> Tensor",
        dtypes={"x": [torch.float32]},
        vmap=lambda info, in_dims, x: (x.movedim(in_dims[0], 0) * 2, 0),
    )(lambda x: x * 2)
    with pytest.raises(TypeError, match="vmap16::typed: argument 'x' has dtype Long, expected"):
        torch.vmap(op)(torch.ones(3, 2, dtype=torch.int64))
    assert torch.equal(torch.vmap(op)(torch.ones(3, 2)), torch.full((3, 2), 2.0))
