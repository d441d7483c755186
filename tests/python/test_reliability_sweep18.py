"""Regression tests for the eighteenth sweep's findings in the Python front (those of the C++
core are in tests/cpp/test_reliability.cpp)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import torch
from test_reliability import assert_survived, run_probe

import opreg
from opreg import _C


@pytest.mark.parametrize("path", ["backward", "vmap_fn_backward", "vmap_loop"])
def test_a_per_example_vmapped_call_never_mixes_two_definitions(path):
    # The per-example loops call the op by name for each example: a replace racing one gave rows
    # of both definitions in one result.
    name = f"mix18::{path}"

    def define(k):
        def fallback(x):
            time.sleep(0.001)
            return x * k

        extra = {"backward": lambda ctx, g: g * k * 10}
        if path == "vmap_fn_backward":
            extra["vmap_fn"] = lambda x: x * k
            extra["fake_vmap_fn"] = torch.empty_like
        if path == "vmap_loop":
            extra = {"vmap_loop": True}
        opreg.register_vmap_op(
            fallback,
            fake_fn=torch.empty_like,
            name=name,
            replace=True,
            schema="(Tensor x) -> Tensor",
            **extra,
        )

    define(2)
    op = getattr(torch.ops.mix18, path).default
    mixed, calls, stop = [], [0], threading.Event()

    def call():
        while not stop.is_set():
            x = torch.ones(6, 2, requires_grad=path != "vmap_loop")
            try:
                rows = torch.vmap(op)(x)[:, 0].tolist()
            except RuntimeError as error:
                assert "call it again" in str(error)
                continue
            calls[0] += 1
            if len(set(rows)) != 1:
                mixed.append(rows)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for thread in threads:
        thread.start()
    for i in range(40):
        time.sleep(0.003 if i % 4 else 0.05)  # some calls race a replace, some run between
        define(3 if i % 2 else 2)
    stop.set()
    for thread in threads:
        thread.join()
    assert not mixed, mixed[:3]
    assert calls[0] > 0


def test_debug_checks_report_a_fake_that_fails_on_meta_tensors():
    # OPREG_DEBUG=1 took every error of a fake on meta tensors for "cannot run there" and
    # compared nothing; a fake that raises or returns the wrong kind of value is reported now.
    result = run_probe(
        """
        import os
        os.environ["OPREG_DEBUG"] = "1"
        import torch, opreg
        def define(name, schema, fake):
            return opreg.register_vmap_op(fake_fn=fake, name=name, schema=schema)(
                lambda x: x * 2 if "two" not in name else (x * 2, x * 3))
        def raises(x):
            raise ValueError("bug in my fake")
        ops = [define("debug18::raises", "(Tensor x) -> Tensor", raises),
               define("debug18::number", "(Tensor x) -> Tensor", lambda x: 3),
               define("debug18::two", "(Tensor x) -> (Tensor, Tensor)",
                      lambda x: (x.new_empty(2),))]
        for op in ops:
            try:
                op(torch.ones(2))
                print("passed")
            except RuntimeError as error:
                print("refused:", str(error).splitlines()[0][:160])
        """
    )
    assert_survived(result)
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith("refused: OPREG_DEBUG") for line in lines)
    assert "bug in my fake" in lines[0]


def test_an_error_while_another_thread_loads_a_library_does_not_deadlock(
    test_ops_library, tmp_path
):
    # The first c10 error of a process loads glibc's unwinder, under the dynamic loader's lock;
    # raised under the registry's lock while a load held the loader's, it deadlocked both.
    library = test_ops_library.parent / "libopreg_failing_wait_then_fail.so"
    go = tmp_path / "go"
    result = run_probe(
        f"""
        import os, threading, time, opreg
        os.environ["OPREG_REPLACE_NAME"] = "unwinder18::x"
        os.environ["OPREG_WAIT_FILE"] = {str(go)!r}
        errors = []
        def load():
            try:
                opreg.load_library({str(library)!r})
            except ValueError as error:
                errors.append(str(error))
        loading = threading.Thread(target=load)
        loading.start()
        time.sleep(0.5)  # the library waits in its initializer, holding the loader's lock
        try:
            opreg.describe_op("unwinder18::never_defined")
        except ValueError as error:
            print("refused:", error)
        open({str(go)!r}, "w").close()
        loading.join()
        print("load:", errors[0].splitlines()[0][:80])
        """,
        timeout=60,
    )
    assert_survived(result)
    assert "refused: opreg: no op named 'unwinder18::never_defined'" in result.stdout
    assert "load:" in result.stdout


def test_a_replace_while_another_thread_s_compile_defines_an_op_does_not_deadlock():
    # The replace held the definition lock while it waited for Dynamo's compile lock, and the
    # compile's fake waited for the definition lock to define an op.
    result = run_probe(
        """
        import threading, time, torch, opreg
        def define(name, fallback, fake=torch.empty_like):
            opreg.register_vmap_op(fallback, fake_fn=fake, name=name, replace=True,
                                   schema="(Tensor x) -> Tensor")
        define("compilelock18::x", lambda x: x * 1)
        torch.compile(lambda t: torch.ops.compilelock18.x(t) + 1)(torch.ones(2))
        started = threading.Event()
        def defining_fake(x):
            started.set()
            time.sleep(1.0)
            define("compilelock18::helper", lambda x: x)
            return torch.empty_like(x)
        define("compilelock18::p", lambda x: x * 2, defining_fake)
        compiled = torch.compile(lambda t: torch.ops.compilelock18.p(t) * 3, fullgraph=True)
        compiling = threading.Thread(target=lambda: print("compiled", compiled(torch.ones(2))))
        compiling.start()
        started.wait()
        time.sleep(0.2)
        replacing = threading.Thread(target=define, args=("compilelock18::x", lambda x: x * 2))
        replacing.start()
        replacing.join(40)
        compiling.join(40)
        print("stuck:", replacing.is_alive(), compiling.is_alive(), flush=True)
        """,
        timeout=120,
    )
    assert "stuck: False False" in result.stdout, result.stdout + result.stderr


def test_a_custom_op_object_refuses_pieces_after_its_op_was_undefined():
    # The object did not see an undefine made outside Python and defined the op again.
    @opreg.custom_op("undefined18::f", mutates_args=())
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    _C.undefine("undefined18::f")
    with pytest.raises(RuntimeError, match="undefined18::f': it was undefined since"):
        f.register_fake(torch.empty_like)
    assert not _C.is_defined("undefined18::f")

    @opreg.custom_op("undefined18::f", mutates_args=())
    def g(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    g.register_fake(torch.empty_like)
    assert g(torch.ones(1)).item() == 3.0


def test_the_command_line_s_reader_going_away_is_no_traceback():
    result = subprocess.run(  # `true` leaves at once: every write of opreg's meets a closed pipe
        f"{sys.executable} -m opreg info | true",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr


@pytest.mark.parametrize("loss", ["torch.vmap(op)(x).sum()", "(op(x) + op(x * 2)).sum()"])
def test_a_failed_backward_with_other_nodes_pending_exits_cleanly(loss):
    # The nodes left pending were freed with the engine's thread-local queue after Python
    # finalized, and the Python ctx they held took the GIL: a segfault at exit.
    result = run_probe(
        f"""
        import torch, opreg
        def broken(ctx, grad):
            raise ValueError("my backward broke")
        op = opreg.register_vmap_op(lambda x: x * 2, fake_fn=torch.empty_like,
                                    name="exit18::f", backward=broken,
                                    schema="(Tensor x) -> Tensor")
        x = torch.ones(2, 3, requires_grad=True)
        try:
            torch.autograd.grad({loss}, x)
        except ValueError as error:
            print("caught", error)
        """
    )
    assert_survived(result)
    assert "caught my backward broke" in result.stdout


def test_grad_through_vmap_of_an_op_with_a_backward_and_outputs_that_are_not_tensors():
    # The per-example loop that runs the op's backward refused a None (Tensor?) or a number.
    def backward(ctx, grad, *others):
        return grad * 11, None

    optional = opreg.register_vmap_op(
        lambda x, flag: (x * 2, x * 3 if flag else None),
        fake_fn=None,
        backward=backward,
        name="loop18::optional",
        schema="(Tensor x, bool flag) -> (Tensor, Tensor?)",
    )
    number = opreg.register_vmap_op(
        lambda x, flag: (x * 2, 7),
        fake_fn=None,
        backward=backward,
        name="loop18::number",
        schema="(Tensor x, bool flag) -> (Tensor, int)",
    )
    listed = opreg.register_vmap_op(  # the loop asked for, with a Tensor[] output
        lambda x, flag: [x * 2, x * 4],
        fake_fn=None,
        vmap_loop=True,
        name="loop18::listed",
        schema="(Tensor x, bool flag) -> Tensor[]",
    )
    x = torch.randn(4, 3, requires_grad=True)
    out, none = torch.vmap(optional, in_dims=(0, None), out_dims=(0, None))(x, False)
    assert none is None
    torch.testing.assert_close(torch.autograd.grad(out.sum(), x)[0], torch.full((4, 3), 11.0))
    out, seven = torch.vmap(number, in_dims=(0, None), out_dims=(0, None))(x, False)
    assert seven == 7
    torch.testing.assert_close(torch.autograd.grad(out.sum(), x)[0], torch.full((4, 3), 11.0))
    first, second = torch.vmap(listed, in_dims=(0, None))(x.detach(), False)
    torch.testing.assert_close([first, second], [x * 2, x * 4])


def test_grad_through_vmap_of_a_view_op_with_a_backward_is_refused_not_copied():
    # The per-example loop stacked the outputs into a new tensor: a declared view became a copy.
    view = opreg.register_vmap_op(
        lambda x: x.view(x.shape),
        fake_fn=lambda x: x.view(x.shape),
        backward=lambda ctx, g: g * 1,
        name="loop18::view",
        schema="(Tensor(a) x) -> Tensor(a)",
    )
    x = torch.ones(4, 3, requires_grad=True) * 1
    with pytest.raises(RuntimeError, match="declares output 0 a view of an input"):
        torch.vmap(lambda t: view(t).mul_(2))(x)
    y = torch.ones(4, 3) * 1
    torch.vmap(lambda t: view(t).mul_(2))(y)  # no gradient: the batched fallback keeps the view
    assert bool((y == 2).all())


def test_vmap_over_no_examples_of_an_op_with_a_backward_keeps_the_graph():
    op = opreg.register_vmap_op(
        lambda x: x * 2,
        fake_fn=torch.empty_like,
        backward=lambda ctx, g: g * 7,
        name="loop18::empty",
        schema="(Tensor x) -> Tensor",
    )
    x = torch.randn(0, 3, requires_grad=True)
    out = torch.vmap(op)(x)
    assert out.shape == (0, 3) and out.requires_grad
    assert torch.autograd.grad(out.sum(), x)[0].shape == (0, 3)


@pytest.mark.parametrize("namespace", ["_dir", "__name__", "loaded_libraries"])
def test_bringing_handles_up_to_date_skips_names_torch_ops_holds_itself(namespace):
    # A C++ library's op in such a namespace (the C++ core accepts it) made every later
    # opreg.load_library raise a bare TypeError from this step.
    from opreg._registry import refresh_handles

    refresh_handles(f"{namespace}::f")


def test_a_rule_gets_an_empty_list_as_the_in_dims_of_an_empty_tensor_list():
    # torch gives [] (an entry per tensor); opreg gave None.
    seen = []

    def rule(info, in_dims, x, ys):
        seen.append(in_dims)
        return x.movedim(in_dims[0], 0) + sum(ys, torch.zeros(())), 0

    op = opreg.register_vmap_op(
        lambda x, ys: x + sum(ys, torch.zeros(())),
        fake_fn=lambda x, ys: torch.empty_like(x),
        vmap=rule,
        name="rule18::empty_list",
        schema="(Tensor x, Tensor[] ys) -> Tensor",
    )
    x = torch.randn(4, 3)
    torch.testing.assert_close(torch.vmap(op, in_dims=(0, None))(x, []), x)
    assert seen == [(0, [])]


def test_opcheck_generates_samples_for_ops_with_defaulted_optional_arguments():
    # Generated samples gave up on `ScalarType? dt=None` (and float?, Layout?, ...) with a message
    # naming neither the argument nor its schema.
    op = opreg.register_vmap_op(
        lambda x, dt=None, eps=None: x * 2,
        fake_fn=None,
        name="opcheck18::defaults",
        schema="(Tensor x, ScalarType? dt=None, float? eps=None) -> Tensor",
    )
    opreg.opcheck(op, devices=["cpu"], checks=["kernel_vs_fallback", "fake_vs_real"])
    needs = opreg.register_vmap_op(
        lambda x, mode: x * 2,
        fake_fn=None,
        name="opcheck18::needs_mode",
        schema="(Tensor x, str mode) -> Tensor",
    )
    with pytest.raises(TypeError, match=r"argument 'mode' of 'opcheck18::needs_mode\(Tensor x"):
        opreg.opcheck(needs, devices=["cpu"])
