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

from collections.abc import Callable
from typing import Any

import torch
from torch._library import custom_ops, simple_registry

from opreg._fork import new_rlock
from opreg._tracing import without_line_events

# OPDEFS holds its entries weakly: these keep them.
_entries: dict[str, TorchLibraryEntry] = {}
_lock = new_rlock()  # reentrant: a trace hook or finalizer may define an op while it is held


class TorchLibraryEntry(custom_ops.CustomOpDef):
    """torch's CustomOpDef in name only: its constructor, which would define an op, is not run;
    the methods torch.library's functions call send the piece to opreg."""

    def __init__(self, qualname: str) -> None:
        self._namespace, self._name = qualname.split("::")  # torch's _qualname joins them

    @property
    def _abstract_fn(self) -> Callable[..., Any]:
        """The op's fake as torch reads it: whether the op has one (has_fake_kernel: every opreg
        op has one), and the one to give back after a block that swaps it (torch's
        fake_profile.unsafe_generate_fake_kernels): a custom_op's fake, or the op itself, which
        register_fake takes as "no fake of its own"."""
        from opreg import _library
        from opreg._registry import op_overload

        found = _library._defined.get(self._qualname)
        fake = getattr(found, "_fake", None)
        return fake if fake is not None else op_overload(self._qualname)

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
        custom_op = self._forward("register_fake")
        if _is_op_itself(fn, self._qualname):  # what _abstract_fn gave for "no fake of its own"
            custom_op._with(_fake=None)
            return fn
        return custom_op.register_fake(fn)

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
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            library = torch.library.Library(self._namespace, "FRAGMENT")
            torch.library._keep_alive.append(library)
            register_user_rule(library, self._qualname, torch_dispatch_class, fn)
            return fn

        return register if fn is None else register(fn)

    def register_effect(self, effect: Any) -> None:
        pass  # torch's _register_effectful_op registers it through a library after this call


def claim(qualname: str) -> None:
    """Puts opreg's entry for ``qualname`` in torch's table of custom ops, once; an op of that
    name that torch.library defined keeps its own."""
    without_line_events()  # Note [Locks and trace hooks]
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
    """opreg's own registration of an op's Python fake, past its entry in torch's table, for
    FakeTensorMode. torch would also register a Meta kernel for it, one per definition, which a
    replace frees while a call on meta tensors may be running it; the op's definition holds its
    own (OpBuilder.python_fake). The registration goes with `library`."""
    fakes = torch._library.simple_registry.singleton.find(qualname).fake_impl
    source = torch._library.utils.get_source(2)
    # allow_override: torch 2.11's default refuses a fake beside a Meta kernel (opreg's own).
    handle = fakes.register(fn, source, lib=_NoMetaKernel(), allow_override=True)
    library._registration_handles.append(handle)


class _NoMetaKernel:
    """What torch's fake registration takes as the library to register a Meta kernel in."""

    def impl(self, *args: Any, **kwargs: Any) -> None:
        pass


def _is_op_itself(fn: Any, qualname: str) -> bool:
    return isinstance(fn, torch._ops.OpOverload) and fn._schema.name == qualname


# Note [Rules for a mode: the user's serve]
# opreg gives some ops a rule of its own for a mode (FakeTensorMode, Note [An op's rule for
# FakeTensorMode]; FunctionalTensorMode, to decompose a Triton function under compile); torch
# keeps one rule per op and mode. A rule the user registers (torch.library.register_torch_dispatch,
# a custom_op's method) serves in its place: opreg's is dropped for it, and a definition made
# while the user's is in place does not add opreg's (adding it would fail with the definition
# made, which a definition must never do). opreg's rule comes back where the user's goes with
# the custom_op object that registered it (a custom_op defined again under its name).
_own_rules: dict[tuple[str, Any], tuple[torch.library.Library, Any, Callable]] = {}
_displaced: dict[tuple[str, Any], tuple[torch.library.Library, Callable]] = {}


def register_torch_dispatch(
    library: torch.library.Library, qualname: str, torch_dispatch_class: Any, fn: Callable
) -> None:
    """opreg's own rule of an op for a Tensor subclass or mode, past its entry in torch's table;
    held back while the user's rule for it is in place (Note [Rules for a mode: the user's
    serve])."""
    without_line_events()  # Note [Locks and trace hooks]
    key = (qualname, torch_dispatch_class)
    with _lock:
        if simple_registry.singleton.find(qualname).torch_dispatch_rules.find(torch_dispatch_class):
            _displaced[key] = (library, fn)
            return
        _displaced.pop(key, None)
        _register_own(library, key, fn)


def _register_own(library: torch.library.Library, key: tuple[str, Any], fn: Callable) -> None:
    library._register_torch_dispatch_rule(key[0].split("::")[1], key[1], fn)
    _own_rules[key] = (library, library._registration_handles[-1], fn)


def register_user_rule(
    library: torch.library.Library, qualname: str, torch_dispatch_class: Any, fn: Callable
) -> None:
    """The user's rule of an op for a Tensor subclass or mode, in place of opreg's own."""
    without_line_events()  # Note [Locks and trace hooks]
    key = (qualname, torch_dispatch_class)
    with _lock:
        own = _own_rules.pop(key, None)
        held_back = None
        if own is not None and any(handle is own[1] for handle in own[0]._registration_handles):
            own[0]._registration_handles.remove(own[1])
            own[1].destroy()
            held_back = _displaced[key] = (own[0], own[2])
        _register_or_restore(library, key, fn, held_back)


def _register_or_restore(
    library: torch.library.Library, key: tuple[str, Any], fn: Callable, held_back: Any
) -> None:
    # Not in register_user_rule's `with` block: CPython 3.11 leaves the `try:` line of a try
    # statement inside one out of its cleanup, and a trace hook's exception raised at that line
    # left the lock held for good (sweep 51 A-F3).
    try:
        library._register_torch_dispatch_rule(key[0].split("::")[1], key[1], fn)
    except BaseException:  # a refused rule changes nothing
        if held_back is not None and not _rule_of(key):
            del _displaced[key]
            _register_own(held_back[0], key, held_back[1])
        raise


def _rule_of(key: tuple[str, Any]) -> Any:
    return simple_registry.singleton.find(key[0]).torch_dispatch_rules.find(key[1])


def reinstate(qualname: str) -> None:
    """opreg's rules of ``qualname`` that a user's rule held back, where that rule is gone."""
    without_line_events()  # Note [Locks and trace hooks]
    with _lock:
        for key in [key for key in _displaced if key[0] == qualname]:
            if not _rule_of(key) and (displaced := _displaced.pop(key, None)) is not None:
                _register_own(displaced[0], key, displaced[1])


def forget(qualname: str) -> None:
    """Drops the records of opreg's rules of ``qualname``, whose libraries go with a definition."""
    without_line_events()  # Note [Locks and trace hooks]
    with _lock:
        for records in (_own_rules, _displaced):
            for key in [key for key in records if key[0] == qualname]:
                records.pop(key, None)  # a definition nested in this loop may have dropped it
