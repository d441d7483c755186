"""Sweep 51's findings on the Python front, each probe in a fresh interpreter: torch.compile's code
follows an op defined again after an undefine, and an exception a trace hook raises at any line of
a definition made through opreg.custom_op leaves no lock held."""

from __future__ import annotations

import ast
import pathlib

import pytest

import opreg
from conftest import run_with_test_ops

_DEFINED_AGAIN = """
import sys, torch, opreg

def define(dtype):
    opreg.register_vmap_op(
        lambda x: (x * 2).to(dtype), fake_fn=lambda x: torch.empty_like(x, dtype=dtype),
        name="sweep51::again", schema="(Tensor x) -> Tensor")

first, second = torch.float32, torch.float64
if sys.argv[1] == "down":
    first, second = second, first
define(first)
compiled = torch.compile(lambda a: torch.ops.sweep51.again(a) + 1)
x = torch.arange(4.0)
assert compiled(x).dtype == first
sys.modules["opreg._C"].undefine("sweep51::again")
define(second)
got, want = compiled(x), torch.ops.sweep51.again(x) + 1
assert got.dtype == want.dtype == second, (got.dtype, want.dtype)
assert torch.equal(got, want), (got, want)
print("followed")
"""


@pytest.mark.parametrize("direction", ["up", "down"])
def test_compiled_code_follows_an_op_defined_again_after_an_undefine(direction: str) -> None:
    # Sweep 51 A-F1: only a replace of a defined op dropped the compiled code; one defined again
    # after an undefine was run by the earlier definition's code (float32 buffers for float64
    # values: wrong values; the other way, a double free).
    probe = run_with_test_ops(_DEFINED_AGAIN, timeout=600, args=(direction,))
    assert probe.returncode == 0 and "followed" in probe.stdout, probe.stdout + probe.stderr


_INTERRUPTED_AT_EACH_LINE = """
import sys, threading, torch, opreg
import opreg._declaration as declaration, opreg._library as library
import opreg._torch_library as torch_library

def free(lock):
    taken = []
    def take():
        taken.append(lock.acquire(timeout=5))
        if taken[0]:
            lock.release()
    thread = threading.Thread(target=take)
    thread.start(); thread.join()
    return taken[0]

def interrupt_at(code, line, action):
    def tracer(frame, event, arg):
        if frame.f_code is not code:
            return None
        def local(frame, event, arg):
            if event == "line" and frame.f_lineno == line:
                raise KeyboardInterrupt(line)
            return local
        return local
    sys.settrace(tracer)
    try:
        action()
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)

op = opreg.custom_op(
    "sweep51::locked", lambda x: x * 2, mutates_args=(), schema="(Tensor x) -> Tensor")
op.register_fake(torch.empty_like)
def new_rule():  # one rule per mode, as torch.library allows
    mode = type("Mode", (torch.utils._python_dispatch.TorchDispatchMode,), {})
    op.register_torch_dispatch(mode, lambda *args: None)
actions = [
    (library.CustomOpDef._with, lambda: op.register_autograd(lambda ctx, g: g)),
    (library.CustomOpDef._set_and_define, lambda: op.register_autograd(lambda ctx, g: g)),
    (library._publish, lambda: opreg.custom_op(
        "sweep51::published", lambda x: x, mutates_args=(), schema="(Tensor x) -> Tensor")),
    (library._define_new, lambda: opreg.custom_op(
        "sweep51::published", lambda x: x, mutates_args=(), schema="(Tensor x) -> Tensor")),
    (torch_library.register_user_rule, new_rule),
    (torch_library._register_or_restore, new_rule),
]
lines = 0
for function, action in actions:
    code = function.__code__
    first, last = code.co_firstlineno, max(line for _, _, line in code.co_lines() if line)
    for line in range(first, last + 1):
        interrupt_at(code, line, action)
        lines += 1
        where = f"{function.__qualname__}, line {line}"
        assert free(op._lock), f"{where}: the op's lock is held"
        assert free(declaration.definition_lock), f"{where}: the definition lock is held"
        assert free(torch_library._lock), f"{where}: the rules' lock is held"
print("free after", lines, "lines")
"""


def test_an_interruption_at_any_line_of_a_custom_op_definition_leaves_no_lock_held() -> None:
    # Sweep 51 A-F3: CPython 3.11 leaves the `try:` line of a try statement inside a `with` block
    # out of the block's cleanup: a trace hook's KeyboardInterrupt raised there left the op's
    # lock held, and another thread's register_autograd hung.
    probe = run_with_test_ops(_INTERRUPTED_AT_EACH_LINE, timeout=300)
    assert probe.returncode == 0 and "free after" in probe.stdout, probe.stdout + probe.stderr


def _tries_in_with_blocks(node: ast.AST, inside: ast.AST | None = None) -> list[int]:
    """The lines of try statements directly inside a `with` block of the same function."""
    found = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            found += _tries_in_with_blocks(child, None)
        elif isinstance(child, (ast.With, ast.AsyncWith)):
            found += _tries_in_with_blocks(child, child)
        else:
            if isinstance(child, ast.Try) and inside is not None:
                found.append(child.lineno)
            found += _tries_in_with_blocks(child, inside)
    return found


def test_no_try_statement_sits_directly_in_a_with_block() -> None:
    # The cause of sweep 51 A-F3, for every lock opreg's Python front takes with `with`.
    sources = sorted(pathlib.Path(opreg.__file__).parent.rglob("*.py"))
    found = {
        path.name: lines
        for path in sources
        if (lines := _tries_in_with_blocks(ast.parse(path.read_text())))
    }
    assert not found, found
