"""Marks functions defined in opreg's private modules as part of the ``opreg`` namespace."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable[..., object])


def public(fn: F) -> F:
    """Report ``opreg`` as the function's module, whatever private file defines it."""
    fn.__module__ = "opreg"
    return fn
