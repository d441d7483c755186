"""Regression tests for the eighteenth sweep's findings on vmap rules, Tensor[] and Tensor?[]
arguments and outputs under vmap, opcheck's vmap check and OPREG_DEBUG under vmap."""

from __future__ import annotations

import pytest
import torch
from test_reliability import assert_survived, run_probe

import opreg
from opreg import _C

# ---- A-F14: a rule's value for a Tensor[] output must be a list ------------------------------


def test_a_rule_returning_a_tensor_for_a_tensor_list_output_is_refused():
    @opreg.custom_op("sw18v::one_list", mutates_args=())
    def one_list(x: torch.Tensor) -> list[torch.Tensor]:
        return [x * 2, x * 3]

    one_list.register_vmap(lambda info, in_dims, x: (x.movedim(in_dims[0], 0) * 2, 0))
    with pytest.raises(
        TypeError,
        match=r"sw18v::one_list.*returned a Tensor for output 0, declared Tensor\[\] in the "
        r"schema; expected a list of tensors",
    ):
        torch.vmap(one_list)(torch.randn(4, 3))


def test_a_rule_returning_a_tensor_for_the_list_of_a_two_output_op_is_refused():
    def rule(info, in_dims, x):
        x = x.movedim(in_dims[0], 0)
        return (x * 1, x * 2), (0, 0)

    op = opreg.register_vmap_op(
        fake_fn=lambda x: (torch.empty_like(x), [torch.empty_like(x)]),
        name="sw18v::pair_list",
        schema="(Tensor x) -> (Tensor, Tensor[])",
        vmap=rule,
    )(lambda x: (x * 1, [x * 2]))
    with pytest.raises(TypeError, match=r"sw18v::pair_list.*returned a Tensor for output 1"):
        torch.vmap(op)(torch.randn(4, 3))


def test_a_boxed_rule_returning_a_tensor_for_a_tensor_list_output_is_refused():
    # The core's own check, which C++ rules meet: no Python adapter in front of it.
    builder = _C.OpBuilder("sw18v::boxed_list(Tensor x) -> (Tensor, Tensor[])")
    builder.fallback(lambda x: (x * 1, [x * 2]))
    builder.vmap(
        lambda batch_size, randomness, in_dims, args: (
            (args[0] * 1, args[0] * 2),
            (in_dims[0], in_dims[0]),
        )
    )
    _C.define_all([builder], {})
    with pytest.raises(
        TypeError,
        match=r"sw18v::boxed_list: the vmap rule returned a Tensor for output 1, declared "
        r"Tensor\[\] in the schema; expected a list of tensors",
    ):
        torch.vmap(torch.ops.sw18v.boxed_list)(torch.randn(4, 3))


# ---- A-F3: torch's per-tensor out_dims for a Tensor[] output --------------------------------


def _mixed_rule(info, in_dims, x):
    x = x.movedim(in_dims[0], 0)
    return [x.movedim(0, 1) * 2, x[0] * 3, x * 4], [1, None, 0]


@pytest.mark.parametrize("depth", [1, 2])
def test_mixed_per_tensor_out_dims_of_a_tensor_list_output_work_as_torch_library_s(depth):
    def body(x: torch.Tensor) -> list[torch.Tensor]:
        return [x * 2, x * 3, x * 4]

    theirs = torch.library.custom_op(f"sw18v_torch::mixed{depth}", mutates_args=())(body)
    ours = opreg.custom_op(f"sw18v::mixed{depth}", mutates_args=())(body)
    for op in (theirs, ours):
        op.register_vmap(_mixed_rule)
    x = torch.randn(2, 4, 3)

    def vmapped(op):
        fn = op
        for _ in range(depth):
            fn = torch.vmap(fn)
        return fn(x if depth == 2 else x[0])

    got, want = vmapped(ours), vmapped(theirs)
    assert len(got) == len(want) == 3
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_nested_out_dims_of_a_tensor_and_tensor_list_op_work():
    def rule(info, in_dims, x):
        x = x.movedim(in_dims[0], 0)
        return (x * 1, [x.movedim(0, 1) * 2, x[0] * 3]), (0, [1, None])

    op = opreg.register_vmap_op(
        fake_fn=lambda x: (torch.empty_like(x), [torch.empty_like(x)] * 2),
        name="sw18v::nested",
        schema="(Tensor x) -> (Tensor, Tensor[])",
        vmap=rule,
    )(lambda x: (x * 1, [x * 2, x * 3]))
    x = torch.randn(4, 3)
    one, (two, three) = torch.vmap(op)(x)
    assert torch.equal(one, x) and torch.equal(two, x * 2)
    assert torch.equal(three, (x[0] * 3).expand(4, 3))
    # The uniform nested form too.
    op_uniform = opreg.register_vmap_op(
        fake_fn=lambda x: (torch.empty_like(x), [torch.empty_like(x)] * 2),
        name="sw18v::nested_uniform",
        schema="(Tensor x) -> (Tensor, Tensor[])",
        vmap=lambda info, d, x: (
            (x.movedim(d[0], 0) * 1, [x.movedim(d[0], 0) * 2, x.movedim(d[0], 0) * 3]),
            (0, [0, 0]),
        ),
    )(lambda x: (x * 1, [x * 2, x * 3]))
    one, (two, three) = torch.vmap(op_uniform)(x)
    assert torch.equal(two, x * 2) and torch.equal(three, x * 3)


def test_per_tensor_out_dims_of_the_wrong_length_are_refused_naming_the_op():
    @opreg.custom_op("sw18v::short_dims", mutates_args=())
    def short_dims(x: torch.Tensor) -> list[torch.Tensor]:
        return [x * 2, x * 3]

    short_dims.register_vmap(
        lambda info, d, x: ([x.movedim(d[0], 0) * 2, x.movedim(d[0], 0) * 3], [0, 0, 0])
    )
    with pytest.raises(
        TypeError, match=r"sw18v::short_dims.*out_dims \[0, 0, 0\] for output 0.*2 tensors"
    ):
        torch.vmap(short_dims)(torch.randn(4, 3))


# ---- A-F11: opcheck's vmap check batches Tensor[] arguments ----------------------------------


def _list_op(name, rule):
    def fallback(xs: list[torch.Tensor], s: float) -> torch.Tensor:
        return sum(xs) * s

    return opreg.register_vmap_op(
        fake_fn=lambda xs, s: torch.empty_like(xs[0]), vmap=rule, name=name
    )(fallback)


def test_opcheck_s_vmap_check_catches_a_wrong_rule_of_a_list_op():
    def wrong(info, in_dims, xs, s):  # ignores xs[1]
        x0 = xs[0].movedim(in_dims[0][0], 0)
        return x0 * s * 2, 0

    op = _list_op("sw18v::wrong_list_rule", wrong)
    with pytest.raises(opreg.OpcheckError, match="differ from a loop of single calls"):
        opreg.opcheck(op, [([torch.randn(3), torch.randn(3)], 2.0)], devices=["cpu"])


def test_opcheck_s_vmap_check_passes_a_right_rule_of_a_list_op():
    def right(info, in_dims, xs, s):
        moved = [
            x.movedim(d, 0) if d is not None else x for x, d in zip(xs, in_dims[0], strict=True)
        ]
        return sum(moved) * s, 0

    op = _list_op("sw18v::right_list_rule", right)
    report = opreg.opcheck(
        op, [([torch.randn(3), torch.randn(3)], 2.0)], devices=["cpu"], checks=["vmap"]
    )
    rows = [r for r in report.rows if r.check == "vmap"]
    assert rows and all(r.passed and not r.skipped for r in rows), str(report)


# ---- A-F7: OPREG_DEBUG=1 compares a vmapped call on the batched fallback with the fake -------


def test_debug_checks_compare_the_batched_fallback_under_vmap_with_the_fake():
    result = run_probe(
        """
        import os
        os.environ["OPREG_DEBUG"] = "1"
        import torch, opreg
        wrong = opreg.register_vmap_op(fake_fn=lambda x: x.new_empty(x.shape[0] + 1),
                                       name="debug18v::wrong",
                                       schema="(Tensor x) -> Tensor")(lambda x: x * 2)
        right = opreg.register_vmap_op(fake_fn=torch.empty_like, name="debug18v::right",
                                       schema="(Tensor x) -> Tensor")(lambda x: x * 2)
        lists = opreg.register_vmap_op(fake_fn=lambda x: [x.new_empty(x.shape)],
                                       name="debug18v::lists",
                                       schema="(Tensor x) -> Tensor[]")(lambda x: [x * 1, x * 2])
        one, two = torch.ones(2, 3), torch.ones(2, 2, 3)
        for fn, x in ((torch.vmap(wrong), one), (torch.vmap(torch.vmap(wrong)), two),
                      (torch.vmap(right), one), (torch.vmap(torch.vmap(right)), two),
                      (torch.vmap(lists), one)):
            try:
                fn(x)
                print("passed")
            except RuntimeError as error:
                print("refused:", str(error).splitlines()[0][:200])
        """
    )
    assert_survived(result)
    lines = result.stdout.splitlines()
    assert len(lines) == 5, result.stdout
    for line in lines[:2]:
        assert line.startswith("refused: OPREG_DEBUG: debug18v::wrong:"), line
        assert "shape [3] per example" in line and "fake gives shape [4]" in line, line
    assert lines[2:4] == ["passed", "passed"]
    assert lines[4].startswith("refused: OPREG_DEBUG: debug18v::lists:") and "2 tensors" in lines[4]


# ---- A-F2: Tensor?[] arguments on the rule, batch_polymorphic and per-example paths ----------

OPTIONAL_LIST = "(Tensor x, Tensor?[] ys) -> Tensor"


def _optional_sum(x, ys):
    return x + sum(t for t in ys if t is not None)


def test_a_rule_takes_tensor_optional_list_arguments_with_none_in_dims_for_none():
    seen = []

    def rule(info, in_dims, x, ys):
        seen.append(in_dims)
        x = x.movedim(in_dims[0], 0)
        moved = [
            y.movedim(d, 0) if d is not None else y
            for y, d in zip(ys, in_dims[1], strict=True)
            if y is not None
        ]
        return x + sum(moved), 0

    op = opreg.register_vmap_op(
        fake_fn=lambda x, ys: torch.empty_like(x),
        name="sw18v::opt_rule",
        schema=OPTIONAL_LIST,
        vmap=rule,
    )(_optional_sum)
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    got = torch.vmap(op, in_dims=(0, [0, None]))(x, [y, None])
    assert torch.equal(got, x + y)
    assert seen[-1] == (0, [0, None])
    got = torch.vmap(op, in_dims=(0, None))(x, [y[0], None])
    assert torch.equal(got, x + y[0])
    assert seen[-1] == (0, [None, None])


@pytest.mark.parametrize(
    "options",
    [{"batch_polymorphic": True}, {"vmap_loop": True}, {"backward": lambda ctx, g: (g * 5, None)}],
    ids=["batch_polymorphic", "vmap_loop", "backward"],
)
def test_tensor_optional_list_arguments_under_vmap(options):
    name = "sw18v::opt_" + next(iter(options))
    op = opreg.register_vmap_op(
        fake_fn=lambda x, ys: torch.empty_like(x), name=name, schema=OPTIONAL_LIST, **options
    )(_optional_sum)
    x = torch.randn(4, 3, requires_grad="backward" in options)
    y = torch.randn(4, 3)
    for ys, in_dims in (([y, None], (0, [0, None])), ([y[0], None], (0, None))):
        got = torch.vmap(op, in_dims=in_dims)(x, ys)
        assert torch.allclose(got, _optional_sum(x, ys))
    if "backward" in options:
        (grad,) = torch.autograd.grad(torch.vmap(op, in_dims=(0, None))(x, [y[0], None]).sum(), x)
        assert torch.equal(grad, torch.full_like(x, 5.0))


def test_vmap_over_no_examples_takes_tensor_optional_list_arguments():
    op = opreg.register_vmap_op(
        fake_fn=lambda x, ys: torch.empty_like(x),
        name="sw18v::opt_empty",
        schema=OPTIONAL_LIST,
        vmap_loop=True,
    )(_optional_sum)
    got = torch.vmap(op, in_dims=(0, [0, None]))(torch.randn(0, 3), [torch.randn(0, 3), None])
    assert got.shape == (0, 3)


def test_per_tensor_out_dims_that_miss_the_batch_are_refused_naming_the_dim():
    @opreg.custom_op("sw18v::wrong_dims", mutates_args=())
    def wrong_dims(x: torch.Tensor) -> list[torch.Tensor]:
        return [x * 2, x * 3]

    wrong_dims.register_vmap(
        lambda info, d, x: ([x.movedim(d[0], 0) * 2, x.movedim(d[0], 0) * 3], [0, 1])
    )
    with pytest.raises(
        TypeError,
        match=r"sw18v::wrong_dims.*out_dims \[0, 1\] for output 0, but its tensor 1 of shape "
        r"\(4, 3\) has no dim 1 of the batch size 4",
    ):
        torch.vmap(wrong_dims)(torch.randn(4, 3))
