"""Regression tests for the seventeenth sweep's findings in the Python front (those of the C++
core are in tests/cpp/test_reliability.cpp)."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import torch
from test_reliability import assert_survived, run_probe

import opreg


def test_torch_s_opcheck_form_takes_an_argument_tuple_of_lists():
    # A tuple whose arguments are all lists (Tensor[]) was taken for opreg's list of samples.
    @opreg.custom_op("opcheck17::sum_list", mutates_args=())
    def sum_list(xs: list[torch.Tensor]) -> torch.Tensor:
        return sum(xs[1:], xs[0].clone())

    @sum_list.register_fake
    def _(xs):
        return torch.empty_like(xs[0])

    a, b = torch.randn(3), torch.randn(3)
    result = opreg.opcheck(sum_list, ([a, b],))
    assert isinstance(result, dict) and set(result.values()) == {"SUCCESS"}
    assert isinstance(opreg.opcheck(sum_list, [([a, b],)], devices=["cpu"]), opreg.OpcheckReport)


def test_opcheck_samples_may_leave_out_arguments_with_a_default_of_none():
    @opreg.register_vmap_op(
        fake_fn=lambda x, eps=None, y=None: torch.empty_like(x), name="opcheck17::eps"
    )
    def with_defaults(
        x: torch.Tensor, eps: float | None = None, y: torch.Tensor | None = None
    ) -> torch.Tensor:
        return x * 2 + (eps or 0.0) + (0 if y is None else y)

    report = opreg.opcheck(torch.ops.opcheck17.eps.default, [(torch.randn(3),)], devices=["cpu"])
    assert not report.failures


def test_opcheck_passes_a_correct_op_that_writes_an_argument_and_returns_an_output():
    # The gradients check wrote into a leaf, and the vmap check batched x but not the written
    # `out`, which vmap can never write a batch into: every such op failed opcheck.
    @opreg.register_vmap_op(
        fake_fn=lambda x, out: torch.empty_like(x),
        name="opcheck17::add_into",
        mutates_args=("out",),
    )
    def add_into(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        out.add_(x)
        return x * 2

    report = opreg.opcheck(torch.ops.opcheck17.add_into.default, devices=["cpu"])
    ran = {row.check for row in report.rows if not row.skipped}
    assert {"gradients", "vmap"} <= ran and not report.failures

    def wrong_rule(info, in_dims, x, out):
        out.add_(x.sum())  # the whole batch's sum, where each example adds its own
        return x.movedim(in_dims[0], 0) * 2, 0

    opreg.register_triton_op(
        fake_fn=lambda x, out: torch.empty_like(x),
        triton_fn=None,
        name="opcheck17::add_wrong",
        schema="(Tensor x, Tensor(a!) out) -> Tensor",
        vmap=wrong_rule,
    )(lambda x, out: (out.add_(x), x * 2)[1])
    report = opreg.opcheck(
        torch.ops.opcheck17.add_wrong.default,
        devices=["cpu"],
        checks=["vmap"],
        raise_on_failure=False,
    )
    assert report.failures


def test_a_backward_gradient_of_the_broadcast_shape_is_summed_to_the_input():
    # PyTorch's engine sums such a gradient down for its own nodes; torch.library's backwards
    # rely on it.
    @opreg.custom_op("grad17::mul", mutates_args=())
    def mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * y

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        return grad * y, grad * x

    mul.register_autograd(backward, setup_context=setup_context)
    x, y = torch.randn(4, requires_grad=True), torch.randn(3, 4, requires_grad=True)
    gx, gy = torch.autograd.grad(mul(x, y).sum(), (x, y))
    torch.testing.assert_close(gx, y.detach().sum(0))
    torch.testing.assert_close(gy, x.detach().expand(3, 4))
    mul.register_autograd(lambda ctx, grad: (grad[:2], None), setup_context=setup_context)
    x = torch.randn(4, requires_grad=True)
    with pytest.raises(
        RuntimeError, match="grad17::mul: backward's gradient for input 'x' has shape"
    ):
        torch.autograd.grad(mul(x, torch.randn(4)).sum(), x)


def test_register_kernel_meta_serves_meta_tensors_as_torch_s_does():
    @opreg.custom_op("meta17::only_cuda", mutates_args=(), device_types="cuda")
    def only_cuda(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    only_cuda.register_kernel("meta", lambda x: torch.empty_like(x))
    assert only_cuda(torch.empty(3, device="meta")).shape == (3,)

    @opreg.custom_op("meta17::cpu_and_meta", mutates_args=(), device_types=("cpu", "meta"))
    def cpu_and_meta(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    assert cpu_and_meta(torch.empty(3, device="meta")).shape == (3,)
    compiled = torch.compile(lambda x: cpu_and_meta(x), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(torch.ones(2)), torch.full((2,), 3.0))


@pytest.mark.parametrize("name", ["__init__", "__dict__", "__class__", "__module__", "__getattr__"])
def test_a_name_torch_ops_cannot_reach_is_refused_before_anything_is_defined(name):
    # The core defined the op, then torch.ops.<ns>.<name> found the namespace's own attribute: a
    # bare AttributeError, and the op stayed defined (a retry was refused as a redefinition).
    qualname = f"dunder17::{name}"
    with pytest.raises(
        ValueError, match=f"name '{qualname}': torch.ops.dunder17.{name} is an attribute"
    ):
        opreg.register_vmap_op(fake_fn=None, name=qualname)(lambda x: x * 2)
    with pytest.raises(ValueError, match="no op named"):
        opreg.describe_op(qualname)


def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def with_vmap_fn(name, **autograd):
    return opreg.register_vmap_op(
        fake_fn=lambda x: torch.empty_like(x),
        vmap_fn=lambda x: x * 2,
        fake_vmap_fn=lambda x: torch.empty_like(x),
        name=f"vmap_fn17::{name}",
        **autograd,
    )(twice)


def test_a_gradient_through_vmap_of_a_vmap_fn_op_keeps_the_ops_autograd():
    # vmap_fn stands for the fallback: its ATen ops were recorded, skipping the op's backward and
    # its 'error' and 'none' policies.
    op = with_vmap_fn("backward", backward=lambda ctx, g: g * 7)
    for shape, vmapped in (((3, 2), torch.vmap(op)), ((2, 3, 2), torch.vmap(torch.vmap(op)))):
        x = torch.ones(shape, requires_grad=True)
        vmapped(x).sum().backward()
        torch.testing.assert_close(x.grad, torch.full(shape, 7.0))
    with opreg.trace() as t:
        torch.vmap(op)(torch.ones(3, 2))  # no gradient: vmap_fn serves the whole batch
    assert t.impls() == ["vmap:rule", "vmap_fn"]

    error = with_vmap_fn("error", autograd="error")
    refused = "vmap_fn17::error: under vmap, an input .* policy is 'error'"
    with pytest.raises(RuntimeError, match=refused):
        torch.vmap(error)(torch.ones(3, 2, requires_grad=True))
    with pytest.raises(RuntimeError, match=refused):
        torch.func.jvp(torch.vmap(error), (torch.ones(3, 2),), (torch.ones(3, 2),))

    none = with_vmap_fn("none", autograd="none")
    assert not torch.vmap(none)(torch.ones(3, 2, requires_grad=True)).requires_grad


def test_ops_with_tensor_list_arguments_vmap_through_rules_batch_polymorphic_and_the_loop():
    # Every vmapped call of such an op was refused ("cannot take its Tensor[] arguments yet").
    a, y = torch.randn(4, 3), torch.randn(3)

    @opreg.custom_op("list17::rule", mutates_args=())
    def with_rule(xs: list[torch.Tensor], s: float) -> torch.Tensor:
        return sum(xs) * s

    @with_rule.register_vmap
    def _(info, in_dims, xs, s):
        assert in_dims == ([0, 0], None)  # the list batched as a whole, each tensor at dim 0
        return sum(xs) * s, 0

    torch.testing.assert_close(
        torch.vmap(with_rule, in_dims=([0, None], None))([a, y], 2.0), (a + y) * 2
    )

    def add_all(x: torch.Tensor, ys: list[torch.Tensor]) -> torch.Tensor:
        return x + sum(ys)

    polymorphic = opreg.register_vmap_op(
        fake_fn=None, name="list17::polymorphic", batch_polymorphic=True
    )(add_all)
    with opreg.trace() as t:
        torch.testing.assert_close(torch.vmap(polymorphic, in_dims=(0, None))(a, [y]), a + y)
    assert t.impls("list17::polymorphic")[0] == "vmap:batch-polymorphic"
    torch.testing.assert_close(torch.vmap(polymorphic, in_dims=(None, 0))(y, [a, a]), y + 2 * a)

    loop = opreg.register_vmap_op(fake_fn=None, name="list17::loop", vmap_loop=True)(add_all)
    torch.testing.assert_close(torch.vmap(loop, in_dims=(None, 0))(y, [a, a]), y + 2 * a)
    assert torch.vmap(loop, in_dims=(None, 0))(y, [a[:0], a[:0]]).shape == (0, 3)


def round_plus(x: torch.Tensor, ys: list[torch.Tensor]) -> torch.Tensor:
    return x.round() + sum(ys)


def test_a_gradient_through_vmap_of_an_op_with_a_tensor_list_uses_its_backward():
    op = opreg.register_vmap_op(
        fake_fn=None, name="list17::backward", backward=lambda ctx, grad: (grad * 5, None)
    )(round_plus)
    x = torch.randn(4, 3, requires_grad=True)
    (grad,) = torch.autograd.grad(torch.vmap(op)(x, [torch.randn(4, 3)]).sum(), x)
    torch.testing.assert_close(grad, torch.full((4, 3), 5.0))


def cosine(x: torch.Tensor) -> torch.Tensor:
    return x.cos()


def test_vmap_of_a_batch_polymorphic_op_keeps_the_batch_size_symbolic_under_tracing():
    # The batch size was made an int: torch.export refused a dynamic batch dim, and
    # torch.compile(dynamic=True) compiled once per batch size.
    op = opreg.register_vmap_op(
        fake_fn=lambda x: torch.empty_like(x), name="symbolic17::cos", batch_polymorphic=True
    )(cosine)

    class Module(torch.nn.Module):
        def forward(self, x):
            return torch.vmap(op)(x) + 1

    batch = torch.export.Dim("batch")
    exported = torch.export.export(Module(), (torch.randn(4, 3),), dynamic_shapes=({0: batch},))
    torch.testing.assert_close(exported.module()(torch.zeros(6, 3)), torch.full((6, 3), 2.0))
    graphs = []

    def count(graph, example_inputs):
        graphs.append(graph)
        return graph

    compiled = torch.compile(lambda x: torch.vmap(op)(x) + 1, dynamic=True, backend=count)
    for size in (4, 5, 6, 7):
        torch.testing.assert_close(compiled(torch.zeros(size, 3)), torch.full((size, 3), 2.0))
    assert len(graphs) == 1


def test_a_vmapped_call_racing_a_replace_of_a_vmap_fn_op_never_mixes_the_definitions():
    # The rule (the op's definition) reached the companion `<name>_vmap` by name, so a call
    # could wrap its inputs with one definition and run the other's vmap_fn (2 * 10 = 20).
    def define(which):
        factor, vmap_factor, wrap_factor = (2, 2, 1) if which == "A" else (3, 0.3, 10)

        def wrap(info, in_dims, x):
            time.sleep(0.002)
            return (x.movedim(in_dims[0], 0) * wrap_factor,)

        def fallback(x: torch.Tensor) -> torch.Tensor:
            return x * factor

        opreg.register_vmap_op(
            fake_fn=lambda x: torch.empty_like(x),
            fake_vmap_fn=lambda x: torch.empty_like(x),
            name="race17::f",
            replace=True,
            vmap_fn=lambda x: x * vmap_factor,
            vmap_wrap_inputs=wrap,
        )(fallback)

    define("A")
    op = torch.ops.race17.f.default
    seen, errors, stop = set(), [], threading.Event()

    def call():
        while not stop.is_set():
            try:
                seen.add(round(torch.vmap(op)(torch.ones(4, 3))[0, 0].item(), 3))
            except RuntimeError as error:
                errors.append(str(error))

    callers = [threading.Thread(target=call) for _ in range(2)]
    for caller in callers:
        caller.start()
    for i in range(60):
        time.sleep(0.001)
        define("AB"[i % 2])
    stop.set()
    for caller in callers:
        caller.join()
    assert seen <= {2.0, 3.0}, seen
    assert all(
        "race17::f' was replaced (or undefined) while this vmapped call ran" in e for e in errors
    )
    torch.testing.assert_close(torch.vmap(op)(torch.ones(4, 3)), torch.full((4, 3), 3.0))


def arange_on(n: int, device: torch.device) -> torch.Tensor:
    return torch.arange(n, device=device, dtype=torch.float32)


def test_a_call_without_a_tensor_keeps_its_size_symbolic_under_tracing():
    # Such calls run the fallback under FakeTensorMode; their SymInt was made an int on the way,
    # so torch.export refused a dynamic dim that reached it.
    op = opreg.register_vmap_op(fake_fn=None, name="symbolic17::arange")(arange_on)

    class Module(torch.nn.Module):
        def forward(self, x):
            return op(x.shape[0], x.device) + x

    exported = torch.export.export(
        Module(), (torch.ones(3),), dynamic_shapes=({0: torch.export.Dim("n")},)
    )
    torch.testing.assert_close(exported.module()(torch.ones(5)), torch.arange(1.0, 6.0))


def test_a_failed_load_rolls_back_only_what_it_did_not_what_other_threads_did_meanwhile(
    test_ops_library, tmp_path
):
    # Its rollback put back an op another thread had undefined during the load, and took away an
    # op another thread had replaced during it (the load had defined it first).
    library = test_ops_library.parent / "libopreg_failing_wait_then_fail.so"
    result = run_probe(
        f"""
        import ctypes, os, threading, time, torch, opreg
        os.environ["OPREG_REPLACE_NAME"] = "rollback17::x"
        os.environ["OPREG_WAIT_FILE"] = {str(tmp_path / "go")!r}
        def doubled(x: torch.Tensor) -> torch.Tensor:
            return x * 2
        opreg.register_vmap_op(fake_fn=None, name="rollback17::x")(doubled)
        # Loaded (and its symbols resolved) before the load, which holds the dynamic loader.
        undefine = ctypes.CDLL({str(test_ops_library)!r}).opreg_test_undefine
        undefine.argtypes = [ctypes.c_char_p]
        assert undefine(b"rollback17::never_defined") != 0
        errors = []
        def load():
            try:
                opreg.load_library({str(library)!r})
            except ValueError as error:
                errors.append(str(error))
        loading = threading.Thread(target=load)
        loading.start()
        names = lambda: {{report.name for report in opreg.describe_ops()}}
        for _ in range(2000):
            if "opreg_failing::waited" in names():
                break
            time.sleep(0.01)
        started = time.monotonic()
        assert undefine(b"rollback17::x") == 0
        def thirty(x: torch.Tensor) -> torch.Tensor:
            return x * 30
        opreg.register_vmap_op(fake_fn=None, name="opreg_failing::waited", replace=True)(thirty)
        open({str(tmp_path / "go")!r}, "w").close()
        assert time.monotonic() - started < 10, "the load did not wait for this thread"
        loading.join()
        assert errors and "opreg_failing::bad" in errors[0], errors
        assert "rollback17::x" not in names()
        print("waited:", torch.ops.opreg_failing.waited(torch.ones(1)).tolist())
        """
    )
    assert_survived(result)
    assert "waited: [30.0]" in result.stdout


def test_custom_op_racing_a_piece_added_on_another_thread_loses_nothing():
    # The older object's piece, checked current before the new custom_op published, redefined the
    # op with its stale pieces; and the name was refused from then on ("defined outside").
    @opreg.custom_op("race17::custom", mutates_args=())
    def first(x: torch.Tensor) -> torch.Tensor:
        return x * 0

    stop = threading.Event()

    def add_pieces():
        while not stop.is_set():
            # RuntimeError: "defined again since", once a newer custom_op holds the name.
            with contextlib.suppress(RuntimeError):
                first.register_autograd(lambda ctx, grad: grad)

    adder = threading.Thread(target=add_pieces)
    adder.start()
    try:
        for k in range(1, 60):
            opreg.custom_op(
                "race17::custom",
                lambda x, k=k: x * k,
                mutates_args=(),
                schema="(Tensor x) -> Tensor",
            )
            assert torch.ops.race17.custom(torch.ones(1)).item() == k
    finally:
        stop.set()
        adder.join()


def test_two_threads_replacing_a_vmap_fn_op_are_not_refused():
    # Each read the Python-side records of the op and its companion while the other changed them:
    # a false "the companion is an op of its own" refusal.
    def define(k):
        def scaled(x: torch.Tensor) -> torch.Tensor:
            return x * k

        opreg.register_vmap_op(
            fake_fn=lambda x: torch.empty_like(x),
            vmap_fn=scaled,
            fake_vmap_fn=lambda x: torch.empty_like(x),
            name="race17::companion",
            replace=True,
        )(scaled)

    errors = []

    def replace(k):
        for _ in range(40):
            try:
                define(k)
            except Exception as error:
                errors.append(error)

    threads = [threading.Thread(target=replace, args=(k,)) for k in (2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:3]


def test_a_vmapped_call_racing_a_replace_of_a_batch_polymorphic_op_never_mixes_the_definitions():
    # The batch-polymorphic path calls the op again, by name: a replace racing it had the new,
    # not batch-polymorphic, fallback take the whole batch (a mean over every example).
    def define(polymorphic):
        def minus_one(x: torch.Tensor) -> torch.Tensor:
            time.sleep(0.001)
            return x - 1

        def centered(x: torch.Tensor) -> torch.Tensor:
            time.sleep(0.001)
            return x - x.mean()

        opreg.register_vmap_op(
            fake_fn=lambda x: torch.empty_like(x),
            name="race17::polymorphic",
            replace=True,
            batch_polymorphic=polymorphic,
        )(minus_one if polymorphic else centered)

    define(True)
    op = torch.ops.race17.polymorphic.default
    x = torch.arange(12.0).reshape(4, 3)
    allowed = (x - 1, x - x.mean(1, keepdim=True))
    wrong, errors, stop = [], [], threading.Event()

    def call():
        while not stop.is_set():
            try:
                result = torch.vmap(op)(x)
            except RuntimeError as error:
                errors.append(str(error))
                continue
            if not any(torch.equal(result, a) for a in allowed):
                wrong.append(result)

    callers = [threading.Thread(target=call) for _ in range(2)]
    for caller in callers:
        caller.start()
    for i in range(60):
        time.sleep(0.001)
        define(i % 2 == 1)
    stop.set()
    for caller in callers:
        caller.join()
    assert not wrong, wrong[:2]
    assert all("race17::polymorphic: the op was replaced" in e for e in errors), errors[:2]


def test_a_library_loaded_by_one_whose_load_fails_is_refused_when_loaded_again(test_ops_library):
    # Its ops were rolled back with the outer library's; loading it again then "succeeded" and
    # defined nothing (a library's initializers run once per process).
    outer = test_ops_library.parent / "libopreg_failing_nested_load.so"
    inner = test_ops_library.parent / "libopreg_failing_thread_define.so"
    result = run_probe(
        f"""
        import os, opreg
        os.environ["OPREG_NESTED_LIBRARY"] = {str(inner)!r}
        os.environ["OPREG_NESTED_THEN_FAIL"] = "1"
        for path in ({str(outer)!r}, {str(inner)!r}):
            try:
                opreg.load_library(path)
            except ValueError as error:
                print("raised:", error)
            else:
                print("loaded:", path)
        ops = [r.name for r in opreg.describe_ops()]
        print("defined:", [name for name in ops if name.startswith("opreg_failing::")])
        """
    )
    assert_survived(result)
    assert "loaded:" not in result.stdout, result.stdout
    assert f"raised: opreg::load_library: '{inner}' was loaded by '{outer}', whose load failed" in (
        result.stdout
    )
    # from_thread was defined on a thread the initializer waited for: that thread's, not the load's
    assert "defined: ['opreg_failing::from_thread']" in result.stdout


def cast_twice(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype) * 2


def test_opcheck_passes_an_op_whose_output_dtype_comes_from_an_argument():
    # gradcheck ran in float64 with the dtype argument kept: "Double did not match Float".
    op = opreg.register_vmap_op(
        fake_fn=lambda x, dtype: torch.empty_like(x, dtype=dtype), name="opcheck17::cast"
    )(cast_twice)
    report = opreg.opcheck(
        torch.ops.opcheck17.cast.default, [(torch.randn(2, 2), torch.float32)], devices=["cpu"]
    )
    assert not report.failures
    (gradients,) = [row for row in report.rows if row.check == "gradients"]
    assert gradients.message == "gradcheck skipped: an output is torch.float32 with float64 inputs"
    assert op is not None


def test_debug_checks_leave_out_calls_whose_fake_cannot_run_on_meta_tensors():
    # OPREG_DEBUG=1 refused valid ops: data-dependent fakes, fakes placing their output by a
    # Device argument or a factory's default device (sixteenth sweep A-F6, seventeenth A-F21).
    result = run_probe(
        """
        import os
        os.environ["OPREG_DEBUG"] = "1"
        import torch, opreg
        def define(name, schema, fallback, fake):
            return opreg.register_triton_op(
                fake_fn=fake, triton_fn=None, name=name, schema=schema)(fallback)
        def data_dependent(x):
            return x.new_empty(torch.library.get_ctx().new_dynamic_size(), 1, dtype=torch.long)
        nonzero = define("debug17::nonzero", "(Tensor x) -> Tensor", lambda x: x.nonzero(),
                         data_dependent)
        to = define("debug17::to", "(Tensor x, Device d) -> Tensor", lambda x, d: x.to(d) * 1,
                    lambda x, d: torch.empty(x.shape, device=d))
        grow = define("debug17::grow", "(Tensor x) -> Tensor", lambda x: torch.cat([x, x[:1]]),
                      lambda x: torch.empty(x.shape[0] + 1))
        print(nonzero(torch.tensor([1.0, 0.0, 2.0])).tolist(),
              to(torch.ones(2), torch.device("cpu")).tolist(), grow(torch.ones(2)).tolist())
        """
    )
    assert_survived(result)
    assert "[[0], [2]] [1.0, 1.0] [1.0, 1.0, 1.0]" in result.stdout


def with_schema(name, schema, fallback, **options):
    return opreg.register_triton_op(
        fake_fn=options.pop("fake_fn", None), triton_fn=None, name=name, schema=schema, **options
    )(fallback)


def test_a_rules_in_dims_are_nested_for_tensor_lists_only():
    seen = []

    def rule(info, in_dims, x, sizes):
        seen.append(in_dims)
        return x.movedim(in_dims[0], 0).reshape(info.batch_size, *sizes) * 1, 0

    op = with_schema(
        "nested17::reshape",
        "(Tensor x, int[] sizes) -> Tensor",
        lambda x, s: x.reshape(s) * 1,
        vmap=rule,
    )
    assert torch.vmap(op, in_dims=(0, None))(torch.ones(3, 4), [2, 2]).shape == (3, 2, 2)
    assert seen == [(0, None)]  # an int[] is no tensor list: None, as torch gives it


def test_a_rule_of_an_op_without_outputs_returning_a_tensor_is_told_the_count():
    def rule(info, in_dims, x):
        return x * 2, 0  # the op returns nothing

    op = with_schema(
        "nested17::sink",
        "(Tensor(a!) x) -> ()",
        lambda x: x.mul_(2) and None,
        fake_fn=lambda x: None,
        vmap=rule,
    )
    with pytest.raises(
        RuntimeError, match="nested17::sink: the vmap rule returned 1 outputs, expected 0"
    ):
        torch.vmap(lambda x: (op(x), x)[1])(torch.ones(3, 2))


def test_a_vmap_rule_returns_a_tensor_list_output_as_one_output():
    # The list was read as several outputs ("returned 2 outputs, expected 1").
    @opreg.custom_op("list17::pair", mutates_args=())
    def pair(x: torch.Tensor) -> list[torch.Tensor]:
        return [x * 2, x * 3]

    x = torch.ones(4, 3)
    for out_dims in (0, [0, 0]):  # one dim, or torch's one per tensor
        pair.register_vmap(lambda info, in_dims, x, d=out_dims: (pair(x.movedim(in_dims[0], 0)), d))
        doubled, tripled = torch.vmap(pair)(x)
        torch.testing.assert_close(doubled, 2 * x)
        torch.testing.assert_close(tripled, 3 * x)
    # Per-tensor dims may differ (eighteenth sweep A-F3), but each must be a dim of the batch's
    # size: the second tensor's dim 1 has 3, the batch 4.
    pair.register_vmap(lambda info, in_dims, x: (pair(x.movedim(in_dims[0], 0)), [0, 1]))
    with pytest.raises(TypeError, match="list17::pair': its vmap rule returned out_dims"):
        torch.vmap(pair)(x)


@pytest.mark.parametrize("kind", ["rule", "batch_polymorphic", "vmap_fn"])
def test_vmap_keeps_a_dynamic_batch_size_symbolic(kind):
    # The batch size reached rules, batch-polymorphic calls and vmap_fn as a number: torch.export
    # with a dynamic batch refused, make_fx's symbolic graph kept the traced batch.
    from torch.fx.experimental.proxy_tensor import make_fx

    name = f"symbatch17::{kind}"
    if kind == "rule":
        sizes = []

        @opreg.custom_op(name, mutates_args=())
        def op(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x.cos() + y

        op.register_fake(lambda x, y: torch.empty_like(x + y))

        def rule(info, in_dims, x, y):
            sizes.append(info.batch_size)
            x = x.movedim(in_dims[0], 0)
            y = y.unsqueeze(0).expand(info.batch_size, *y.shape) if in_dims[1] is None else y
            return op(x, y), 0

        op.register_vmap(rule)
    else:
        extra = {"batch_polymorphic": True}
        if kind == "vmap_fn":
            extra = {"vmap_fn": lambda x, y: x.cos() + y, "fake_vmap_fn": torch.add}
        op = opreg.register_vmap_op(
            lambda x, y: x.cos() + y,
            fake_fn=torch.add,
            name=name,
            schema="(Tensor x, Tensor y) -> Tensor",
            **extra,
        )

    def batched(x, y):
        return torch.vmap(op, in_dims=(0, None))(x, y) + 1

    class Module(torch.nn.Module):
        def forward(self, x, y):
            return batched(x, y)

    x, y = torch.randn(4, 3), torch.randn(3)
    exported = torch.export.export(
        Module(), (x, y), dynamic_shapes=({0: torch.export.Dim("batch")}, None)
    )
    for batch in (1, 6):
        x = torch.randn(batch, 3)
        torch.testing.assert_close(exported.module()(x, y), x.cos() + y + 1)
        graph = make_fx(batched, tracing_mode="symbolic")(torch.randn(4, 3), y)
        torch.testing.assert_close(graph(x, y), x.cos() + y + 1)
    if kind == "rule":
        assert any(isinstance(size, torch.SymInt) for size in sizes)


def test_opcheck_compares_a_data_dependent_fake_with_the_real_op():
    # Its fake ran without a ShapeEnv, where new_dynamic_size() cannot make a size: every
    # correct data-dependent fake failed.
    @opreg.custom_op("opcheck17::positive", mutates_args=())
    def positive(x: torch.Tensor) -> torch.Tensor:
        return x[x > 0].clone()

    @positive.register_fake
    def _(x):
        return x.new_empty(torch.library.get_ctx().new_dynamic_size())

    sample = [(torch.tensor([-1.0, 1.0, 2.0]),)]
    opreg.opcheck(positive, sample, devices=["cpu"], checks=["fake_vs_real"])

    @positive.register_fake
    def _(x):
        return x.new_empty(torch.library.get_ctx().new_dynamic_size(), 2)

    with pytest.raises(opreg.OpcheckError, match="the fake has 2 dims, the real 1"):
        opreg.opcheck(positive, sample, devices=["cpu"], checks=["fake_vs_real"])


def test_opcheck_checks_a_vmap_fn_op_s_fake_vmap_fn():
    def define(name, fake_vmap_fn):
        return opreg.register_vmap_op(
            lambda x: x * 2,
            fake_fn=torch.empty_like,
            vmap_fn=lambda x: x * 2,
            fake_vmap_fn=fake_vmap_fn,
            name=name,
            schema="(Tensor x) -> Tensor",
        )

    good = define("opcheck17::fake_vmap_good", torch.empty_like)
    opreg.opcheck(good, [(torch.randn(3),)], devices=["cpu"], checks=["fake_vs_real"])
    bad = define("opcheck17::fake_vmap_bad", lambda x: x.new_empty(x.shape[0] + 1, *x.shape[1:]))
    with pytest.raises(opreg.OpcheckError, match=r"fake_vs_real failed.*batch size 2"):
        opreg.opcheck(bad, [(torch.randn(3),)], devices=["cpu"], checks=["fake_vs_real"])
    # The op's vmap check runs vmap_fn itself, not its fake: it passes.
    opreg.opcheck(bad, [(torch.randn(3),)], devices=["cpu"], checks=["vmap"])
