"""Cheaper launches of Triton JIT kernels from an op's ``triton_fn`` (and ``vmap_fn``).

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
C++ (src/python/jit_launch.cpp): the adopted kernel's ``run`` is a C function.

The kernels an op's Python functions reach through their globals and closures are adopted:
``run`` is replaced on the kernel object (not its class). "Inside an op" is set by the C++ side
while it calls an op's Python pieces.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from opreg import _C


class CachedLaunches:
    """The compiled kernels one JIT kernel's launches resolved to, by specialization key."""

    def __init__(
        self,
        kernel: Any,
        triton_run: Callable[..., Any],
        current_device: Callable[[], int] | None = None,
        current_stream: Callable[[int], int] | None = None,
    ) -> None:
        from triton import knobs

        self.kernel = kernel
        params = [
            (param.name, param.default, bool(getattr(param, "is_constexpr", False)))
            for param in kernel.params
        ]
        self.native = _C.TritonLaunchCache(
            kernel, triton_run, params, knobs.runtime, knobs.compilation
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
    kernel and its cache keep each other alive, as JIT kernels live as long as their module."""
    cache = kernel.__dict__.get("_opreg_launches")
    if cache is None:
        cache = CachedLaunches(kernel, kernel.run)
        kernel._opreg_launches = cache
        kernel.run = cache.run
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


def adopt_kernels_reached_by(*fns: Callable[..., Any] | None) -> list[Any]:
    """Adopts the JIT kernels the given functions reach and lists them (none when Triton is
    missing, kernels are interpreted, or reached some other way)."""
    kernels: dict[int, Any] = {}
    for fn in fns:
        if fn is None:
            continue
        try:
            reached = kernels_reached_by(fn)
        except ImportError:
            return []
        kernels.update((id(kernel), kernel) for kernel in reached)
    for kernel in kernels.values():
        adopt(kernel)
    return list(kernels.values())
