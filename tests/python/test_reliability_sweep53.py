"""Sweep 53's findings on the Python front: every function that takes a lock in a with statement
keeps a trace hook's line events out of its frame; the compile key holds more of torch's state;
an exception whose notes cannot be read reaches the caller as itself."""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest
import torch

import opreg
from conftest import run_with_test_ops
from opreg import _C, _compile_key

_LOCKS = ("lock", "defining", "HeldLock")


def _functions_taking_locks(tree: ast.AST) -> list[ast.FunctionDef]:
    """The functions with a with statement (in their own body) whose context names a lock."""
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        pending = list(function.body)
        while pending:
            node = pending.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            if isinstance(node, (ast.With, ast.AsyncWith)) and any(
                name in ast.unparse(item.context_expr) for item in node.items for name in _LOCKS
            ):
                found.append(function)
                break
            pending += list(ast.iter_child_nodes(node))
    return found


def _starts_without_line_events(function: ast.FunctionDef) -> bool:
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return bool(body) and ast.unparse(body[0]) == "without_line_events()"


def test_every_function_taking_a_lock_turns_its_line_events_off_first() -> None:
    # Sweep 53 A-F2: CPython 3.11 gives a with statement's line a line event after its block and
    # before __exit__, outside the block's cleanup: a trace hook's KeyboardInterrupt there left
    # the definition lock held, and every definition on another thread waited for good.
    sources = sorted(pathlib.Path(opreg.__file__).parent.rglob("*.py"))
    functions = {
        f"{path.name}:{function.name}:{function.lineno}": _starts_without_line_events(function)
        for path in sources
        for function in _functions_taking_locks(ast.parse(path.read_text()))
    }
    assert len(functions) >= 20, functions  # the check finds them: defining, the tables' locks
    assert all(functions.values()), [name for name, ok in functions.items() if not ok]


_HELD_BY_A_TRACE_HOOK_AT_A_WITH_EXIT = """
import sys, threading, torch, opreg
function = sys.argv[1]

def define(factor, name="sweep53::with_exit"):
    opreg.register_vmap_op(
        lambda x: x * factor, fake_fn=torch.empty_like, name=name,
        schema="(Tensor x) -> Tensor", replace=True)

define(2)
seen = {}

def tracer(frame, event, arg):
    code = frame.f_code
    if code.co_name != function or "opreg" not in code.co_filename or event != "line":
        return tracer
    line = open(code.co_filename).read().splitlines()[frame.f_lineno - 1].strip()
    if line.startswith("with ") and "lock" in line.lower():
        key = (id(frame), frame.f_lineno)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] == 2:  # the with line again: its block is done and __exit__ is next
            raise KeyboardInterrupt(f"{function}: at the exit of {line}")
    return tracer

sys.settrace(tracer)
try:
    define(3)
except KeyboardInterrupt:
    pass
finally:
    sys.settrace(None)
done = threading.Event()
threading.Thread(target=lambda: (define(5, "sweep53::other"), done.set()), daemon=True).start()
assert done.wait(60), "another thread's definition waited for a lock this one held"
print("defined on another thread")
"""


@pytest.mark.parametrize("function", ["defining", "forget", "claim", "declare"])
def test_a_trace_hook_s_interruption_at_a_with_block_s_exit_leaves_no_lock_held(function) -> None:
    # Sweep 53 A-F2's reproducer, for each function it named.
    probe = run_with_test_ops(_HELD_BY_A_TRACE_HOOK_AT_A_WITH_EXIT, args=(function,), timeout=300)
    assert probe.returncode == 0 and "defined on another thread" in probe.stdout, (
        probe.stdout + probe.stderr
    )


def _set_state(name: str, on: bool) -> None:
    if name == "swap_module_params":
        torch.__future__.set_swap_module_params_on_conversion(on)
    elif name == "overwrite_module_params":
        torch.__future__.set_overwrite_module_params_on_conversion(on)
    elif name == "sparse_invariants":
        torch.sparse.check_sparse_tensor_invariants.enable() if on else (
            torch.sparse.check_sparse_tensor_invariants.disable()
        )
    elif name == "anomaly":
        torch.autograd.set_detect_anomaly(on)
    elif name == "print_options":
        torch.set_printoptions(precision=7 if on else 4)
    elif name == "dynamo_config":
        dynamo_config = pytest.importorskip("torch._dynamo.config")
        dynamo_config.cache_size_limit = 9 if on else 8
    elif name == "numpy_errors":
        numpy = pytest.importorskip("numpy")
        numpy.seterr(all="raise" if on else "warn")


@pytest.mark.parametrize(
    "state",
    [
        "swap_module_params",
        "overwrite_module_params",
        "sparse_invariants",
        "anomaly",
        "print_options",
        "dynamo_config",
        "numpy_errors",
    ],
)
def test_the_compile_key_holds_more_of_torch_s_state(state: str) -> None:
    # Sweep 53 A-F1: a fake choosing its dtype by each of these gave one key for two behaviours,
    # and a second process sharing the cache ran the first one's code (float32 read as float64).
    opreg.register_vmap_op(
        lambda x: x * 2,
        fake_fn=torch.empty_like,
        name="sweep53::keyed",
        schema="(Tensor x) -> Tensor",
        replace=True,
    )
    try:
        _set_state(state, False)
        off = _compile_key.current_fingerprint("sweep53::keyed")
        _set_state(state, True)
        on = _compile_key.current_fingerprint("sweep53::keyed")
    finally:
        _set_state(state, False)
    assert off != on
    assert _compile_key.current_fingerprint("sweep53::keyed") == off  # and is stable


class _NotesRaise(Exception):
    @property
    def __notes__(self) -> list[str]:
        raise KeyboardInterrupt("raised by __notes__")


def _raises_notes_raise(x: torch.Tensor) -> torch.Tensor:
    raise _NotesRaise("the user's error from the fake")


def test_an_exception_whose_notes_raise_reaches_the_caller_as_itself() -> None:
    # Sweep 53 A-F4: a KeyboardInterrupt raised by reading its __notes__ took its place.
    op = opreg.register_vmap_op(
        lambda x: x * 2,
        fake_fn=_raises_notes_raise,
        name="sweep53::notes",
        schema="(Tensor x) -> Tensor",
    )
    raised = None
    try:  # not pytest.raises: its match reads the notes too
        op(torch.ones(2, device="meta"))
    except _NotesRaise as error:
        raised = error.args
    assert raised == ("the user's error from the fake",)


def test_the_locks_helper_is_one_c_call_each_way() -> None:
    # Entering and leaving _C.HeldLock run no Python line (Note [Locks and trace hooks]).
    import threading

    lock = threading.RLock()
    events = []

    def tracer(frame, event, arg):
        events.append((frame.f_code.co_name, event))
        return tracer

    sys.settrace(tracer)
    try:
        with _C.HeldLock(lock, 1.0, alone=True) as had:
            held = lock._is_owned()
    finally:
        sys.settrace(None)
    assert had and held and not lock._is_owned()
    assert not [
        event for event in events if event[0] != "test_the_locks_helper_is_one_c_call_each_way"
    ]


def test_a_device_given_to_load_library_is_said_not_to_be_a_file() -> None:
    # Sweep 53 B-N19: /dev/null was said to be "no library at" a path that exists.
    with pytest.raises(OSError, match="/dev/null is not a regular file"):
        opreg.load_library("/dev/null")


def test_the_locks_helper_refuses_a_second_enter() -> None:
    # Sweep 54 B-N27: entered twice, it took the lock twice and released it once.
    import threading

    lock = threading.RLock()
    held = _C.HeldLock(lock, 1.0, alone=True)
    with held, pytest.raises(RuntimeError, match="entered while in use"):
        held.__enter__()
    assert not lock._is_owned()
    assert sys.getswitchinterval() < 1.0
