"""Which implementation served each opreg call: for tests, the demo and debugging."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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
        """The implementations that ran, in order, for one op or all."""
        return [r.impl for r in self.records if op is None or r.op == op]


@public
@contextmanager
def trace() -> Iterator[Trace]:
    """Record which implementation serves each opreg call made by this thread inside the block.

    Blocks nest: an outer block also records what an inner one does. Calls made by other threads
    are not recorded (but a backward pass that PyTorch runs on its own threads for this thread is).

    >>> with opreg.trace() as t:
    ...     torch.ops.opreg_example.scale_add(x, y)
    >>> t.impls()
    ['kernel:cpu_loop']
    """
    scope = _C.TraceScope()
    try:
        yield Trace(scope)
    finally:
        scope.close()
