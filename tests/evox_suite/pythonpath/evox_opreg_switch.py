"""Serve EvoX's op-registration, Triton-backend and Philox modules from opreg, without editing EvoX.

After :func:`install`, importing EvoX (``import evox``) finds these four modules served by opreg,
each a module whose names are opreg's own objects; every other EvoX module is EvoX's own:

- ``evox.utils.op_register``: ``register_vmap_op``, ``VmapInfo`` and
  ``_default_vmap_wrap_inputs`` (``opreg.default_vmap_wrap_inputs``);
- ``evox.triton_kernels.op_register``: ``register_triton_op``;
- ``evox.triton_kernels.backend``: ``has_triton``, ``triton_device_types``,
  ``triton_supports_device``, ``register_triton_device_type``;
- ``evox.triton_kernels.kernels.philox``: every name of ``opreg.philox.__all__``.

So ``evox.utils`` and ``evox.triton_kernels`` re-export opreg's functions, and EvoX's ops
(``fused_add``, EvalMonitor's ``_data_sink``, non-dominated sorting's ranks) are defined by opreg's
``register_*_op`` when EvoX imports them. A name the served module lacks (EvoX's private state,
such as ``backend._triton_device_types``) raises an ``AttributeError`` that says so.

``install()`` must run before EvoX is imported; it imports nothing itself (opreg is imported when
EvoX first asks for a served module), so it is cheap enough for every interpreter start
(``sitecustomize.py`` of this folder calls it when ``EVOX_OPREG_SWITCH=1``). ``report()`` tells
which of the four modules the running process got from opreg and which from EvoX's files.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable

ENV_VAR = "EVOX_OPREG_SWITCH"


def _utils_op_register() -> dict[str, object]:
    import opreg

    return {
        "register_vmap_op": opreg.register_vmap_op,
        "VmapInfo": opreg.VmapInfo,
        "_default_vmap_wrap_inputs": opreg.default_vmap_wrap_inputs,
    }


def _triton_op_register() -> dict[str, object]:
    import opreg

    return {"register_triton_op": opreg.register_triton_op}


def _triton_backend() -> dict[str, object]:
    import opreg

    return {
        name: getattr(opreg, name)
        for name in (
            "has_triton",
            "triton_device_types",
            "triton_supports_device",
            "register_triton_device_type",
        )
    }


def _philox() -> dict[str, object]:
    import opreg.philox

    return {name: getattr(opreg.philox, name) for name in opreg.philox.__all__}


#: EvoX module name -> (opreg module it stands for, the names it serves).
SERVED_MODULES: dict[str, tuple[str, Callable[[], dict[str, object]]]] = {
    "evox.utils.op_register": ("opreg", _utils_op_register),
    "evox.triton_kernels.op_register": ("opreg", _triton_op_register),
    "evox.triton_kernels.backend": ("opreg", _triton_backend),
    "evox.triton_kernels.kernels.philox": ("opreg.philox", _philox),
}

_SERVED_MARK = "__served_by_opreg__"


def _missing_name(module_name: str, served_from: str) -> Callable[[str], object]:
    def __getattr__(name: str) -> object:
        raise AttributeError(
            f"module {module_name!r} is served by {served_from} (evox_opreg_switch), which has no "
            f"{name!r}: it is not a name of EvoX's public API that opreg serves "
            "(EvoX's private module state has no opreg counterpart)"
        )

    return __getattr__


class _OpregServedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the modules of :data:`SERVED_MODULES` ahead of EvoX's files and fills them."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in SERVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=False)

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        served_from, names = SERVED_MODULES[module.__name__]
        module.__doc__ = f"EvoX's {module.__name__}, served by {served_from} (evox_opreg_switch)."
        module.__dict__.update(names())
        module.__all__ = sorted(name for name in names() if not name.startswith("_"))
        setattr(module, _SERVED_MARK, served_from)
        module.__getattr__ = _missing_name(module.__name__, served_from)


_FINDER = _OpregServedModules()


def installed() -> bool:
    return _FINDER in sys.meta_path


def install() -> None:
    """Serve :data:`SERVED_MODULES` from opreg from now on; EvoX must not be imported yet."""
    if installed():
        return
    imported = sorted(name for name in SERVED_MODULES if name in sys.modules)
    if imported:
        raise RuntimeError(
            f"evox_opreg_switch.install() came too late: {', '.join(imported)} is already "
            "imported from EvoX's files; install the switch before `import evox`"
        )
    sys.meta_path.insert(0, _FINDER)


def report() -> dict[str, str]:
    """Where each module of :data:`SERVED_MODULES` came from in this process:
    ``"opreg"``/``"opreg.philox"``, ``"evox file <path>"``, or ``"not imported"``."""
    where = {}
    for name in SERVED_MODULES:
        module = sys.modules.get(name)
        if module is None:
            where[name] = "not imported"
        elif hasattr(module, _SERVED_MARK):
            where[name] = getattr(module, _SERVED_MARK)
        else:
            where[name] = f"evox file {getattr(module, '__file__', None)}"
    return where
