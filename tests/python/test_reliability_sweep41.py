"""Regression tests for the forty-first adversarial sweep's findings and the earlier ones fixed
with them (reports kept outside the repository), beside the earlier sweeps' files."""

from __future__ import annotations

import ctypes
import os
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import opreg
from conftest import run_with_test_ops


def test_a_call_that_read_no_dispatch_keys_still_takes_the_ops_backward():
    # Sweep 39 b19-2: while a replace on another thread registered the op's schema anew, a call
    # read none of its arguments' dispatch keys and skipped autograd: the gradient came from the
    # fallback's ops (5) instead of the op's backward (7). A redispatch with no keys makes the call
    # that race makes.
    opreg.register_triton_op(
        fake_fn=None,
        triton_fn=None,
        name="sweep41::no_keys",
        schema="(Tensor x) -> Tensor",
        backward=lambda ctx, grad: grad * 7,
        setup_context=lambda ctx, inputs, output: None,
    )(lambda x: x * 5)
    x = torch.ones(2, requires_grad=True)
    no_keys = torch._C.DispatchKeySet(torch._C.DispatchKey.Undefined)
    y = torch.ops.sweep41.no_keys.default.redispatch(no_keys, x)
    y.sum().backward()
    assert y.tolist() == [5.0, 5.0]
    assert x.grad.tolist() == [7.0, 7.0]
    with torch.no_grad():
        assert torch.ops.sweep41.no_keys.default.redispatch(no_keys, x).tolist() == [5.0, 5.0]


def _define_within_the_next_definition(define_outer, define_nested) -> int:
    """Runs define_outer() with a profile hook that calls define_nested() on the same thread at
    the first torch.library.Library made after define_all, as a finalizer or a trace hook
    may."""
    fired = []

    def hook(frame, event, arg):
        if (
            not fired
            and event == "call"
            and frame.f_code.co_name == "__init__"
            and frame.f_code.co_filename.endswith(os.path.join("torch", "library.py"))
        ):
            fired.append(True)
            define_nested()

    sys.setprofile(hook)
    try:
        define_outer()
    finally:
        sys.setprofile(None)
    return len(fired)


def _defined(name: str) -> bool:
    return name in {report.name for report in opreg.describe_ops()}


def _define_plain(name: str, factor: int) -> None:
    opreg.register_triton_op(
        fake_fn=lambda x: x.new_empty(x.shape[0] * factor),
        triton_fn=None,
        name=name,
        schema="(Tensor x) -> Tensor",
        replace=True,
    )(lambda x: x.repeat(factor))


def _define_with_vmap_fn(name: str, factor: int) -> None:
    opreg.register_vmap_op(
        fake_fn=lambda x: x.new_empty(x.shape[0] * factor),
        vmap_fn=lambda x: x.repeat(1, factor) + 1000,
        fake_vmap_fn=lambda x: x.new_empty(x.shape[0], x.shape[1] * factor),
        name=name,
        schema="(Tensor x) -> Tensor",
        replace=True,
    )(lambda x: x.repeat(factor))


@pytest.mark.parametrize("nested_has_vmap_fn", [True, False])
def test_a_definition_made_while_another_records_its_pieces_wins_whole(nested_has_vmap_fn):
    # Sweep 40 A-F2: a profile hook defined the op again (with vmap_fn) while this thread recorded
    # the Python pieces of an outer definition (without): the outer's records overwrote the
    # nested one's, and the companion it left was never undefined. The definition made last now
    # holds every piece, and a later plain definition undefines its companion.
    name = f"sweep41::nested_{int(nested_has_vmap_fn)}"
    outer, nested = (
        (_define_plain, _define_with_vmap_fn)
        if nested_has_vmap_fn
        else (_define_with_vmap_fn, _define_plain)
    )
    outer(name, 2)
    assert _define_within_the_next_definition(lambda: outer(name, 3), lambda: nested(name, 5)) == 1
    op = getattr(torch.ops.sweep41, name.split("::")[1])
    x = torch.ones(2, 4)
    assert op(x[0]).shape == (20,)
    assert op(x[0].to("meta")).shape == (20,)
    row = x[0]
    with FakeTensorMode() as mode:
        assert op(mode.from_tensor(row)).shape == (20,)
    assert torch.compile(op, backend="aot_eager", fullgraph=True)(x[0]).shape == (20,)
    batched = torch.vmap(op)(x)
    assert batched.shape == (2, 20)
    assert (batched[0, 0].item() == 1001.0) == nested_has_vmap_fn
    assert _defined(f"{name}_vmap") == nested_has_vmap_fn
    _define_plain(name, 7)
    assert not _defined(f"{name}_vmap")
    assert torch.vmap(op)(x).shape == (2, 28)


def test_a_cpp_replace_made_while_a_python_definition_records_keeps_its_own_fake(
    test_ops_library,
):
    # The Python front records a definition's pieces under the serial the core published it with.
    # It read the serial afterwards, where a C++ thread's replace in between had the Python fake
    # recorded as the C++ definition's (too narrow a window to hit on purpose). Here the replace
    # comes from a hook on this thread while the pieces are recorded: the C++ definition keeps
    # its own fake.
    name = "sweep41::replaced_while_recording"
    opreg.load_library(test_ops_library)
    replacing = ctypes.PyDLL(str(test_ops_library))
    _define_plain(name, 2)
    replaced = []
    assert (
        _define_within_the_next_definition(
            lambda: _define_plain(name, 3),
            lambda: replaced.append(replacing.opreg_test_replace_here(name.encode())),
        )
        == 1
    )
    assert replaced == [0]
    row = torch.ones(2)
    assert torch.ops.sweep41.replaced_while_recording(row).tolist() == [5.0, 5.0]
    with FakeTensorMode() as mode:
        assert torch.ops.sweep41.replaced_while_recording(mode.from_tensor(row)).shape == (2,)
    compiled = torch.compile(torch.ops.sweep41.replaced_while_recording, backend="aot_eager")
    assert compiled(row).tolist() == [5.0, 5.0]


def test_a_python_op_called_inside_a_definition_is_refused(test_ops_library):
    # Sweep 41 B-F1, sweep 42 B-F1: a kernel factory (run under opreg's lock) that called a Python
    # op waited for the GIL, while a Python thread holding it waited for opreg's lock
    # (describe_ops, a definition): a deadlock, from a thread with the GIL too, since the Python
    # code lets it go now and then. Now refused, naming the op and the piece, with the GIL or
    # without.
    result = run_with_test_ops(
        """
        import ctypes, os, threading, time, torch, opreg
        def slow_twice(x):
            time.sleep(0.002)  # lets the GIL go
            return x * 2
        opreg.register_triton_op(fake_fn=None, triton_fn=None, name="sweep41::python_twice",
                                 schema="(Tensor x) -> Tensor")(slow_twice)
        opreg.load_library(os.environ["OPREG_TEST_OPS"])
        releasing = ctypes.CDLL(os.environ["OPREG_TEST_OPS"])
        holding = ctypes.PyDLL(os.environ["OPREG_TEST_OPS"])
        stop = False
        def describe():
            while not stop:
                opreg.describe_ops()
        describer = threading.Thread(target=describe)
        describer.start()
        try:
            statuses = [library.opreg_test_call_inside_a_definition(b"sweep41::python_twice")
                        for library in (releasing, holding) for _ in range(10)]
        finally:
            stop = True
            describer.join()
        print("statuses", statuses)
        print("defined", any(r.name == "opreg_test::calling_in_factory"
                             for r in opreg.describe_ops()))
        """,
        test_ops_library,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"statuses {[1] * 20}" in result.stdout
    assert "defined False" in result.stdout
    assert (
        "sweep41::python_twice: the fallback, written in Python, was called inside a definition "
        "(by a kernel factory), which holds opreg's lock" in result.stderr
    )


def test_a_definition_racing_an_undefine_of_its_op_ends_whole(test_ops_library):
    # Sweep 41 A-F2: a C++ undefine of the op between the core's publish and the Python front's
    # records (here from a hook, at each of the calls into C the definition makes) made the
    # definition raise about its companion's undefine, or DTensor's registration, after it took
    # effect. It returns, and the op ends defined or undefined, never with a companion left.
    import torch.distributed.tensor

    opreg.load_library(test_ops_library)
    undefining = ctypes.CDLL(str(test_ops_library))
    name = "sweep41::undefined_while_defined"
    outcomes = set()
    for target in range(1, 200, 3):
        _define_with_vmap_fn(name, 2)
        returns = [0]

        def hook(frame, event, arg, target=target, returns=returns):
            if event == "c_return" and "opreg" in frame.f_code.co_filename:
                returns[0] += 1
                if returns[0] == target:
                    undefining.opreg_test_undefine(name.encode())

        sys.setprofile(hook)
        try:
            _define_plain(name, 5)
        finally:
            sys.setprofile(None)
        assert not _defined(f"{name}_vmap")
        if _defined(name):
            assert torch.ops.sweep41.undefined_while_defined(torch.ones(2)).tolist() == [1.0] * 10
        outcomes.add(_defined(name))
    assert outcomes == {True, False}


def test_a_trace_hook_that_defines_whenever_it_fires_lets_a_definition_end(test_ops_library):
    # Sweep 42 A-F2: a trace hook (guarded against running again) that defines an op every 50th
    # line made a definition never return: pieces recorded outside the hook fired it again, and a
    # definition made inside torch.library's bookkeeping waited for opreg's own lock there.
    result = run_with_test_ops(
        """
        import sys, torch, opreg
        def define(name, factor):
            opreg.register_triton_op(fake_fn=lambda x: torch.empty_like(x), triton_fn=None,
                                     name=name, replace=True,
                                     schema="(Tensor x) -> Tensor")(lambda x: x * factor)
        define("sweep41::shared", 0)
        lines, busy, nested = [0], [False], [0]
        def trace(frame, event, arg):
            if event == "line":
                lines[0] += 1
                if lines[0] % 50 == 0 and not busy[0]:
                    busy[0] = True
                    try:
                        nested[0] += 1
                        define("sweep41::shared", nested[0])
                    finally:
                        busy[0] = False
            return trace
        sys.settrace(trace)
        define("sweep41::outer", 1)
        sys.settrace(None)
        shared = torch.ops.sweep41.shared(torch.ones(1)).item()
        outer = torch.ops.sweep41.outer(torch.ones(1)).item()
        print("returned", nested[0] > 0, shared == nested[0], outer)
        """,
        test_ops_library,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "returned True True 1.0" in result.stdout


def test_a_replaced_definitions_python_pieces_are_freed_without_another_definition(
    test_ops_library,
):
    # The record of the last definition made on a thread kept its declarations (its fallback and
    # fake) until the thread's next definition: past a C++ replace of its op, after which the
    # op's first call on a fake tensor drops its Python pieces.
    import gc
    import weakref

    class Held:
        pass

    held = Held()
    alive = weakref.ref(held)
    name = "sweep41::freed_when_replaced"
    opreg.load_library(test_ops_library)
    opreg.register_triton_op(
        fake_fn=lambda x, held=held: torch.empty_like(x),
        triton_fn=None,
        name=name,
        schema="(Tensor x) -> Tensor",
        replace=True,
    )(lambda x, held=held: x + 1)
    del held
    assert ctypes.PyDLL(str(test_ops_library)).opreg_test_replace_here(name.encode()) == 0
    with FakeTensorMode() as mode:
        assert torch.ops.sweep41.freed_when_replaced(mode.from_tensor(torch.ones(2))).shape == (2,)
    gc.collect()
    assert alive() is None
