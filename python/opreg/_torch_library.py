"""What torch.library's registration functions find for an opreg op, so that a piece given to
``torch.library.register_kernel``/``register_fake``/``register_autograd``/``register_vmap``/
``register_autocast`` reaches opreg instead of the dispatcher behind opreg's back (where it
would override the op out of opreg's sight, and a later replace would not take it back); and
opreg's own registrations of Python pieces, which must not go through that entry.

Note [torch.library's registrations of an opreg op]
torch.library's register_* functions look an op's name up in torch's table of custom ops
(torch._library.custom_ops.OPDEFS) and hand the piece to the entry they find. opreg puts an
entry there for each op it defines: for an op of :func:`opreg.custom_op`/:func:`opreg.triton_op`
it adds the piece through that op's methods (the op is defined again with it); for an op
defined otherwise it refuses, naming the keyword that gives the piece. Not covered: PyTorch's
lower-level ``torch.library.impl`` and ``Library.impl``, which register a kernel for a dispatch
key directly and replace opreg's there."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch._library import custom_ops

# OPDEFS holds its entries weakly: these keep them.
_entries: dict[str, TorchLibraryEntry] = {}
_lock = threading.Lock()


class TorchLibraryEntry(custom_ops.CustomOpDef):
    """torch's CustomOpDef in name only: its constructor, which would define an op, is not run;
    the methods torch.library's functions call send the piece to opreg."""

    def __init__(self, qualname: str) -> None:
        self._namespace, self._name = qualname.split("::")  # torch's _qualname joins them
        from opreg._registry import op_overload

        # torch asks whether the op has a fake (has_fake_kernel): every opreg op has one.
        self._abstract_fn = op_overload(qualname)

    def __repr__(self) -> str:
        return f"<opreg's entry for {self._qualname} in torch.library>"

    def _forward(self, api: str) -> Any:
        """The opreg.custom_op object that takes the piece; ValueError where there is none."""
        from opreg import _library

        found = _library.find_custom_op(f"torch.library.{api}", self._qualname)
        if found is None:
            raise ValueError(
                f"torch.library.{api}: op '{self._qualname}' was defined by opreg and is not "
                "defined now; define it again through opreg, with the piece"
            )
        return found

    def register_kernel(self, device_types: Any, fn: Callable[..., Any] | None = None, /) -> Any:
        return self._forward("register_kernel").register_kernel(device_types, fn)

    def register_fake(self, fn: Callable[..., Any], /) -> Any:
        return self._forward("register_fake").register_fake(fn)

    def register_autograd(
        self, backward: Callable[..., Any], /, *, setup_context: Callable[..., Any] | None = None
    ) -> None:
        self._forward("register_autograd").register_autograd(backward, setup_context=setup_context)

    def register_vmap(self, func: Callable[..., Any] | None = None, /) -> Any:
        return self._forward("register_vmap").register_vmap(func)

    def register_autocast(self, device_type: str, cast_inputs: Any) -> None:
        raise ValueError(
            f"torch.library.register_autocast: op '{self._qualname}' is an opreg op, which "
            "autocast does not cast: cast its inputs before the call"
        )

    def register_torch_dispatch(
        self, torch_dispatch_class: Any, fn: Callable[..., Any] | None = None, /
    ) -> Any:
        # A rule for one Tensor subclass or mode overrides nothing of opreg's: torch's own path.
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            library = torch.library.Library(self._namespace, "FRAGMENT")
            torch.library._keep_alive.append(library)
            library._register_torch_dispatch_rule(self._name, torch_dispatch_class, fn)
            return fn

        return register if fn is None else register(fn)

    def register_effect(self, effect: Any) -> None:
        pass  # torch's _register_effectful_op registers it through a library after this call


def claim(qualname: str) -> None:
    """Puts opreg's entry for ``qualname`` in torch's table of custom ops, once; an op of that
    name that torch.library defined keeps its own."""
    if "." in qualname:  # an overload's name: torch's table holds ops by name
        return
    with _lock:
        if qualname in _entries:
            return
        if custom_ops.OPDEFS.get(qualname) is not None:
            return
        entry = TorchLibraryEntry(qualname)
        _entries[qualname] = entry
        custom_ops.OPDEFS[qualname] = entry


def register_fake(library: torch.library.Library, qualname: str, fn: Callable[..., Any]) -> None:
    """opreg's own registration of an op's Python fake, past its entry in torch's table."""
    # The caller's module is the fake's (frame 2 here): torch checks it against a C++ op's stub.
    library._register_fake(qualname.split("::")[1], fn, _stacklevel=2)


def register_torch_dispatch(
    library: torch.library.Library, qualname: str, torch_dispatch_class: Any, fn: Callable
) -> None:
    """opreg's own rule of an op for a Tensor subclass or mode, past its entry in torch's table."""
    library._register_torch_dispatch_rule(qualname.split("::")[1], torch_dispatch_class, fn)
