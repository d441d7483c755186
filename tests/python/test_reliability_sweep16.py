"""Regression tests for the sixteenth sweep's findings in the Python front (those of the C++ core
are in tests/cpp/test_reliability.cpp, those of loading in test_reliability.py, those of the AOT
tools in test_reliability_aot.py)."""

from __future__ import annotations

import functools
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


def define(name, schema, fallback, **options):
    return opreg.register_triton_op(
        fake_fn=options.pop("fake_fn", None), triton_fn=None, name=name, schema=schema, **options
    )(fallback)


def test_vmap_fn_and_vmap_rules_get_keyword_only_arguments_by_name():
    # The companion of a vmap_fn, and a rule with torch.library.register_vmap's signature, were
    # called with every argument positionally: each vmapped call of such an op failed.
    x = torch.randn(3, 2)
    with_vmap_fn = define(
        "kw16::vmap_fn",
        "(Tensor x, *, float a=1.0) -> Tensor",
        lambda x, *, a=1.0: x * a,
        vmap_fn=lambda x, *, a=1.0: x * a,
        fake_vmap_fn=lambda x, *, a=1.0: torch.empty_like(x),
    )
    torch.testing.assert_close(torch.vmap(with_vmap_fn)(x), x)
    torch.testing.assert_close(torch.vmap(lambda v: with_vmap_fn(v, a=3.0))(x), 3 * x)

    def rule(info, in_dims, x, *, a=1.0):
        assert len(in_dims) == 1  # positional arguments only, as torch gives them
        return x.movedim(in_dims[0], 0) * a, 0

    with_rule = define(
        "kw16::rule", "(Tensor x, *, float a=1.0) -> Tensor", lambda x, *, a=1.0: x * a, vmap=rule
    )
    torch.testing.assert_close(torch.vmap(lambda v: with_rule(v, a=3.0))(x), 3 * x)


def test_a_vmap_rule_that_cannot_take_keyword_only_arguments_is_refused_at_definition():
    with pytest.raises(
        TypeError, match=r"kw16::narrow': vmap is called as vmap\(info, in_dims, x, a=a\)"
    ):
        define(
            "kw16::narrow",
            "(Tensor x, *, float a) -> Tensor",
            lambda x, *, a: x * a,
            vmap=lambda info, in_dims, x: (x, 0),
        )
    with pytest.raises(
        ValueError, match=r"kw16::tensor': the vmap rule .* tensor argument 'y' is keyword-only"
    ):
        define(
            "kw16::tensor",
            "(Tensor x, *, Tensor y) -> Tensor",
            lambda x, *, y: x + y,
            vmap=lambda info, in_dims, x, *, y: (x + y, 0),
        )
    for name in ("kw16::narrow", "kw16::tensor"):
        with pytest.raises(ValueError, match="no op named"):
            opreg.describe_op(name)


def sink(x, y):
    x.add_(y)


def batched_sink_rule(info, in_dims, x, y):
    x.add_(y if in_dims[1] is None else y.movedim(in_dims[1], 0))
    return None, None  # torch.library's convention for an op without outputs


def test_ops_without_outputs_vmap_through_vmap_fn_and_rules():
    schema = "(Tensor(a!) x, Tensor y) -> ()"
    through_vmap_fn = define(
        "sink16::vmap_fn",
        schema,
        sink,
        fake_fn=lambda x, y: None,
        vmap_fn=sink,
        fake_vmap_fn=lambda x, y: None,
    )
    through_rule = define(
        "sink16::rule", schema, sink, fake_fn=lambda x, y: None, vmap=batched_sink_rule
    )

    @opreg.custom_op("sink16::custom", mutates_args=("x",))
    def through_custom_op(x: torch.Tensor, y: torch.Tensor) -> None:
        x.add_(y)

    through_custom_op.register_vmap(batched_sink_rule)

    def call_then_return_x(op, x, y):
        assert op(x, y) is None
        return x

    for op in (through_vmap_fn, through_rule, through_custom_op):
        x, y = torch.zeros(3, 2), torch.arange(6.0).reshape(3, 2)
        torch.vmap(functools.partial(call_then_return_x, op))(x, y)
        torch.testing.assert_close(x, y)


def test_a_vmap_fn_returning_a_tensor_list_serves_the_ops_one_output():
    op = define(
        "list16::vmap_fn",
        "(Tensor x) -> Tensor[]",
        lambda x: [x * 2, x * 3],
        vmap_fn=lambda x: [x * 2, x * 3],
        fake_vmap_fn=lambda x: [torch.empty_like(x), torch.empty_like(x)],
    )
    x = torch.arange(6.0).reshape(3, 2)
    with opreg.trace() as t:
        doubled, tripled = torch.vmap(op)(x)
    assert "list16::vmap_fn_vmap" in {record.op for record in t.records}
    torch.testing.assert_close(doubled, 2 * x)
    torch.testing.assert_close(tripled, 3 * x)


def test_two_outputs_sharing_memory_are_refused_under_vmap_and_grad_as_in_eager():
    shared = define(
        "alias16::shared",
        "(Tensor x) -> (Tensor, Tensor)",
        lambda x: (lambda y: (y, y.view(y.shape)))(x * 2),
    )
    calls = (
        lambda: shared(torch.randn(2)),
        lambda: torch.vmap(shared)(torch.randn(3, 2)),
        lambda: torch.vmap(torch.vmap(shared))(torch.randn(3, 2, 2)),
        lambda: torch.func.grad(lambda x: shared(x)[0].sum())(torch.randn(2)),
    )
    for call in calls:
        with pytest.raises(
            RuntimeError,
            match="alias16::shared: the fallback returned outputs 0 and 1 sharing memory",
        ):
            call()
    apart = define("alias16::apart", "(Tensor x) -> (Tensor, Tensor)", lambda x: (x * 2, x * 3))
    doubled, _ = torch.vmap(apart)(torch.ones(3, 2))
    torch.testing.assert_close(doubled, 2 * torch.ones(3, 2))


def test_debug_checks_compare_the_fake_of_ops_taking_tensor_lists():
    # Calls with tensors in lists were skipped: a fake giving a Tensor[] of the wrong length went
    # unseen, and torch.compile then dropped outputs.
    os.environ["OPREG_DEBUG"] = "1"
    try:
        result = run_probe(
            """
            import torch, opreg
            def doubled(xs: list[torch.Tensor]) -> list[torch.Tensor]:
                return [t * 2 for t in xs]
            wrong = opreg.register_vmap_op(
                fake_fn=lambda xs: [torch.empty_like(xs[0])], name="debug16::wrong_length"
            )(doubled)
            right = opreg.register_vmap_op(
                fake_fn=lambda xs: [torch.empty_like(t) for t in xs], name="debug16::right"
            )(doubled)
            assert [t.shape for t in right([torch.ones(2), torch.ones(3)])] == [(2,), (3,)]
            try:
                wrong([torch.ones(2), torch.ones(2)])
            except RuntimeError as error:
                expected = "debug16::wrong_length: the fallback returned output 0 with 2 tensors"
                assert expected in str(error), error
            else:
                raise AssertionError("not refused")
            print("ok")
            """
        )
    finally:
        del os.environ["OPREG_DEBUG"]
    assert_survived(result)
    assert result.stdout.strip().endswith("ok")
