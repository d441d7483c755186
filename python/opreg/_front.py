"""The Python front: define ops from Python through opreg's C++ core.

``register_triton_op`` and ``register_vmap_op`` accept EvoX's calls keyword for keyword (switch
the import and keep the code); the decorated function is the fallback. Everything else an opreg
op has (argument checks, autograd policies and explicit backwards, vmap without a per-example
loop, kernels that decline, ``info``) comes from the same core that C++ ops use.
"""

from __future__ import annotations

import contextvars
import inspect
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch
import torch.utils._pytree as pytree

from opreg import _C, _jit_cache
from opreg._public import public
from opreg._registry import accelerated_device_types, register_accelerated_device_type

DEFAULT_NAMESPACE = "opreg_py"

# ---- Triton: present, and working? ------------------------------------------------------------

_triton_status: tuple[bool, str] | None = None


@public
def has_triton() -> bool:
    """Whether Triton imports and works (EvoX only checked that the package can be found)."""
    return triton_status()[0]


def triton_status() -> tuple[bool, str]:
    """(usable, why not)."""
    global _triton_status
    if _triton_status is None:
        try:
            import triton.language as tl

            import triton

            if not callable(getattr(triton, "jit", None)) or not hasattr(tl, "program_id"):
                raise ImportError("triton lacks triton.jit or triton.language.program_id")
            _triton_status = (True, "")
        except Exception as error:
            _triton_status = (False, f"Triton is not usable: {type(error).__name__}: {error}")
    return _triton_status


@public
def triton_device_types() -> list[str]:
    """Device types that Triton kernels serve by default (initially ``["cuda"]``)."""
    return accelerated_device_types()


@public
def register_triton_device_type(name: str) -> str:
    """Add a device type for Triton kernels (stripped, lower-cased); reaches ops defined earlier."""
    return register_accelerated_device_type(name)


# ---- traceable Triton launches ------------------------------------------------------------------

_decomposing: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "opreg_decomposing", default=False
)


@public
@runtime_checkable
class TritonKernelLike(Protocol):
    """What ``opreg.wrap_triton`` returns: index by the grid, then call with the arguments."""

    def __getitem__(self, grid: Any) -> Callable[..., Any]: ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


class _WrappedTriton:
    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        if _decomposing.get():
            return torch.library.wrap_triton(self.kernel)[grid]
        return self.kernel[grid]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _decomposing.get():
            return torch.library.wrap_triton(self.kernel)(*args, **kwargs)
        return self.kernel(*args, **kwargs)


@public
def wrap_triton(kernel: Any) -> TritonKernelLike:
    """Launch ``kernel`` so that torch.compile and torch.export see it when they trace an opreg
    op (as ``torch.library.wrap_triton`` inside ``triton_op``); in eager, launch it directly."""
    return _WrappedTriton(kernel)


@public
@dataclass(frozen=True)
class AotLaunch:
    """An AOT-compiled Triton kernel attached to an op by declaration, evaluated in C++ on every
    call (no Python): expressions over the op's arguments (names, ``out<i>``, ``numel(a)``,
    ``size(a, d)``, ``stride(a, d)``, ``cdiv(e, n)``, literals); outputs ``"fake"`` or
    ``"like:<argument>"``. See include/opreg/aot_launch.h."""

    kernel: str
    grid: tuple[str, ...]
    arguments: tuple[str, ...]
    outputs: str = "fake"


# ---- autograd and vmap helpers ------------------------------------------------------------------


@public
class AutogradContext:
    """The ``ctx`` of setup_context and backward: save tensors with ``save_for_backward``, any
    other value as an attribute."""

    def __init__(self, cpp: _C.AutogradContext) -> None:
        object.__setattr__(self, "_cpp", cpp)

    def save_for_backward(self, *tensors: torch.Tensor) -> None:
        self._cpp.save_for_backward(list(tensors))

    @property
    def saved_tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(self._cpp.saved_tensors)

    @property
    def needs_input_grad(self) -> tuple[bool, ...]:
        return tuple(self._cpp.needs_input_grad(i) for i in range(self._cpp.num_inputs))


@public
class VmapInfo(NamedTuple):
    batch_size: int
    randomness: str


@public
def default_vmap_wrap_inputs(info: VmapInfo, in_dims: Sequence[int | None], *args: Any):
    """EvoX's wrapping: each argument's batch dim to the front; unbatched tensors get a leading
    dim of size 1 (which broadcasts), as EvoX does."""

    def wrap(arg: Any, dim: int | None) -> Any:
        if dim is None:
            return pytree.tree_map_only(torch.Tensor, lambda t: t.unsqueeze(0), arg)
        return pytree.tree_map_only(torch.Tensor, lambda t: t.movedim(dim, 0), arg)

    return tuple(wrap(arg, dim) for arg, dim in zip(args, in_dims, strict=True))


def _as_tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _out_dims(out_dims: int | Sequence[int | None], count: int) -> tuple[int | None, ...]:
    if isinstance(out_dims, int) or out_dims is None:
        return (out_dims,) * count
    return tuple(out_dims)


# ---- definition -------------------------------------------------------------------------------


@dataclass
class _Registration:
    """What the Python side holds for one op: its torch.library objects and kernel status."""

    qualname: str
    libraries: list[torch.library.Library]
    kernel_status: str
    jit_kernels: list[Any]


_registrations: dict[str, _Registration] = {}


@public
def kernel_status(name: str) -> str:
    """What serves an op's calls: for Python-defined ops, why its Triton kernel is on or off and
    how its JIT launches went; for C++-defined ops, the kernel of each device type. A ValueError
    names an op that opreg did not define."""
    registration = _registrations.get(name)
    if registration is None:
        report = _C.describe_op(name)  # a ValueError naming the op when there is none
        served = [f"{k.device_type}: {k.served_by}" for k in report.kernels]
        return "; ".join(served or ["no kernels: the fallback serves every device"])
    launches = [kernel.describe() for kernel in registration.jit_kernels]
    return "; ".join([registration.kernel_status, *launches])


def _qualified_name(name: str | None, fn: Callable[..., Any]) -> str:
    if name is None:
        return f"{DEFAULT_NAMESPACE}::{fn.__name__}"
    return name if "::" in name else f"{DEFAULT_NAMESPACE}::{name}"


def _schema(qualname: str, fn: Callable[..., Any], schema: str | None, mutates_args: Any) -> str:
    if schema is None:
        try:
            schema = torch.library.infer_schema(fn, mutates_args=mutates_args)
        except ValueError as error:
            raise ValueError(f"opreg: op '{qualname}': {error}") from None
    if not isinstance(schema, str) or not schema.strip().startswith("("):
        raise ValueError(
            f"opreg: op '{qualname}': schema= is the signature without the name, e.g. "
            f"'(Tensor x, float alpha) -> Tensor'; got {schema!r}"
        )
    return qualname + schema.strip()


def _device_types(types: str | Sequence[str] | None) -> list[str] | None:
    if types is None:
        return None
    return [types.strip().lower()] if isinstance(types, str) else [t.strip().lower() for t in types]


def _check_callables(qualname: str, **pieces: Any) -> None:
    """Pieces that are called later (at a call, under compile, in a backward) are checked now."""
    for keyword, piece in pieces.items():
        if piece is not None and not callable(piece):
            raise TypeError(
                f"opreg: op '{qualname}': {keyword} must be callable or None, got "
                f"{type(piece).__name__}"
            )


def _check_options(qualname: str, **options: Any) -> None:
    """Keyword combinations and types that would only fail later, refused at definition."""
    where = f"opreg: op '{qualname}'"
    if options["vmap_fn"] is not None and options["fake_vmap_fn"] is None:
        raise TypeError(
            f"{where}: vmap_fn needs fake_vmap_fn (the fake of the batched computation), as in EvoX"
        )
    if options["vmap"] is not None and options["vmap_fn"] is not None:
        raise TypeError(f"{where}: give vmap (a rule) or vmap_fn, not both")
    out_dims = options["vmap_out_dims"]
    if not (
        out_dims is None
        or isinstance(out_dims, int)
        or (
            isinstance(out_dims, (tuple, list))
            and all(d is None or isinstance(d, int) for d in out_dims)
        )
    ):
        raise TypeError(
            f"{where}: vmap_out_dims must be an int, None or a sequence of them, got {out_dims!r}"
        )
    mutates = options["mutates_args"]
    if mutates != "unknown" and (
        isinstance(mutates, str) or not isinstance(mutates, (tuple, list, set, frozenset))
    ):
        raise TypeError(
            f"{where}: mutates_args must be a sequence of argument names or 'unknown', "
            f"got {mutates!r}"
        )
    if options["aot"] is not None and not isinstance(options["aot"], AotLaunch):
        raise TypeError(
            f"{where}: aot must be an opreg.AotLaunch, got {type(options['aot']).__name__}"
        )
    if options["autograd"] == "error" and options["backward"] is not None:
        raise ValueError(
            f"{where}: autograd='error' refuses gradients, but a backward is given; "
            "leave one of them out"
        )


def _checked_fake(qualname: str, fake_fn: Callable[..., Any]) -> Callable[..., Any]:
    """The fake, with its outputs checked against the schema (the C++ core checks C++ fakes)."""
    returns = None

    def fake(*args: Any, **kwargs: Any) -> Any:
        nonlocal returns
        if returns is None:
            returns = [r.type for r in _op(qualname)._schema.returns]
        result = fake_fn(*args, **kwargs)
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
        for index, (value, kind) in enumerate(zip(values, returns, strict=True)):
            if isinstance(kind, torch.TensorType) and not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"opreg: op '{qualname}': its fake returned {type(value).__name__} for "
                    f"output {index}, expected a Tensor"
                )
        return result

    return fake


def _forget(qualname: str, schema_changed: bool) -> None:
    """Drop opreg's Python-side registrations of an op; with a new schema, also torch.ops'
    cached handle, so that the next access reads the new schema."""
    registration = _registrations.pop(qualname, None)
    if registration is not None:
        for library in registration.libraries:
            library._destroy()
    if schema_changed:
        namespace, name = qualname.split("::")
        vars(getattr(torch.ops, namespace)).pop(name.split(".")[0], None)


def _op(qualname: str) -> torch._ops.OpOverload:
    namespace, name = qualname.split("::")
    packet = getattr(getattr(torch.ops, namespace), name.split(".")[0])
    return getattr(packet, name.split(".")[1] if "." in name else "default")


@dataclass
class _Declaration:
    """One Python-defined op, ready for the C++ core (``cpp``) and for the Python-side
    registrations made after the core accepted it."""

    qualname: str
    cpp: Any  # _C.PythonOpDefinition
    fake_fn: Callable[..., Any] | None
    decompose_with: tuple[Callable[..., Any], Callable[..., Any], list[str] | None] | None
    kernel_status: str
    jit_kernels: list[Any]


def _declare(
    fn: Callable[..., Any],
    *,
    qualname: str,
    schema: str | None,
    mutates_args: Any,
    fake_fn: Callable[..., Any] | None,
    kernels: list[tuple[str, list[str] | None, Callable[..., Any], Callable[..., Any] | None]],
    aot_kernels: list[tuple[str, list[str] | None, AotLaunch]] | None = None,
    vmap_rule: Callable[..., Any] | None,
    batch_polymorphic: bool,
    vmap_loop: bool,
    random: bool,
    backward: Callable[..., Any] | None,
    setup_context: Callable[..., Any] | None,
    autograd: str,
    decompose_with: tuple[Callable[..., Any], list[str] | None] | None,
    replace: bool,
    kernel_status_text: str,
    origin: str,
    fallback_label: str = "fallback",
    bitwise: bool = False,
    jit_kernels: Sequence[Any] = (),
) -> _Declaration:
    _check_callables(
        qualname, fallback=fn, fake_fn=fake_fn, backward=backward, setup_context=setup_context
    )
    if autograd not in ("fallback", "error", "none"):
        raise ValueError(
            f"opreg: op '{qualname}': autograd must be 'fallback', 'error' or 'none', "
            f"got {autograd!r}"
        )
    definition = _C.PythonOpDefinition()
    definition.schema = _schema(qualname, fn, schema, mutates_args)
    definition.fallback = fn
    definition.fallback_label = fallback_label
    cpp_kernels = []
    for kernel_name, device_types, kernel_fn, accepts in kernels:
        kernel = _C.PythonKernelDefinition()
        kernel.name, kernel.device_types, kernel.fn = kernel_name, device_types, kernel_fn
        kernel.accepts = accepts
        cpp_kernels.append(kernel)
    definition.kernels = cpp_kernels
    cpp_aot = []
    for kernel_name, device_types, launch in aot_kernels or []:
        aot = _C.PythonAotDefinition()
        aot.name, aot.device_types = kernel_name, device_types
        aot.launch = _C.AotLaunch(
            launch.kernel, list(launch.grid), list(launch.arguments), launch.outputs
        )
        cpp_aot.append(aot)
    definition.aot_kernels = cpp_aot
    definition.python_fake = fake_fn is not None
    definition.python_module = __name__
    definition.autograd_policy = autograd
    definition.backward = backward
    definition.setup_context = setup_context
    definition.make_context = AutogradContext
    definition.vmap_rule = vmap_rule
    definition.batch_polymorphic = batch_polymorphic
    definition.vmap_per_example_loop = vmap_loop
    definition.random = random
    definition.bitwise = bitwise
    definition.replace = replace
    definition.origin = origin
    decomposition = None
    if decompose_with is not None:
        decomposition = (decompose_with[0], fn, decompose_with[1])
    return _Declaration(
        qualname, definition, fake_fn, decomposition, kernel_status_text, list(jit_kernels)
    )


def _define(*declarations: _Declaration) -> list[torch._ops.OpOverload]:
    """Defines the ops together through the C++ core, which validates everything before it
    changes anything: all are defined, or none and the earlier definitions stay. Then the
    Python-side pieces (fakes, the decomposition under compile) replace the earlier ones."""
    schemas_before = {}
    for declaration in declarations:
        try:
            schemas_before[declaration.qualname] = _C.describe_op(declaration.qualname).schema
        except ValueError:
            schemas_before[declaration.qualname] = None
    _C.define_python_ops([declaration.cpp for declaration in declarations])
    for declaration in declarations:
        qualname = declaration.qualname
        schema_now = _C.describe_op(qualname).schema
        _forget(qualname, schema_changed=schemas_before[qualname] not in (None, schema_now))
        library = torch.library.Library(qualname.split("::")[0], "FRAGMENT")
        if declaration.fake_fn is not None:
            fake = _checked_fake(qualname, declaration.fake_fn)
            torch.library.register_fake(qualname, fake, lib=library)
        if declaration.decompose_with is not None:
            triton_fn, fallback, device_types = declaration.decompose_with
            torch.library.register_torch_dispatch(
                qualname,
                _functional_tensor_mode(),
                _decomposition(triton_fn, fallback, device_types),
                lib=library,
            )
        _registrations[qualname] = _Registration(
            qualname, [library], declaration.kernel_status, declaration.jit_kernels
        )
    return [_op(declaration.qualname) for declaration in declarations]


def _functional_tensor_mode() -> type:
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    return FunctionalTensorMode


def _decomposition(
    triton_fn: Callable[..., Any], fallback: Callable[..., Any], device_types: list[str] | None
) -> Callable[..., Any]:
    """Under AOT dispatch (torch.compile), run the implementation itself, so that triton_fn's
    wrap_triton launches become graph nodes the compiler sees (as torch.library.triton_op), or
    the fallback's ATen ops on devices the kernel does not serve (and under Triton's interpreter,
    whose kernels cannot be traced)."""

    def decompose(mode, op, types, args, kwargs):
        from torch.export._trace import custom_triton_ops_decomposition_disabled

        if custom_triton_ops_decomposition_disabled():  # torch.export keeps the op whole
            return mode.__torch_dispatch__(op, types, args, kwargs)
        tensors = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        device = tensors[0].device.type if tensors else "cpu"
        serves = device in (device_types or triton_device_types())
        interpreted = os.environ.get("TRITON_INTERPRET") == "1"
        impl = triton_fn if serves and not interpreted else fallback
        token = _decomposing.set(True)
        try:
            with mode:
                return impl(*args, **kwargs)
        finally:
            _decomposing.reset(token)

    return decompose


def _vmap_fn_rules(
    qualname: str,
    fn: Callable[..., Any],
    *,
    schema: str | None,
    mutates_args: Any,
    vmap_fn: Callable[..., Any],
    fake_vmap_fn: Callable[..., Any] | None,
    vmap_wrap_inputs: Callable[..., Any] | None,
    vmap_out_dims: Any,
    replace: bool,
    origin: str,
) -> tuple[Callable[..., Any], _Declaration]:
    """EvoX's vmap_fn, at any depth, without one op per level: one companion op `<name>_vmap`
    runs vmap_fn on inputs with leading batch dims; the rule of both ops wraps the inputs of
    one more level and calls the companion again, so the innermost call sees every level.
    Returns the rule and the companion's declaration (defined together with the op)."""
    _check_callables(
        qualname, vmap_fn=vmap_fn, fake_vmap_fn=fake_vmap_fn, vmap_wrap_inputs=vmap_wrap_inputs
    )
    wrap = vmap_wrap_inputs or default_vmap_wrap_inputs
    companion_name = qualname + "_vmap"
    companion: list[torch._ops.OpOverload] = []

    def rule(batch_size: int, randomness: str, in_dims: list[int | None], args: tuple):
        if not companion:
            companion.append(_op(companion_name))
        wrapped = wrap(VmapInfo(batch_size, randomness), in_dims, *args)
        outputs = _as_tuple(companion[0](*wrapped))
        return outputs, _out_dims(vmap_out_dims, len(outputs))

    # vmap_fn has fn's signature (EvoX's contract): the schema comes from fn when none is given.
    declaration = _declare(
        vmap_fn,
        qualname=companion_name,
        schema=schema
        if schema is not None
        else _schema(companion_name, fn, None, mutates_args)[len(companion_name) :],
        mutates_args=mutates_args,
        fake_fn=fake_vmap_fn,
        kernels=[],
        vmap_rule=rule,
        batch_polymorphic=False,
        vmap_loop=False,
        random=False,
        backward=None,
        setup_context=None,
        autograd="fallback",
        decompose_with=None,
        replace=replace,
        kernel_status_text="vmap_fn serves every device",
        origin=origin,
        fallback_label="vmap_fn",
    )
    return rule, declaration


def _origin(depth: int = 3) -> str:
    frame = inspect.stack()[depth]
    return f"{frame.filename}:{frame.lineno}"


def _explicit_rule(qualname: str, vmap: Callable[..., Any]) -> Callable[..., Any]:
    """torch.library.register_vmap's signature: vmap(info, in_dims, *args) -> (out, out_dims)."""

    def rule(batch_size: int, randomness: str, in_dims: list[int | None], args: tuple):
        result = vmap(VmapInfo(batch_size, randomness), tuple(in_dims), *args)
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise TypeError(
                f"opreg: op '{qualname}': its vmap rule must return (outputs, out_dims), got "
                f"{type(result).__name__}"
            )
        outputs, out_dims = result
        outputs = _as_tuple(outputs)
        return outputs, _out_dims(out_dims, len(outputs))

    return rule


@public
def register_triton_op(
    *,
    fake_fn: Callable[..., Any] | None,
    triton_fn: Callable[..., Any] | None,
    vmap_fn: Callable[..., Any] | None = None,
    fake_vmap_fn: Callable[..., Any] | None = None,
    vmap_wrap_inputs: Callable[..., Any] | None = None,
    vmap_out_dims: int | Sequence[int | None] = 0,
    max_vmap_level: int | None = None,
    name: str | None = None,
    mutates_args: Any = (),
    device_types: str | Sequence[str] | None = None,
    triton_device_types: str | Sequence[str] | None = None,
    schema: str | None = None,
    # opreg's additions (keyword-only, all optional):
    backward: Callable[..., Any] | None = None,
    setup_context: Callable[..., Any] | None = None,
    autograd: str = "fallback",
    vmap: Callable[..., Any] | None = None,
    batch_polymorphic: bool = False,
    vmap_loop: bool = False,
    random: bool = False,
    triton_accepts: Callable[..., bool] | None = None,
    traceable: bool | None = None,
    bitwise: bool = False,
    aot: AotLaunch | None = None,
    replace: bool = False,
) -> Callable[[Callable[..., Any]], torch._ops.OpOverload]:
    """Define an op whose decorated function is the fallback, with ``triton_fn`` as the kernel
    for ``triton_device_types`` (the Triton device registry when None). EvoX's parameters keep
    their meaning; see README "Coming from EvoX" for every difference.

    opreg's additions: ``backward``/``setup_context`` (as torch.library.register_autograd) and
    ``autograd`` ("fallback", "error" or "none") for calls that need gradients; ``vmap`` (an
    explicit rule with torch.library.register_vmap's signature), ``batch_polymorphic`` and
    ``vmap_loop``; ``random``; ``triton_accepts(*args) -> bool`` to decline calls the kernel
    does not handle; ``aot`` (an :class:`AotLaunch`: an AOT-compiled kernel launched from C++
    with no Python on the call, serving ``triton_device_types`` instead of ``triton_fn``, which
    then only runs when torch.compile traces the op); ``bitwise`` (its kernel matches the
    fallback bit for bit, checked by opreg.opcheck); ``traceable`` (default: whether triton_fn
    uses opreg.wrap_triton) to let torch.compile see the Triton kernels; ``replace`` to
    redefine an existing op.
    """
    del max_vmap_level, device_types  # see "Coming from EvoX": opreg needs neither

    def decorator(fn: Callable[..., Any]) -> torch._ops.OpOverload:
        qualname = _qualified_name(name, fn)
        origin = _origin(2)
        _check_options(
            qualname,
            vmap_fn=vmap_fn,
            fake_vmap_fn=fake_vmap_fn,
            vmap=vmap,
            vmap_out_dims=vmap_out_dims,
            mutates_args=mutates_args,
            aot=aot,
            autograd=autograd,
            backward=backward,
        )
        kernels = []
        usable, why = triton_status()
        status = "no triton_fn"
        aot_kernels = []
        if aot is not None and aot.outputs == "fake" and fake_fn is not None:
            raise ValueError(
                f"opreg.register_triton_op({qualname}): AotLaunch outputs='fake' reads the op's "
                "C++ fake; a Python fake_fn is not reachable there: use outputs='like:<argument>'"
            )
        if aot is not None:
            aot_kernels.append(("triton_aot", _device_types(triton_device_types), aot))
            status = f"AOT kernel {aot.kernel} (C++ launcher)"
        elif triton_fn is not None:
            if usable:
                types = _device_types(triton_device_types)
                kernels.append(("triton", types, triton_fn, triton_accepts))
                status = f"triton_fn serves {', '.join(types) if types else 'the Triton devices'}"
            else:
                status = f"triton_fn is off: {why}"
        _check_callables(qualname, triton_fn=triton_fn, triton_accepts=triton_accepts, vmap=vmap)
        rule = None
        companions = []
        if vmap_fn is not None:
            rule, companion = _vmap_fn_rules(
                qualname,
                fn,
                schema=schema,
                mutates_args=mutates_args,
                vmap_fn=vmap_fn,
                fake_vmap_fn=fake_vmap_fn,
                vmap_wrap_inputs=vmap_wrap_inputs,
                vmap_out_dims=vmap_out_dims,
                replace=replace,
                origin=origin,
            )
            companions.append(companion)
        elif vmap is not None:
            rule = _explicit_rule(qualname, vmap)
        wants_trace = traceable
        if wants_trace is None:
            wants_trace = triton_fn is not None and "wrap_triton" in getattr(
                getattr(triton_fn, "__code__", None), "co_names", ()
            )
        decompose_with = None
        if wants_trace and triton_fn is not None and usable:
            decompose_with = (triton_fn, _device_types(triton_device_types))
        declaration = _declare(
            fn,
            qualname=qualname,
            schema=schema,
            mutates_args=mutates_args,
            fake_fn=fake_fn,
            kernels=kernels,
            vmap_rule=rule,
            batch_polymorphic=batch_polymorphic,
            vmap_loop=vmap_loop,
            random=random,
            backward=backward,
            setup_context=setup_context,
            autograd=autograd,
            decompose_with=decompose_with,
            replace=replace,
            kernel_status_text=status,
            origin=origin,
            bitwise=bitwise,
            aot_kernels=aot_kernels,
            jit_kernels=_jit_cache.adopt_kernels_reached_by(triton_fn, vmap_fn) if usable else [],
        )
        return _define(declaration, *companions)[0]

    return decorator


@public
def register_vmap_op(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    fake_fn: Callable[..., Any] | None,
    vmap_fn: Callable[..., Any] | None = None,
    fake_vmap_fn: Callable[..., Any] | None = None,
    vmap_wrap_inputs: Callable[..., Any] | None = None,
    vmap_out_dims: int | Sequence[int | None] = 0,
    max_vmap_level: int | None = None,
    name: str | None = None,
    mutates_args: Any = (),
    device_types: str | Sequence[str] | None = None,
    schema: str | None = None,
    **opreg_options: Any,
) -> Any:
    """EvoX's register_vmap_op: an op with a fallback, a fake and optionally a vmap_fn; usable as
    ``@register_vmap_op(fake_fn=...)`` or ``register_vmap_op(fn, fake_fn=...)``. Accepts the
    same additions as :func:`register_triton_op`."""
    decorator = register_triton_op(
        fake_fn=fake_fn,
        triton_fn=None,
        vmap_fn=vmap_fn,
        fake_vmap_fn=fake_vmap_fn,
        vmap_wrap_inputs=vmap_wrap_inputs,
        vmap_out_dims=vmap_out_dims,
        max_vmap_level=max_vmap_level,
        name=name,
        mutates_args=mutates_args,
        device_types=device_types,
        schema=schema,
        **opreg_options,
    )
    return decorator if fn is None else decorator(fn)
