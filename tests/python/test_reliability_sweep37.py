"""Regression tests for the thirty-seventh adversarial sweep's findings (reports kept outside the
repository), beside the earlier sweeps' files."""

from __future__ import annotations

import pytest
import torch

import opreg


def test_a_vmap_rule_must_view_the_tensor_list_its_output_is_declared_a_view_of():
    # Sweep 37 A-F4: for (Tensor(a)[] xs, Tensor y) -> Tensor(a) a rule returning a view of y (or a
    # clone) was accepted, and an in-place change through the output under vmap reached y, or
    # nothing, where eager calls change xs.
    def first(xs, y):
        return xs[0].view(-1)

    def rule(view_of):
        def vmap(info, dims, xs, y):
            batched = view_of(xs, y).movedim(0, 0)
            return batched.reshape(batched.shape[0], -1), 0

        return vmap

    cases = {
        "of_y": lambda xs, y: y,
        "clone": lambda xs, y: xs[0].clone(),
        "of_xs": lambda xs, y: xs[0],
    }
    ops = {
        name: opreg.register_triton_op(
            schema="(Tensor(a)[] xs, Tensor y) -> Tensor(a)",
            fake_fn=first,
            triton_fn=None,
            name=f"sweep37::list_view_{name}",
            vmap=rule(view_of),
        )(first)
        for name, view_of in cases.items()
    }
    for name in ("of_y", "clone"):
        x, y = torch.ones(3, 2), torch.ones(3, 2)
        with pytest.raises(
            RuntimeError,
            match=f"sweep37::list_view_{name}: the vmap rule returned output 0 sharing memory "
            "with none of 'xs', but the schema",
        ):
            torch.vmap(lambda xs, y, op=ops[name]: op(xs, y).mul_(5), in_dims=([0], 0))([x], y)
        assert x.sum().item() == y.sum().item() == 6.0
    x, y = torch.ones(3, 2), torch.ones(3, 2)
    torch.vmap(lambda xs, y: ops["of_xs"](xs, y).mul_(5), in_dims=([0], 0))([x], y)
    assert (x.sum().item(), y.sum().item()) == (30.0, 6.0)

    def clones(xs):
        return [x.view(-1) for x in xs]

    listed = opreg.register_triton_op(
        schema="(Tensor(a)[] xs) -> Tensor(a)[]",
        fake_fn=clones,
        triton_fn=None,
        name="sweep37::list_of_clones",
        vmap=lambda info, dims, xs: ([x.clone() for x in xs], [0] * len(xs)),
    )(clones)
    with pytest.raises(RuntimeError, match="sweep37::list_of_clones: the vmap rule returned"):
        torch.vmap(lambda xs: listed(xs)[0].mul_(5), in_dims=([0],))([torch.ones(3, 2)])
