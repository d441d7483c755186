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

    def __init__(self) -> None:
        self._records: list[TraceRecord] | None = None

    @property
    def records(self) -> list[TraceRecord]:
        if self._records is not None:
            return self._records
        return [TraceRecord(*r) for r in _C.trace_records()]

    def impls(self, op: str | None = None) -> list[str]:
        """The implementations that ran, in order, for one op or all."""
        return [r.impl for r in self.records if op is None or r.op == op]

    def _freeze(self) -> None:
        self._records = [TraceRecord(*r) for r in _C.trace_records()]


@public
@contextmanager
def trace() -> Iterator[Trace]:
    """Record which implementation serves each opreg call inside the block.

    >>> with opreg.trace() as t:
    ...     torch.ops.opreg_example.scale_add(x, y)
    >>> t.impls()
    ['kernel:cpu_loop']
    """
    recorded = Trace()
    _C.set_trace_enabled(True)
    try:
        yield recorded
    finally:
        recorded._freeze()
        _C.set_trace_enabled(False)
