"""Cheaper launches of Triton JIT kernels from an op's ``triton_fn``.

Triton's launcher rebuilds a specialization key in Python on every call (binding, signature
strings, cache-key tuples) before it launches the compiled kernel. Once Triton has compiled (or
found) the kernel for a call, opreg remembers it under a key at least as fine as Triton's, and
later calls with that key launch the compiled kernel directly through Triton's own compiled
launcher. The key: the current device; each tensor's dtype and 16-byte alignment; each
integer's width class, whether it is 1 and whether 16 divides it; the type of floats, bools and
None; every keyword argument's name, type and value; Triton's debug and instrumentation
settings. Anything else (other argument types, pre-run hooks, changed globals, warm-up calls)
goes through Triton unchanged, as do all launches outside opreg ops; launch hooks are called as
Triton calls them.

The kernels a ``triton_fn`` reaches through its globals and closure are adopted: their ``run``
is wrapped (on the kernel object, not its class) so that launches inside an opreg op take the
cached path. Launches elsewhere call Triton's ``run`` as before.
"""

from __future__ import annotations

import collections
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any

from opreg import _C

_inside_op: contextvars.ContextVar[bool] = contextvars.ContextVar("opreg_inside_op", default=False)


def specialization_key(device: int, args: tuple, kwargs: dict[str, Any], salt: Any = ()) -> Any:
    """The cache key of a launch (a flat tuple), or None when an argument is outside what the
    key covers. Computed in C++ (src/python/jit_launch.cpp): it runs on every launch."""
    return _C.triton_launch_key(device, args, kwargs, salt)


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
        self.triton_run = triton_run
        self.params = [(param.name, param.default) for param in kernel.params]
        self.knobs = knobs
        self.native = _C.TritonLaunchCache(tuple(name for name, _ in self.params), knobs.runtime)
        if current_device is not None and current_stream is not None:
            self.native.bind_driver(current_device, current_stream)
        self.through_triton: collections.Counter[str] = collections.Counter()

    @property
    def hits(self) -> int:
        return self.native.hits

    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        if warmup or not _inside_op.get():
            return self.triton_run(*args, grid=grid, warmup=warmup, **kwargs)
        declined = self._declined()
        if declined:
            self.through_triton[declined] += 1
            return self.triton_run(*args, grid=grid, warmup=False, **kwargs)
        if not self.native.bound:  # the driver starts lazily: bind it at the first launch
            from triton.runtime import driver

            self.native.bind_driver(
                driver.active.get_current_device, driver.active.get_current_stream
            )
        # Triton compiles another kernel when these change.
        salt = self.kernel.debug or self.knobs.runtime.debug
        salt = (salt, self.knobs.compilation.instrumentation_mode)
        compiled = self.native.launch(grid, args, kwargs, salt)
        if compiled is not None:
            return compiled
        key = specialization_key(self.native.current_device(), args, kwargs, salt)
        if key is None:
            self.through_triton["arguments outside the key"] += 1
            return self.triton_run(*args, grid=grid, warmup=False, **kwargs)
        self.through_triton["first launch of a specialization"] += 1
        compiled = self.triton_run(*args, grid=grid, warmup=False, **kwargs)
        if compiled is not None and hasattr(compiled, "function"):
            self.native.store(key, compiled, self._defaults_plan(len(args), kwargs))
        return compiled

    def describe(self) -> str:
        """Launches so far: cached, and through Triton with why."""
        reasons = ", ".join(f"{count} {why}" for why, count in self.through_triton.items())
        return f"{self.hits} cached launches; through Triton: {reasons or 'none'}"

    def _declined(self) -> str:
        """Why a launch must go through Triton's own path ('' when it need not)."""
        if self.kernel.pre_run_hooks:
            return "pre-run hooks"
        missing = object()
        for (name, _), (value, module_globals) in getattr(
            self.kernel, "used_global_vals", {}
        ).items():
            if module_globals.get(name, missing) != value:
                return "a global the kernel read has changed"
        return ""

    def _defaults_plan(self, num_args: int, kwargs: dict[str, Any]) -> tuple:
        """How the parameters after the positional ones get their values: keyword or default."""
        return tuple((name in kwargs, name, default) for name, default in self.params[num_args:])


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
    """Route ``kernel``'s launches inside opreg ops through the cache (once per kernel)."""
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


def accelerated(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` running with cached launches for the JIT kernels it reaches (listed in the
    result's ``jit_kernels``); ``fn`` itself when it reaches none (Triton missing, interpreted
    kernels, kernels reached some other way)."""
    try:
        kernels = kernels_reached_by(fn)
    except ImportError:
        return fn
    if not kernels:
        return fn
    for kernel in kernels:
        adopt(kernel)

    @functools.wraps(fn)
    def run_inside_op(*args: Any, **kwargs: Any) -> Any:
        token = _inside_op.set(True)
        try:
            return fn(*args, **kwargs)
        finally:
            _inside_op.reset(token)

    run_inside_op.jit_kernels = kernels  # type: ignore[attr-defined]
    return run_inside_op
