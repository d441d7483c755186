"""vmap from the Python front: torch.library.register_vmap-style rules, and EvoX's ``vmap_fn``
at any depth through one companion op (``<name>_vmap``) defined together with the op."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.utils._pytree as pytree

from opreg._declaration import OpDeclaration
from opreg._public import public
from opreg._registry import op_overload


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


def explicit_rule(qualname: str, vmap: Callable[..., Any]) -> Callable[..., Any]:
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
        if not (out_dims is None or isinstance(out_dims, (int, tuple, list))):
            raise TypeError(
                f"opreg: op '{qualname}': its vmap rule returned out_dims {out_dims!r}; expected "
                "an int, None or one of them per output"
            )
        return outputs, _out_dims(out_dims, len(outputs))

    return rule


def vmap_fn_companion(
    qualname: str,
    signature: str,
    *,
    vmap_fn: Callable[..., Any],
    fake_vmap_fn: Callable[..., Any] | None,
    vmap_wrap_inputs: Callable[..., Any] | None,
    vmap_out_dims: Any,
    replace: bool,
    origin: str,
    random: bool = False,
) -> tuple[Callable[..., Any], OpDeclaration]:
    """EvoX's vmap_fn, at any depth, without one op per level: one companion op `<name>_vmap`
    runs vmap_fn on inputs with leading batch dims; the rule of both ops wraps the inputs of
    one more level and calls the companion again, so the innermost call sees every level.
    ``signature`` is the op's schema without its name (vmap_fn has the op's signature: EvoX's
    contract). Returns the rule and the companion's declaration (defined together with the op)."""
    wrap = vmap_wrap_inputs or default_vmap_wrap_inputs
    companion_name = qualname + "_vmap"
    companion: list[torch._ops.OpOverload] = []

    def rule(batch_size: int, randomness: str, in_dims: list[int | None], args: tuple):
        if random and randomness == "same":
            # vmap_fn computes the whole batch at once: nothing makes its draws repeat per example.
            raise RuntimeError(
                f"opreg: op '{qualname}': it is random and its vmap_fn draws for the whole "
                "batch, so torch.vmap's randomness='same' cannot be honoured; use "
                "randomness='different', or give the op a vmap rule"
            )
        if not companion:
            companion.append(op_overload(companion_name))
        wrapped = wrap(VmapInfo(batch_size, randomness), in_dims, *args)
        outputs = _as_tuple(companion[0](*wrapped))
        return outputs, _out_dims(vmap_out_dims, len(outputs))

    declaration = OpDeclaration(
        schema=companion_name + signature,
        fallback=vmap_fn,
        fallback_label="vmap_fn",
        fake=fake_vmap_fn,
        vmap=rule,
        replace=replace,
        origin=origin,
        kernel_status="vmap_fn serves every device",
        companion_of=qualname,
    )
    return rule, declaration
