"""Running opreg's code right after a module of PyTorch's is imported, without importing it: for
modules that cost a process which never uses them a large share of its start (DTensor's, about as
much as torch itself; Inductor's config, over a second)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

_waiting: dict[str, _RunAfterImport] = {}


def run_after_import(fullname: str, callback: Callable[[], None], what: str) -> None:
    """Calls ``callback`` once the module ``fullname`` has run (now, if it already has). An error
    in it becomes a warning saying ``what`` was not done: it never breaks the user's import."""
    if fullname in sys.modules:
        callback()
    elif fullname not in _waiting:
        _waiting[fullname] = _RunAfterImport(fullname, callback, what)
        sys.meta_path.insert(0, _waiting[fullname])


class _RunAfterImport(importlib.abc.MetaPathFinder):
    """Finds the module with the other finders and wraps its loader; removes itself from
    sys.meta_path once the module has run."""

    def __init__(self, fullname: str, callback: Callable[[], None], what: str) -> None:
        self._fullname, self._callback, self._what = fullname, callback, what

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self._fullname:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _LoaderThenRun(spec.loader, self)
        return spec

    def ran(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        _waiting.pop(self._fullname, None)
        try:
            self._callback()
        except Exception as error:
            warnings.warn(f"opreg: {self._what}: {error}", stacklevel=3)


class _LoaderThenRun(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, finder: _RunAfterImport) -> None:
        self._loader, self._finder = loader, finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._finder.ran()

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, ...
        return getattr(self._loader, name)
