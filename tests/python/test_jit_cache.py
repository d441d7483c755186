"""The JIT launch cache (python/opreg/_jit_cache.py): which launches reuse a compiled kernel,
which go back to Triton, what the launch receives; the version gate, the switches and fail-safe
adoption. On CPU the compiled kernel is a recorder; with CUDA, real kernels are compared with the
fallback and with the cache off, bit for bit."""

from __future__ import annotations

import math
import os
import random
import struct

import pytest
import torch

import opreg
from opreg import _C, _jit_cache
from opreg._jit_cache import CachedLaunches


def _skip_unless_tested_triton():
    import triton

    if triton.__version__ not in _jit_cache.TESTED_TRITON_VERSIONS:
        pytest.skip(f"the JIT launch cache is inactive under Triton {triton.__version__}")


@pytest.fixture
def cache_on(monkeypatch):
    """The cache switches on while this test defines ops (whatever the run's environment)."""
    pytest.importorskip("triton")
    _skip_unless_tested_triton()
    monkeypatch.setenv(_jit_cache.CACHE_SWITCH, "1")
    monkeypatch.delenv(_jit_cache.DIRECT_LAUNCH_SWITCH, raising=False)


class Param:
    def __init__(self, name, default=None, is_constexpr=False):
        self.name, self.default, self.is_constexpr = name, default, is_constexpr


class FakeKernel:
    """What CachedLaunches reads from a triton JITFunction."""

    def __init__(self):
        self.params = [
            Param("x"),
            Param("n"),
            Param("BLOCK", 64, is_constexpr=True),
            Param("FLAG", False, is_constexpr=True),
        ]
        self.pre_run_hooks = []
        self.debug = False
        self.used_global_vals = {}


class Compiled:
    """A compiled kernel whose launches are recorded (Triton's launcher ABI)."""

    function, packed_metadata = 1234, (4, 1, 0)

    def __init__(self):
        self.launches, self.hooks = [], []

    def run(self, g0, g1, g2, stream, function, metadata, launch_metadata, enter, exit, *args):
        self.launches.append(((g0, g1, g2), stream, args))
        self.hooks.append((launch_metadata, enter, exit))

    def launch_metadata(self, grid, stream, *args):
        return ("metadata", grid, stream, args)


class Launches:
    """A CachedLaunches over a FakeKernel whose Triton path compiles a recorder each time."""

    def __init__(self):
        self.compiled = []

        def triton_run(*args, grid, warmup, **kwargs):
            self.compiled.append(Compiled())
            return self.compiled[-1]

        self.cache = CachedLaunches(FakeKernel(), triton_run, lambda: 0, lambda device: 77)
        self.kernel = self.cache.kernel

    def __call__(self, *args, inside=True, **kwargs):
        if not inside:
            return self.cache.run(*args, **kwargs)
        with _jit_cache.inside_op():
            return self.cache.run(*args, **kwargs)

    def key(self, *args, **kwargs):
        return self.cache.native.key(args, kwargs)


@pytest.fixture
def launches():
    pytest.importorskip("triton")
    _skip_unless_tested_triton()
    return Launches()


def test_second_launch_with_the_same_specialization_reuses_the_compiled_kernel(launches):
    x = torch.zeros(64)
    launches(x, 64, grid=(4,), warmup=False, BLOCK=16)
    launches(x, 128, grid=lambda meta: (meta["n"] // meta["BLOCK"], 2), warmup=False, BLOCK=16)
    assert len(launches.compiled) == 1 and launches.cache.hits == 1
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
        ((torch.zeros(64), 64, 16), (torch.zeros(64), 64, 32)),  # a constexpr, by position
        ((torch.zeros(64), 64, 16), (torch.zeros(64), 64, 16.0)),  # ... with its type
    ],
)
def test_what_triton_specializes_on_gives_another_key(launches, first, second):
    launches(*first, grid=(1,), warmup=False)
    launches(*second, grid=(1,), warmup=False)
    assert len(launches.compiled) == 2 and launches.cache.hits == 0


def test_keys_take_constexprs_and_options_by_value_and_runtime_arguments_by_kind(launches):
    x = torch.zeros(4)
    assert launches.key(x, BLOCK=1) != launches.key(x, BLOCK=2)
    assert launches.key(x, BLOCK=1) != launches.key(x, BLOCK=True)
    assert launches.key(x, num_warps=4) != launches.key(x, num_warps=8)
    assert launches.key(x, n=32) == launches.key(x, n=64)  # a runtime argument by keyword
    assert launches.key(x, 32) == launches.key(x, 64)
    assert launches.key(x) != launches.key(x, grid=(1,), BLOCK=64)
    assert launches.key(x, grid=(1,), warmup=False) == launches.key(x)  # the launch's own
    assert launches.key(x, "a string") is None
    assert launches.key(x, layout=object()) is None
    assert launches.cache.native.key((x,), {}, 0) != launches.cache.native.key((x,), {}, 1)
    assert launches.cache.native.key((x,), {}) != launches.cache.native.key((x,), {}, debug=True)


def test_launches_the_key_cannot_cover_go_to_triton_every_time(launches):
    for _ in range(2):
        launches(torch.zeros(4), (1, 2), grid=(1,), warmup=False)
    assert len(launches.compiled) == 2 and launches.cache.hits == 0


def test_hooks_changed_globals_warmup_and_outside_ops_go_to_triton(launches):
    x = torch.zeros(64)
    launches(x, 64, grid=(1,), warmup=False)
    launches(x, 64, grid=(1,), warmup=True)
    launches.kernel.pre_run_hooks.append(lambda *args, **kwargs: None)
    launches(x, 64, grid=(1,), warmup=False)
    launches.kernel.pre_run_hooks.clear()
    module_globals = {"SCALE": 2}
    launches.kernel.used_global_vals = {("SCALE", id(module_globals)): (1, module_globals)}
    launches(x, 64, grid=(1,), warmup=False)
    launches.kernel.used_global_vals = {}
    launches(x, 64, grid=(1,), warmup=False, inside=False)
    assert not _C.inside_op()
    assert len(launches.compiled) == 5 and launches.cache.hits == 0
    launches(x, 64, grid=(1,), warmup=False)
    assert launches.cache.hits == 1
    assert launches.cache.describe() == (
        "1 cached launches (0 from C++), through Triton's launcher because Triton's active "
        "driver is not CUDA; through Triton: 1 first launch of a specialization, "
        "1 pre-run hooks, 1 a global the kernel read has changed"
    )


def test_launch_hooks_see_cached_launches_as_triton_shows_them(launches):
    from triton import knobs

    x = torch.zeros(64)
    launches(x, 64, grid=(1,), warmup=False)
    knobs.runtime.launch_enter_hook.add(print)
    try:
        launches(x, 64, grid=(1,), warmup=False)
    finally:
        knobs.runtime.launch_enter_hook.remove(print)
    launches(x, 64, grid=(1,), warmup=False)
    compiled = launches.compiled[0]
    assert launches.cache.hits == 2 and len(compiled.hooks) == 2
    metadata, enter, exit = compiled.hooks[0]
    assert metadata == ("metadata", (1,), 77, (x, 64, 64, False))
    assert enter is knobs.runtime.launch_enter_hook and exit is knobs.runtime.launch_exit_hook
    assert compiled.hooks[1] == (None, None, None)  # no hook set: nothing to call


def test_errors_in_the_grid_reach_the_caller(launches):
    x = torch.zeros(64)
    launches(x, 64, grid=(1,), warmup=False)

    def grid(meta):
        raise ValueError("bad grid")

    with pytest.raises(ValueError, match="bad grid"):
        launches(x, 64, grid=grid, warmup=False)
    with pytest.raises(TypeError):
        launches(x, 64, grid=7, warmup=False)
    with pytest.raises(IndexError, match=r"a Triton launch grid needs 1 to 3 sizes, got \(\)"):
        launches(x, 64, grid=(), warmup=False)


def test_jit_kernels_are_found_through_globals_closures_and_wrappers():
    pytest.importorskip("triton")
    _skip_unless_tested_triton()
    from triton.runtime.jit import JITFunction

    kernel = JITFunction(_kernel_source)

    class Autotuned:
        fn = kernel

    wrapped = Autotuned()

    def launcher():
        return wrapped, torch, kernel  # the same kernel twice: listed once

    assert _jit_cache.kernels_reached_by(launcher) == [kernel]
    globals()["_global_kernel"] = JITFunction(_add_source)
    assert _jit_cache.kernels_reached_by(_launches_a_global) == [_global_kernel]  # noqa: F821
    assert _jit_cache.kernels_reached_by(len) == []
    cache = _jit_cache.adopt(kernel)
    assert _jit_cache.adopt(kernel) is cache and kernel.run == cache.run
    assert _jit_cache.adopt_kernels_reached_by(len, None) == []
    reached = _jit_cache.adopt_kernels_reached_by(launcher, _launches_a_global)
    assert [entry.kernel for entry in reached] == [kernel, _global_kernel]  # noqa: F821


def _kernel_source(x_ptr, n):
    pass


def _add_source(x_ptr, y_ptr, out_ptr, n, BLOCK_SIZE):
    pass


def _launches_a_global():
    return _global_kernel  # noqa: F821  (set by the test that reads it)


class FakeTritonOp:
    """An op whose triton_fn launches a real JITFunction whose Triton path compiles a recorder
    (Triton itself needs a GPU here), served on the CPU."""

    def __init__(self, name):
        from triton.runtime.jit import JITFunction

        kernel = JITFunction(_add_source)
        self.compiled = []

        def triton_run(*args, grid, warmup, **kwargs):
            self.compiled.append(Compiled())
            return self.compiled[-1]

        kernel.run = triton_run  # what adoption wraps
        self.kernel, self.triton_run = kernel, triton_run

        def triton_add(x, y):
            out = torch.empty_like(x)
            kernel[lambda meta: (meta["n"] // meta["BLOCK_SIZE"],)](
                x, y, out, x.numel(), BLOCK_SIZE=4
            )
            return out

        def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x + y

        self.op = opreg.register_triton_op(
            fake_fn=lambda x, y: torch.empty_like(x),
            triton_fn=triton_add,
            triton_device_types="cpu",
            name=name,
            replace=True,
        )(add)
        self.name = name


def test_an_op_launches_through_the_cache_and_reports_it(cache_on):
    fake = FakeTritonOp("opreg_test_jit::add")
    cache = fake.kernel._opreg_launches  # adopted at registration
    cache.native.bind_driver(lambda: 0, lambda device: 5)
    x = torch.ones(16)
    for _ in range(3):
        fake.op(x, x)
    fake.kernel[(1,)](x, x, x, 16, BLOCK_SIZE=4)  # outside the op: Triton's path
    assert len(fake.compiled) == 2 and cache.hits == 2
    assert [launch[0] for launch in fake.compiled[0].launches] == [(4, 1, 1), (4, 1, 1)]
    assert opreg.kernel_status("opreg_test_jit::add") == (
        "triton_fn serves cpu; _add_source: 2 cached launches (0 from C++), through Triton's "
        "launcher because Triton's active driver is not CUDA; "
        "through Triton: 1 first launch of a specialization"
    )


def _runs_through_triton(fake, status_tail):
    """The op's kernel kept Triton's launcher: every call reaches it, and kernel_status says why."""
    assert _jit_cache.cache_of(fake.kernel) is None and fake.kernel.run is fake.triton_run
    x = torch.ones(16)
    for _ in range(3):
        fake.op(x, x)
    assert len(fake.compiled) == 3  # no call skipped Triton's path
    assert opreg.kernel_status(fake.name) == f"triton_fn serves cpu; _add_source: {status_tail}"


def test_the_switch_off_keeps_triton_launcher_and_says_so(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("OPREG_JIT_LAUNCH_CACHE", "0")
    fake = FakeTritonOp("opreg_test_jit::switched_off")
    _runs_through_triton(
        fake, "Triton's launcher (the JIT launch cache is off (OPREG_JIT_LAUNCH_CACHE=0))"
    )


def test_an_untested_triton_version_keeps_triton_launcher_and_says_so(monkeypatch):
    triton = pytest.importorskip("triton")
    monkeypatch.setenv("OPREG_JIT_LAUNCH_CACHE", "1")
    monkeypatch.setattr(_jit_cache, "TESTED_TRITON_VERSIONS", ("0.0.1", "0.0.2"))
    fake = FakeTritonOp("opreg_test_jit::untested")
    _runs_through_triton(
        fake,
        "Triton's launcher (the JIT launch cache is off: it was tested on Triton 0.0.1, 0.0.2, "
        f"not {triton.__version__})",
    )


def test_the_version_gate_reads_one_list(monkeypatch):
    triton = pytest.importorskip("triton")
    monkeypatch.setenv("OPREG_JIT_LAUNCH_CACHE", "1")
    monkeypatch.setattr(_jit_cache, "TESTED_TRITON_VERSIONS", (triton.__version__,))
    assert _jit_cache.cache_off_reason() == ""
    monkeypatch.setattr(triton, "__version__", "3.7.0")
    assert "not 3.7.0" in _jit_cache.cache_off_reason()


class _Injected(RuntimeError):
    pass


def _refuse(*args, **kwargs):
    raise _Injected("injected failure")


@pytest.mark.parametrize("where", ["native cache", "Python cache", "after run was replaced"])
def test_a_failed_adoption_keeps_triton_launcher_and_says_why(monkeypatch, where):
    triton = pytest.importorskip("triton")
    from triton.runtime.jit import JITFunction

    monkeypatch.setenv("OPREG_JIT_LAUNCH_CACHE", "1")  # adopting is tried, whatever the version
    monkeypatch.setattr(_jit_cache, "TESTED_TRITON_VERSIONS", (triton.__version__,))

    if where == "native cache":
        monkeypatch.setattr(_C, "TritonLaunchCache", _refuse)
    elif where == "Python cache":
        monkeypatch.setattr(_jit_cache, "CachedLaunches", _refuse)
    else:

        def refuse_cache(self, name, value):
            if name == "_opreg_launches":
                _refuse()
            object.__setattr__(self, name, value)

        monkeypatch.setattr(JITFunction, "__setattr__", refuse_cache)
    fake = FakeTritonOp(f"opreg_test_jit::failed_{where.split()[0]}")
    _runs_through_triton(
        fake, "Triton's launcher (adopting it failed: _Injected: injected failure)"
    )


def test_direct_launch_switch_off_keeps_hits_on_triton_compiled_launcher(monkeypatch):
    pytest.importorskip("triton")
    _skip_unless_tested_triton()
    monkeypatch.setenv("OPREG_JIT_DIRECT_LAUNCH", "0")
    from triton.runtime.jit import JITFunction

    kernel = JITFunction(_add_source)
    compiled = Compiled()
    kernel.run = lambda *args, grid, warmup, **kwargs: compiled
    cache = _jit_cache.adopt(kernel)
    cache.native.bind_driver(lambda: 0, lambda device: 5)
    x = torch.ones(16)
    with _jit_cache.inside_op():
        for _ in range(2):
            kernel[(1,)](x, x, x, 16, BLOCK_SIZE=4)
    assert cache.hits == 1 and len(compiled.launches) == 1
    assert cache.describe() == (
        "1 cached launches (0 from C++), through Triton's launcher because launches from C++ "
        "are off (OPREG_JIT_DIRECT_LAUNCH=0); through Triton: 1 first launch of a specialization"
    )


# ---- the direct launch's parameter packing (src/triton/launch.cpp), as Triton's launcher packs ---


def _fp16_as_triton(value):
    try:
        return struct.pack("<e", value)  # PyFloat_Pack2, what Triton's pack_fp16 calls
    except OverflowError:
        return None


def _fp32_as_triton(value):
    try:
        return struct.pack("<f", value)  # (float)value, as Triton's pack_fp32
    except OverflowError:  # where the C cast gives an infinity
        return struct.pack("<f", math.copysign(math.inf, value))


def _bf16_as_triton(value):
    return _fp32_as_triton(value)[2:]  # the float32's upper half, truncated


def test_half_precision_scalars_are_packed_as_triton_packs_them():
    pack = _C._jit_cache_pack
    # Rounding to float32 first would land on the half-way point and round down: wrong.
    double_rounding_trap = 1 + 2**-11 + 2**-40
    values = [0.0, -0.0, 1.0, 1 / 3, 65504.0, 65519.99, 65520.0, -1e6, 6e-8, 2e-8, 1e-300]
    values += [double_rounding_trap, -double_rounding_trap, math.inf, -math.inf, 1.5e308]
    generator = random.Random(0)
    values += [generator.uniform(-7e4, 7e4) for _ in range(2000)]
    values += [math.ldexp(generator.random(), generator.randint(-30, 17)) for _ in range(2000)]
    for value in values:
        assert pack("fp16", value) == _fp16_as_triton(value), value
        assert pack("bf16", value) == _bf16_as_triton(value), value
        assert pack("fp32", value) == _fp32_as_triton(value), value
        assert pack("fp64", value) == struct.pack("<d", value), value
    assert pack("fp16", math.nan) == struct.pack("<e", math.nan)
    assert pack("fp32", 3) == struct.pack("<f", 3.0)  # an int for a float parameter
    assert pack("fp32", "3") is None and pack("fp16", 1e300) is None


def test_integer_scalars_are_packed_or_left_to_triton_launcher():
    pack = _C._jit_cache_pack
    assert pack("i32", -5) == struct.pack("<i", -5) and pack("i32", 2**31) is None
    assert pack("i64", -(2**40)) == struct.pack("<q", -(2**40)) and pack("i64", 2**63) is None
    assert pack("u32", 2**32 - 1) == struct.pack("<I", 2**32 - 1) and pack("u32", -1) is None
    assert pack("i16", -(2**15)) == struct.pack("<h", -(2**15)) and pack("i16", 2**15) is None
    assert pack("i1", True) == b"\x01" and pack("i1", False) == b"\x00"
    assert pack("i8", 127) == b"\x7f"
    assert pack("i8", -1) is None  # Triton's launcher parses 8-bit integers as unsigned
    assert pack("i32", 1.0) is None and pack("u64", 2**64) is None
    with pytest.raises(ValueError, match="not a scalar parameter type: \\*fp32"):
        pack("*fp32", 0)


# ---- with CUDA: real kernels ------------------------------------------------------------------

needs_cuda_triton = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs CUDA and compiled Triton",
)


def _native_cache(kernel):
    """The cache of a kernel that a test module's op adopted at import, or a skip saying why
    there is none (the switch was off, or Triton untested, when the module defined its op)."""
    cache = _jit_cache.cache_of(kernel)
    if cache is None:
        pytest.skip(f"{kernel.__name__} was not adopted: {_jit_cache.cache_off_reason()}")
    return cache.native


@needs_cuda_triton
def test_cached_launches_match_the_fallback_on_every_specialization():
    import seed_example

    launches = _native_cache(seed_example._add_kernel)
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
    assert launches.hits >= len(cases) and launches.direct_hits == launches.hits
    assert launches.indirect_reasons == []
    status = opreg.kernel_status("opreg_py::fused_add")
    assert "_add_kernel: " in status and " from C++); through Triton: " in status
    stream = torch.cuda.Stream()
    x, y = cases[-1]
    with torch.cuda.stream(stream):
        out = seed_example.fused_add(x, y)
    stream.synchronize()
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)


@needs_cuda_triton
def test_scalars_none_pointers_and_positional_constexprs_launch_from_cpp():
    import jit_cache_kernels as kernels

    launches = _native_cache(kernels._axpby_kernel)
    for _ in range(2):  # the second round hits the cache
        for n in (1, 100, 4095, 4096, 100_000):
            x, y, bias = (torch.randn(n, device="cuda") for _ in range(3))
            for alpha, beta, offset, with_bias in [
                (1.5, -0.25, 3, False),
                (0.0, 2.0, -(2**40), True),
                (-1.0, 1.0, 0, True),
            ]:
                b = bias if with_bias else None
                b_cpu = None if b is None else b.cpu()
                expected = kernels.axpby(x.cpu(), y.cpu(), alpha, beta, offset, b_cpu)
                actual = kernels.axpby(x, y, alpha, beta, offset, b)
                torch.testing.assert_close(actual.cpu(), expected)
    assert launches.direct_hits > 0 and launches.direct_hits == launches.hits
    assert launches.indirect_reasons == []


@needs_cuda_triton
def test_launches_from_a_vmap_fn_are_cached_too():
    import evox_style_ops as ops

    launches = _native_cache(ops.scale_rows_kernel)
    x = torch.randn(3, 4, 100, device="cuda")
    scaled = torch.vmap(torch.vmap(ops.scale_rows, in_dims=(0, None)), in_dims=(0, None))
    scaled(x, 2.0)  # the first launch of this specialization compiles
    before = launches.direct_hits
    ops.calls.clear()
    torch.testing.assert_close(scaled(x, 2.0), x * 2.0, rtol=0, atol=0)
    assert "vmap_fn(3, 4, 100)" in ops.calls  # one vmap_fn call for both levels ...
    assert launches.direct_hits == before + 1  # ... whose launch was cached, from C++


@needs_cuda_triton
def test_half_precision_scalars_launch_from_cpp_as_from_triton(cache_on):
    import jit_cache_kernels as kernels

    kernel = kernels.affine_half_kernel
    launches = _jit_cache.adopt(kernel).native
    before = launches.direct_hits
    x = torch.randn(1000, device="cuda")
    with _jit_cache.inside_op():  # compiles, and caches this specialization
        kernel[(4,)](x, torch.empty_like(x), 1000, 1.0, 1.0, BLOCK=256)
    for alpha, beta in [(1.5, -0.25), (0.333, 3.7), (-2.0e4, 1.0e30), (1 + 2**-11 + 2**-40, 0.0)]:
        through_triton, from_cpp = (
            torch.full_like(x, float("nan")),
            torch.full_like(x, float("nan")),
        )
        kernel[(4,)](x, through_triton, 1000, alpha, beta, BLOCK=256)  # outside an op
        with _jit_cache.inside_op():
            kernel[(4,)](x, from_cpp, 1000, alpha, beta, BLOCK=256)
        torch.testing.assert_close(from_cpp, through_triton, rtol=0, atol=0, equal_nan=True)
        if abs(beta) < 100:  # Triton rounds alpha to fp16 and truncates beta to bf16
            torch.testing.assert_close(from_cpp, x * alpha + beta, rtol=0.01, atol=0.02)
    assert launches.direct_hits == before + 4 and launches.indirect_reasons == []


# The three ways a cached op's launch can go: each its own kernel objects, defined under its
# switches (read when an op is defined).
_MODES = {
    "off": {"OPREG_JIT_LAUNCH_CACHE": "0"},
    "key_only": {"OPREG_JIT_LAUNCH_CACHE": "1", "OPREG_JIT_DIRECT_LAUNCH": "0"},
    "direct": {"OPREG_JIT_LAUNCH_CACHE": "1", "OPREG_JIT_DIRECT_LAUNCH": "1"},
}


def _ops_in_mode(mode, monkeypatch):
    """The seed's add and the test kernels' axpby and affine_half, as ops over fresh kernel
    objects defined with the cache in `mode`; returns (ops by name, kernels)."""
    import jit_cache_kernels as kernels
    import seed_example

    import triton

    for switch, value in _MODES[mode].items():
        monkeypatch.setenv(switch, value)
    add_kernel = triton.jit(seed_example._add_kernel.fn)
    axpby_kernel = triton.jit(kernels._axpby_kernel.fn)
    half_kernel = triton.jit(kernels.affine_half_kernel.fn)

    def triton_add(x, y):
        out = torch.empty_like(x)
        n = x.numel()
        add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)](
            x, y, out, n, BLOCK_SIZE=1024
        )
        return out

    def triton_affine_half(x, alpha, beta):
        out = torch.empty_like(x)
        half_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), alpha, beta, BLOCK=256)
        return out

    def define(triton_fn):
        return opreg.register_triton_op(
            fake_fn=None,
            triton_fn=triton_fn,
            name=f"opreg_test_jit_modes::{triton_fn.__name__}_{mode}",
            replace=True,
        )

    @define(triton_add)
    def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y

    axpby = define(kernels.axpby_triton_fn(axpby_kernel))(kernels.axpby_reference)

    @define(triton_affine_half)
    def affine_half(x: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
        return x * alpha + beta

    ops = {"add": add, "axpby": axpby, "affine_half": affine_half}
    return ops, (add_kernel, axpby_kernel, half_kernel)


def _mode_cases():
    generator = torch.Generator(device="cuda").manual_seed(0)
    base = torch.randn(2**20 + 20, device="cuda", generator=generator)
    cases = []
    for dtype in (torch.float32, torch.float16):
        full = base.to(dtype)
        for n in (1, 17, 1024, 2**20 + 3):
            for offset in (0, 1):
                x, y = full[offset : offset + n], full[offset + 2 : offset + 2 + n]
                cases.append(("add", (x, y)))
    for n in (1, 100, 4096, 100_000):
        x, y, bias = base[:n], base[n : 2 * n], base[2 * n : 3 * n]
        for alpha, beta, offset, b in [(1.5, -0.25, 3, None), (0.0, 2.0, -(2**40), bias)]:
            cases.append(("axpby", (x, y, alpha, beta, offset, b)))
    for alpha, beta in [(1.5, -0.25), (0.333, 3.7), (1 + 2**-11 + 2**-40, 1.0e30)]:
        cases.append(("affine_half", (base[:1000], alpha, beta)))
    return cases


@needs_cuda_triton
def test_outputs_are_bitwise_equal_with_the_cache_off_on_and_launching_from_cpp(monkeypatch):
    _skip_unless_tested_triton()
    cases = _mode_cases()
    outputs, kernels_by_mode = {}, {}
    for mode in _MODES:
        ops, kernels_by_mode[mode] = _ops_in_mode(mode, monkeypatch)
        outputs[mode] = [[ops[name](*args) for name, args in cases] for _ in range(2)]
    torch.cuda.synchronize()
    for mode in ("key_only", "direct"):
        for round_ in range(2):  # the first round compiles, the second hits the cache
            for (name, _), off, on in zip(
                cases, outputs["off"][round_], outputs[mode][round_], strict=True
            ):
                assert torch.equal(off, on), f"{name} differs with the cache {mode}"
    assert all(_jit_cache.cache_of(kernel) is None for kernel in kernels_by_mode["off"])
    key_only = [_jit_cache.cache_of(kernel).native for kernel in kernels_by_mode["key_only"]]
    assert all(cache.hits > 0 and cache.direct_hits == 0 for cache in key_only)
    direct = [_jit_cache.cache_of(kernel).native for kernel in kernels_by_mode["direct"]]
    assert all(cache.direct_hits > 0 and cache.direct_hits == cache.hits for cache in direct)
