"""Which implementation served each opreg call: for tests, the demo and debugging."""

from __future__ import annotations

import threading
from typing import NamedTuple

from opreg import _C
from opreg._public import public


@public
class TraceRecord(NamedTuple):
    op: str  # "namespace::name"
    impl: str  # "fallback", "kernel:<name>", "fake", ...
    device: str  # "cpu", "cuda:0", "meta", ...


class Trace:
    """The records of one :func:`trace` block; read them while or after it runs."""

    def __init__(self, scope: _C.TraceScope) -> None:
        self._scope = scope

    @property
    def records(self) -> list[TraceRecord]:
        return [TraceRecord(*r) for r in self._scope.records()]

    def impls(self, op: str | None = None) -> list[str]:
        """The implementations that ran, in order, for one op ("namespace::name") or all."""
        if op is not None and not isinstance(op, str):
            raise TypeError(
                "opreg.trace(): impls(op) takes an op name like 'namespace::name' or None, got "
                f"{type(op).__name__} {op!r}"
            )
        if op is not None and "::" not in op:
            raise ValueError(
                f"opreg.trace(): impls(op): op {op!r} has no namespace; records name ops as "
                "'namespace::name'"
            )
        return [r.impl for r in self.records if op is None or r.op == op]


class _TraceBlock:
    """The context manager :func:`trace` returns: one ``with`` block, then spent."""

    def __init__(self) -> None:
        self._scope: _C.TraceScope | None = None
        self._used = False

    def __enter__(self) -> Trace:
        if self._used:
            raise RuntimeError(
                "opreg.trace(): this trace was already used for a with block; call "
                "opreg.trace() again for each block (its records stay readable on the first)"
            )
        self._used = True
        self._scope = _C.TraceScope()
        self._thread = threading.get_ident()
        _open_blocks().append(self)
        return Trace(self._scope)

    def __exit__(self, *exc_info: object) -> None:
        if self._scope is None:
            raise RuntimeError(
                "opreg.trace(): __exit__ was called on a trace whose block was not entered "
                "(or was already exited); use it as `with opreg.trace() as t:`"
            )
        if self._thread != threading.get_ident():
            raise RuntimeError(
                "opreg.trace(): a trace block must be exited on the thread that entered it (it "
                "records that thread's calls); this thread did not enter it"
            )
        scope, self._scope = self._scope, None
        scope.close()
        blocks = _open_blocks()
        innermost = blocks[-1] is self
        blocks.remove(self)
        if not innermost:
            raise RuntimeError(
                "opreg.trace(): this block was exited before a block entered inside it; exit "
                "blocks in the reverse order of entering them, as with statements do (this one "
                "stopped recording, the inner one goes on)"
            )


_thread_state = threading.local()


def _open_blocks() -> list[_TraceBlock]:
    """This thread's trace blocks that are entered and not yet exited, innermost last."""
    if not hasattr(_thread_state, "blocks"):
        _thread_state.blocks = []
    return _thread_state.blocks


@public
def trace() -> _TraceBlock:
    """Record which implementation serves each opreg call made by this thread inside the block.

    Blocks nest: an outer block also records what an inner one does. Calls made by other threads
    are not recorded (but a backward pass that PyTorch runs on its own threads for this thread is).

    >>> with opreg.trace() as t:
    ...     torch.ops.opreg_example.scale_add(x, y)
    >>> t.impls()
    ['kernel:cpu_loop']
    """
    return _TraceBlock()
