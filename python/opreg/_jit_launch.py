"""Cheaper launches of Triton JIT kernels from an op's ``triton_fn``.

Triton's launcher rebuilds a specialization key in Python on every call (binding, signature
strings, cache-key tuples) before it launches the compiled kernel: about two thirds of its host
cost. Once Triton has compiled (or found) the kernel for a call, opreg remembers it under a key
that is at least as fine as Triton's, and later calls with that key launch the compiled kernel
directly through Triton's own compiled launcher. The key: the current device; each tensor's
dtype and 16-byte alignment; each integer's width class, whether it is 1 and whether 16 divides
it; the type of floats, bools and None; every keyword argument's name, type and value. Anything
else (other argument types, launch hooks, pre-run hooks, changed globals, warm-up calls) goes
through Triton unchanged, as do all launches outside opreg ops.

The kernels a ``triton_fn`` reaches through its globals and closure are adopted: their ``run``
is wrapped (on the kernel object, not its class) so that launches inside an opreg op take the
cached path. Launches elsewhere call Triton's ``run`` as before.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

_INT32 = (-(2**31), 2**31)
_INT64 = (-(2**63), 2**63)

_inside_op: contextvars.ContextVar[bool] = contextvars.ContextVar("opreg_inside_op", default=False)


def _argument_key(value: Any) -> Any:
    """The part of the key for one argument, or ``_UNCACHEABLE``."""
    kind = type(value)
    if kind is bool:
        return (bool, value)
    if kind is int:
        return (
            int,
            _INT32[0] <= value < _INT32[1],
            _INT64[0] <= value < _INT64[1],
            value == 1,
            value % 16 == 0,
        )
    if kind is float:
        return float
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.data_ptr() % 16 == 0)
    return _UNCACHEABLE


_UNCACHEABLE = object()
_KEYWORD_TYPES = (int, float, bool, str, type(None))


def specialization_key(device: int, args: tuple, kwargs: dict[str, Any]) -> tuple | None:
    """The cache key of a launch, or None when an argument is outside what the key covers."""
    parts: list[Any] = [device]
    for value in args:
        part = _argument_key(value)
        if part is _UNCACHEABLE:
            return None
        parts.append(part)
    for name, value in kwargs.items():
        kind = type(value)
        if kind not in _KEYWORD_TYPES:
            if not isinstance(value, torch.Tensor):
                return None
            parts.append((name, _argument_key(value)))
            continue
        parts.append((name, kind, value))
    return tuple(parts)


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
        self.names = tuple(name for name, _ in self.params)
        self.entries: dict[tuple, tuple[Any, tuple]] = {}
        self.hits = 0
        self.knobs = knobs
        self.current_device = current_device  # bound on first use: the driver starts lazily
        self.current_stream = current_stream

    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        if warmup or not _inside_op.get() or not self._plain_launch():
            return self.triton_run(*args, grid=grid, warmup=warmup, **kwargs)
        if self.current_device is None or self.current_stream is None:
            from triton.runtime import driver

            self.current_device = driver.active.get_current_device
            self.current_stream = driver.active.get_current_stream
        device = self.current_device()
        key = specialization_key(device, args, kwargs)
        if key is not None:  # Triton compiles another kernel when these change
            key += (self.kernel.debug or self.knobs.runtime.debug,)
            key += (self.knobs.compilation.instrumentation_mode,)
        entry = self.entries.get(key) if key is not None else None
        if entry is None:
            compiled = self.triton_run(*args, grid=grid, warmup=False, **kwargs)
            if key is not None and compiled is not None and hasattr(compiled, "function"):
                self.entries[key] = (compiled, self._defaults_plan(len(args), kwargs))
            return compiled
        self.hits += 1
        compiled, plan = entry
        values = args + tuple(
            kwargs[name] if keyword else default for keyword, name, default in plan
        )
        if callable(grid):
            grid = grid(dict(zip(self.names, values, strict=True)))
        size = len(grid)
        compiled.run(
            grid[0],
            grid[1] if size > 1 else 1,
            grid[2] if size > 2 else 1,
            self.current_stream(device),
            compiled.function,
            compiled.packed_metadata,
            None,
            None,
            None,
            *values,
        )
        return compiled

    def _plain_launch(self) -> bool:
        """No hook observes launches and no global the kernel read has changed."""
        runtime = self.knobs.runtime
        if self.kernel.pre_run_hooks:
            return False
        if _observed(runtime.launch_enter_hook) or _observed(runtime.launch_exit_hook):
            return False
        missing = object()
        for (name, _), (value, module_globals) in getattr(
            self.kernel, "used_global_vals", {}
        ).items():
            if module_globals.get(name, missing) != value:
                return False
        return True

    def _defaults_plan(self, num_args: int, kwargs: dict[str, Any]) -> tuple:
        """How the parameters after the positional ones get their values: keyword or default."""
        return tuple((name in kwargs, name, default) for name, default in self.params[num_args:])


def _observed(hook: Any) -> bool:
    """Whether a launch hook is set: Triton 3.6 keeps an always-present chain of hooks."""
    return hook is not None and bool(getattr(hook, "calls", True))


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
    return [kernel for value in candidates for kernel in _jit_functions(value)]


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


def accelerated(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` running with cached launches for the JIT kernels it reaches; ``fn`` itself when
    it reaches none (Triton missing, interpreted kernels, kernels reached some other way)."""
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

    return run_inside_op
