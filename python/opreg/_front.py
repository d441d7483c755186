"""The Python front: EvoX's ``register_triton_op`` and ``register_vmap_op``, keyword for keyword
(switch the import and keep the code); the decorated function is the fallback. Each call becomes
one :class:`~opreg._declaration.OpDeclaration` (two with a ``vmap_fn``), defined through the same
C++ builder as C++ ops, so argument checks, autograd policies and explicit backwards, vmap without
a per-example loop, kernels that decline and ``describe_op`` are the core's."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from opreg import _C, _jit_cache
from opreg._declaration import (
    KernelDeclaration,
    OpDeclaration,
    check_positional,
    check_signature,
    define,
    defining,
    flag_names,
    parse_schema,
)
from opreg._public import public
from opreg._registry import Sharding, caller_origin, check_op_name
from opreg._tracing import without_line_events
from opreg._triton import AotLaunch, triton_status, uses_wrap_triton
from opreg._vmap import RuleShape, check_rule_arguments, explicit_rule, vmap_fn_companion

DEFAULT_NAMESPACE = "opreg_py"

# Keywords that EvoX or earlier opreg releases spell differently from the core's flag names.
_FLAG_ALIASES = {"vmap_loop": "vmap_per_example_loop"}


def _qualified_name(name: str | None, fn: Callable[..., Any]) -> str:
    if name is None:
        if not callable(fn):
            raise TypeError(
                f"opreg: the decorated fallback must be callable, got {type(fn).__name__}"
            )
        if not isinstance(getattr(fn, "__name__", None), str):
            raise TypeError(
                f"opreg: the fallback (a {type(fn).__name__}) has no __name__ to name the op "
                "after; pass name='ns::op'"
            )
        name = fn.__name__
    if not isinstance(name, str):
        raise TypeError(f"opreg: name must be a string like 'ns::op', got {name!r}")
    if not name.isascii():
        raise ValueError(f"opreg: op name {name!r} has a non-ASCII character; names are ASCII")
    qualname = name if "::" in name else f"{DEFAULT_NAMESPACE}::{name}"
    check_op_name("opreg", qualname)
    return qualname


def _schema(qualname: str, fn: Callable[..., Any], schema: str | None, mutates_args: Any) -> str:
    inferred = schema is None
    # torch's inference would say only "'int' object is not iterable"
    _check_mutates_args_type(f"opreg: op '{qualname}'", mutates_args)
    if schema is None:
        if not (inspect.isfunction(fn) or inspect.ismethod(fn)):
            raise ValueError(
                f"opreg: op '{qualname}': no schema= given, and none can be inferred from a "
                f"{type(fn).__name__} object (only from a def with annotations); pass "
                "schema='(Tensor x, ...) -> Tensor'"
            )
        try:
            schema = torch.library.infer_schema(fn, mutates_args=mutates_args)
        except ValueError as error:
            raise ValueError(f"opreg: op '{qualname}': {error}") from None
    if not isinstance(schema, str) or not schema.strip().startswith("("):
        raise ValueError(
            f"opreg: op '{qualname}': schema= is the signature without the name, e.g. "
            f"'(Tensor x, float alpha) -> Tensor'; got {schema!r}"
        )
    if not inferred:
        _check_mutates_args(qualname, qualname + schema.strip(), mutates_args)
    return qualname + schema.strip()


def _check_mutates_args_type(where: str, mutates_args: Any) -> None:
    if isinstance(mutates_args, str) and mutates_args == "unknown":
        return
    if isinstance(mutates_args, str) or not isinstance(mutates_args, Iterable):
        raise TypeError(
            f"{where}: mutates_args must be a sequence of argument names or 'unknown', "
            f"got {mutates_args!r}"
        )


def _check_mutates_args(qualname: str, full_schema: str, mutates_args: Any) -> None:
    """mutates_args given with a schema must name the arguments the schema marks (a!)."""
    if isinstance(mutates_args, str) or not mutates_args:  # "unknown", or nothing claimed
        return
    try:
        parsed = parse_schema(qualname, full_schema)
    except ValueError:  # the core refuses the schema, saying why
        return
    written = {
        a.name for a in parsed.arguments if a.alias_info is not None and a.alias_info.is_write
    }
    claimed = set(mutates_args) if isinstance(mutates_args, Iterable) else set()
    if claimed != written:
        raise ValueError(
            f"opreg: op '{qualname}': mutates_args names {sorted(claimed)}, but the schema marks "
            f"{sorted(written) or 'no argument'} as mutated (Tensor(a!) x); with schema= given, "
            "write the mutation in the schema and leave mutates_args out or make them agree"
        )


def _device_types(
    qualname: str, keyword: str, types: str | Sequence[str] | None
) -> list[str] | None:
    """Device types as the core takes them ('cuda', not 'cuda:0'), each one checked; a type
    named twice counts once, as in torch.library.custom_op's device_types."""
    if types is None:
        return None
    where = f"opreg: op '{qualname}': {keyword}"
    if isinstance(types, str):
        types = [types]
    elif not isinstance(types, (list, tuple, set, frozenset)):
        raise TypeError(f"{where} must be a device type or a list of them, got {types!r}")
    checked = []
    for given in types:
        if not isinstance(given, str):
            raise TypeError(f"{where}: expected device type names like 'cuda', got {given!r}")
        device_type = given.strip().lower()
        if ":" in device_type:
            raise ValueError(
                f"{where}: {given!r} is a device; name its type "
                f"({device_type.split(':')[0]!r}): a kernel serves every device of its type"
            )
        if not device_type.isidentifier():
            raise ValueError(f"{where}: {given!r} is not a device type name like 'cuda'")
        if device_type not in checked:
            checked.append(device_type)
    return checked


# The keywords that take functions.
_CALLABLE_KEYWORDS = (
    "fallback",
    "fake_fn",
    "triton_fn",
    "triton_accepts",
    "backward",
    "setup_context",
    "vmap",
    "vmap_fn",
    "fake_vmap_fn",
    "vmap_wrap_inputs",
)


def _check_callables(qualname: str, pieces: Mapping[str, Any]) -> None:
    """Pieces that are called later (at a call, under compile, in a backward) are checked now."""
    for keyword, piece in pieces.items():
        if piece is not None and not callable(piece):
            raise TypeError(
                f"opreg: op '{qualname}': {keyword} must be callable or None, got "
                f"{type(piece).__name__}"
            )


def _check_options(qualname: str, options: Mapping[str, Any]) -> None:
    """Keyword combinations and types that would only fail later, refused at definition."""
    where = f"opreg: op '{qualname}'"
    if options["vmap_fn"] is not None and options["fake_vmap_fn"] is None:
        raise TypeError(
            f"{where}: vmap_fn needs fake_vmap_fn (the fake of the batched computation), as in EvoX"
        )
    if options["triton_accepts"] is not None and (
        options["triton_fn"] is None or options["aot"] is not None
    ):
        serving = "aot's C++ launcher serves the calls" if options["aot"] else "no triton_fn"
        raise ValueError(
            f"{where}: triton_accepts is given but {serving}; it decides which calls triton_fn "
            "takes, so it would never run: give triton_fn (without aot), or leave it out"
        )
    if options["vmap"] is not None and options["vmap_fn"] is not None:
        raise TypeError(f"{where}: give vmap (a rule) or vmap_fn, not both")
    if options["vmap_fn"] is None:
        for keyword in ("fake_vmap_fn", "vmap_wrap_inputs"):
            if options[keyword] is not None:
                raise ValueError(
                    f"{where}: {keyword} is given without vmap_fn; it is only used with "
                    "vmap_fn, so it would never run: give vmap_fn too, or leave it out"
                )
    traceable = options["traceable"]
    if traceable is not None and not isinstance(traceable, bool):
        raise TypeError(
            f"{where}: traceable must be True, False or None (None: whether triton_fn uses "
            f"opreg.wrap_triton), got {traceable!r}"
        )
    out_dims = options["vmap_out_dims"]

    def is_dim(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if not (
        out_dims is None
        or is_dim(out_dims)
        or (isinstance(out_dims, (tuple, list)) and all(d is None or is_dim(d) for d in out_dims))
    ):
        raise TypeError(
            f"{where}: vmap_out_dims must be an int, None or a sequence of them, got {out_dims!r}"
        )
    if options["vmap_fn"] is None and not (type(out_dims) is int and out_dims == 0):
        raise ValueError(
            f"{where}: vmap_out_dims={out_dims!r} is given without vmap_fn; it says where "
            "vmap_fn's outputs have their batch, so it would never be used: give vmap_fn too, "
            "or leave it out"
        )
    _check_mutates_args_type(where, options["mutates_args"])
    aot = options["aot"]
    if aot is not None and not isinstance(aot, AotLaunch):
        raise TypeError(f"{where}: aot must be an opreg.AotLaunch, got {type(aot).__name__}")
    if aot is not None and aot.outputs == "fake" and options["fake_fn"] is not None:
        raise ValueError(
            f"{where}: AotLaunch outputs='fake' reads the op's C++ fake; a Python fake_fn is not "
            "reachable there: use outputs='like:<argument>'"
        )
    if options["autograd"] not in ("fallback", "error", "none"):
        raise ValueError(
            f"{where}: autograd must be 'fallback', 'error' or 'none', got {options['autograd']!r}"
        )
    if options["autograd"] == "error" and options["backward"] is not None:
        raise ValueError(
            f"{where}: autograd='error' refuses gradients, but a backward is given; "
            "leave one of them out"
        )
    if options["autograd"] == "none" and options["backward"] is not None:
        raise ValueError(
            f"{where}: autograd='none' declares outputs without gradients, but a backward is "
            "given (it would serve the gradients); leave one of them out"
        )
    if options["setup_context"] is not None and options["backward"] is None:
        raise ValueError(
            f"{where}: setup_context is given without backward; it only prepares the backward's "
            "ctx, so give both (as torch.library.register_autograd)"
        )
    _check_sharding(qualname, options["sharding"])
    if not isinstance(options["replace"], bool):
        raise TypeError(f"{where}: replace must be True or False, got {options['replace']!r}")
    dtypes = options["dtypes"]
    if dtypes is not None and not (
        isinstance(dtypes, Mapping)
        and all(
            isinstance(k, str)
            and isinstance(v, (tuple, list))
            and all(isinstance(d, torch.dtype) for d in v)
            for k, v in dtypes.items()
        )
    ):
        raise TypeError(
            f"{where}: dtypes must map argument names to lists of torch dtypes, got {dtypes!r}"
        )


_SHARDINGS = ("pointwise", "replicate", "none")


def _check_sharding(qualname: str, sharding: Any) -> None:
    """sharding= is a kind by name (or opreg.Sharding), a strategy function, or None."""
    if sharding is None or callable(sharding) or sharding in _SHARDINGS:
        return
    if isinstance(sharding, Sharding) and sharding is not Sharding.PYTHON:
        return
    raise (ValueError if isinstance(sharding, str | Sharding) else TypeError)(
        f"opreg: op '{qualname}': sharding must be 'pointwise', 'replicate', 'none' or a "
        "strategy function (as torch.distributed.tensor.experimental.register_sharding takes), "
        f"got {sharding!r}"
    )


def _flags(qualname: str, options: dict[str, Any]) -> dict[str, bool]:
    """The core's flags among the keywords (OPREG_OP_FLAGS); anything else is refused."""
    known = flag_names()
    flags = {}
    for alias, flag in _FLAG_ALIASES.items():
        if alias in options and flag in options:
            raise TypeError(
                f"opreg: op '{qualname}': {alias} is another name for {flag}; give one of them"
            )
    for keyword, value in options.items():
        flag = _FLAG_ALIASES.get(keyword, keyword)
        if flag not in known:
            raise TypeError(
                f"opreg: op '{qualname}': unknown keyword {keyword!r}; the flags are "
                f"{', '.join(known)} (see help(opreg.register_triton_op))"
            )
        if not isinstance(value, bool):
            raise TypeError(
                f"opreg: op '{qualname}': {keyword} must be True or False, got {value!r}"
            )
        flags[flag] = value
    return flags


def _check_vmap_flags(qualname: str, given: Mapping[str, Any], flags: Mapping[str, bool]) -> None:
    """A vmap rule (vmap=, or vmap_fn's) serves torch.vmap; flags choosing another way are refused
    rather than silently overridden by the rule. ``flags`` are the keywords as given."""
    if given["vmap"] is None and given["vmap_fn"] is None:
        return
    rule = "vmap (a rule)" if given["vmap"] is not None else "vmap_fn"
    for keyword, value in flags.items():
        flag = _FLAG_ALIASES.get(keyword, keyword)
        if value and flag in ("batch_polymorphic", "vmap_per_example_loop"):
            raise ValueError(
                f"opreg: op '{qualname}': {rule} and {keyword}=True are both given; under "
                f"torch.vmap the rule would serve every call and {keyword} would never apply: "
                "give one of them"
            )


def _tensor_list_type(schema_type: Any) -> bool:
    return isinstance(schema_type, torch._C.ListType) and "Tensor" in str(schema_type)


def _check_autograd_and_vmap_signatures(
    qualname: str, given: Mapping[str, Any], full_schema: str
) -> None:
    try:
        parsed = parse_schema(qualname, full_schema)
    except ValueError:  # the core refuses the schema, saying why
        return
    positional = [a.name for a in parsed.arguments if not a.kwarg_only]
    grads = [f"grad{i}" for i in range(len(parsed.returns))]
    # backward gets one gradient per output (None for a number's); a backward is refused for a
    # tensor list output, so the count is fixed where none is one.
    fixed_count = not any(_tensor_list_type(r.type) for r in parsed.returns)
    if given["backward"] is not None and fixed_count:
        check_positional(qualname, "backward", given["backward"], ["ctx", *grads])
    if given["setup_context"] is not None:
        check_positional(
            qualname, "setup_context", given["setup_context"], ["ctx", "inputs", "output"]
        )
    if given["vmap"] is not None:
        check_rule_arguments(qualname, "the vmap rule", parsed)
        keyword_only = [a.name for a in parsed.arguments if a.kwarg_only]
        arguments = ["info", "in_dims", *positional]
        check_positional(qualname, "vmap", given["vmap"], arguments, keyword_only)
    out_dims = given["vmap_out_dims"]
    sequence = isinstance(out_dims, (tuple, list))
    if given["vmap_fn"] is not None and sequence and len(out_dims) != len(parsed.returns):
        raise ValueError(
            f"opreg: op '{qualname}': vmap_out_dims {tuple(out_dims)!r} gives "
            f"{len(out_dims)} dims, but the op has {len(parsed.returns)} outputs; give one "
            "per output (or one int for all)"
        )


class _Required:
    """The default of a keyword EvoX requires: its absence is said naming the op."""

    def __repr__(self) -> str:
        return "<required>"


_REQUIRED: Any = _Required()


def _check_called_with_keywords(
    api: str, fn: Any, name: str | None, usage: str, **required: Any
) -> None:
    """Refuses the mistakes Python would say without the op: a bare @register_triton_op
    (a function and none of the keywords it needs), a required keyword left out."""
    op = f"op '{name}'" if isinstance(name, str) else None
    if fn is not None:
        what = getattr(fn, "__name__", None) if callable(fn) else None
        op = op or (f"op '{what}'" if isinstance(what, str) else f"a {type(fn).__name__}")
    if fn is not None and all(value is _REQUIRED for value in required.values()):
        raise TypeError(
            f"opreg: {op}: {api} was used bare, without its keywords; call it with them: {usage}"
        )
    missing = [keyword for keyword, value in required.items() if value is _REQUIRED]
    if missing:
        raise TypeError(
            f"opreg: {f'{op}: ' if op else ''}{api} needs the keyword argument"
            f"{'s' * (len(missing) > 1)} {' and '.join(missing)} (None for none); call it as "
            f"{usage}"
        )


@public
def register_triton_op(
    fn: Any = None,
    /,
    *,
    fake_fn: Callable[..., Any] | None = _REQUIRED,
    triton_fn: Callable[..., Any] | None = _REQUIRED,
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
    triton_accepts: Callable[..., bool] | None = None,
    traceable: bool | None = None,
    aot: AotLaunch | None = None,
    dtypes: Mapping[str, Sequence[torch.dtype]] | None = None,
    sharding: str | Sharding | Callable[..., Any] | None = None,
    replace: bool = False,
    **flags: bool,
) -> Any:
    """Define an op whose decorated function is the fallback, with ``triton_fn`` as the kernel
    for ``triton_device_types`` (the Triton device registry when None); usable as
    ``@register_triton_op(fake_fn=..., triton_fn=...)`` or, as register_vmap_op,
    ``register_triton_op(fn, fake_fn=..., triton_fn=...)``. EvoX's parameters keep
    their meaning; see README "Coming from EvoX" for every difference.

    opreg's additions: ``backward``/``setup_context`` (as torch.library.register_autograd) and
    ``autograd`` ("fallback", "error" or "none") for calls that need gradients; ``vmap`` (an
    explicit rule with torch.library.register_vmap's signature); ``triton_accepts(*args) ->
    bool`` to decline calls the kernel does not handle; ``aot`` (an :class:`AotLaunch`: an
    AOT-compiled kernel launched from C++ with no Python on the call, serving
    ``triton_device_types`` instead of ``triton_fn``, which then only runs when torch.compile
    traces the op); ``dtypes`` ({argument: [dtypes]}, checked on every call); ``traceable``
    (default: whether triton_fn uses opreg.wrap_triton) to let torch.compile see the Triton
    kernels; ``sharding`` for DTensor: ``"pointwise"`` (elementwise: each rank computes its
    shard), ``"replicate"`` (inputs gathered), ``"none"`` (DTensor refuses calls), or a strategy
    function as torch.distributed.tensor.experimental.register_sharding takes; without it
    ``"none"`` (docs/distributed.md);
    ``replace`` to redefine an existing op. The flags, each ``False`` by default, are
    the core's (OPREG_OP_FLAGS in include/opreg/definition.h); ``vmap_loop`` is another
    spelling of ``vmap_per_example_loop``. Each flag and what it promises:
    """
    _check_called_with_keywords(
        "register_triton_op",
        fn,
        name,
        "@register_triton_op(fake_fn=..., triton_fn=...) or "
        "register_triton_op(fn, fake_fn=..., triton_fn=...)",
        fake_fn=fake_fn,
        triton_fn=triton_fn,
    )
    if max_vmap_level is not None and (
        not isinstance(max_vmap_level, int)
        or isinstance(max_vmap_level, bool)
        or max_vmap_level < 0
    ):
        raise TypeError(
            f"opreg: op '{name}': max_vmap_level must be None or an int of at least 0 (EvoX's "
            f"meaning; opreg needs no limit), got {max_vmap_level!r}"
        )
    del max_vmap_level  # see "Coming from EvoX": opreg needs neither it nor device_types

    def decorator(fn: Callable[..., Any]) -> torch._ops.OpOverload:
        without_line_events()  # Note [Locks and trace hooks]
        qualname = _qualified_name(name, fn)
        origin = caller_origin()
        given = dict(
            fallback=fn,
            fake_fn=fake_fn,
            triton_fn=triton_fn,
            triton_accepts=triton_accepts,
            backward=backward,
            setup_context=setup_context,
            vmap=vmap,
            vmap_fn=vmap_fn,
            fake_vmap_fn=fake_vmap_fn,
            vmap_wrap_inputs=vmap_wrap_inputs,
            vmap_out_dims=vmap_out_dims,
            mutates_args=mutates_args,
            aot=aot,
            autograd=autograd,
            dtypes=dtypes,
            sharding=sharding,
            replace=replace,
            traceable=traceable,
        )
        _check_options(qualname, given)
        op_flags = _flags(qualname, flags)
        _check_vmap_flags(qualname, given, flags)
        _check_callables(qualname, {k: given[k] for k in _CALLABLE_KEYWORDS})
        full_schema = _schema(qualname, fn, schema, mutates_args)
        for keyword in ("fallback", "fake_fn", "triton_fn", "triton_accepts"):
            if given[keyword] is not None:
                check_signature(qualname, keyword, given[keyword], full_schema)
        _check_autograd_and_vmap_signatures(qualname, given, full_schema)
        if callable(sharding):
            check_signature(qualname, "sharding", sharding, full_schema)

        _device_types(qualname, "device_types", device_types)  # checked as EvoX's torch does
        kernel_types = _device_types(qualname, "triton_device_types", triton_device_types)
        if triton_device_types is not None and triton_fn is None and aot is None:
            raise ValueError(
                f"opreg: op '{qualname}': triton_device_types={triton_device_types!r} is given "
                "without triton_fn or aot; it says which devices their kernel serves, so it "
                "would never be used: give the kernel too, or leave it out"
            )
        if kernel_types == []:
            raise ValueError(
                f"opreg: op '{qualname}': triton_device_types names no device type, so triton_fn "
                "would serve nothing; name them, or leave it out (None) to follow the Triton "
                "device types"
            )
        usable, why = triton_status()
        kernels = []
        status = "no triton_fn"
        if aot is not None:
            kernels.append(KernelDeclaration("triton_aot", kernel_types, aot=aot))
            status = f"AOT kernel {aot.kernel} (C++ launcher)"
            if aot.kernel not in {kernel["name"] for kernel in _C.triton_describe_kernels()}:
                # A bundle or library may register it later; until then calls take the fallback.
                status += "; not registered yet, so the fallback serves its calls until it is"
        elif triton_fn is not None:
            if usable:
                kernels.append(
                    KernelDeclaration("triton", kernel_types, fn=triton_fn, accepts=triton_accepts)
                )
                serves = ", ".join(kernel_types) if kernel_types else "the Triton devices"
                status = f"triton_fn serves {serves}"
            else:
                status = f"triton_fn is off: {why}"

        rule = None
        companions = []
        if vmap_fn is not None:
            signature = full_schema[len(qualname) :]
            for keyword in ("vmap_fn", "fake_vmap_fn"):
                if given[keyword] is not None:
                    check_signature(qualname, keyword, given[keyword], full_schema)
            rule, companion = vmap_fn_companion(
                qualname,
                signature,
                RuleShape.of(parse_schema(qualname, full_schema)),
                vmap_fn=vmap_fn,
                fake_vmap_fn=fake_vmap_fn,
                vmap_wrap_inputs=vmap_wrap_inputs,
                vmap_out_dims=vmap_out_dims,
                replace=replace,
                origin=origin,
                autograd="backward" if backward is not None else autograd,
                random=op_flags.get("random", False),
            )
            companions.append(companion)
        elif vmap is not None:
            rule = explicit_rule(qualname, vmap, RuleShape.of(parse_schema(qualname, full_schema)))

        wants_trace = uses_wrap_triton(triton_fn) if traceable is None else traceable
        decompose_with = None
        if wants_trace and triton_fn is not None and usable:
            decompose_with = (triton_fn, kernel_types)
        declaration = OpDeclaration(
            schema=full_schema,
            fallback=fn,
            fake=fake_fn,
            kernels=kernels,
            dtypes=dict(dtypes or {}),
            autograd=autograd,
            backward=backward,
            setup_context=setup_context,
            vmap=rule,
            sharding=sharding.value if isinstance(sharding, Sharding) else sharding,
            replace=replace,
            origin=origin,
            decompose_with=decompose_with,
            kernel_status=status,
            jit_kernels=_jit_cache.adopt_kernels_reached_by(triton_fn, vmap_fn) if usable else [],
            **op_flags,
        )
        with defining():
            defined = define(declaration, *companions)[0]
            if companions:
                rule.pin()
        return defined

    return decorator if fn is None else decorator(fn)


if register_triton_op.__doc__:  # None under python -OO
    register_triton_op.__doc__ += "".join(
        f"\n    - ``{flag}=True``: {promise}." for flag, promise in _C.op_flags()
    )


@public
def register_vmap_op(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    fake_fn: Callable[..., Any] | None = _REQUIRED,
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
    same additions as :func:`register_triton_op`, except ``triton_fn``."""
    if "triton_fn" in opreg_options:
        # EvoX's register_vmap_op has no kernel: refused rather than clash with the None below.
        def refuse(fn: Callable[..., Any]) -> Any:
            raise TypeError(
                f"opreg: op '{_qualified_name(name, fn)}': register_vmap_op takes no triton_fn "
                "(EvoX's has none); give the kernel to register_triton_op(triton_fn=...) instead"
            )

        return refuse if fn is None else refuse(fn)
    if fake_fn is _REQUIRED:  # a bare @register_vmap_op too
        _check_called_with_keywords(
            "register_vmap_op",
            None,
            name if name is not None or fn is None else getattr(fn, "__name__", None),
            "@register_vmap_op(fake_fn=...) or register_vmap_op(fn, fake_fn=...)",
            fake_fn=fake_fn,
        )
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
