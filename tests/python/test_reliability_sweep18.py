"""Regression tests for the eighteenth sweep's findings in the Python front (those of the C++
core are in tests/cpp/test_reliability.cpp)."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from test_reliability import assert_survived, run_probe

import opreg


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
