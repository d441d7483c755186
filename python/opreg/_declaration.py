"""One Python declaration of an op, mirroring the C++ builder (include/opreg/definition.h), and
defining declarations through the core: :class:`OpDeclaration` holds what ``_C.OpBuilder`` takes,
field for field (its flags are the core's OPREG_OP_FLAGS, read by name), plus the pieces that
stay in Python (the fake, the decomposition under compile, the kernel status)."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import re
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

import torch
import torch.utils._pytree as pytree

from opreg import _C, _compile_key, _dtensor, _torch_library
from opreg._public import public
from opreg._registry import (
    check_text,
    forget_compiled_code,
    op_name,
    op_namespace,
    op_overload,
    refresh_handles,
    renew_packets,
    run_between_compiled_calls,
)
from opreg._tracing import without_line_events
from opreg._triton import AotLaunch, decomposition, functional_tensor_mode


@public
class AutogradContext:
    """The ``ctx`` of setup_context and backward, as torch.autograd.Function's: save tensors
    (or None) with ``save_for_backward``, any other value as an attribute; in setup_context,
    ``mark_non_differentiable`` and ``set_materialize_grads``."""

    def __init__(self, cpp: _C.AutogradContext, op: str = "") -> None:
        object.__setattr__(self, "_cpp", cpp)
        object.__setattr__(self, "_op", op)

    def _tensors(self, method: str, values: tuple[Any, ...], none: bool) -> list[Any]:
        for index, value in enumerate(values):
            if not (isinstance(value, torch.Tensor) or (none and value is None)):
                raise TypeError(
                    f"opreg: op '{self._op}': ctx.{method} takes tensors"
                    f"{' or None' if none else ''}, got {type(value).__name__} {value!r} as "
                    f"its argument {index}"
                    + (
                        "; keep other values as attributes of ctx (ctx.name = value)"
                        if none
                        else ""
                    )
                )
        return list(values)

    def save_for_backward(self, *tensors: torch.Tensor | None) -> None:
        self._cpp.save_for_backward(self._tensors("save_for_backward", tensors, none=True))

    def mark_non_differentiable(self, *outputs: torch.Tensor) -> None:
        self._cpp.mark_non_differentiable(
            self._tensors("mark_non_differentiable", outputs, none=False)
        )

    def set_materialize_grads(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(
                f"opreg: op '{self._op}': ctx.set_materialize_grads takes a bool, got "
                f"{type(value).__name__} {value!r}"
            )
        self._cpp.set_materialize_grads(value)

    @property
    def saved_tensors(self) -> tuple[torch.Tensor | None, ...]:
        return tuple(self._cpp.saved_tensors)

    @property
    def needs_input_grad(self) -> tuple[bool, ...]:
        return tuple(self._cpp.needs_input_grad(i) for i in range(self._cpp.num_inputs))


@dataclass
class KernelDeclaration:
    """A kernel: a Python function (``fn``, optionally declining calls with ``accepts``) or an
    AOT-compiled Triton kernel launched from C++ (``aot``), serving ``devices`` (None: the
    accelerated device types)."""

    name: str
    devices: list[str] | None = None
    fn: Callable[..., Any] | None = None
    accepts: Callable[..., bool] | None = None
    aot: AotLaunch | None = None


@dataclass
class OpDeclaration:
    """Everything one op is defined from. The fields up to ``origin`` are the C++ builder's."""

    schema: str  # "ns::name(Tensor x) -> Tensor"
    fallback: Callable[..., Any]
    fallback_label: str = ""  # the trace's name for the fallback (default: "fallback")
    fallback_words: str = ""  # how messages name it (default: "the fallback")
    fake: Callable[..., Any] | None = None  # registered from Python (torch.library.register_fake)
    kernels: list[KernelDeclaration] = field(default_factory=list)
    dtypes: Mapping[str, Sequence[torch.dtype]] = field(default_factory=dict)
    autograd: str = "fallback"  # "fallback", "error" or "none"
    backward: Callable[..., Any] | None = None
    setup_context: Callable[..., Any] | None = None
    vmap: Callable[..., Any] | None = None  # rule(batch_size, randomness, in_dims, args)
    # DTensor: "pointwise", "replicate", "none", a strategy function (torch's register_sharding
    # form), or None for the core's default (include/opreg/definition.h, Sharding).
    sharding: str | Callable[..., Any] | None = None
    # The flags (OPREG_OP_FLAGS in include/opreg/definition.h):
    bitwise: bool = False
    allow_mixed_devices: bool = False
    batch_polymorphic: bool = False
    vmap_per_example_loop: bool = False
    random: bool = False
    cuda_graph_unsafe: bool = False
    replace: bool = False
    # Set: replace only the definition of this serial (_C.definition_serial; 0: none), so that
    # one another thread made meanwhile is refused.
    replace_only: int | None = None
    origin: str = ""
    # Python-side pieces, registered once the core accepted the definition:
    decompose_with: tuple[Callable[..., Any], list[str] | None] | None = None
    kernel_status: str = ""
    jit_kernels: list[Any] = field(default_factory=list)
    # vmap_fn's companion op (`<name>_vmap`): the op whose vmap calls it, defined together with it.
    companion_of: str | None = None

    def compiled_pieces(self) -> list[Any]:
        """What code compiled with the op may have traced of this definition (where it came from
        and what opreg says about it aside)."""
        # replace_only: the serial it replaces, this process's (sweep 48 A-F6: a custom_op's key
        # changed with how many definitions came before it).
        left_out = {"origin", "kernel_status", "jit_kernels", "replace_only"}
        return [(f.name, getattr(self, f.name)) for f in fields(self) if f.name not in left_out]

    @property
    def qualname(self) -> str:
        return self.schema[: self.schema.index("(")]

    def builder(self) -> _C.OpBuilder:
        check_text(f"opreg: op '{self.qualname}'", "schema", self.schema)
        for argument in self.dtypes:
            check_text(f"opreg: op '{self.qualname}'", "dtypes= argument name", argument)
        builder = _C.OpBuilder(self.schema)
        builder.fallback(self.fallback, self.fallback_label, self.fallback_words)
        if self.fake is not None:
            builder.python_fake(__name__, _meta_fake(self))
        for kernel in self.kernels:
            if kernel.aot is not None:
                launch = kernel.aot
                factory = _C.triton_aot(
                    _C.AotLaunch(
                        launch.kernel, list(launch.grid), list(launch.arguments), launch.outputs
                    )
                )
                builder.kernel(factory, kernel.name, kernel.devices)
            else:
                builder.kernel(
                    kernel.fn, kernel.name, kernel.devices, kernel.accepts, self.fallback
                )
        for argument, dtypes in self.dtypes.items():
            builder.dtypes(argument, list(dtypes))
        for flag, _promise in _C.op_flags():
            builder.flag(flag, getattr(self, flag))
        builder.autograd(self.autograd)
        if callable(self.sharding):
            builder.sharding(_C.Sharding.PYTHON)
        elif self.sharding is not None:
            builder.sharding(_C.Sharding.__members__[self.sharding.upper()])
        if self.backward is not None:
            qualname = self.schema.split("(")[0]
            context = lambda cpp: AutogradContext(cpp, qualname)  # noqa: E731
            builder.backward(self.backward, self.setup_context, context, self.schema)
        if self.vmap is not None:
            builder.vmap(self.vmap, self.schema)
        builder.replace(self.replace)
        if self.replace_only is not None:
            builder.replace_only(self.replace_only)
        builder.origin(self.origin)
        if self.companion_of is not None:
            builder.part_of(self.companion_of)
        return builder


def flag_names() -> list[str]:
    return [flag for flag, _promise in _C.op_flags()]


def parse_schema(qualname: str, schema: str) -> torch._C.FunctionSchema:
    """torch's parse of `schema`, with its failures (its parser raises RuntimeError, IndexError
    for an int out of range, internal asserts for list defaults of the wrong type) as one
    ValueError naming the op."""
    check_text(f"opreg: op '{qualname}'", "schema", schema)
    try:
        return torch._C.parse_schema(schema)
    except Exception as error:
        # torch's parser starts some messages with a newline: the first line that says something,
        # and the schema with its position marker under it when there is one.
        lines = [line for line in str(error).splitlines() if line.strip()]
        why = "\n".join(lines) if any("<--- HERE" in line for line in lines) else lines[0]
        if isinstance(error, IndexError | OverflowError):
            why = (
                "a number in it is out of range (an int default must fit in 64 bits; a float "
                "default must be 0 or of a double's size, 2.2e-308 to 1.8e308)"
            )
        elif "INTERNAL ASSERT" in why and "expected " in str(error):
            expected = str(error).rsplit("expected ", 1)[1].split()[0]
            why = f"a list default holds a value that is not a {expected}"
        elif "INTERNAL ASSERT" in why and "please report a bug to PyTorch. " in why:
            why = why.split("please report a bug to PyTorch. ", 1)[1]  # what the assert says
        raise ValueError(f"opreg: op '{qualname}': cannot parse schema '{schema}': {why}") from None


def _signature(qualname: str, keyword: str, fn: Any) -> inspect.Signature | None:
    """``fn``'s signature; None where there is none to read (builtins and C functions)."""
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    except Exception as error:  # its __signature__ or __getattr__ raised (sweep 46 A-F6)
        raise TypeError(
            f"opreg: op '{qualname}': {keyword} cannot be inspected: reading its signature "
            f"raised {type(error).__name__}: {error}; give a function, or a callable whose "
            "signature can be read"
        ) from error


def check_signature(qualname: str, keyword: str, fn: Any, schema: str) -> None:
    """A Python piece that cannot take the schema's arguments fails at definition, naming it."""
    signature = _signature(qualname, keyword, fn)
    if signature is None:
        return
    try:
        arguments = parse_schema(qualname, schema).arguments
    except ValueError:  # the core refuses the schema, saying why
        return
    if len({a.name for a in arguments}) != len(arguments):
        return
    positional = [a.name for a in arguments if not a.kwarg_only]
    keywords = {a.name: None for a in arguments if a.kwarg_only}
    try:
        signature.bind(*positional, **keywords)
    except TypeError as error:
        names = ", ".join(a.name for a in arguments)
        raise TypeError(
            f"opreg: op '{qualname}': {keyword} cannot be called with the schema's arguments "
            f"({names}): {error}; its signature is {signature}"
        ) from None


def check_positional(
    qualname: str, keyword: str, fn: Any, arguments: Sequence[str], keywords: Sequence[str] = ()
) -> None:
    """A piece that opreg calls with fixed arguments (backward, setup_context, a vmap rule) fails
    at definition if it cannot take them, not at its first call."""
    signature = _signature(qualname, keyword, fn)
    if signature is None:
        return
    try:
        signature.bind(*arguments, **dict.fromkeys(keywords))
    except TypeError as error:
        call = ", ".join([*arguments, *(f"{name}={name}" for name in keywords)])
        raise TypeError(
            f"opreg: op '{qualname}': {keyword} is called as {keyword}({call}), "
            f"but its signature is {signature}: {error}"
        ) from None


# ---- defining ----------------------------------------------------------------------------------


@dataclass
class _Registration:
    """What the Python side holds for one op: its torch.library objects and kernel status."""

    qualname: str
    libraries: list[torch.library.Library]
    kernel_status: str
    jit_kernels: list[Any]
    # The one record of vmap_fn companions: a companion's registration names the op it was
    # defined with (companion_of), and that op's current one names the companion its vmap calls
    # (companion). Both change only once the core accepted a definition.
    companion_of: str | None = None
    companion: str | None = None
    serial: int = 0  # the C++ definition these pieces belong to (_C.definition_serial)


_registrations: dict[str, _Registration] = {}


def still_current(qualname: str, serial: int) -> bool:
    """Whether the op's definition is still the one whose Python pieces (its fake, its
    decomposition) hold ``serial``: a definition made from C++ outside a library load, and
    opreg::undefine, do not pass through Python. A piece that is no longer current drops the
    op's Python pieces (the caller then serves the call through the op as it is now); for an
    undefined op, the call raises what the op's own call raises."""
    now = _C.definition_serial(qualname)
    if now == serial:
        return True
    if now == 0:
        raise RuntimeError(
            f"{qualname}: the op is not defined now (it was undefined, or its definition was "
            "rolled back when its library failed to load); define it again to call it"
        )
    registration = _registrations.get(qualname)
    if registration is not None and registration.serial == serial:
        _forget(qualname)
        _compile_key.forget(qualname)
    follow_cpp_definitions([qualname])
    return False


def companion_owner(name: str) -> str | None:
    """The op whose current definition's vmap calls ``name`` as its vmap_fn companion, or None."""
    owner = _links(name)[0]
    if owner is None:
        return None
    if _links(owner)[1] != name:
        return None  # the owner was defined again without vmap_fn: the companion serves nothing
    if not _C.is_defined(owner):
        return None  # undefined (opreg::undefine took the companion along): nothing calls it
    return owner


def refuse_companion(name: str, where: str) -> None:
    """Defining ``name`` on its own while it is an op's vmap_fn companion would change that op's
    vmap and not the op: refused, naming both."""
    owner = companion_owner(name)
    if owner is not None:
        raise ValueError(
            f"{where}: op '{name}' is the vmap_fn companion of '{owner}' (defined with it; "
            f"torch.vmap of '{owner}' calls it), so defining '{name}' on its own would change "
            f"what '{owner}' computes under torch.vmap and not '{owner}' itself; replace "
            f"'{owner}' instead (register_triton_op(..., vmap_fn=..., name='{owner}', "
            "replace=True)), or choose another name"
        )


def _check_companions(declarations: Sequence[OpDeclaration]) -> list[OpDeclaration]:
    """No definition takes over a companion from its op, and no companion overwrites an op of
    its own. Returns the declarations, with a companion that its op made earlier set to be
    replaced: it belongs to the op, which may have been undefined without it (opreg::undefine
    knows nothing of companions), and is defined again with it."""
    defining = {d.qualname for d in declarations}
    checked = []
    for declaration in declarations:
        name, owner = declaration.qualname, declaration.companion_of
        if owner is None:
            if companion_owner(name) not in (None, *defining):
                refuse_companion(name, "opreg")
            checked.append(declaration)
            continue
        made_by_owner = _links(name)[0] == owner
        if not made_by_owner and _registered_form(name) is not None:
            raise ValueError(
                f"opreg: op '{owner}': its vmap_fn is served by a companion op named '{name}', "
                f"but '{name}' is an op of its own, not the companion of '{owner}', and "
                f"defining '{owner}' with vmap_fn would replace it; rename one of the two, or "
                f"give '{owner}' a vmap rule (vmap=) instead of vmap_fn"
            )
        checked.append(
            dataclasses.replace(declaration, replace=True) if made_by_owner else declaration
        )
    return checked


def python_kernel_status(name: str) -> str | None:
    """Why a Python-defined op's Triton kernel is on or off and how its JIT launches went; None
    for ops defined in C++."""
    registration = _registrations.get(name)
    # An undefine or a definition from C++ does not pass through Python: the serial tells.
    if registration is None or registration.serial != _C.definition_serial(name):
        return None
    launches = [kernel.describe() for kernel in registration.jit_kernels]
    return "; ".join([registration.kernel_status, *launches])


def registration_of(name: str) -> object:
    """The Python side of the op's current definition (None for ops defined elsewhere): a new
    object each time the op is defined, so holders of an older one can tell."""
    return _registrations.get(name)


@public
def kernel_status(name: str) -> str:
    """What serves an op's calls: for Python-defined ops, why its Triton kernel is on or off and
    how its JIT launches went; for C++-defined ops, the kernel of each device type. A ValueError
    names an op that opreg did not define."""
    status = python_kernel_status(op_name(name, "kernel_status"))
    if status is not None:
        return status
    report = _C.describe_op(name)  # a ValueError naming the op when there is none
    served = [f"{k.device_type}: {k.describe()}" for k in report.kernels]
    return "; ".join(served or ["no kernels: the fallback serves every device"])


def _add_note(error: BaseException, note: str) -> None:
    """Adds opreg's note naming the op and the piece to a Python piece's exception, which stays
    itself: an exception whose notes cannot be read or added to (a frozen or user-made one) is
    raised without the note (sweep 52 A-F3: its add_note's AttributeError took its place)."""
    try:
        notes = getattr(error, "__notes__", [])
        if isinstance(notes, list) and note not in notes:
            error.add_note(note)
    except BaseException:  # sweep 53 A-F4: even a KeyboardInterrupt its __notes__ raises
        pass


def _registered_form(qualname: str) -> tuple[str, bool] | None:
    """What torch.ops' handle of an op caches: its schema and its tags (from the flags)."""
    try:
        report = _C.describe_op(qualname)
    except ValueError:
        return None
    return report.schema, report.flags.as_dict()["cuda_graph_unsafe"]


def _forget(qualname: str) -> None:
    """Drop opreg's Python-side registrations of an op, and bring torch.ops' handles of it up to
    its schema now."""
    registration = _registrations.pop(qualname, None)
    _torch_library.forget(qualname)
    if registration is not None:
        for library in registration.libraries:
            library._destroy()
    if (rule := _cpp_rules.pop(qualname, None)) is not None:
        rule[1]._destroy()
    refresh_handles(qualname)


def python_defined_forms() -> dict[str, tuple[str, bool] | None]:
    """The ops defined from Python, each with what torch.ops' handle of it caches."""
    return {qualname: _registered_form(qualname) for qualname in _registrations}


def forget_replaced_by(library: str, before: Mapping[str, tuple[str, bool] | None]) -> None:
    """After a library load: the ops it replaced lose their Python definition's pieces that stay
    in Python (seen: its fake and its decomposition under compile went on serving
    torch.compile, which then ran the old Triton kernels or failed on the old fake's shape).
    So do the ops it undefined."""
    for qualname, form in before.items():
        now = _registered_form(qualname)
        undefined_by_it = now is None and form is not None
        if undefined_by_it or (now is not None and _C.describe_op(qualname).origin == library):
            _forget(qualname)
            _compile_key.forget(qualname)


def _single_device(values: Sequence[Any]) -> torch.device | None:
    """The one device of the tensor arguments (0-dim CPU tensors aside), None without any or
    when they are on several devices (the fallback serves such calls: its outputs' devices are
    its own business)."""
    devices = {
        t.device
        for t in values
        if isinstance(t, torch.Tensor) and not (t.dim() == 0 and t.device.type == "cpu")
    }
    return devices.pop() if len(devices) == 1 else None


def _check_no_alias(qualname: str, index: int, output: Any, inputs: list[torch.Tensor]) -> None:
    outputs = output if isinstance(output, (list, tuple)) else [output]
    for tensor in outputs:
        if isinstance(tensor, torch.Tensor) and any(
            torch._C._is_alias_of(tensor, given) for given in inputs
        ):
            raise RuntimeError(
                f"opreg: op '{qualname}': its fake returned output {index} sharing memory with "
                "an input, but the schema declares no alias; return a new tensor "
                "(e.g. torch.empty_like(x))"
            )


def _check_outputs_apart(qualname: str, values: list[Any], declared_alias: list[bool]) -> None:
    """Two outputs on one memory, where the schema declares no alias (the C++ core's check of
    the other pieces, src/core/registry.cpp)."""
    seen: list[tuple[torch.Tensor, int]] = []
    for index, value in enumerate(values):
        if declared_alias[index]:
            continue
        for tensor in value if isinstance(value, (list, tuple)) else [value]:
            if not isinstance(tensor, torch.Tensor):
                continue
            for other, other_index in seen:
                if torch._C._is_alias_of(tensor, other):
                    where = (
                        f"two tensors in output {index}"
                        if other_index == index
                        else f"outputs {other_index} and {index}"
                    )
                    raise RuntimeError(
                        f"opreg: op '{qualname}': its fake returned {where} sharing memory, but "
                        "the schema declares no alias; return separate tensors "
                        "(e.g. torch.empty_like(x) for each)"
                    )
            seen.append((tensor, index))


_ENUM_CLASSES = {
    "ScalarType": "torch.dtype",
    "Layout": "torch.layout",
    "MemoryFormat": "torch.memory_format",
}


# Note [An op's rule for FakeTensorMode]
# Two things FakeTensorMode does not do right for an op whose fake is its fallback run on meta
# tensors (or that may be called without a tensor), which a rule of the op for the mode does:
# - A call without a tensor: FakeTensorMode takes the op for a factory (torch.empty) and calls it
#   with device='meta', which its schema lacks, or (for a Tensor? given None, an empty Tensor[])
#   finds no device for its outputs. The fallback makes such a call's outputs itself, on the
#   device the op puts them on, and run under the mode it makes fake tensors: so the rule runs it.
# - A fallback that fails on meta tensors: FakeTensorMode replaces opreg's NotImplementedError,
#   which says why, with an UnsupportedOperatorException naming only the op (torch.compile then
#   runs the op outside the graph, which must stay so); the rule gives that exception the reason.
#   (Such a fallback includes one with a Device output: on meta tensors it would give 'meta',
#   where a real call gives another device, so the core refuses it there.)
# Calls with tensors otherwise take the mode's usual path. Ops with a fake given from Python keep
# it; the rule is given from define() for ops defined from Python, and from
# follow_cpp_definitions() for ops defined in C++ (libraries loaded by opreg.load_library, and a
# definition a rule finds made from C++ behind Python's back).


def _may_run_without_tensors(schema: str) -> bool:
    """No argument is a plain Tensor: a call may pass none."""
    try:
        arguments = torch._C.parse_schema(schema).arguments
    except Exception:  # the core refuses the schema, saying why
        return False
    return not any(isinstance(argument.type, torch.TensorType) for argument in arguments)


def _fake_mode_rule_of(qualname: str, serial: int) -> Callable[..., Any]:
    """FakeTensorMode's rule of an op (Note [An op's rule for FakeTensorMode])."""
    from torch._subclasses.fake_tensor import UnsupportedOperatorException

    returns = op_overload(qualname)._schema.returns

    def with_tensors(mode: Any, op: Any, types: Any, args: Any, kwargs: Any) -> Any:
        try:
            return mode.__torch_dispatch__(op, types, args, kwargs)
        except UnsupportedOperatorException as error:
            reason = error.__cause__ or error.__context__
            if not isinstance(reason, NotImplementedError) or qualname not in str(reason):
                raise
            clearer = UnsupportedOperatorException(error.func)
            said = str(reason).split("\n\nAt:\n")[0]  # not the Python stack of the fallback's error
            clearer.args = (f"{error.func}: {said}",)
            raise clearer from reason

    def rule(mode: Any, op: Any, types: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not still_current(qualname, serial):  # defined again from C++: its rule now, if any
            with mode:
                return op(*args, **kwargs)
        if any(isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves((args, kwargs))):
            return with_tensors(mode, op, types, args, kwargs)
        try:
            with mode:
                outputs = _C.call_fallback(qualname, list(args), dict(kwargs))
        except Exception as error:  # it stays itself; a note names the op, as for the fake
            _add_note(error, f"opreg: raised in the fallback of {qualname} (run by FakeTensorMode)")
            raise
        count = len(returns)
        return None if count == 0 else outputs[0] if count == 1 else tuple(outputs)

    return rule


def _fake_mode_rule(qualname: str, serial: int, library: torch.library.Library) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    _torch_library.register_torch_dispatch(
        library, qualname, FakeTensorMode, _fake_mode_rule_of(qualname, serial)
    )


_cpp_rules: dict[str, tuple[int, torch.library.Library]] = {}  # FakeTensorMode rules of C++ ops


def cpp_rules() -> list[str]:
    """The ops defined in C++ that hold a FakeTensorMode rule."""
    return list(_cpp_rules)


def _reachable(qualname: str) -> bool:
    """Whether torch.ops gives the op's packet: for a name its Python objects hold themselves
    (an op `__init__` or `name`, a namespace `_dir`) it gives that attribute, and no PyTorch tool
    reaches the op. A C++ library may define such ops: every later load_library raised reading
    them (sweep 54 B-N53)."""
    namespace, name = qualname.split("::")
    packet = getattr(op_namespace(namespace), name.split(".")[0], None)
    return isinstance(packet, torch._ops.OpOverloadPacket)


def follow_cpp_definitions(names: Sequence[str]) -> None:
    """Gives ops defined in C++ (not from Python) their FakeTensorMode rule where they need one,
    and drops the rules of definitions that are gone."""
    for qualname in names:
        if qualname in _registrations:
            continue
        serial = _C.definition_serial(qualname)
        held = _cpp_rules.pop(qualname, None)
        if held is not None and held[0] == serial:
            _cpp_rules[qualname] = held
            continue
        if held is not None:
            _torch_library.forget(qualname)
            held[1]._destroy()
        if serial == 0 or not _reachable(qualname):
            continue
        _torch_library.claim(qualname)
        report = _C.describe_op(qualname)
        if report.fake == _C.FakeSource.PYTHON or (
            report.fake == _C.FakeSource.EXPLICIT and not _may_run_without_tensors(report.schema)
        ):
            continue
        library = torch.library.Library(qualname.split("::")[0], "FRAGMENT")
        _fake_mode_rule(qualname, serial, library)
        _cpp_rules[qualname] = (serial, library)


# A fake's symbolic numbers stand for what only a real run knows: converting one to a schema's
# type would specialize it.
_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)
_NUMBER_TYPES = r"\b(int|SymInt|float|SymFloat|bool|SymBool|Scalar|complex)\b"  # may be symbolic


def _checked_fake(declaration: OpDeclaration, serial: int | None) -> Callable[..., Any]:
    """The fake, with its outputs checked against the schema and the inputs' device (the C++
    core checks C++ fakes). The one FakeTensorMode calls (`serial`: its definition's) sends a call
    made after the op was defined again from C++ to its definition now, and records its trace;
    the one the core holds (`serial` None) is its definition's, and the core records it."""
    qualname, fake_fn = declaration.qualname, declaration.fake
    parsed = torch._C.parse_schema(declaration.schema)
    returns = [r.type for r in parsed.returns]
    lengths = {index: r.N for index, r in enumerate(parsed.returns) if r.N is not None}  # int[2]
    numeric = [re.search(_NUMBER_TYPES, str(r.real_type)) is not None for r in parsed.returns]
    declared_alias = [r.alias_info is not None for r in parsed.returns]
    enums = {  # output index -> (enumeration, how many values it has)
        index: (name, _C.enum_value_count(name))
        for index, r in enumerate(parsed.returns)
        if (name := str(r.real_type).removeprefix("Optional[").removesuffix("]")) in _ENUM_CLASSES
    }

    names = [argument.name for argument in parsed.arguments]
    dtype_rules = {
        names.index(name): (name, list(allowed)) for name, allowed in declaration.dtypes.items()
    }

    def check_dtypes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """dtypes= as the C++ core checks it on real tensors: under FakeTensorMode and on meta
        tensors too, so tracing refuses what the compiled code would."""
        for index, (name, allowed) in dtype_rules.items():
            value = args[index] if index < len(args) else kwargs.get(name)
            elements = value if isinstance(value, (list, tuple)) else [value]
            for position, tensor in enumerate(elements):
                if isinstance(tensor, torch.Tensor) and tensor.dtype not in allowed:
                    where = f" element {position}" if isinstance(value, (list, tuple)) else ""
                    raise TypeError(
                        f"{qualname}: argument '{name}'{where} has dtype {tensor.dtype}, "
                        f"expected one of: {', '.join(str(dtype) for dtype in allowed)}"
                    )

    def fake(*args: Any, **kwargs: Any) -> Any:
        if serial is not None and not still_current(qualname, serial):
            return op_overload(qualname)(*args, **kwargs)
        check_dtypes(args, kwargs)
        if serial is not None and _C.trace_enabled():  # as the core records a C++ fake
            first = next((t for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor)), None)
            _C.record_trace(qualname, "fake", "-" if first is None else str(first.device))
        try:
            result = fake_fn(*args, **kwargs)
        except Exception as error:  # it stays itself; a note names the op, as for the fallback
            _add_note(error, f"opreg: raised in the fake of {qualname}")
            raise
        inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if not returns:
            values = [] if result is None or (isinstance(result, tuple) and not result) else None
        elif len(returns) == 1:
            values = [result]
        else:
            values = list(result) if isinstance(result, (tuple, list)) else None
        if values is None or len(values) != len(returns):
            raise TypeError(
                f"opreg: op '{qualname}': its fake returned {type(result).__name__}, expected "
                f"{len(returns)} outputs"
            )
        device = _single_device([*args, *kwargs.values()])
        meta_call = device is None and any(t.is_meta for t in inputs)
        for index, (value, kind) in enumerate(zip(values, returns, strict=True)):
            if isinstance(kind, torch.TensorType) and not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"opreg: op '{qualname}': its fake returned {type(value).__name__} for "
                    f"output {index}, expected a Tensor"
                )
            if device is not None and isinstance(value, torch.Tensor) and value.device != device:
                raise RuntimeError(
                    f"opreg: op '{qualname}': its fake returned output {index} on "
                    f"{value.device}, expected {device} (the device of its inputs)"
                )
            if meta_call and isinstance(value, torch.Tensor) and not value.is_meta:
                raise RuntimeError(
                    f"opreg: op '{qualname}': its fake returned output {index} on "
                    f"{value.device} for a call with a meta tensor among its arguments; such a "
                    "call computes shapes, not values, so its outputs must be meta tensors (its "
                    "values would be uninitialised memory). Put every tensor argument on one "
                    "device"
                )
            if (
                index in lengths
                and isinstance(value, (list, tuple))
                and len(value) != lengths[index]
            ):
                raise ValueError(
                    f"opreg: op '{qualname}': its fake returned {len(value)} elements for output "
                    f"{index}, expected {lengths[index]}"
                )
            symbolic = [v for v in pytree.tree_leaves(value) if isinstance(v, _SYMBOLIC)]
            if not symbolic:
                _C.check_fake_output(qualname, value, declaration.schema, index)
            elif not numeric[index]:
                raise TypeError(
                    f"{qualname}: its fake returned a {type(symbolic[0]).__name__} for output "
                    f"{index}, expected {returns[index]} (the schema's return type)"
                )
            if not declared_alias[index]:
                _check_no_alias(qualname, index, value, inputs)
            if index in enums and type(value) is int and not 0 <= value < enums[index][1]:
                name, count = enums[index]
                raise ValueError(
                    f"opreg: op '{qualname}': its fake returned {value} for output {index}, "
                    f"which is no {name} (expected 0 to {count - 1}, or a {_ENUM_CLASSES[name]})"
                )
        _check_outputs_apart(qualname, values, declared_alias)
        return result

    return fake


def _meta_fake(declaration: OpDeclaration) -> Callable[..., Any]:
    """The fake for calls on meta tensors, held by the op's definition in the core (torch's Meta
    kernel for a Python fake, registered per definition, was freed by a replace while a call ran
    it). As torch's, it refuses torch.library.get_ctx(): meta tensors have no symbolic sizes."""
    qualname = declaration.qualname
    checked: list[Callable[..., Any]] = []  # made at the first call: the schema is valid then

    def no_context() -> Any:
        raise RuntimeError(
            f"opreg: op '{qualname}': its fake asks torch.library.get_ctx() for a size that "
            "depends on the data, which a call on meta tensors cannot give; call the op under "
            "FakeTensorMode (as torch.compile does) instead"
        )

    def meta(*args: Any, **kwargs: Any) -> Any:
        if not checked:
            checked.append(_checked_fake(declaration, None))
        # Left without the fake's exception: contextlib gives it to the generator, setting its
        # __traceback__, which an exception refusing attributes turned into an AttributeError in
        # its place (sweep 52 A-F3).
        context = torch._library.fake_impl.set_ctx_getter(no_context)
        context.__enter__()
        try:
            return checked[0](*args, **kwargs)
        finally:
            context.__exit__(None, None, None)

    return meta


# Held by each definition from Python, from the checks that read the Python-side records to
# their update: two threads defining one name (or an op and its companion) check and define in
# turn, so neither's checks read records the other is changing (reentrant: a fallback may define).
definition_lock = threading.RLock()
_defining_here = threading.local()  # .forget(_waits): a replace was made; .recording: see _define
# A fork copies the lock held by the thread defining at that moment, a thread the child does not
# have: every definition in the child (a DataLoader worker, say) waited forever. A fork waits for
# the definition to end instead, and holds the lock across, so the child copies no half-made one.
os.register_at_fork(
    before=definition_lock.acquire,
    after_in_parent=definition_lock.release,
    after_in_child=definition_lock.release,
)


@contextlib.contextmanager
def defining() -> Iterator[None]:
    """Holds the definition lock. torch.compile's code compiled before a replace is dropped once
    the outermost block releases it: dropping waits for Dynamo's compile lock, which a compile on
    another thread holds while its fake (say) waits for this lock to define an op."""
    without_line_events()  # Note [Locks and trace hooks]
    outermost = not definition_lock._is_owned()  # not a flag an interruption could leave set
    try:
        with definition_lock:
            if outermost:  # what an interrupted definition left is not taken for one in flight
                _defining_here.recording = []
            yield
    finally:
        if outermost and _defining_here.__dict__.get("forget", False):
            # Waits only where a replace could not invalidate the compiled code before publishing
            # (Note [Replacing under compiled calls]); else it is only freed, by its own thread if
            # not at once. Interrupted before the next line: the next definition does it.
            forget_compiled_code(wait=_defining_here.__dict__.get("forget_waits", True))
            _defining_here.forget = False
            _defining_here.forget_waits = False


def define(*declarations: OpDeclaration) -> list[torch._ops.OpOverload]:
    """Defines the ops together through the C++ core, which validates everything before it
    changes anything: all are defined, or none and the earlier definitions stay. Then the
    Python-side pieces (fakes, the decomposition under compile) replace the earlier ones."""
    without_line_events()  # Note [Locks and trace hooks]
    with defining():
        return _define(declarations)


def _define(declarations: Sequence[OpDeclaration]) -> list[torch._ops.OpOverload]:
    declarations = tuple(_check_companions(declarations))
    builders = [declaration.builder() for declaration in declarations]
    registered_before = {d.qualname: _registered_form(d.qualname) for d in declarations}
    defined_companions = {d.qualname for d in declarations if d.companion_of is not None}
    dropped_companions = [  # of ops defined again without vmap_fn (or with another companion)
        (companion, _C.definition_serial(companion))
        for d in declarations
        if (companion := _links(d.qualname)[1]) is not None and companion not in defined_companions
    ]
    # Note [A definition made while another records its pieces]
    # Recording runs Python code, where a profiler or trace hook, or a finalizer, may define ops
    # on this thread (the definition lock is reentrant). Such a definition records its pieces at
    # once (inside the hook, which may guard itself against running again), and each records only
    # ops that its own definition still holds. One whose pieces the interrupted record then wrote
    # over is recorded again, once, when the outermost definition ends: a hook that defines
    # whenever Python code runs would otherwise never let it end.
    # A definition a hook makes on this thread may come at any line, this function's too: the
    # tables of groups are made when first used and dropped by the definition that leaves none in
    # flight (sweep 41: a hook defining every 50th line found them dropped by another).
    recording = _defining_here.recording  # reset by the outermost defining()
    made = _Made(declarations, {}, dropped_companions)
    # An op defined again after an undefine is replaced too, for torch.compile's code compiled
    # for the earlier definition (sweep 51 A-F1: it ran on, with wrong values or a double free).
    replacing = any(
        registered_before[d.qualname] is not None or _C.defined_before(d.qualname)
        for d in declarations
    )
    recording.append(made)
    try:
        _publish_and_record(made, builders, recording[0] is made, replacing)
    finally:
        del recording[next((i for i, group in enumerate(recording) if group is made), None) :]
        if not recording:  # the groups hold Python pieces: none outlives its definition here
            _defining_here.__dict__.pop("overwritten", None)
            _defining_here.__dict__.pop("latest", None)
    return [op_overload(declaration.qualname) for declaration in declarations]


def _links(name: str) -> tuple[str | None, str | None]:
    """(the op whose vmap_fn companion ``name`` is, ``name``'s companion) by its current
    definition, one this thread published and has yet to record included."""
    now = _C.definition_serial(name)
    for made in reversed(getattr(_defining_here, "recording", None) or []):
        if made.published.get(name) == now:
            owner = next(d.companion_of for d in made.declarations if d.qualname == name)
            companion = next(
                (d.qualname for d in made.declarations if d.companion_of == name), None
            )
            return owner, companion
    registration = _registrations.get(name)
    if registration is None:
        return None, None
    return registration.companion_of, registration.companion


class _Made(NamedTuple):
    """One definition from Python, as the core published it, until its pieces are recorded."""

    declarations: Sequence[OpDeclaration]
    published: Mapping[str, int]  # op -> the serial the core published it with
    dropped_companions: Sequence[tuple[str, int]]


# How long a replace waits for a compile on another thread before it renews torch.ops' packets
# (renew_packets), where it could not publish between compiled calls; past it,
# forget_compiled_code renews them once opreg's lock is released.
_RENEW_WAIT_S = 0.1

# How often recording a published definition is begun again after an exception interrupted it.
_RECORD_ATTEMPTS = 8


def _publish_and_record(made: _Made, builders: list[Any], outermost: bool, replacing: bool) -> None:
    """Has the core publish the definitions (all or none), then records their Python pieces. A
    replace does both between compiled calls (Note [Replacing under compiled calls]); where it
    could not, compiled code calling these ops through torch.ops' packets compiles again."""
    if not replacing:
        _publish_and_record_now(made, builders, outermost)
        return
    quiet = False
    try:
        quiet = run_between_compiled_calls(
            lambda: _publish_and_record_now(made, builders, outermost)
        )
    finally:
        if made.published:  # done by defining() once the lock is released
            _defining_here.forget = True
            _defining_here.forget_waits = (
                _defining_here.__dict__.get("forget_waits", False) or not quiet
            )
    if not quiet:
        # A compile holding Dynamo's lock is waited for briefly: it may wait for this thread.
        renew_packets(made.published, wait_s=_RENEW_WAIT_S)


def _publish_and_record_now(made: _Made, builders: list[Any], outermost: bool) -> None:
    """Once the core has published, an exception arriving (Ctrl-C, a signal handler's, a trace
    hook's) must not leave the definition half recorded (seen: its companion taken for an op of
    its own, and every later definition of the name refused): recording is begun again, and the
    first such exception raised once it is done. Begun again, it is whole: each op's pieces are
    forgotten before they are made. Outermost, it also records the ones written over meanwhile
    (once: later ones stay so, Guarantees: not covered). Every line the uninterrupted path runs
    after the core published is inside the first try."""
    try:
        _C.define_all(builders, made.published)  # filled before it returns
        _record_with_overwritten(made, outermost)
        return
    except BaseException as error:
        if not made.published:
            raise  # refused, or interrupted before it published: nothing changed
        interruption = error
    for _ in range(_RECORD_ATTEMPTS):
        try:
            _record_with_overwritten(made, outermost)
            break
        except BaseException as error:
            interruption = interruption or error
    raise interruption


def _record_with_overwritten(made: _Made, outermost: bool) -> None:
    _record(made)
    if outermost:
        for again in list(_defining_here.__dict__.get("overwritten", {}).values()):
            _record(again)


def _record(made: _Made) -> None:
    """The Python-side pieces of the definitions the core published under ``made.published``."""
    latest = _defining_here.__dict__.setdefault("latest", {})  # op -> the group holding its pieces
    for declaration in made.declarations:
        qualname = declaration.qualname
        serial = made.published[qualname]
        if _C.definition_serial(qualname) != serial:
            continue  # defined again since (from C++, or nested): the later one's pieces stand
        latest[qualname] = made
        _record_one(declaration, made.declarations, serial)
        # One made meanwhile on this thread (its pieces were written over): recorded again.
        later = latest[qualname]
        if later is not made and later.published[qualname] == _C.definition_serial(qualname):
            _defining_here.__dict__.setdefault("overwritten", {})[id(later)] = later
    for companion, serial in made.dropped_companions:  # it would hold its name and serve nothing
        if _C.definition_serial(companion) != serial:
            continue  # defined again since: no longer the dropped one
        _forget(companion)
        try:
            _C.undefine(companion)
        except ValueError:  # undefined already: opreg::undefine of its op took it along
            if _C.is_defined(companion):
                raise


def _record_one(
    declaration: OpDeclaration, declarations: Sequence[OpDeclaration], serial: int
) -> None:
    """One op's Python-side pieces, for its definition of ``serial``."""
    qualname = declaration.qualname
    _forget(qualname)
    companion = next((d.qualname for d in declarations if d.companion_of == qualname), None)
    library = torch.library.Library(qualname.split("::")[0], "FRAGMENT")
    # Held at once: a record begun again after an interruption finds the library to destroy.
    _registrations[qualname] = _Registration(
        qualname,
        [library],
        declaration.kernel_status,
        declaration.jit_kernels,
        companion_of=declaration.companion_of,
        companion=companion,
        serial=serial,
    )
    if declaration.fake is not None:
        _torch_library.register_fake(library, qualname, _checked_fake(declaration, serial))
    else:  # Note [An op's rule for FakeTensorMode]
        _fake_mode_rule(qualname, serial, library)

    if declaration.decompose_with is not None:
        triton_fn, device_types = declaration.decompose_with
        _torch_library.register_torch_dispatch(
            library,
            qualname,
            functional_tensor_mode(),
            decomposition(
                triton_fn,
                declaration.fallback,
                device_types,
                current=lambda qualname=qualname, serial=serial: still_current(qualname, serial),
            ),
        )
    _torch_library.claim(qualname)
    strategy = declaration.sharding if callable(declaration.sharding) else None
    _dtensor.declare(qualname, strategy)
    try:
        _compile_key.declare(qualname, [declaration.compiled_pieces()])
    except Exception as error:  # the op is defined: a cache key's gap must not undo that
        warnings.warn(
            f"opreg: op '{qualname}': torch.compile's caches do not see this definition: {error}",
            stacklevel=2,
        )
