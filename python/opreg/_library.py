"""torch.library's custom-op API from opreg, so that ``import opreg as library`` can stand in for
``torch.library``: ``triton_op``, ``custom_op``, ``wrap_triton``/``capture_triton``, the
``CustomOpDef`` methods and their function forms, and ``opcheck`` in torch's call form. Each op
is one :class:`~opreg._declaration.OpDeclaration`; a method that adds a piece re-defines the op
with it (the core replaces a definition atomically, and a refused one leaves the op as it was).
docs/python-front.md, "Coming from torch.library", lists the differences from torch."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from opreg import _C, _jit_cache, _torch_library
from opreg._declaration import (
    KernelDeclaration,
    OpDeclaration,
    check_positional,
    check_signature,
    define,
    defining,
    parse_schema,
    refuse_companion,
    registration_of,
)
from opreg._fork import new_rlock
from opreg._front import _device_types, _schema
from opreg._opcheck import opcheck as _opreg_opcheck
from opreg._public import public
from opreg._registry import caller_origin, check_op_name, op_overload
from opreg._tracing import without_line_events
from opreg._triton import faking_launches, triton_status, wrap_triton
from opreg._vmap import RuleShape, check_rule_arguments, explicit_rule

_DeviceTypes = str | Sequence[str] | None

# The ops defined here, by qualified name (a later custom_op/triton_op of a name replaces the op,
# as torch.library.custom_op does).
_defined: dict[str, CustomOpDef] = {}


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _without_hop(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with torch.library.wrap_triton launching kernels directly (no higher-order op), as
    torch's triton_op runs its function on real tensors."""
    from torch._library.triton import set_wrap_triton_enabled

    def run(*args: Any, **kwargs: Any) -> Any:
        with set_wrap_triton_enabled(False):
            return fn(*args, **kwargs)

    return run


def _fake_from(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A triton_op's fake: its function on fake tensors, kernel launches skipped (torch's fake
    of the launch higher-order op does nothing)."""

    def fake(*args: Any, **kwargs: Any) -> Any:
        with faking_launches():
            return fn(*args, **kwargs)

    return fake


def _device_type_of(args: Iterable[Any]) -> str:
    for value in args:
        if isinstance(value, torch.Tensor):
            return value.device.type
        if isinstance(value, (list, tuple)):
            found = _device_type_of(value)
            if found != "cpu":
                return found
        if isinstance(value, torch.device):
            return value.type
    return "cpu"


def _device_list(where: str, device_types: _DeviceTypes) -> list[str | None]:
    if device_types is None:
        return [None]
    if isinstance(device_types, str):
        return [device_types]
    if isinstance(device_types, Iterable) and all(isinstance(t, str) for t in device_types):
        return list(device_types)
    raise TypeError(
        f"{where}: device_types must be a str such as 'cpu', a sequence of them, or None, got "
        f"{device_types!r}"
    )


@public
class CustomOpDef(torch._library.custom_ops.CustomOpDef):
    """What :func:`opreg.triton_op` and :func:`opreg.custom_op` return: called like the op, with
    torch.library.CustomOpDef's methods. Each method that adds a piece (fake, kernel, backward,
    vmap rule) re-defines the op with it; ``torch.ops.<ns>.<name>`` stays the same op.

    A torch CustomOpDef in name only (its constructor, which would define an op, is not run), so
    that torch.library's functions given this object call its methods, as they do torch's."""

    def __init__(
        self,
        qualname: str,
        schema: str,
        *,
        triton_fn: Callable[..., Any] | None,
        origin: str,
    ) -> None:
        self._namespace, self._name = qualname.split("::")  # torch's _qualname joins them
        self._schema = schema
        self._triton_fn = triton_fn
        self._origin = origin
        self._kernels: dict[str, Callable[..., Any]] = {}  # device type -> kernel
        self._reference: Callable[..., Any] | None = None  # register_kernel(None or "cpu")
        self._fake: Callable[..., Any] | None = None
        self._meta_kernel: Callable[..., Any] | None = None  # register_kernel("meta")
        self._backward: Callable[..., Any] | None = None
        self._setup_context: Callable[..., Any] | None = None
        self._vmap: Callable[..., Any] | None = None
        self._dispatch_library: torch.library.Library | None = None
        self._opoverload: torch._ops.OpOverload | None = None
        parsed = parse_schema(qualname, qualname + schema)
        self._parsed = parsed
        self._keyword_only = [a.name for a in parsed.arguments if a.kwarg_only]
        self._positional = [a.name for a in parsed.arguments if not a.kwarg_only]
        self._grads = [f"grad{i}" for i in range(len(parsed.returns))]
        # One gradient per output (None for a number's); a backward is refused for a tensor list.
        self._fixed_grad_count = not any(
            isinstance(r.type, torch.ListType) and "Tensor" in str(r.type) for r in parsed.returns
        )
        self._registration: object = None  # the definition this object made last
        # Held while a method reads and redefines the pieces: each call from several threads
        # adds its piece to the others' and sees the definition this object made last.
        self._lock = new_rlock()

    @property
    def __name__(self) -> str:  # functools and torch read it
        return self._qualname.split("::")[1]

    def __repr__(self) -> str:
        return f"<opreg.CustomOpDef({self._qualname})>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._opoverload(*args, **kwargs)

    # ---- the declaration ----------------------------------------------------------------------

    def _missing_reference(self) -> Callable[..., Any]:
        qualname, short = self._qualname, self._qualname.split("::")[1]
        triton = ["the Triton device types"] if self._triton_fn is not None else []
        serving = ", ".join([*triton, *sorted(self._kernels)]) or "no device type"

        def missing(*args: Any, **kwargs: Any) -> Any:
            device = _device_type_of([*args, *kwargs.values()])
            if device == "meta":
                raise NotImplementedError(
                    f"opreg: op '{qualname}' has no fake and no reference to run on meta "
                    f"tensors; register one with {short}.register_fake(fn)"
                )
            raise NotImplementedError(
                f"opreg: op '{qualname}' has no implementation for device type '{device}': its "
                f"kernels serve {serving}. Register one with {short}.register_kernel('{device}', "
                "fn) (a 'cpu' or None kernel is the reference, which serves every other device), "
                "or give triton_op(..., fallback=fn)"
            )

        return missing

    def _declaration(self) -> OpDeclaration:
        reference = self._reference
        # Under Triton's interpreter the function runs on CPU tensors, as with torch, and stays
        # opaque to torch.compile (interpreted launches cannot be traced). It is no reference for
        # autograd or vmap: its launches neither record gradients nor take batched tensors.
        has_reference = reference is not None
        decompose = self._triton_fn is not None and not (_interpreted() and reference is None)
        if reference is None and self._triton_fn is not None and _interpreted():
            reference = _without_hop(self._triton_fn)
        usable, why = triton_status()
        kernels = [
            KernelDeclaration("register_kernel", [device], fn=fn)
            for device, fn in self._kernels.items()
        ]
        status = "no triton_op function"
        if self._triton_fn is not None:
            if usable:
                kernels.append(KernelDeclaration("triton", None, fn=_without_hop(self._triton_fn)))
                status = "the triton_op function serves the Triton devices"
            else:
                status = f"the triton_op function is off: {why}"
        # A "meta" kernel is what torch's fake tensors fall back to without a fake: opreg's fake.
        fake = self._fake or self._meta_kernel
        if fake is None and self._triton_fn is not None:
            fake = _fake_from(self._triton_fn)
        return OpDeclaration(
            schema=self._qualname + self._schema,
            fallback=reference or self._missing_reference(),
            fallback_label="" if reference is not None else "no reference",
            fake=fake,
            kernels=kernels,
            autograd="fallback" if has_reference or self._backward is not None else "error",
            backward=self._adapted_backward(),
            setup_context=self._adapted_setup_context(),
            vmap=None
            if self._vmap is None
            else explicit_rule(self._qualname, self._vmap, RuleShape.of(self._parsed)),
            vmap_per_example_loop=not has_reference and self._vmap is None,
            replace=True,
            origin=self._origin,
            decompose_with=(self._triton_fn, None) if decompose and usable else None,
            kernel_status=status,
            jit_kernels=_jit_cache.adopt_kernels_reached_by(self._triton_fn, None)
            if usable and self._triton_fn is not None
            else [],
        )

    def _define(self, replacing: int) -> None:
        """Defines the op, replacing only the definition of serial ``replacing`` (0: none): a
        definition made meanwhile on another thread (a library's load) is not overwritten."""
        declaration = dataclasses.replace(self._declaration(), replace_only=replacing)
        (self._opoverload,) = define(declaration)
        self._registration = registration_of(self._qualname)

    def _is_current(self) -> bool:
        # The serial too: an undefine or a definition from C++ does not pass through Python.
        registration = registration_of(self._qualname)
        return registration is self._registration and _C.definition_serial(
            self._qualname
        ) == getattr(registration, "serial", None)

    def _check_current(self) -> None:
        if not self._is_current() and not _C.is_defined(self._qualname):
            raise RuntimeError(
                f"opreg: op '{self._qualname}': it was undefined since this object defined it "
                "(opreg::undefine, or its library's failed load); define it again (custom_op or "
                "triton_op with its name) to add pieces"
            )
        if not self._is_current():
            raise RuntimeError(
                f"opreg: op '{self._qualname}': it was defined again since this object defined "
                "it (replace=True, custom_op or triton_op with its name); add pieces through "
                "what the newer definition returned"
            )

    def _with(self, **pieces: Any) -> None:
        """Sets pieces and re-defines the op; a refused definition restores them."""
        without_line_events()  # Note [Locks and trace hooks]
        with self._lock, defining():  # current when checked, and still when defined
            serial = _C.definition_serial(self._qualname)
            self._check_current()
            self._set_and_define(serial, pieces)

    def _set_and_define(self, serial: int, pieces: Mapping[str, Any]) -> None:
        # Not in _with's `with` block: CPython 3.11 leaves the `try:` line of a try statement
        # inside one out of its cleanup, and a trace hook's KeyboardInterrupt raised at that line
        # left the lock held for good (sweep 51 A-F3: another thread's register_autograd hung).
        before = {name: getattr(self, name) for name in pieces}
        try:
            for name, value in pieces.items():
                setattr(self, name, value)
            self._define(serial)
        except BaseException:
            if self._took_effect(serial):  # interrupted once published (Ctrl-C): it stands
                self._hold_current()
            else:
                for name, value in before.items():
                    setattr(self, name, value)
            raise

    def _hold_current(self) -> None:
        """Takes the op's current definition for this object's (one it made)."""
        self._opoverload = op_overload(self._qualname)
        self._registration = registration_of(self._qualname)

    def _took_effect(self, replacing: int) -> bool:
        """Whether a definition this thread made (the definition lock held) replaced the one of
        serial ``replacing`` and was recorded, though it raised."""
        registration = registration_of(self._qualname)
        now = _C.definition_serial(self._qualname)
        return registration is not None and now != replacing and registration.serial == now

    # ---- keyword-only arguments, as torch passes them -----------------------------------------

    def _split(self, inputs: Sequence[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        count = len(inputs) - len(self._keyword_only)
        return tuple(inputs[:count]), dict(zip(self._keyword_only, inputs[count:], strict=True))

    def _adapted_setup_context(self) -> Callable[..., Any] | None:
        setup = self._setup_context
        if setup is None or not self._keyword_only:
            return setup

        def setup_context(ctx: Any, inputs: Sequence[Any], output: Any) -> Any:
            positional, keyword_only = self._split(inputs)
            return setup(ctx, positional, keyword_only, output)

        return setup_context

    def _adapted_backward(self) -> Callable[..., Any] | None:
        backward = self._backward
        if backward is None or not self._keyword_only:
            return backward

        def backward_with_keyword_only(ctx: Any, *grads: Any) -> Any:
            result = backward(ctx, *grads)
            result = tuple(result) if isinstance(result, (tuple, list)) else (result,)
            return (*result, *([None] * len(self._keyword_only)))

        return backward_with_keyword_only

    # ---- torch.library.CustomOpDef's methods --------------------------------------------------

    def _where(self, method: str) -> str:
        return f"opreg: op '{self._qualname}': {method}"

    def _check_callable(self, method: str, fn: Any, what: str = "fn") -> None:
        if not callable(fn):
            raise TypeError(
                f"{self._where(method)}: {what} must be callable, got {type(fn).__name__}"
            )

    def register_fake(self, fn: Callable[..., Any], /) -> Callable[..., Any]:
        """The op's fake (abstract evaluation for torch.compile, torch.export and meta tensors);
        usable as a decorator. Replaces a triton_op's fake (its function on fake tensors)."""
        self._check_callable("register_fake", fn)
        check_signature(self._qualname, "register_fake's fn", fn, self._qualname + self._schema)
        self._with(_fake=fn, _meta_kernel=None)  # one fake serves meta tensors and fake ones
        return fn

    def _placed(self, types: Sequence[str | None], fn: Callable[..., Any]) -> dict[str, Any]:
        """The pieces with ``fn`` serving device ``types``: "cpu" or None is the reference,
        "meta" what torch's fake tensors fall back to without a fake (opreg's fake)."""
        pieces = {
            "_reference": self._reference,
            "_kernels": dict(self._kernels),
            "_meta_kernel": self._meta_kernel,
        }
        for device in types:
            kind = None if device is None else device.strip().lower()
            if kind in (None, "cpu"):
                pieces["_reference"] = fn
            elif kind == "meta":
                pieces["_meta_kernel"] = fn
            else:
                pieces["_kernels"][kind] = fn
        return pieces

    def register_kernel(
        self, device_types: _DeviceTypes, fn: Callable[..., Any] | None = None, /
    ) -> Callable[..., Any]:
        """An implementation for ``device_types``; usable as a decorator. ``"cpu"`` or None
        gives the reference (opreg's fallback): it serves every device without a kernel."""
        types = _device_list(self._where("register_kernel"), device_types)
        for device in types:
            if device is not None:
                _device_types(self._qualname, "register_kernel", device)

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            without_line_events()  # Note [Locks and trace hooks]
            self._check_callable("register_kernel", fn)
            check_signature(
                self._qualname, "register_kernel's fn", fn, self._qualname + self._schema
            )
            if self._fake is not None and any(
                device is not None and device.strip().lower() == "meta" for device in types
            ):
                # torch runs a "meta" kernel for meta tensors and the fake for fake ones; opreg's
                # one fake serves both, so a second would never run.
                raise ValueError(
                    f"{self._qualname}: register_kernel('meta'): the op has a fake "
                    "(register_fake), which serves calls on meta tensors as well as on fake "
                    "ones, so a kernel for 'meta' would never run; give it as the fake "
                    "(register_fake) instead"
                )
            with self._lock:
                self._with(**self._placed(types, fn))
            return fn

        return register if fn is None else register(fn)

    def register_autograd(
        self, backward: Callable[..., Any], /, *, setup_context: Callable[..., Any] | None = None
    ) -> None:
        """A backward formula, as torch.library.register_autograd: ``backward(ctx, *grads)``
        returns one gradient per positional input; ``setup_context(ctx, inputs, output)`` (with
        ``keyword_only_inputs`` before ``output`` when the op has keyword-only arguments)."""
        self._check_callable("register_autograd", backward, "backward")
        for argument in self._parsed.arguments:
            # torch's custom_op refuses such arguments; here they would get no gradient, silently.
            if argument.kwarg_only and "Tensor" in str(argument.type):
                raise ValueError(
                    f"{self._qualname}: register_autograd: argument '{argument.name}' is a "
                    f"keyword-only {argument.type}, and the backward gives gradients to "
                    "positional inputs only, so it would get none; make it a positional argument"
                )
        if self._fixed_grad_count:
            check_positional(self._qualname, "backward", backward, ["ctx", *self._grads])
        if setup_context is not None:
            self._check_callable("register_autograd", setup_context, "setup_context")
            keyword_only = ["keyword_only_inputs"] if self._keyword_only else []
            arguments = ["ctx", "inputs", *keyword_only, "output"]
            check_positional(self._qualname, "setup_context", setup_context, arguments)
        self._with(_backward=backward, _setup_context=setup_context)

    def register_vmap(self, func: Callable[..., Any] | None = None) -> Callable[..., Any]:
        """A vmap rule ``func(info, in_dims, *args, **kwargs) -> (output, out_dims)``, as
        torch.library.register_vmap; usable as a decorator."""

        def register(func: Callable[..., Any]) -> Callable[..., Any]:
            self._check_callable("register_vmap", func, "func")
            check_rule_arguments(self._qualname, "register_vmap's func", self._parsed)
            arguments = ["info", "in_dims", *self._positional]
            check_positional(
                self._qualname, "register_vmap's func", func, arguments, self._keyword_only
            )
            self._with(_vmap=func)
            return func

        return register if func is None else register(func)

    def register_autocast(self, device_type: str, cast_inputs: Any) -> None:
        raise ValueError(
            f"{self._where('register_autocast')}: autocast does not cast the inputs of opreg "
            "ops: cast them before the call"
        )

    def set_kernel_enabled(self, device_type: str, enabled: bool = True) -> Any:
        raise ValueError(
            f"{self._where('set_kernel_enabled')}: opreg ops do not switch kernels off; define "
            "the op again without the kernel (its fallback then serves)"
        )

    def register_effect(self, effect: Any) -> None:
        pass  # torch's _register_effectful_op registers it through a library after this call

    def register_torch_dispatch(
        self, torch_dispatch_class: Any, fn: Callable[..., Any] | None = None, /
    ) -> Callable[..., Any]:
        """A rule for a Tensor subclass or TorchDispatchMode, as
        torch.library.register_torch_dispatch; usable as a decorator."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            without_line_events()  # Note [Locks and trace hooks]
            self._check_callable("register_torch_dispatch", fn)
            with self._lock:
                self._check_current()
                if self._dispatch_library is None:
                    self._dispatch_library = torch.library.Library(
                        self._qualname.split("::")[0], "FRAGMENT"
                    )
                _torch_library.register_user_rule(
                    self._dispatch_library, self._qualname, torch_dispatch_class, fn
                )
            return fn

        return register if fn is None else register(fn)


def _new_op(
    api: str,
    name: str,
    fn: Callable[..., Any],
    *,
    mutates_args: Any,
    schema: str | None,
    triton_fn: Callable[..., Any] | None,
) -> CustomOpDef:
    without_line_events()  # Note [Locks and trace hooks]
    check_op_name(f"opreg.{api}", name)
    if not callable(fn):
        raise TypeError(f"opreg.{api}: op '{name}': fn must be callable, got {type(fn).__name__}")
    full_schema = _schema(name, fn, schema, mutates_args)
    if schema is not None:
        check_signature(name, "fn", fn, full_schema)
    signature = full_schema[len(name) :]
    refuse_companion(name, f"opreg.{api}")
    with defining():  # not while another thread defines it: its object is being updated
        _check_name_free(api, name)
    return CustomOpDef(name, signature, triton_fn=triton_fn, origin=caller_origin())


def _check_name_free(api: str, name: str) -> None:
    """A name is free for custom_op/triton_op unless another front (register_triton_op, C++)
    defined it; the op object of its last custom_op/triton_op is replaced."""
    previous = _defined.get(name)
    if previous is None or not previous._is_current():
        try:
            _C.describe_op(name)
        except ValueError:
            pass
        else:  # defined by register_triton_op or C++: the core refuses it, naming the origin
            raise ValueError(
                f"opreg.{api}: op '{name}' is already defined by opreg outside opreg.{api}; "
                "choose another name"
            )


def _publish(api: str, op: CustomOpDef) -> CustomOpDef:
    # Checked again with the definition: another thread may have defined the name meanwhile.
    without_line_events()  # Note [Locks and trace hooks]
    with defining():
        serial = _C.definition_serial(op._qualname)
        _check_name_free(api, op._qualname)
        previous = _defined.get(op._qualname)
        interruption = _define_new(op, serial)
    if previous is not None and previous._dispatch_library is not None:
        previous._dispatch_library._destroy()  # its rules go with it, as torch's custom_op's
        _torch_library.reinstate(op._qualname)
    if interruption is not None:
        raise interruption
    return op


def _define_new(op: CustomOpDef, serial: int) -> BaseException | None:
    """Defines ``op`` and records it as its name's custom_op object; the exception that
    interrupted it once the core published it (Ctrl-C), when the op is this object's, as a
    definition that returned (sweep 48 A-F2: it stayed defined, its name refused to every later
    custom_op as "defined outside opreg.custom_op"; sweep 51: so after an interruption at the line
    that recorded it). Not in _publish's `with` block: see CustomOpDef._set_and_define."""
    try:
        op._define(serial)
        _defined[op._qualname] = op
    except BaseException as error:
        if not op._took_effect(serial):
            raise
        op._hold_current()
        _defined[op._qualname] = op
        return error
    return None


@public
def triton_op(
    name: str,
    fn: Callable[..., Any] | None = None,
    /,
    *,
    mutates_args: str | Iterable[str],
    schema: str | None = None,
    fallback: Callable[..., Any] | None = None,
) -> Any:
    """torch.library.triton_op: an op whose ``fn`` launches Triton kernels through
    :func:`opreg.wrap_triton` (or torch's); usable as a decorator. ``fn`` is the kernel for the
    Triton device types (:func:`opreg.triton_device_types`), the op's fake (run on fake tensors,
    launches skipped) and what torch.compile decomposes the op into. ``fallback=`` (or
    ``register_kernel("cpu", fn)``) gives the reference, which serves every other device; without
    one such calls raise NotImplementedError naming the op. Re-using a name replaces the op."""

    def define_op(fn: Callable[..., Any]) -> CustomOpDef:
        op = _new_op("triton_op", name, fn, mutates_args=mutates_args, schema=schema, triton_fn=fn)
        if fallback is not None:
            op._check_callable("triton_op", fallback, "fallback")
            check_signature(
                op._qualname, "triton_op's fallback", fallback, op._qualname + op._schema
            )
            op._reference = fallback
        _publish("triton_op", op)
        try:
            from torch._library.triton import get_inner_triton_kernels, triton_ops_to_kernels

            triton_ops_to_kernels[name] = get_inner_triton_kernels(fn)
        except Exception:  # best effort, as in torch: AOTInductor reads it
            pass
        return op

    return define_op if fn is None else define_op(fn)


@public
def custom_op(
    name: str,
    fn: Callable[..., Any] | None = None,
    /,
    *,
    mutates_args: str | Iterable[str],
    device_types: _DeviceTypes = None,
    schema: str | None = None,
    tags: Any = None,
) -> Any:
    """torch.library.custom_op: ``fn`` implements the op on ``device_types`` (None: every device,
    as opreg's reference; ``"cpu"`` also gives the reference); usable as a decorator. ``tags``
    are accepted and not applied. Re-using a name replaces the op."""
    del tags
    types = _device_list(f"opreg.custom_op: op '{name}'", device_types)
    for device in types:
        if device is not None:
            _device_types(name, "custom_op's device_types", device)

    def define_op(fn: Callable[..., Any]) -> CustomOpDef:
        op = _new_op(
            "custom_op", name, fn, mutates_args=mutates_args, schema=schema, triton_fn=None
        )
        for piece, value in op._placed(types, fn).items():
            setattr(op, piece, value)
        return _publish("custom_op", op)

    return define_op if fn is None else define_op(fn)


@public
def capture_triton(triton_kernel: Any, /) -> Any:
    """The older name of :func:`opreg.wrap_triton`, as torch.library.capture_triton."""
    return wrap_triton(triton_kernel)


# ---- the function forms -------------------------------------------------------------------------


def _find(api: str, op: Any) -> CustomOpDef | None:
    """The op defined here that ``op`` names; None for ops opreg does not define (torch.library
    then registers the piece). Ops that opreg defines otherwise take their pieces as keywords."""
    if isinstance(op, CustomOpDef):
        return op
    if isinstance(op, torch._library.custom_ops.CustomOpDef):  # torch.library.custom_op's
        name = op._qualname
    elif isinstance(op, torch._ops.OpOverload):
        name = op._schema.name
    elif isinstance(op, torch._ops.OpOverloadPacket):
        name = op._qualified_op_name
    elif isinstance(op, str):
        name = op.split(".")[0]
    else:
        raise TypeError(
            f"opreg.{api}: op must be a CustomOpDef, an op of torch.ops or a 'namespace::name' "
            f"string, got {type(op).__name__}"
        )
    return find_custom_op(f"opreg.{api}", name)


def find_custom_op(where: str, name: str) -> CustomOpDef | None:
    """The op of :func:`custom_op` or :func:`triton_op` named ``name``, which takes pieces; None
    for ops opreg does not define; ValueError for ops opreg defines otherwise."""
    without_line_events()  # Note [Locks and trace hooks]
    with defining():  # not between a redefinition and its record
        found = _defined.get(name)
        if found is not None and (found._is_current() or not _C.is_defined(name)):
            return found  # (an undefined one says so when given a piece)
    try:
        _C.describe_op(name)
    except ValueError:
        return None
    raise ValueError(
        f"{where}: op '{name}' was defined by opreg.register_triton_op, register_vmap_op, "
        "opreg.define or C++; give this piece where it is defined (fake_fn=, backward=/"
        "setup_context=, vmap=, a kernel) instead"
    )


@public
def register_fake(
    op: Any, func: Callable[..., Any] | None = None, /, *, lib: Any = None, **options: Any
) -> Any:
    """torch.library.register_fake: for ops defined by :func:`custom_op` or :func:`triton_op`,
    their ``register_fake``; for other ops, torch.library's."""
    found = _find("register_fake", op)
    if found is None:
        return torch.library.register_fake(op, func, lib=lib, **options)
    return found.register_fake if func is None else found.register_fake(func)


@public
def register_kernel(
    op: Any,
    device_types: _DeviceTypes,
    func: Callable[..., Any] | None = None,
    /,
    *,
    lib: Any = None,
) -> Any:
    """torch.library.register_kernel; see :meth:`CustomOpDef.register_kernel`."""
    found = _find("register_kernel", op)
    if found is None:
        return torch.library.register_kernel(op, device_types, func, lib=lib)
    return found.register_kernel(device_types, func)


@public
def register_autograd(
    op: Any,
    backward: Callable[..., Any],
    /,
    *,
    setup_context: Callable[..., Any] | None = None,
    lib: Any = None,
) -> None:
    """torch.library.register_autograd; see :meth:`CustomOpDef.register_autograd`."""
    found = _find("register_autograd", op)
    if found is None:
        torch.library.register_autograd(op, backward, setup_context=setup_context, lib=lib)
    else:
        found.register_autograd(backward, setup_context=setup_context)


@public
def register_vmap(op: Any, func: Callable[..., Any] | None = None, /, *, lib: Any = None) -> Any:
    """torch.library.register_vmap; see :meth:`CustomOpDef.register_vmap`."""
    found = _find("register_vmap", op)
    if found is None:
        return torch.library.register_vmap(op, func, lib=lib)
    return found.register_vmap(func)


@public
def register_torch_dispatch(
    op: Any,
    torch_dispatch_class: Any,
    func: Callable[..., Any] | None = None,
    /,
    *,
    lib: Any = None,
) -> Any:
    """torch.library.register_torch_dispatch; see :meth:`CustomOpDef.register_torch_dispatch`."""
    found = _find("register_torch_dispatch", op)
    if found is None:
        return torch.library.register_torch_dispatch(op, torch_dispatch_class, func, lib=lib)
    return found.register_torch_dispatch(torch_dispatch_class, func)


# ---- opcheck in both call forms -----------------------------------------------------------------

_TORCH_OPCHECK_KEYWORDS = ("test_utils", "raise_exception", "atol", "rtol")


def _is_argument_tuple(op: Any, samples: Any) -> bool:
    """torch's ``opcheck(op, args)``: one tuple of the op's arguments, not a list of samples. A
    tuple of sequences is the arguments of an op whose leading arguments are lists (``Tensor[]``,
    ``int[]``) when each is a flat sequence (of tensors, numbers), as such an argument is."""
    from opreg._opcheck import Sample

    if not isinstance(samples, tuple):
        return False
    if not samples or not all(isinstance(s, (Sample, tuple, list)) for s in samples):
        return True
    schema = getattr(op, "_schema", None)
    if schema is None or len(samples) > len(schema.arguments):
        return False
    for value, argument in zip(samples, schema.arguments, strict=False):
        flat = not isinstance(value, Sample) and not any(
            isinstance(item, (tuple, list)) for item in value
        )
        if not (flat and isinstance(argument.type, torch.ListType)):
            return False
    return True


@public
def opcheck(
    op: Any, samples: Any = None, kwargs: dict[str, Any] | None = None, **options: Any
) -> Any:
    """Check an op. Two call forms:

    - torch.library.opcheck's, ``opcheck(op, args, kwargs=None, *, test_utils=...,
      raise_exception=True, atol=None, rtol=None)`` with ``args`` one tuple of arguments:
      torch's checks, its result (a dict) and its errors.
    - opreg's, ``opcheck(op, samples=None, *, devices=None, checks=..., raise_on_failure=True,
      progress=None)``: every check of docs/opcheck.md on each sample and device, an
      :class:`opreg.OpcheckReport`.
    """
    if isinstance(op, CustomOpDef):
        op = op._opoverload
    torch_form = (
        kwargs is not None
        or any(k in options for k in _TORCH_OPCHECK_KEYWORDS)
        or _is_argument_tuple(op, samples)
    )
    if torch_form:
        unknown = set(options) - set(_TORCH_OPCHECK_KEYWORDS)
        if unknown:
            raise TypeError(
                f"opreg.opcheck: torch's call form (op, args, kwargs) takes "
                f"{', '.join(_TORCH_OPCHECK_KEYWORDS)}; got {', '.join(sorted(unknown))}"
            )
        if not isinstance(samples, tuple):
            given = ", ".join(sorted(k for k in options if k in _TORCH_OPCHECK_KEYWORDS))
            raise TypeError(
                "opreg.opcheck: torch's call form opcheck(op, args, kwargs, ...)"
                + (f" (chosen by {given}=)" if given else "")
                + " takes args as one tuple of the op's arguments, got "
                + f"{type(samples).__name__}; opreg's form takes a list of samples and "
                "raise_on_failure= (docs/opcheck.md)"
            )
        for tolerance in ("atol", "rtol"):
            value = options.get(tolerance)
            if value is not None and not (isinstance(value, int | float) and value >= 0):
                raise ValueError(f"opreg.opcheck: {tolerance} must be a number >= 0, got {value!r}")
        return torch.library.opcheck(op, samples, kwargs, **options)
    return _opreg_opcheck(op, samples, **options)
