"""Regression tests for what the adversarial sweep 46 found (see issue 13's notes): an exception
(Ctrl-C, a signal handler's, a trace hook's) arriving in a definition from Python once the core
has published it."""

from __future__ import annotations

import pytest
import torch

import opreg
from conftest import run_with_test_ops

# Raises KeyboardInterrupt at the n-th line opreg's Python runs in a definition, for each n (a
# stride of them past 400), then checks that the op is wholly the old or wholly the new
# definition (value, vmap through its vmap_fn companion, gradient, fake), or not defined when it
# was new, and that defining it again works and is whole.
_INTERRUPTED = """
import sys, torch, opreg
from torch.func import vmap
from opreg import _C

MODE = sys.argv[1]
OPREG_DIR = opreg.__file__.rsplit("/", 1)[0]
x = torch.randn(3, 4)


def make(name, k, replace):
    return opreg.register_vmap_op(
        lambda x: x * k, fake_fn=torch.empty_like, vmap_fn=lambda x: x * k,
        fake_vmap_fn=torch.empty_like, backward=lambda ctx, g: g * k,
        setup_context=lambda ctx, inputs, output: None, name=name,
        schema="(Tensor x) -> Tensor", replace=replace)


def doubled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def made_by_custom_op(name):
    op = opreg.custom_op(name, mutates_args=())(doubled)
    op.register_fake(lambda x: torch.empty_like(x))
    return op


def state(name):
    op = getattr(torch.ops.interrupted, name.split("::")[1])
    xr = torch.randn(3, requires_grad=True)
    return (
        round((op(x) / x).mean().item()),
        round((vmap(op)(x) / x).mean().item()) if MODE != "custom_op" else None,
        round(torch.autograd.grad(op(xr).sum(), xr)[0].mean().item()),
        tuple(op(torch.empty(2, 5, device="meta")).shape),
    )


def whole(k):
    return (k, k if MODE != "custom_op" else None, k, (2, 5))


def definition(name, k, n):
    # MODE new: a new op; replace: a replace of one defined with k = 1; custom_op: a
    # CustomOpDef's register_fake (a definition made again).
    if MODE == "new":
        return lambda: make(name, k, False)
    if MODE == "replace":
        make(name, 1, False)
        return lambda: make(name, k, True)
    op = made_by_custom_op(name)
    return lambda: op.register_fake(lambda x: torch.empty_like(x))


def interrupt_at(n):
    seen = [0]

    def hook(frame, event, arg):
        if frame.f_code.co_filename.startswith(OPREG_DIR) and event == "line":
            seen[0] += 1
            if seen[0] == n:
                raise KeyboardInterrupt(f"{frame.f_code.co_name}:{frame.f_lineno}")
        return hook

    return hook


count = [0]
def counter(frame, event, arg):
    if frame.f_code.co_filename.startswith(OPREG_DIR) and event == "line":
        count[0] += 1
    return counter
run = definition("interrupted::probe", 3, 0)
sys.settrace(counter)
run()
sys.settrace(None)
total = count[0]
points = range(1, total + 1, max(1, total // 400))
bad = interrupted = 0
for n in points:
    name = f"interrupted::op{n}"
    run = definition(name, 3, n)
    before = state(name) if _C.is_defined(name) else None
    where = None
    sys.settrace(interrupt_at(n))
    try:
        run()
    except KeyboardInterrupt as stop:
        interrupted += 1
        where = str(stop)
    finally:
        sys.settrace(None)
    try:
        now = state(name) if _C.is_defined(name) else None
        k = 2 if MODE == "custom_op" else 3
        if now not in (before, whole(k)):
            bad += 1
            print("neither old nor new after", where, now)
        if MODE == "custom_op":
            run()  # the CustomOpDef still takes pieces
            again = 2
        else:
            make(name, 5, _C.is_defined(name))
            again = 5
        if state(name) != whole(again):
            bad += 1
            print("not whole once defined again after", where, state(name))
    except Exception as error:
        bad += 1
        print("failed after", where, type(error).__name__, str(error)[:300])
print(f"points={len(points)} interrupted={interrupted} bad={bad}")
"""


@pytest.mark.parametrize("mode", ["new", "replace", "custom_op"])
def test_an_interruption_anywhere_in_a_definition_leaves_it_not_made_or_whole(mode):
    # Sweep 46 A-F2: interrupted after the core published it, a definition was left half
    # recorded: a new op and its companion defined although the definition raised, every later
    # definition of the name refused ("'<op>_vmap' is an op of its own"), and a CustomOpDef
    # refusing every later piece ("it was defined again since this object defined it").
    done = run_with_test_ops(_INTERRUPTED, timeout=600, args=(mode,))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = done.stdout.strip().splitlines()[-1]
    fields = dict(field.split("=") for field in summary.split())
    assert int(fields["points"]) >= 100, summary
    assert int(fields["interrupted"]) > int(fields["points"]) // 2, summary
    assert fields["bad"] == "0", done.stdout[-3000:]


_ALARMED = """
import random, signal, time, torch, opreg


class Timeout(BaseException):  # as pytest-timeout's signal method raises, not an Exception
    pass


def handler(signum, frame):
    raise Timeout()


signal.signal(signal.SIGALRM, handler)


def make(name, k):
    return opreg.register_vmap_op(
        lambda x: x * k, fake_fn=torch.empty_like, vmap_fn=lambda x: x * k,
        fake_vmap_fn=torch.empty_like, name=name, schema="(Tensor x) -> Tensor", replace=True)


make("alarmed::op0", 1)
start = time.perf_counter()
make("alarmed::op0", 2)
duration = time.perf_counter() - start
random.seed(46)
interrupted = 0
for i in range(150):
    name = f"alarmed::op{i % 10}"
    make(name, 1)
    try:
        signal.setitimer(signal.ITIMER_REAL, random.uniform(0, duration))
        make(name, 2)
        signal.setitimer(signal.ITIMER_REAL, 0)
    except Timeout:
        interrupted += 1
    signal.setitimer(signal.ITIMER_REAL, 0)
    value = getattr(torch.ops.alarmed, name.split("::")[1])(torch.ones(2))
    assert value.tolist() in ([1.0, 1.0], [2.0, 2.0]), value
    make(name, 3)  # raised ValueError ("an op of its own") for 15 of 20 names
    assert getattr(torch.ops.alarmed, name.split("::")[1])(torch.ones(2)).tolist() == [3.0, 3.0]
print("interrupted", interrupted)
"""


def test_a_signal_handlers_exception_in_replaces_leaves_every_op_replaceable():
    done = run_with_test_ops(_ALARMED, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) > 10, done.stdout  # the alarms fell inside the replaces


@pytest.mark.parametrize(
    ("schema", "returned", "message"),
    [
        (
            "(Tensor x) -> Tensor[]",
            lambda x, doubled: ([doubled, doubled], (0,)),
            "the vmap rule returned two tensors in output 0 sharing memory",
        ),
        (
            "(Tensor x) -> (Tensor, Tensor[])",
            lambda x, doubled: ((doubled, [x * 3, doubled]), (0, 0)),
            "the vmap rule returned outputs 0 and 1 sharing memory",
        ),
        (
            "(Tensor x) -> (Tensor, Tensor)",
            lambda x, doubled: ((doubled, x), (0, None)),
            "the vmap rule returned output 1 sharing memory with an input",
        ),
        (
            "(Tensor x) -> (Tensor, Tensor)",
            lambda x, doubled: ((doubled, torch.empty(2, device="meta")), (0, None)),
            "the vmap rule returned output 1 on meta, expected cpu",
        ),
        (
            "(Tensor x) -> (Tensor, Tensor[])",
            lambda x, doubled: ((doubled, [x[0]]), (0, None)),
            "the vmap rule returned output 1 sharing memory with an input",
        ),
    ],
    ids=[
        "list holding one tensor twice",
        "tensor and list sharing one",
        "unbatched output is the input",
        "unbatched output on meta",
        "unbatched list holding a view of the input",
    ],
)
def test_a_vmap_rules_list_and_unbatched_outputs_are_checked(schema, returned, message):
    # Sweep 46 B-F1: a Tensor[] output's elements were not compared with each other or with the
    # other outputs, and an output with out_dim None skipped the device and alias checks: each
    # came out of torch.vmap with no error.
    many = "Tensor[]" in schema

    def fallback(x):
        if schema.endswith("-> Tensor[]"):
            return [x * 2, x * 2]
        return (x * 2, [x * 3, x * 4]) if many else (x * 2, x * 3)

    def fake(x):
        if schema.endswith("-> Tensor[]"):
            return [torch.empty_like(x), torch.empty_like(x)]
        pair = [torch.empty_like(x), torch.empty_like(x)]
        return (torch.empty_like(x), pair) if many else (torch.empty_like(x), torch.empty_like(x))

    def rule(info, in_dims, x):
        return returned(x, x * 2)

    name = f"sweep46::rule_outputs_{abs(hash((schema, message))) % 10**8}"
    op = opreg.register_vmap_op(
        fallback, fake_fn=fake, vmap=rule, name=name, schema=schema, replace=True
    )
    with pytest.raises(RuntimeError) as raised:
        torch.vmap(op)(torch.ones(3, 2))
    assert str(raised.value).startswith(f"{name}: {message}"), str(raised.value)


def test_a_vmap_rules_output_sharing_a_tensor_list_inputs_memory_is_refused():
    def rule(info, in_dims, xs):
        return xs[0], 0

    op = opreg.register_vmap_op(
        lambda xs: xs[0] * 1,
        fake_fn=lambda xs: torch.empty_like(xs[0]),
        vmap=rule,
        name="sweep46::rule_list_input",
        schema="(Tensor[] xs) -> Tensor",
        replace=True,
    )
    with pytest.raises(
        RuntimeError,
        match="sweep46::rule_list_input: the vmap rule returned "
        "output 0 sharing memory with an input",
    ):
        torch.vmap(op)([torch.ones(3, 2), torch.ones(3, 2)])


def _named_fallback(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@pytest.mark.parametrize(
    ("declare", "message"),
    [
        (
            lambda: opreg.register_triton_op(_named_fallback),
            "opreg: op '_named_fallback': register_triton_op was used bare, without its "
            "keywords; call it with them: @register_triton_op(fake_fn=..., triton_fn=...)",
        ),
        (
            lambda: opreg.register_triton_op(fake_fn=None, name="sweep47::half"),
            "opreg: op 'sweep47::half': register_triton_op needs the keyword argument triton_fn "
            "(None for none)",
        ),
        (
            lambda: opreg.register_vmap_op(_named_fallback),
            "opreg: op '_named_fallback': register_vmap_op needs the keyword argument fake_fn",
        ),
    ],
    ids=["bare register_triton_op", "no triton_fn", "bare register_vmap_op"],
)
def test_evox_decorators_without_their_keywords_are_said_naming_the_op(declare, message):
    # Sweep 47 A-U2: Python's own errors ("register_triton_op() takes 0 positional arguments but
    # 1 was given", "missing 1 required keyword-only argument") named no op and no usage.
    with pytest.raises(TypeError) as raised:
        declare()
    assert str(raised.value).startswith(message), str(raised.value)


def _aliasing(x: torch.Tensor) -> torch.Tensor:
    return x


def _listing(x: torch.Tensor) -> list[torch.Tensor]:
    return [x * 2]


@pytest.mark.parametrize(
    ("fallback", "sharding", "advice"),
    [
        (_listing, "pointwise", 'declare sharding="replicate" or "none", or a strategy function'),
        (_aliasing, "replicate", 'declare sharding="none", or a strategy function that keeps'),
    ],
)
def test_a_refused_sharding_is_said_in_pythons_words(fallback, sharding, advice):
    # Sweep 47 A-U1: a Python user was told to declare Sharding::kReplicate or kNone.
    schema = "(Tensor(a) x) -> Tensor(a)" if fallback is _aliasing else None
    with pytest.raises(ValueError) as raised:
        opreg.register_triton_op(
            fake_fn=None,
            triton_fn=None,
            name=f"sweep47::sharding_{sharding}",
            schema=schema,
            sharding=sharding,
        )(fallback)
    assert advice in str(raised.value) and "Sharding::" not in str(raised.value)


class _Uninspectable:
    @property
    def __signature__(self):
        raise RuntimeError("signature boom")

    def __call__(self, x):
        return torch.empty_like(x)


def test_a_piece_whose_signature_cannot_be_read_is_said_naming_the_op_and_piece():
    # Sweep 46 A-F6: the user's bare RuntimeError('signature boom') named neither.
    with pytest.raises(TypeError) as raised:
        opreg.register_triton_op(
            fake_fn=_Uninspectable(), triton_fn=None, name="sweep46::uninspectable"
        )(_named_fallback)
    assert str(raised.value).startswith(
        "opreg: op 'sweep46::uninspectable': fake_fn cannot be inspected: reading its signature "
        "raised RuntimeError: signature boom"
    )
    assert not hasattr(torch.ops.sweep46, "uninspectable")
