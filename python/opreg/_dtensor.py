"""DTensor (torch.distributed.tensor) sharding strategies for opreg ops. Each op's sharding, as
its report says (``OpReport.sharding``: declared, or the core's default), becomes a strategy
registered through torch's public ``torch.distributed.tensor.experimental.register_sharding``,
so that DTensor calls the op on the local shards instead of refusing it or gathering.

Importing torch.distributed.tensor costs about as much again as importing torch, so opreg never
imports it: while it is not imported, a one-shot import hook waits for it and then registers
every op; once it is, each definition (``register_triton_op``, ``opreg.load_library``)
registers its ops at once. One strategy function is registered per ``OpOverload`` and reads the
op's current definition at each propagation, so a replaced op serves its new sharding."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from opreg import _C
from opreg._after_import import run_after_import
from opreg._fork import new_rlock
from opreg._tracing import without_line_events

_DTENSOR = "torch.distributed.tensor"

# The strategy functions given to the Python front (sharding=fn), by op name: the current
# definition's (a definition without one removes its op's entry).
_strategies: dict[str, Callable[..., Any]] = {}
# The OpOverloads whose strategy opreg registered, by id (the value keeps the object alive), with
# the definition serial it was registered for: a definition made since registers it again, in
# place of a strategy the user registered for the op meanwhile.
_registered: dict[int, tuple[torch._ops.OpOverload, int]] = {}
_lock = new_rlock()


def declare(qualname: str, strategy: Callable[..., Any] | None) -> None:
    """Record a Python-front op's strategy function (None: it has none), then register."""
    without_line_events()  # Note [Locks and trace hooks]
    with _lock:
        if strategy is None:
            _strategies.pop(qualname, None)
        else:
            _strategies[qualname] = strategy
    sync([qualname])


def sync(qualnames: Iterable[str] | None = None) -> None:
    """Register the strategies of these ops (None: every opreg op) with DTensor, if it is
    imported; else the import hook registers them all when it is."""
    without_line_events()  # Note [Locks and trace hooks]
    module = sys.modules.get(_DTENSOR)
    if module is None or not hasattr(module, "DTensor"):
        return  # not imported, or still being imported: the hook runs once it is
    with _lock:
        names = [r.name for r in _C.describe_ops()] if qualnames is None else list(qualnames)
        for name in names:
            _register(name)
        _forget_cached_propagations()


def _register(qualname: str) -> None:
    from opreg._registry import op_overload  # _registry imports this module

    overload = op_overload(qualname)
    serial = _C.definition_serial(qualname)
    registered = _registered.get(id(overload))
    try:
        sharding = _C.describe_op(qualname).sharding
    except ValueError:
        return  # undefined meanwhile (by a C++ thread, say): it is registered when defined again
    if registered is None and sharding == _C.Sharding.NONE:
        return  # DTensor refuses the call, naming the op (or opreg's strategy says why, below)
    if registered is not None and registered[1] == serial:
        return
    from torch.distributed.tensor.experimental import register_sharding

    register_sharding(overload)(_strategy_for(qualname, overload))
    _registered[id(overload)] = (overload, serial)


def _strategy_for(qualname: str, overload: torch._ops.OpOverload) -> Callable[..., Any]:
    """The function registered for `overload`: it serves the op's current sharding."""

    def strategy(*args: Any, **kwargs: Any) -> list[tuple[list[Any], list[Any]]]:
        sharding = _C.describe_op(qualname).sharding
        if sharding == _C.Sharding.POINTWISE:
            return pointwise(qualname, overload, args, kwargs)
        if sharding == _C.Sharding.REPLICATE:
            return replicate(overload, args, kwargs)
        if sharding == _C.Sharding.PYTHON and qualname in _strategies:
            choices = _strategies[qualname](*args, **kwargs)
            _check_choices(qualname, overload, choices, len([*args, *kwargs.values()]))
            _check_placements(qualname, overload, choices, args, kwargs)
            return choices
        if sharding == _C.Sharding.PYTHON:
            raise NotImplementedError(
                f"opreg: op '{qualname}' declares a DTensor strategy function "
                "(Sharding::kPython), but none was given; pass it as sharding=fn to the Python "
                "front, see docs/distributed.md"
            )
        raise NotImplementedError(
            f"opreg: op '{qualname}' has no DTensor sharding strategy (its current definition "
            "declares none); declare one with sharding= (Python) or .sharding(...) (C++), see "
            "docs/distributed.md"
        )

    strategy.__name__ = f"opreg_sharding[{qualname}]"
    return strategy


def _check_choices(
    qualname: str, overload: torch._ops.OpOverload, choices: Any, arguments: int
) -> None:
    """A TypeError naming the op unless a strategy function's `choices` are what
    register_sharding takes: a non-empty list of (output placements, input placements) pairs,
    one placement (or None) per output and per argument. DTensor's own errors on other values
    name neither (``min() arg is an empty sequence``)."""
    from torch.distributed.tensor.placement_types import Placement

    def placements(value: Any, counts: tuple[int, ...]) -> bool:
        return (
            isinstance(value, list | tuple)
            and len(value) in counts
            and all(
                p is None
                or isinstance(p, Placement)
                or (isinstance(p, list | tuple) and all(isinstance(q, Placement) for q in p))
                for p in value
            )
        )

    outputs = len(overload._schema.returns)
    # One per argument the call passed, or one per argument of the schema (defaults left out),
    # as register_sharding takes either.
    counts = (arguments, len(overload._schema.arguments))
    if (
        not isinstance(choices, list | tuple)
        or not choices
        or not all(
            isinstance(c, list | tuple)
            and len(c) == 2
            and placements(c[0], (outputs,))
            and placements(c[1], counts)
            for c in choices
        )
    ):
        raise TypeError(
            f"opreg: op '{qualname}': its sharding strategy function returned "
            f"{type(choices).__name__} {choices!r:.100}, expected a non-empty list of "
            f"(output placements, input placements) pairs: {outputs} placements for the outputs "
            f"and {' or '.join(map(str, sorted(set(counts))))} for the arguments (None for one "
            "that is no tensor: one per argument the call passed, or per argument of the "
            "schema), as torch.distributed.tensor.experimental.register_sharding takes"
        )


def _check_placements(
    qualname: str,
    overload: torch._ops.OpOverload,
    choices: Any,
    args: Sequence[Any],
    kwargs: dict[str, Any],
) -> None:
    """A ValueError naming the op, the value and the placement unless each placement of the
    `choices` fits its value: a DTensor argument gets a placement, any other argument None, and
    Shard(d) has 0 <= d < ndim, for the outputs too (their ndim from a run on meta tensors).
    DTensor accepts a Shard of a dim an output lacks and returns a DTensor it cannot gather;
    for arguments its errors name nothing (``min() arg is an empty sequence``)."""
    names = [a.name for a in overload._schema.arguments][: len(args)] + list(kwargs)
    values = [*args, *kwargs.values()]
    aliased = {a.name for a in overload._schema.arguments if a.alias_info is not None}

    def check(what: str, placement: Any, ndim: int) -> None:
        if placement.is_shard() and not 0 <= placement.dim < ndim:
            raise ValueError(
                f"opreg: op '{qualname}': its sharding strategy function gave {placement!r} for "
                f"{what}, which has {ndim} dims; expected a dim from 0 to {ndim - 1} (DTensor "
                "takes no negative dim here)"
            )

    output_dims: list[int] | None = None
    for outputs, inputs in choices:
        # Placements past the arguments the call passed stand for defaults (None for a Tensor?
        # left out, as for one passed None: sweep 34 A-F1), as DTensor takes them.
        given = [*zip(names, values, strict=True)]
        given += [
            (a.name, a.default_value) for a in overload._schema.arguments if a.name not in names
        ]
        for (name, value), placement in zip(given, inputs, strict=False):
            if isinstance(placement, list | tuple) or isinstance(value, list | tuple):
                # A Tensor[] argument: DTensor checks its placements one by one.
                if name in aliased:
                    _check_aliased_list(qualname, name, value, placement)
                continue
            what = f"argument '{name}'"
            if _is_spec(value) and placement is None:
                raise ValueError(
                    f"opreg: op '{qualname}': its sharding strategy function gave None for "
                    f"{what}, a DTensor; give it a placement (Replicate() to gather it)"
                )
            if not _is_spec(value) and placement is not None:
                raise ValueError(
                    f"opreg: op '{qualname}': its sharding strategy function gave {placement!r} "
                    f"for {what}, which is no DTensor ({type(value).__name__}); give None there"
                )
            if placement is not None:
                check(what, placement, len(value.shape))
            if name in aliased:
                _check_aliased(qualname, what, value, placement)
        for index, placement in enumerate(outputs):
            if placement is None or isinstance(placement, list | tuple) or not placement.is_shard():
                continue
            if output_dims is None:
                output_dims = _output_dims(overload, args, kwargs)
            if index < len(output_dims) and output_dims[index] >= 0:
                check(f"output {index}", placement, output_dims[index])


def _check_aliased(qualname: str, what: str, value: Any, placement: Any) -> None:
    """A ValueError unless a DTensor argument the op writes or an output views keeps its
    placement: DTensor would redistribute it into a new tensor, and the write or the view would
    reach only that. DTensor applies each choice to every mesh dim and may combine choices across
    them, so the placement must be the argument's own on every mesh dim."""
    if not _is_spec(value) or all(own == placement for own in value.placements):
        return
    raise ValueError(
        f"opreg: op '{qualname}': its sharding strategy function gave {placement!r} for {what}, "
        f"which the op writes or an output views, a DTensor placed {tuple(value.placements)!r}: "
        "DTensor would redistribute it into a new tensor, and the write or the view would reach "
        "only that; give it its own placement (on a mesh of several dims, DTensor applies each "
        "choice to every mesh dim, so only an argument placed alike on each can be kept)"
    )


def _check_aliased_list(qualname: str, name: str, values: Any, placement: Any) -> None:
    """_check_aliased for each DTensor of a Tensor[] argument the op writes or an output views;
    `placement` is one for every element or a list of one per element."""
    if not isinstance(values, list | tuple):
        return
    for i, value in enumerate(values):
        if isinstance(placement, list | tuple):
            if i >= len(placement):
                break
            element = placement[i]
        else:
            element = placement
        if element is not None:
            _check_aliased(qualname, f"element {i} of argument '{name}'", value, element)


def _meta(value: Any) -> Any:
    """A DTensor argument's stand-in for a run on meta tensors; other values as they are."""
    if not _is_spec(value):
        return value
    return torch.empty(value.shape, dtype=value.tensor_meta.dtype, device="meta")


def _output_dims(
    overload: torch._ops.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]
) -> list[int]:
    """Each output's ndim (-1 for one that is no tensor), from a run of the op on meta tensors;
    none where the op cannot say so (symbolic sizes under compile, an op without a fake)."""
    if not all(isinstance(s, int) for v in args if _is_spec(v) for s in v.shape):
        return []
    try:
        result = overload(*map(_meta, args), **{k: _meta(v) for k, v in kwargs.items()})
    except Exception:
        return []
    results = result if isinstance(result, tuple | list) else (result,)
    return [r.dim() if isinstance(r, torch.Tensor) else -1 for r in results]


def _is_spec(value: Any) -> bool:
    """A DTensor argument as register_sharding passes it (a DTensorSpec: global shape and
    placements); tensors that are not DTensors do not come here."""
    return hasattr(value, "placements") and hasattr(value, "tensor_meta")


def replicate(
    overload: torch._ops.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]
) -> list[tuple[list[Any], list[Any]]]:
    """Gather every DTensor input; every rank computes the whole output."""
    from torch.distributed.tensor import Replicate

    values = [*args, *kwargs.values()]
    outputs = [Replicate()] * len(overload._schema.returns)
    return [(outputs, [Replicate() if _is_spec(v) else None for v in values])]


def pointwise(
    qualname: str, overload: torch._ops.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]
) -> list[tuple[list[Any], list[Any]]]:
    """Shard(d) of the broadcast output from Shard of the same dim of each input (Replicate for
    an input broadcast along d), or everything replicated; DTensor picks the cheapest."""
    from torch.distributed.tensor import Replicate, Shard

    values = [*args, *kwargs.values()]
    shape = torch.broadcast_shapes(*(v.shape for v in values if _is_spec(v)))
    _check_output_shape(qualname, overload, args, kwargs, shape)
    outputs = len(overload._schema.returns)
    choices = [([Replicate()] * outputs, [Replicate() if _is_spec(v) else None for v in values])]
    for dim in range(len(shape)):
        inputs: list[Any] = []
        for value in values:
            own = dim - (len(shape) - len(value.shape)) if _is_spec(value) else -1
            if not _is_spec(value):
                inputs.append(None)
            elif own >= 0 and value.shape[own] == shape[dim]:
                inputs.append(Shard(own))
            else:  # broadcast along dim: every rank needs all of it
                inputs.append(Replicate())
        choices.append(([Shard(dim)] * outputs, inputs))
    return choices


def _check_output_shape(
    qualname: str,
    overload: torch._ops.OpOverload,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    shape: torch.Size,
) -> None:
    """A pointwise op's outputs have its inputs' broadcast shape: an op declared pointwise whose
    output shape differs (e.g. `seeds -> (..., n)`) is refused here rather than sharded wrongly.
    Runs the op on meta tensors once per new input shape (DTensor caches the propagation)."""
    if not all(isinstance(size, int) for size in shape):
        return  # symbolic sizes (under compile): nothing to compare without a hint

    result = overload(*map(_meta, args), **{k: _meta(v) for k, v in kwargs.items()})
    results = result if isinstance(result, tuple | list) else (result,)
    for index, output in enumerate(results):
        if tuple(output.shape) != tuple(shape):
            raise ValueError(
                f"opreg: op '{qualname}': its DTensor sharding is declared pointwise, but "
                f"output {index} has shape "
                f"{list(output.shape)}, not its inputs' broadcast shape {list(shape)}, so the op "
                "is not elementwise; declare sharding='replicate', 'none' or a strategy function"
            )


def _forget_cached_propagations() -> None:
    """DTensor caches each op's sharding propagation by the op and its inputs' specs (one cache
    in C++, one in Python), and register_sharding clears neither: an op replaced with another
    sharding would keep its old one for inputs seen before. Clearing them takes torch
    internals (torch 2.13: the two functions below); tests/python/test_dtensor.py replaces an
    op's sharding after a call and fails if this stops working."""
    from torch.distributed.tensor import DTensor

    clear = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear is not None:
        clear()
    propagator = DTensor._op_dispatcher.sharding_propagator
    cached = getattr(propagator.propagate_op_sharding, "cache_clear", None)
    if cached is not None:
        cached()


# ---- waiting for torch.distributed.tensor ------------------------------------------------------


def install() -> None:
    """At ``import opreg``: register now if DTensor is imported, else once it is."""
    if _DTENSOR in sys.modules or torch.distributed.is_available():
        run_after_import(_DTENSOR, sync, "DTensor sharding strategies were not registered")
