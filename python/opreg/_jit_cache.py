"""The JIT launch cache: cheaper launches of Triton JIT kernels from an op's ``triton_fn`` (and
``vmap_fn``).

Triton's launcher rebuilds a specialization key in Python on every call (binding, signature
strings, cache-key tuples) before it launches the compiled kernel. Once Triton has compiled (or
found) the kernel for a call made inside an opreg op, opreg remembers it under a key at least as
fine as Triton's, and later calls with that key skip Triton's Python path: a plain CUDA kernel
is launched from C++ (cuLaunchKernel, parameters packed as Triton's launcher packs them), others
through Triton's own compiled launcher. The key: the current device; each tensor's dtype and
16-byte alignment; each integer argument's width class, whether it is 1 and whether 16 divides
it; the type of floats, bools and None; constexpr parameters and other keywords by type and
value; Triton's debug and instrumentation settings. Anything else (other argument types,
pre-run hooks, changed globals, warm-up calls) goes through Triton unchanged, as do all launches
outside opreg ops; launch hooks are called as Triton calls them. The per-launch part lives in
C++ (src/python/jit_cache/): the adopted kernel's ``run`` is a C function.

This re-implements the private start of Triton's launcher (``JITFunction.run``), so it is
contained: it adopts kernels only under the Triton versions it was tested on
(``TESTED_TRITON_VERSIONS``), only while ``OPREG_JIT_LAUNCH_CACHE`` is not ``0`` when the op is
defined, and a failure while adopting leaves the kernel with Triton's launcher; in each case
``opreg.kernel_status`` says why. ``OPREG_JIT_DIRECT_LAUNCH=0`` keeps the cache but launches its
hits through Triton's compiled launcher instead of from C++ (to measure the C++ launch).

The kernels an op's Python functions reach through their globals and closures are adopted:
``run`` is replaced on the kernel object (not its class). "Inside an op" is set by the C++ side
while it calls an op's Python pieces.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from opreg import _C

# The Triton releases whose JITFunction.run and CUDA launcher the cache was checked against; under
# any other version, kernels keep Triton's own launcher.
TESTED_TRITON_VERSIONS = ("3.6.0",)

CACHE_SWITCH = "OPREG_JIT_LAUNCH_CACHE"
DIRECT_LAUNCH_SWITCH = "OPREG_JIT_DIRECT_LAUNCH"


class CachedLaunches:
    """The compiled kernels one JIT kernel's launches resolved to, by specialization key."""

    def __init__(
        self,
        kernel: Any,
        triton_run: Callable[..., Any],
        current_device: Callable[[], int] | None = None,
        current_stream: Callable[[int], int] | None = None,
        direct_launch: bool = True,
    ) -> None:
        from triton import knobs

        self.kernel = kernel
        params = [
            (param.name, param.default, bool(getattr(param, "is_constexpr", False)))
            for param in kernel.params
        ]
        direct_launch_off = (
            "" if direct_launch else f"launches from C++ are off ({_off(DIRECT_LAUNCH_SWITCH)})"
        )
        self.native = _C.TritonLaunchCache(
            kernel, triton_run, params, knobs.runtime, knobs.compilation, direct_launch_off
        )
        if current_device is not None and current_stream is not None:
            self.native.bind_driver(current_device, current_stream)
        self.run = self.native.run

    @property
    def hits(self) -> int:
        return self.native.hits

    def describe(self) -> str:
        """Launches so far: cached (and how many of those from C++), through Triton with why."""
        native = self.native
        reasons = ", ".join(f"{count} {why}" for why, count in native.through_triton)
        text = f"{native.hits} cached launches ({native.direct_hits} from C++)"
        if native.indirect_reasons:
            text += f", through Triton's launcher because {'; '.join(native.indirect_reasons)}"
        return f"{text}; through Triton: {reasons or 'none'}"


class JitKernel:
    """A JIT kernel an op reaches, for ``kernel_status``: its cache, or why it has none."""

    def __init__(self, kernel: Any, not_adopted: str = "") -> None:
        self.kernel, self.not_adopted = kernel, not_adopted

    def describe(self) -> str:
        cache = cache_of(self.kernel)  # adopted since, for another op: its launches are cached
        if cache is not None:
            return f"{self.name}: {cache.describe()}"
        return f"{self.name}: Triton's launcher ({self.not_adopted})"

    @property
    def name(self) -> str:
        return getattr(self.kernel, "__name__", "JIT kernels")


def _off(switch: str) -> str:
    return f"{switch}={os.environ.get(switch)}"


def cache_off_reason() -> str:
    """Why the JIT launch cache does not adopt kernels now ('' when it does): the switch, or a
    Triton version it was not tested on."""
    if os.environ.get(CACHE_SWITCH, "1") == "0":
        return f"the JIT launch cache is off ({_off(CACHE_SWITCH)})"
    import triton

    version = getattr(triton, "__version__", "unknown")
    if version not in TESTED_TRITON_VERSIONS:
        tested = ", ".join(TESTED_TRITON_VERSIONS)
        return f"the JIT launch cache is off: it was tested on Triton {tested}, not {version}"
    return ""


def cache_of(kernel: Any) -> CachedLaunches | None:
    return getattr(kernel, "__dict__", {}).get("_opreg_launches")


def inside_op() -> Any:
    """A context manager marking its body as running inside an opreg op (tests, diagnostics)."""
    return _C.InsideOpScope()


def _jit_functions(value: Any) -> Iterator[Any]:
    """The JIT kernels behind a global or closure value (through autotuner/heuristics wrappers)."""
    from triton.runtime.jit import JITFunction

    seen = 0
    while value is not None and seen < 8:
        if isinstance(value, JITFunction):
            yield value
            return
        value = getattr(value, "fn", None)
        seen += 1


def adopt(kernel: Any) -> CachedLaunches:
    """Route ``kernel``'s launches inside opreg ops through the cache (once per kernel). The
    kernel and its cache keep each other alive, as JIT kernels live as long as their module.
    ``OPREG_JIT_DIRECT_LAUNCH=0`` (read now) keeps its cache hits off the C++ launch."""
    cache = cache_of(kernel)
    if cache is None:
        direct = os.environ.get(DIRECT_LAUNCH_SWITCH, "1") != "0"
        cache = CachedLaunches(kernel, kernel.run, direct_launch=direct)
        own_run = kernel.__dict__.get("run")  # usually none: the class's run, Triton's
        kernel.run = cache.run
        try:
            kernel._opreg_launches = cache
        except BaseException:
            if own_run is None:
                del kernel.run
            else:
                kernel.run = own_run
            raise
    return cache


def kernels_reached_by(fn: Callable[..., Any]) -> list[Any]:
    """JIT kernels that ``fn`` names as globals or holds in its closure."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    candidates = [fn.__globals__.get(name) for name in code.co_names]
    candidates += [cell.cell_contents for cell in fn.__closure__ or () if _filled(cell)]
    kernels = [kernel for value in candidates for kernel in _jit_functions(value)]
    return list({id(kernel): kernel for kernel in kernels}.values())


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


def adopt_kernels_reached_by(*fns: Callable[..., Any] | None) -> list[JitKernel]:
    """Adopts the JIT kernels the given functions reach, when the cache is on, and lists them
    (none when Triton is missing, kernels are interpreted, or reached some other way). Never
    raises: a kernel whose adoption fails keeps Triton's launcher, and its entry says why."""
    kernels: dict[int, Any] = {}
    try:
        for fn in fns:
            if fn is not None:
                kernels.update((id(kernel), kernel) for kernel in kernels_reached_by(fn))
        off = cache_off_reason()
    except ImportError:
        return []
    except Exception as error:  # a function whose globals or closure cannot be read as expected
        return [JitKernel(None, f"finding its kernels failed: {type(error).__name__}: {error}")]
    found = []
    for kernel in kernels.values():
        if off:
            found.append(JitKernel(kernel, off))
            continue
        try:
            adopt(kernel)
            found.append(JitKernel(kernel))
        except Exception as error:
            found.append(JitKernel(kernel, f"adopting it failed: {type(error).__name__}: {error}"))
    return found
