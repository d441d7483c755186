"""PyTorch's own docstring examples of ``torch.library.triton_op``, ``wrap_triton``,
``register_autograd`` and ``opcheck``, read from the installed torch when the tests run (never
copied here): each runs once as written and once with ``torch.library`` replaced by ``opreg``,
each run with its own op namespace. The two runs must leave the same values; then the functions
and ops the example defines get the example's inputs in eager, ``torch.compile(fullgraph=True)``,
``torch.export.export`` and opcheck (torch's for torch's run, opreg's for opreg's), with the same
outcomes for both. Examples written for CUDA skip without it; their CPU counterparts rewrite the
device (Triton kernels then run in Triton's interpreter, which conftest turns on without a GPU)."""

from __future__ import annotations

import itertools
import os
import re
import sys
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

import opreg

# ---- reading the examples -----------------------------------------------------------------------

_PROMPT = re.compile(r"^\s*(?:>>>|\.\.\.)(?: |$)(.*)$")


def docstring_examples(api: str) -> list[str]:
    """The doctest blocks (``>>>``/``...`` lines, prompts removed) of torch.library.<api>."""
    blocks: list[list[str]] = []
    previous_was_code = False
    for line in (getattr(torch.library, api).__doc__ or "").splitlines():
        match = _PROMPT.match(line)
        if match and not previous_was_code:
            blocks.append([])
        if match:
            blocks[-1].append(match.group(1))
        previous_was_code = bool(match)
    return ["\n".join(block) + "\n" for block in blocks]


_NAMESPACE = re.compile(r"""(["'])(\w+)::(?=\w)""")
_CUDA_DEVICE = re.compile(r"""device\s*=\s*(["'])cuda\1""")
# Triton 3.6's interpreter reads only tl.constexpr itself as a constexpr annotation, not the string
# "tl.constexpr" that the examples' kernels use (compiled Triton reads both).
_STRING_CONSTEXPR = re.compile(r""":\s*(["'])tl\.constexpr\1""")


def rewrite(code: str, *, library: str, namespace: str, device: str) -> str:
    """The example for one run: its op namespace (``mylib``) replaced by ``namespace``; with
    ``library="opreg"``, ``torch.library`` replaced by ``opreg``; with ``device="cpu"``, CUDA
    tensors made on the CPU and kernels' constexpr annotations readable by the interpreter."""
    code = _NAMESPACE.sub(lambda m: f"{m.group(1)}{namespace}::", code)
    if library == "opreg":
        code = "import opreg\n" + re.sub(r"\btorch\.library\b", "opreg", code)
    if device == "cpu":
        code = _STRING_CONSTEXPR.sub(": tl.constexpr", _CUDA_DEVICE.sub('device="cpu"', code))
    return code


# ---- what each example is checked with ----------------------------------------------------------


def _fixed_calls(*calls: tuple[str, str, str]) -> Callable[[dict], list[tuple[str, str, str]]]:
    return lambda names: list(calls)


def _each_sample(names: dict) -> list[tuple[str, str, str]]:
    return [("numpy_mul", f"sample_inputs[{i}]", "{}") for i in range(len(names["sample_inputs"]))]


@dataclass(frozen=True)
class Example:
    api: str
    # The calls to check, as (function, args, kwargs) expressions in the example's names.
    calls: Callable[[dict], list[tuple[str, str, str]]]
    # Names the example uses without importing them: it reads them from torch/library.py's module.
    prelude: str = ""
    # The functions of `calls` that are ops (opcheck applies); the others are plain functions.
    ops: frozenset[str] = field(default_factory=frozenset)
    uses_triton: bool = False


EXAMPLES = {
    example.api: example
    for example in [
        Example(
            "triton_op",
            _fixed_calls(("add", "(x, y)", "{}")),
            ops=frozenset({"add"}),
            uses_triton=True,
        ),
        # torch's doctest runner skips this one (+SKIP); it runs here. `add` is a plain function
        # around wrap_triton, `gm` its make_fx graph; the example's own output is gm.code.
        Example(
            "wrap_triton",
            _fixed_calls(("add", "(x, y)", "{}"), ("gm", "(x, y)", "{}")),
            uses_triton=True,
        ),
        # `x` is the example's last one, made for numpy_mul; numpy_sin takes any tensor.
        Example(
            "register_autograd",
            _fixed_calls(("numpy_sin", "(x,)", "{}"), ("numpy_mul", "(x,)", "{'val': 3.14}")),
            ops=frozenset({"numpy_sin", "numpy_mul"}),
        ),
        # The example's setup_context unpacks its two inputs into one name, so each run stops at
        # the first sample that requires grad, with torch as with opreg; every sample is checked.
        Example(
            "opcheck",
            _each_sample,
            prelude="import torch\nfrom torch import Tensor\n",
            ops=frozenset({"numpy_mul"}),
        ),
    ]
}


# ---- running an example -------------------------------------------------------------------------

_runs = itertools.count()


@dataclass
class Run:
    library: str  # "torch" or "opreg"
    namespace: str
    names: dict[str, Any]  # the example's globals when it ended
    printed: str
    error: str | None  # how the example itself failed, if it did


def _normalized(text: str, namespace: str) -> str:
    """Text comparable across runs: the run's namespace (and module) back to "mylib", traced
    kernel and constant-argument numbers (each run's kernel is another one) dropped."""
    text = text.replace(f"docex_{namespace}", "mylib").replace(namespace, "mylib")
    return re.sub(r"\b(kernel_idx|constant_args_idx) = \d+", r"\1 = N", text)


def _described(error: BaseException, namespace: str) -> str:
    """``Type: first line of the message`` (opreg's PEP 678 notes aside)."""
    lines = traceback.format_exception_only(type(error), error)
    notes = getattr(error, "__notes__", None)
    if isinstance(notes, list) and notes:
        lines = lines[: -len(notes)] or lines
    first = (lines[-1].splitlines() or [""])[0]
    return _normalized(first, namespace)


def _error_types(described: str | None) -> list[str] | None:
    """What must agree between torch's run and opreg's: the type of each error (the messages
    may differ: opreg's messages name opreg's API)."""
    if described is None:
        return None
    return [re.sub(r":.*", "", line, count=1) for line in described.splitlines()]


def run_example(example: Example, library: str, device: str, tmp_path: Path, capsys) -> Run:
    namespace = f"{library}_docex_{os.getpid()}_{next(_runs)}"
    (written,) = docstring_examples(example.api)
    code = example.prelude + rewrite(written, library=library, namespace=namespace, device=device)
    assert re.search(r"\btorch\.library\b", written), "the example no longer uses torch.library"
    if library == "opreg":
        assert "torch.library" not in code
    if example.ops:
        assert f"{namespace}::" in code, "the example's ops no longer have a 'mylib::' name"
    # From a file: @triton.jit reads its function's source, which exec'd strings lack.
    path = tmp_path / f"{example.api}_{namespace}.py"
    path.write_text(code)
    module = types.ModuleType(f"docex_{namespace}")  # torch.compile looks up its functions' module
    module.__file__ = str(path)
    sys.modules[module.__name__] = module
    names = module.__dict__
    torch.manual_seed(0)  # the same inputs in both runs
    torch._dynamo.reset()
    capsys.readouterr()
    error = None
    try:
        exec(compile(code, str(path), "exec"), names)
    except Exception as raised:
        error = _described(raised, namespace)
    printed = _normalized(capsys.readouterr().out, namespace)
    return Run(library, namespace, names, printed, error)


# ---- comparing outcomes -------------------------------------------------------------------------


@dataclass
class Outcome:
    value: Any = None
    error: str | None = None


def _outcome(run: Run, thunk: Callable[[], Any]) -> Outcome:
    torch._dynamo.reset()
    try:
        return Outcome(value=thunk())
    except Exception as error:
        return Outcome(error=_described(error, run.namespace))


def _assert_same(a: Outcome, b: Outcome, what: str) -> None:
    assert _error_types(a.error) == _error_types(b.error), (
        f"{what}: {a.error!r} against {b.error!r}"
    )
    if isinstance(a.value, str):
        assert _error_types(a.value) == _error_types(b.value), (
            f"{what}: {a.value!r} against {b.value!r}"
        )
    elif a.error is None:
        torch.testing.assert_close(a.value, b.value, msg=lambda m: f"{what}: {m}")


class _Call(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.fn, self.kwargs = fn, kwargs

    def forward(self, *args: Any) -> Any:
        return self.fn(*args, **self.kwargs)


def _opcheck_result(run: Run, fn: Any, args: tuple, kwargs: dict) -> str:
    """Each test's result: SUCCESS or the error's first line."""
    check = opreg.opcheck if run.library == "opreg" else torch.library.opcheck
    result = check(fn, args, kwargs, raise_exception=False)
    return "\n".join(
        f"{test} {value if value == 'SUCCESS' else _described(value, run.namespace)}"
        for test, value in sorted(result.items())
    )


def _check_call(run: Run, fn: Any, args: tuple, kwargs: dict, is_op: bool) -> dict[str, Outcome]:
    eager = _outcome(run, lambda: fn(*args, **kwargs))
    call = _Call(fn, kwargs)
    outcomes = {
        "eager": eager,
        "compiled": _outcome(run, lambda: torch.compile(call, fullgraph=True)(*args)),
        "exported": _outcome(run, lambda: torch.export.export(call, args).module()(*args)),
    }
    for how in ("compiled", "exported"):
        if outcomes[how].error is None and eager.error is None:
            _assert_same(outcomes[how], eager, f"{run.library}: {how} against eager")
    if is_op:
        outcomes["opcheck"] = _outcome(run, lambda: _opcheck_result(run, fn, args, kwargs))
    return outcomes


def checked_calls(run: Run, example: Example) -> dict[str, Outcome]:
    """Each call's outcome in eager, compiled (fullgraph), exported and (for ops) opcheck; the
    compiled and exported results, where they come, equal eager."""
    outcomes: dict[str, Outcome] = {}
    for index, expressions in enumerate(example.calls(run.names)):
        where = f"call {index}, {expressions[0]}{expressions[1]}"
        try:
            fn, args, kwargs = (eval(expression, run.names) for expression in expressions)
        except NameError as error:  # the example failed before defining it
            outcomes[where] = Outcome(error=_described(error, run.namespace))
            continue
        is_op = expressions[0] in example.ops
        for how, outcome in _check_call(run, fn, args, kwargs, is_op).items():
            outcomes[f"{where}: {how}"] = outcome
    return outcomes


def _tensors(names: dict[str, Any]) -> dict[str, Any]:
    return {
        name: value
        for name, value in names.items()
        if isinstance(value, torch.Tensor)
        or (isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value))
    }


# ---- where opreg knowingly differs ---------------------------------------------------------------


@dataclass(frozen=True)
class KnownDifference:
    """A check (regex over "the example" or "call N, fn(args): how") of one example on one device
    where the outcomes differ on purpose or by a bug reported elsewhere: each side's outcome
    (``ok``, the error, or opcheck's per-test lines) must match its pattern, so that the entry
    fails once the difference goes away."""

    api: str
    device: str
    checks: str
    torch: str
    opreg: str
    why: str


KNOWN_DIFFERENCES = [
    KnownDifference(
        "triton_op",
        "cpu",
        r"the example|: (compiled|exported|opcheck)$",
        torch=r"RuntimeError",
        opreg=r"^(ok|(test_\w+ SUCCESS\n?)+)$",
        why="torch cannot trace a Triton kernel that runs in Triton's interpreter (its launches "
        "read fake tensors' data pointers); opreg keeps a triton_op opaque under "
        "TRITON_INTERPRET=1 (README, 'Coming from torch.library'), so compile, export and "
        "opcheck work and equal eager",
    ),
    KnownDifference(
        "register_autograd",
        "cpu",
        r": (compiled|exported|opcheck)$",
        torch=r"^torch._dynamo.exc.TorchRuntimeError: RuntimeError when making fake tensor call$|"
        r"RuntimeError: There was no fake impl registered for "
        r"<CustomOpDef\(mylib::numpy_(sin|mul)\)>",
        opreg=r"Unsupported: Operator does not support running with fake tensors|"
        r"UnsupportedOperatorException: mylib.numpy_(sin|mul).default",
        why="the example registers no fake: torch's custom_op then has a fake that raises "
        "RuntimeError naming register_fake; an opreg op without a fake has none at all, so fake "
        "tensors raise UnsupportedOperatorException naming only the op (the same checks fail, "
        "with another error; the fix lies in opreg's definition path, outside _library.py)",
    ),
]


def _summary(outcome: Outcome) -> str:
    return outcome.error or (outcome.value if isinstance(outcome.value, str) else "ok")


def _known_difference(api: str, device: str, what: str) -> KnownDifference | None:
    for known in KNOWN_DIFFERENCES:
        if (known.api, known.device) == (api, device) and re.search(known.checks, what):
            return known
    return None


def _same_or_known(api: str, device: str, what: str, opreg_: Outcome, torch_: Outcome) -> None:
    known = _known_difference(api, device, what)
    if known is None:
        _assert_same(opreg_, torch_, what)
        return
    assert re.search(known.torch, _summary(torch_)), f"{what}, torch: {_summary(torch_)!r}"
    assert re.search(known.opreg, _summary(opreg_)), f"{what}, opreg: {_summary(opreg_)!r}"


# ---- the tests ----------------------------------------------------------------------------------

_VARIANTS = [(api, variant) for api in EXAMPLES for variant in ("as written", "on cpu")]


@pytest.mark.parametrize(("api", "variant"), _VARIANTS, ids=[f"{a}-{v}" for a, v in _VARIANTS])
def test_docstring_example_behaves_as_with_torch(api, variant, tmp_path, capsys):
    example = EXAMPLES[api]
    (code,) = docstring_examples(api)
    written_for_cuda = bool(_CUDA_DEVICE.search(code))
    if variant == "as written":
        device = "cuda" if written_for_cuda else "cpu"
        if written_for_cuda and not torch.cuda.is_available():
            pytest.skip("the example makes CUDA tensors; its CPU counterpart runs without a GPU")
    else:
        device = "cpu"
        if not written_for_cuda:
            pytest.skip("the example runs on the CPU as written")
        if example.uses_triton and os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("Triton kernels run on CPU tensors only in Triton's interpreter")

    with_torch = run_example(example, "torch", device, tmp_path, capsys)
    with_opreg = run_example(example, "opreg", device, tmp_path, capsys)
    torch_calls = checked_calls(with_torch, example)
    opreg_calls = checked_calls(with_opreg, example)
    if os.environ.get("OPREG_DOCEX_SHOW"):  # to see every outcome: pytest -s
        for library, calls in (("torch", torch_calls), ("opreg", opreg_calls)):
            for what, outcome in calls.items():
                print(f"{api} on {device}, {library}: {what} -> {_summary(outcome)}")

    example_ran = (Outcome(error=with_opreg.error), Outcome(error=with_torch.error))
    _same_or_known(api, device, "the example", *example_ran)
    assert with_opreg.printed == with_torch.printed
    torch_tensors, opreg_tensors = _tensors(with_torch.names), _tensors(with_opreg.names)
    if _known_difference(api, device, "the example"):  # torch's stopped early
        opreg_tensors = {name: opreg_tensors[name] for name in torch_tensors}
    torch.testing.assert_close(opreg_tensors, torch_tensors)

    assert opreg_calls.keys() == torch_calls.keys() and torch_calls
    for what, torch_outcome in torch_calls.items():
        _same_or_known(api, device, what, opreg_calls[what], torch_outcome)
