"""vmap of C++-defined opreg ops: rules, batch-polymorphic ops (one call whatever the depth), the
fallback under vmap (default), the per-example loop (opt-in, warned once), randomness, in_dims and
out_dims, nesting, and composition with grad, jacrev and torch.compile. Each vmapped result is
checked against a loop of single calls, and the trace shows which implementation ran."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from torch.func import grad, jacrev, vmap

import opreg
from conftest import DEVICES, requires_cuda

ops = torch.ops.opreg_test
scale_add = torch.ops.opreg_example.scale_add


def loop(fn, *args, in_dims):
    size = next(a.shape[d] for a, d in zip(args, in_dims, strict=True) if d is not None)
    return torch.stack(
        [
            fn(*(a if d is None else a.select(d, b) for a, d in zip(args, in_dims, strict=True)))
            for b in range(size)
        ]
    )


@pytest.mark.parametrize("device", DEVICES)
def test_batch_polymorphic_op_is_called_once(device):
    x, y = torch.randn(7, 33, device=device), torch.randn(7, 33, device=device)
    with opreg.trace() as t:
        out = vmap(scale_add, in_dims=(0, 0, None))(x, y, 0.5)
    assert t.impls("opreg_example::scale_add")[0] == "vmap:batch-polymorphic"
    assert len([i for i in t.impls() if not i.startswith("vmap")]) == 1
    torch.testing.assert_close(out, loop(lambda a, b: scale_add(a, b, 0.5), x, y, in_dims=(0, 0)))


@pytest.mark.parametrize("in_dims", [(0, None), (None, 1), (0, -1), (-1, 0)])
def test_in_dims_none_int_negative_per_argument(in_dims):
    x, y = torch.randn(5, 6), torch.randn(6, 5)
    xs = x if in_dims[0] is not None else x[0]
    ys = y if in_dims[1] is not None else y[:, 0]
    out = vmap(lambda a, b: scale_add(a, b, 2.0), in_dims=in_dims)(xs, ys)
    torch.testing.assert_close(
        out, loop(lambda a, b: scale_add(a, b, 2.0), xs, ys, in_dims=in_dims)
    )


def test_out_dims():
    x = torch.randn(4, 3)
    out = vmap(lambda a: scale_add(a, a, 1.0), out_dims=1)(x)
    torch.testing.assert_close(out, (2 * x).t())


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_nested_vmap_batch_polymorphic_one_kernel_call(depth):
    x = torch.randn(*([3] * depth), 17)
    fn = lambda a: scale_add(a, a, 1.0)  # noqa: E731
    for _ in range(depth):
        fn = vmap(fn)
    with opreg.trace() as t:
        out = fn(x)
    assert t.impls().count("vmap:batch-polymorphic") == depth
    assert t.impls()[-1] == "kernel:cpu_loop"  # one call, contiguous: the kernel serves it
    torch.testing.assert_close(out, 2 * x)


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_rule_runs_at_every_depth(depth):
    x = torch.randn(4, 5, *([2] * depth))  # batch dims last; each vmap maps the last one left
    fn = ops.rowsum
    for _ in range(depth):
        fn = vmap(fn, in_dims=-1)
    with opreg.trace() as t:
        out = fn(x)
    assert t.impls() == ["vmap:rule"] * depth + ["fallback"]  # one call sums every example
    expected = x.sum(1).permute(*reversed(range(1, depth + 1)), 0)
    torch.testing.assert_close(out, expected)


def test_fallback_runs_under_vmap_by_default():
    x = torch.randn(6, 4)
    with opreg.trace() as t:
        out = vmap(lambda a: ops.affine(a, 2.0, 1.0))(x)
    assert t.impls()[0] == "vmap:fallback"
    torch.testing.assert_close(out, loop(lambda a: ops.affine(a, 2.0, 1.0), x, in_dims=(0,)))


def test_fallback_that_cannot_be_batched_says_what_to_do():
    with pytest.raises(RuntimeError, match="normalize_by_max: its fallback cannot run under vmap"):
        vmap(ops.normalize_by_max)(torch.randn(3, 4))


def test_a_fallbacks_own_check_keeps_its_type_and_message_under_vmap():
    # It became a RuntimeError saying the fallback "cannot run under vmap" (23rd sweep, B-F7).
    with pytest.raises(ValueError, match="x must not be empty") as eager:
        ops.nonempty_sum(torch.ones(0))
    with pytest.raises(ValueError, match="x must not be empty") as vmapped:
        vmap(ops.nonempty_sum)(torch.ones(3, 0))
    assert "cannot run under vmap" not in str(vmapped.value)
    assert "raised by the fallback of opreg_test::nonempty_sum under vmap" in str(vmapped.value)
    assert "under vmap" not in str(eager.value)
    torch.testing.assert_close(vmap(ops.nonempty_sum)(torch.ones(3, 2)), torch.full((3,), 2.0))


def test_per_example_loop_is_opt_in_and_warned_once():
    x = torch.randn(5, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = vmap(ops.normalize_by_max_looped)(x)
        vmap(ops.normalize_by_max_looped)(x)
    messages = [str(w.message) for w in caught if "per-example loop" in str(w.message)]
    assert len(messages) <= 1  # once per process; an earlier test may already have seen it
    torch.testing.assert_close(first, loop(ops.normalize_by_max_looped, x, in_dims=(0,)))


def test_bad_rule_output_count_is_an_error():
    with pytest.raises(
        RuntimeError, match="bad_vmap_rule: the vmap rule returned 2 outputs, expected 1"
    ):
        vmap(ops.bad_vmap_rule)(torch.randn(3, 2))


@pytest.mark.parametrize("op", ["undefined_vmap_rule", "undefined_unbatched_vmap_rule"])
def test_a_rule_returning_an_undefined_tensor_is_named_so(op):
    # Returned unbatched (out_dim None), it came out as None (sweep 48 B-V5).
    with pytest.raises(
        TypeError,
        match=f"{op}: the vmap rule returned an undefined tensor for output 0, "
        "declared Tensor in the schema; expected a tensor",
    ):
        vmap(getattr(ops, op), out_dims=None)(torch.randn(3, 2))


def test_randomness_error_same_different():
    x = torch.zeros(4)
    with pytest.raises(RuntimeError, match="opreg_test::noisy: the op is random"):
        vmap(lambda _: ops.noisy(x))(torch.zeros(3))
    same = vmap(lambda _: ops.noisy(x), randomness="same")(torch.zeros(3))
    assert torch.equal(same[0], same[1]) and torch.equal(same[1], same[2])
    different = vmap(lambda _: ops.noisy(x), randomness="different")(torch.zeros(3))
    assert not torch.equal(different[0], different[1])
    batched = vmap(ops.noisy, randomness="different")(torch.zeros(3, 4))
    assert not torch.equal(batched[0], batched[1])


def test_vmap_of_grad_and_grad_of_vmap_and_jacrev():
    x, y = torch.randn(5, 3), torch.randn(5, 3)

    def loss(a, b):
        return scale_add(a, b, 0.5).pow(2).sum()

    per_example = vmap(grad(loss))(x, y)
    torch.testing.assert_close(per_example, 2 * (x + 0.5 * y))
    whole = grad(lambda a: vmap(lambda r: scale_add(r, r, 1.0))(a).pow(2).sum())(x)
    torch.testing.assert_close(whole, 8 * x)
    jac = jacrev(lambda a: scale_add(a, y[0], 0.5))(x[0])
    torch.testing.assert_close(jac, torch.eye(3))
    jac_sq = jacrev(ops.square)(x[0])
    torch.testing.assert_close(jac_sq, torch.diag(2 * x[0]))


def test_vmap_under_torch_compile():
    def f(a, b):
        return vmap(lambda r, s: scale_add(r, s, 0.5))(a, b).sin()

    x, y = torch.randn(4, 8), torch.randn(4, 8)
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(x, y), f(x, y))


def test_info_reports_vmap_support():
    assert opreg.describe_op("opreg_test::rowsum").vmap is opreg.VmapSupport.RULE
    support = opreg.VmapSupport
    assert opreg.describe_op("opreg_example::scale_add").vmap is support.BATCH_POLYMORPHIC
    assert opreg.describe_op("opreg_test::affine").vmap is support.FALLBACK
    assert opreg.describe_op("opreg_test::normalize_by_max_looped").vmap is support.PER_EXAMPLE_LOOP
    assert (
        "vmap:     per-example loop"
        in opreg.describe_op("opreg_test::normalize_by_max_looped").describe()
    )


@requires_cuda
def test_batch_polymorphic_kernel_serves_vmap_on_cuda():
    x, y = torch.randn(64, 1000, device="cuda"), torch.randn(64, 1000, device="cuda")
    with opreg.trace() as t:
        out = vmap(scale_add, in_dims=(0, 0, None))(x, y, 0.5)
    assert t.impls() == ["vmap:batch-polymorphic", "kernel:fused"]
    torch.testing.assert_close(out, x + 0.5 * y)


def test_compiled_vmap_of_vmap_with_dynamic_shapes():
    # Found by EvoX's test_non_dominate under opreg: the vmap rule's output check read sizes()
    # of a tensor whose sizes were symbolic.
    def fake(a: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(a)

    double = opreg.register_vmap_op(
        lambda a: a * 2,
        fake_fn=fake,
        vmap_fn=lambda a: a * 2,
        fake_vmap_fn=fake,
        name="opreg_vmap_test::dynamic_double",
        schema="(Tensor a) -> Tensor",
    )
    x = torch.randn(3, 5, 4)
    out = torch.compile(torch.vmap(torch.vmap(double)), dynamic=True)(x)
    torch.testing.assert_close(out, x * 2)


# Note [Gradients through vmap] (src/core/vmap.cpp): a gradient taken through torch.vmap(op) uses
# the op's backward and honours its autograd policy, as the eager call does.
def straight_through(name, **autograd):
    """round() forward; by default an identity-times-two backward (round's own derivative is 0)."""
    if not autograd:
        autograd = dict(backward=lambda ctx, g: 2 * g, setup_context=lambda ctx, inputs, out: None)
    return opreg.register_triton_op(
        fake_fn=None,
        triton_fn=None,
        name=f"vmap_grad::{name}",
        schema="(Tensor x) -> Tensor",
        **autograd,
    )(lambda x: x.round())


def test_gradient_through_vmap_uses_the_ops_backward_at_every_depth():
    op = straight_through("backward")
    x = torch.randn(2, 4, 3, requires_grad=True)
    expected = torch.full_like(x, 2.0)
    torch.testing.assert_close(torch.autograd.grad(vmap(op)(x).sum(), x)[0], expected)
    torch.testing.assert_close(torch.autograd.grad(vmap(vmap(op))(x).sum(), x)[0], expected)
    torch.testing.assert_close(grad(lambda v: vmap(vmap(op))(v).sum())(x.detach()), expected)
    torch.testing.assert_close(vmap(grad(lambda v: vmap(op)(v).sum()))(x.detach()), expected)
    torch.testing.assert_close(jacrev(vmap(op))(x[0].detach()).sum((0, 1)), expected[0])
    weight = torch.ones(3, requires_grad=True)
    loss = vmap(lambda row: op(row * weight).sum())(x[0].detach()).sum()
    torch.testing.assert_close(torch.autograd.grad(loss, weight)[0], 2 * x[0].detach().sum(0))


def test_gradient_through_vmap_of_a_custom_op_uses_register_autograd():
    @opreg.custom_op("vmap_grad::custom", mutates_args=())
    def custom(x: torch.Tensor) -> torch.Tensor:
        return x.round()

    custom.register_autograd(lambda ctx, g: 3 * g)
    x = torch.randn(4, 3, requires_grad=True)
    torch.testing.assert_close(
        torch.autograd.grad(vmap(custom)(x).sum(), x)[0], 3 * torch.ones_like(x)
    )


def test_gradient_through_vmap_honours_the_error_and_none_policies():
    error = straight_through("error", autograd="error")
    none = straight_through("none", autograd="none")
    x = torch.randn(4, 3, requires_grad=True)
    for call in (
        lambda: vmap(error)(x),
        lambda: torch.func.jvp(vmap(error), (x.detach(),), (x.detach(),)),
    ):
        with pytest.raises(
            RuntimeError, match=r"vmap_grad::error: under vmap, an input .* policy is 'error'"
        ):
            call()
    assert torch.equal(vmap(error)(x.detach()), x.detach().round())  # nothing needs a gradient
    assert not none(x).requires_grad and not vmap(none)(x).requires_grad
    tangent = torch.func.jvp(vmap(none), (x.detach(),), (torch.ones_like(x),))[1]
    assert torch.equal(tangent, torch.zeros_like(x))


def test_vmap_without_gradients_keeps_the_batched_fallback():
    op = straight_through("fast")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with opreg.trace() as t:
            vmap(op)(torch.randn(4, 3))
    assert t.impls("vmap_grad::fast")[0] == "vmap:fallback"
    with opreg.trace() as t:
        vmap(op)(torch.randn(4, 3, requires_grad=True))
    assert t.impls("vmap_grad::fast")[0] == "vmap:per-example loop"


def test_a_cpp_rule_keeps_a_dynamic_batch_size_symbolic():
    # info.batch_size is a SymInt: an export with a dynamic batch serves every batch size.
    x, row = torch.randn(4, 2, 3), torch.randn(3)
    torch.testing.assert_close(vmap(ops.add_row, in_dims=(0, None))(x, row), x + row)

    class Module(torch.nn.Module):
        def forward(self, x, row):
            return vmap(ops.add_row, in_dims=(0, None))(x, row)

    exported = torch.export.export(
        Module(), (x, row), dynamic_shapes=({0: torch.export.Dim("batch")}, None)
    )
    for batch in (1, 5):
        x = torch.randn(batch, 2, 3)
        torch.testing.assert_close(exported.module()(x, row), x + row)


# A fallback or rule may start transforms of its own (torch.vmap, torch.func.grad inside it): they
# nest under the transforms the op is called in, as in a torch.library.custom_op. They hit
# functorch's internal assert (savedLocalDispatchKeySet_) before.


def _functorch_depth():
    return torch._C._functorch.get_dynamic_layer_stack_depth()


@functools.cache
def _vmapping_sin():
    @opreg.register_vmap_op(fake_fn=torch.empty_like, name="nested_transforms::vmapping_sin")
    def op(x: torch.Tensor) -> torch.Tensor:
        return vmap(torch.sin)(x) * 2

    return op


def _grad_of_cube():
    @opreg.register_vmap_op(fake_fn=torch.empty_like, name="nested_transforms::grad_of_cube")
    def op(x: torch.Tensor) -> torch.Tensor:  # 3 x^2, elementwise
        return vmap(grad(lambda t: t**3))(x.reshape(-1)).reshape(x.shape)

    return op


def test_a_fallback_that_starts_a_transform_runs_under_every_transform():
    op = _vmapping_sin()
    x = torch.randn(3, 4, dtype=torch.float64)
    ones = torch.ones_like(x)
    torch.testing.assert_close(op(x), 2 * x.sin())
    torch.testing.assert_close(vmap(op)(x), 2 * x.sin())
    deeper = torch.randn(2, 3, 4, dtype=torch.float64)
    torch.testing.assert_close(vmap(vmap(op))(deeper), 2 * deeper.sin())
    torch.testing.assert_close(grad(lambda t: op(t).sum())(x), 2 * x.cos())
    torch.testing.assert_close(vmap(grad(lambda t: op(t).sum()))(x), 2 * x.cos())
    torch.testing.assert_close(grad(lambda t: vmap(op)(t).sum())(x), 2 * x.cos())
    torch.testing.assert_close(torch.func.jvp(op, (x,), (ones,))[1], 2 * x.cos())
    torch.testing.assert_close(torch.func.jacrev(op)(x[0]), torch.diag(2 * x[0].cos()))
    torch.testing.assert_close(torch.func.jacfwd(op)(x[0]), torch.diag(2 * x[0].cos()))
    leaf = x.clone().requires_grad_()
    torch.testing.assert_close(torch.autograd.grad(vmap(op)(leaf).sum(), leaf)[0], 2 * x.cos())
    assert _functorch_depth() == 0


def test_a_fallback_that_takes_gradients_runs_under_every_transform():
    op = _grad_of_cube()
    x = torch.randn(3, 4, dtype=torch.float64)
    torch.testing.assert_close(op(x), 3 * x**2)
    torch.testing.assert_close(vmap(op)(x), 3 * x**2)
    torch.testing.assert_close(grad(lambda t: op(t).sum())(x), 6 * x)
    torch.testing.assert_close(vmap(grad(lambda t: op(t).sum()))(x), 6 * x)
    torch.testing.assert_close(torch.func.jvp(op, (x,), (torch.ones_like(x),))[1], 6 * x)
    assert _functorch_depth() == 0


def test_a_rule_that_starts_a_transform_runs_below_the_layer():
    def rule(info, in_dims, x):
        return vmap(torch.sin, in_dims=in_dims[0])(x) * 2, 0

    op = opreg.register_vmap_op(
        lambda x: x.sin() * 2,
        fake_fn=torch.empty_like,
        vmap=rule,
        name="nested_transforms::rule_vmaps",
        schema="(Tensor x) -> Tensor",
    )
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    with opreg.trace() as t:
        torch.testing.assert_close(vmap(op)(x), 2 * x.sin())
        torch.testing.assert_close(vmap(op, in_dims=1)(x), 2 * x.sin().movedim(1, 0))
        torch.testing.assert_close(vmap(vmap(op))(x), 2 * x.sin())
    assert set(t.impls("nested_transforms::rule_vmaps")) == {"vmap:rule"}
    torch.testing.assert_close(grad(lambda t: vmap(op)(t).sum())(x), 2 * x.cos())
    assert _functorch_depth() == 0


def test_a_transform_failing_inside_a_fallback_leaves_the_layers_as_they_were():
    @opreg.register_vmap_op(fake_fn=torch.empty_like, name="nested_transforms::fails_inside")
    def op(x: torch.Tensor) -> torch.Tensor:
        return vmap(lambda t: t.reshape(5))(x)  # one example is 4 numbers: refused

    x = torch.randn(3, 4)
    for call in (lambda: vmap(op)(x), lambda: grad(lambda t: op(t).sum())(x)):
        with pytest.raises(RuntimeError, match="is invalid for input of size"):
            call()
        assert _functorch_depth() == 0
    sin = _vmapping_sin()  # and the next transforms run as usual
    torch.testing.assert_close(vmap(sin)(x), 2 * x.sin())
    torch.testing.assert_close(vmap(lambda t: t * 2)(x), 2 * x)
