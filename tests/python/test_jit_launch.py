"""Cached launches of Triton JIT kernels inside opreg ops (python/opreg/_jit_launch.py): which
launches reuse a compiled kernel, which go back to Triton, and what the launch receives. On CPU
the compiled kernel is a recorder; with CUDA, real kernels are compared with the fallback."""

from __future__ import annotations

import os

import pytest
import torch

import opreg
from opreg import _jit_launch
from opreg._jit_launch import CachedLaunches, specialization_key


class Param:
    def __init__(self, name, default=None):
        self.name, self.default = name, default


class FakeKernel:
    """What CachedLaunches reads from a triton JITFunction."""

    def __init__(self):
        self.params = [Param("x"), Param("n"), Param("BLOCK", 64), Param("FLAG", False)]
        self.pre_run_hooks = []
        self.debug = False
        self.used_global_vals = {}


class Compiled:
    """A compiled kernel whose launches are recorded (Triton's launcher ABI)."""

    function, packed_metadata = 1234, ("meta",)

    def __init__(self):
        self.launches, self.hooks = [], []

    def run(self, g0, g1, g2, stream, function, metadata, launch_metadata, enter, exit, *args):
        self.launches.append(((g0, g1, g2), stream, args))
        self.hooks.append((launch_metadata, enter, exit))

    def launch_metadata(self, grid, stream, *args):
        return ("metadata", grid, stream, args)


@pytest.fixture
def launches():
    compiled = []

    def triton_run(*args, grid, warmup, **kwargs):
        compiled.append(Compiled())
        return compiled[-1]

    cache = CachedLaunches(FakeKernel(), triton_run, lambda: 0, lambda device: 77)
    cache.compiled = compiled
    token = _jit_launch._inside_op.set(True)
    yield cache
    _jit_launch._inside_op.reset(token)


def test_second_launch_with_the_same_specialization_reuses_the_compiled_kernel(launches):
    x = torch.zeros(64)
    launches.run(x, 64, grid=(4,), warmup=False, BLOCK=16)
    launches.run(x, 128, grid=lambda meta: (meta["n"] // meta["BLOCK"], 2), warmup=False, BLOCK=16)
    assert len(launches.compiled) == 1 and launches.hits == 1
    # All parameters in order (keyword and default ones too), the grid from them, the stream.
    assert launches.compiled[0].launches == [((8, 2, 1), 77, (x, 128, 16, False))]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ((torch.zeros(64), 64), (torch.zeros(64)[1:], 64)),  # 16-byte alignment
        ((torch.zeros(64), 64), (torch.zeros(64, dtype=torch.float64), 64)),  # dtype
        ((torch.zeros(64), 64), (torch.zeros(64), 1)),  # == 1
        ((torch.zeros(64), 64), (torch.zeros(64), 63)),  # divisibility by 16
        ((torch.zeros(64), 64), (torch.zeros(64), 2**31)),  # 32- vs 64-bit integer
        ((torch.zeros(64), 1), (torch.zeros(64), True)),  # bool is not int
    ],
)
def test_what_triton_specializes_on_gives_another_key(launches, first, second):
    launches.run(*first, grid=(1,), warmup=False)
    launches.run(*second, grid=(1,), warmup=False)
    assert len(launches.compiled) == 2 and launches.hits == 0


def test_keyword_values_are_part_of_the_key():
    x = torch.zeros(4)
    assert specialization_key(0, (x,), {"BLOCK": 1}) != specialization_key(0, (x,), {"BLOCK": 2})
    assert specialization_key(0, (x,), {"BLOCK": 1}) != specialization_key(0, (x,), {"BLOCK": True})
    assert specialization_key(0, (x,), {}) != specialization_key(1, (x,), {})
    assert specialization_key(0, (x, "a string"), {}) is None
    assert specialization_key(0, (x,), {"layout": object()}) is None


def test_launches_the_key_cannot_cover_go_to_triton_every_time(launches):
    for _ in range(2):
        launches.run(torch.zeros(4), (1, 2), grid=(1,), warmup=False)
    assert len(launches.compiled) == 2 and launches.hits == 0


def test_hooks_changed_globals_warmup_and_outside_ops_go_to_triton(launches):
    x = torch.zeros(64)
    launches.run(x, 64, grid=(1,), warmup=False)
    launches.run(x, 64, grid=(1,), warmup=True)
    launches.kernel.pre_run_hooks.append(lambda *args, **kwargs: None)
    launches.run(x, 64, grid=(1,), warmup=False)
    launches.kernel.pre_run_hooks.clear()
    module_globals = {"SCALE": 2}
    launches.kernel.used_global_vals = {("SCALE", id(module_globals)): (1, module_globals)}
    launches.run(x, 64, grid=(1,), warmup=False)
    launches.kernel.used_global_vals = {}
    token = _jit_launch._inside_op.set(False)
    launches.run(x, 64, grid=(1,), warmup=False)
    _jit_launch._inside_op.reset(token)
    assert len(launches.compiled) == 5 and launches.hits == 0
    launches.run(x, 64, grid=(1,), warmup=False)
    assert launches.hits == 1
    assert launches.describe() == (
        "1 cached launches; through Triton: 1 first launch of a specialization, "
        "1 pre-run hooks, 1 a global the kernel read has changed"
    )


def test_launch_hooks_see_cached_launches_as_triton_shows_them(launches):
    from triton import knobs

    x = torch.zeros(64)
    launches.run(x, 64, grid=(1,), warmup=False)
    knobs.runtime.launch_enter_hook.add(print)
    try:
        launches.run(x, 64, grid=(1,), warmup=False)
    finally:
        knobs.runtime.launch_enter_hook.remove(print)
    launches.run(x, 64, grid=(1,), warmup=False)
    compiled = launches.compiled[0]
    assert launches.hits == 2 and len(compiled.hooks) == 2
    metadata, enter, exit = compiled.hooks[0]
    assert metadata == ("metadata", (1,), 77, (x, 64, 64, False))
    assert enter is knobs.runtime.launch_enter_hook and exit is knobs.runtime.launch_exit_hook
    assert compiled.hooks[1] == (None, None, None)  # no hook set: nothing to call


def test_jit_kernels_are_found_through_globals_closures_and_wrappers():
    pytest.importorskip("triton")
    from triton.runtime.jit import JITFunction

    kernel = JITFunction(_kernel_source)

    class Autotuned:
        fn = kernel

    wrapped = Autotuned()

    def launcher():
        return wrapped, torch, kernel  # the same kernel twice: listed once

    assert _jit_launch.kernels_reached_by(launcher) == [kernel]
    globals()["_global_kernel"] = JITFunction(_add_source)
    assert _jit_launch.kernels_reached_by(_launches_a_global) == [_global_kernel]  # noqa: F821
    assert _jit_launch.kernels_reached_by(len) == []
    cache = _jit_launch.adopt(kernel)
    assert _jit_launch.adopt(kernel) is cache and kernel.run == cache.run
    assert _jit_launch.accelerated(len) is len


def _kernel_source(x_ptr, n):
    pass


def _add_source(x_ptr, y_ptr, out_ptr, n, BLOCK_SIZE):
    pass


def _launches_a_global():
    return _global_kernel  # noqa: F821  (set by the test that reads it)


def test_an_op_launches_through_the_cache_and_reports_it():
    pytest.importorskip("triton")
    from triton.runtime.jit import JITFunction

    kernel = JITFunction(_add_source)
    launched = []

    def triton_add(x, y):
        out = torch.empty_like(x)
        kernel[lambda meta: (meta["n"] // meta["BLOCK_SIZE"],)](x, y, out, x.numel(), BLOCK_SIZE=4)
        launched.append(out)
        return out

    def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y

    op = opreg.register_triton_op(
        fake_fn=lambda x, y: torch.empty_like(x),
        triton_fn=triton_add,
        triton_device_types="cpu",
        name="opreg_test_jit::add",
    )(add)
    cache = kernel._opreg_launches  # adopted at registration; Triton itself needs a GPU here
    compiled = []

    def triton_run(*args, grid, warmup, **kwargs):
        compiled.append(Compiled())
        return compiled[-1]

    cache.triton_run = triton_run
    cache.native.bind_driver(lambda: 0, lambda device: 5)
    x = torch.ones(16)
    for _ in range(3):
        op(x, x)
    kernel[(1,)](x, x, x, 16, BLOCK_SIZE=4)  # outside the op: Triton's path
    assert len(compiled) == 2 and cache.hits == 2
    assert [launch[0] for launch in compiled[0].launches] == [(4, 1, 1), (4, 1, 1)]
    assert opreg.kernel_status("opreg_test_jit::add") == (
        "triton_fn serves cpu; _add_source: 2 cached launches; "
        "through Triton: 1 first launch of a specialization"
    )


needs_cuda_triton = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs CUDA and compiled Triton",
)


@needs_cuda_triton
def test_cached_launches_match_the_fallback_on_every_specialization():
    import seed_example

    base = torch.randn(2**20 + 20, device="cuda")
    cases = []
    for dtype in (torch.float32, torch.float16):
        full = base.to(dtype)
        for n in (1, 17, 1023, 1024, 2**20 + 3):
            for offset in (0, 1):  # 16-byte aligned, then not
                cases.append((full[offset : offset + n], full[offset + 2 : offset + 2 + n]))
    for _ in range(2):  # the second round hits the cache
        for x, y in cases:
            torch.testing.assert_close(seed_example.fused_add(x, y), x + y, rtol=0, atol=0)
    assert seed_example._add_kernel._opreg_launches.hits >= len(cases)
    status = opreg.kernel_status("opreg_py::fused_add")
    assert "_add_kernel: " in status and " cached launches; through Triton: " in status
    stream = torch.cuda.Stream()
    x, y = cases[-1]
    with torch.cuda.stream(stream):
        out = seed_example.fused_add(x, y)
    stream.synchronize()
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)
