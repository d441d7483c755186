"""vmap from the Python front: torch.library.register_vmap-style rules, and EvoX's ``vmap_fn``
at any depth through one companion op (``<name>_vmap``) defined together with the op."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.utils._pytree as pytree
from torch.autograd.forward_ad import _set_fwd_grad_enabled

from opreg import _C
from opreg._declaration import OpDeclaration
from opreg._public import public
from opreg._registry import op_overload


@public
class VmapInfo(NamedTuple):
    batch_size: int | torch.SymInt  # symbolic under tracing with a dynamic batch
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


class RuleShape(NamedTuple):
    """What a Python rule's call needs from the op's schema: the core passes every argument
    positionally and takes one value per return."""

    keyword_only: tuple[str, ...]
    num_returns: int
    single_list_return: bool  # one return, a list (Tensor[]): the rule's list is that output
    tensor_lists: tuple[bool, ...] = ()  # per argument: a Tensor[], Tensor?[] or Tensor[]?
    list_returns: tuple[bool, ...] = ()  # per return: whether it is a Tensor[]
    tensor_list_returns: tuple[bool, ...] = ()  # per return: whether it is a Tensor[] or Tensor?[]
    view_returns: tuple[bool, ...] = ()  # per return: whether the schema declares it an alias

    @classmethod
    def of(cls, schema: torch._C.FunctionSchema) -> RuleShape:
        returns = schema.returns
        return cls(
            keyword_only=tuple(a.name for a in schema.arguments if a.kwarg_only),
            num_returns=len(returns),
            single_list_return=len(returns) == 1 and isinstance(returns[0].type, torch.ListType),
            tensor_lists=tuple(
                str(a.type) in ("List[Tensor]", "List[Optional[Tensor]]", "Optional[List[Tensor]]")
                for a in schema.arguments
            ),
            list_returns=tuple(str(r.type) == "List[Tensor]" for r in returns),
            tensor_list_returns=tuple(
                str(r.type) in ("List[Tensor]", "List[Optional[Tensor]]") for r in returns
            ),
            view_returns=tuple(r.alias_info is not None for r in returns),
        )

    def split(self, args: Sequence[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        count = len(args) - len(self.keyword_only)
        return tuple(args[:count]), dict(zip(self.keyword_only, args[count:], strict=True))

    def outputs(self, value: Any) -> tuple[Any, ...]:
        """The op's outputs from what a rule or vmap_fn returned, as the op returns them: None
        (or nothing) for an op without outputs, the value itself for one output (a list too,
        for a Tensor[] output), one value per output otherwise."""
        if self.num_returns == 0 and (value is None or _empty_sequence(value)):
            return ()
        if self.num_returns == 1:
            one = (
                isinstance(value, (tuple, list)) and len(value) == 1 and not self.single_list_return
            )
            return (value[0],) if one else (value,)
        return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _empty_sequence(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and len(value) == 0


def _out_dims(out_dims: int | Sequence[int | None], count: int) -> tuple[int | None, ...]:
    if isinstance(out_dims, int) or out_dims is None:
        return (out_dims,) * count
    return tuple(out_dims)


def _check_vmap_fn_batch(
    qualname: str, outputs: Sequence[Any], out_dims: Sequence[int | None], batch_size: int
) -> None:
    """vmap_fn's outputs hold the batch where vmap_out_dims says: the op's vmap checks say so
    too, but of "the vmap rule", which a vmap_fn's user never wrote (sweep 43 A-F3)."""
    for index, (output, dim) in enumerate(zip(outputs, out_dims, strict=False)):
        if not isinstance(output, torch.Tensor) or not isinstance(dim, int):
            continue  # the op's checks say what is wrong with it
        if not -output.dim() <= dim < output.dim():
            raise RuntimeError(
                f"{qualname}: its vmap_out_dims gives dim {dim} for output {index}, which its "
                f"vmap_fn returned with {output.dim()} dims"
            )
        if output.shape[dim] != batch_size:
            raise RuntimeError(
                f"{qualname}: its vmap_fn returned output {index} with {output.shape[dim]} "
                f"entries along dim {dim} (its vmap_out_dims), expected the batch size "
                f"{batch_size}: vmap_fn computes every example of the batch at once"
            )


def explicit_rule(qualname: str, vmap: Callable[..., Any], shape: RuleShape) -> Callable[..., Any]:
    """torch.library.register_vmap's signature: vmap(info, in_dims, *args, **kwargs) ->
    (output, out_dims), with in_dims for the positional arguments and keyword-only ones passed by
    name (the op's definition refuses keyword-only tensors with a rule, as torch does)."""

    def rule(batch_size: int, randomness: str, in_dims: list[int | None], args: tuple):
        positional, keyword_only = shape.split(args)
        info = VmapInfo(batch_size, randomness)
        # A Tensor[] argument's in_dims entry is one per tensor (None for a None), as torch
        # gives it; a Tensor[]? given None has one entry, None.
        nested = tuple(
            [None if t is None else dim for t in arg] if is_list and arg is not None else dim
            for arg, dim, is_list in zip(positional, in_dims, shape.tensor_lists, strict=False)
        )
        result = vmap(info, nested, *positional, **keyword_only)
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise TypeError(
                f"opreg: op '{qualname}': its vmap rule must return (outputs, out_dims), got "
                f"{type(result).__name__}"
            )
        outputs, out_dims = result
        outputs = shape.outputs(outputs)
        for index, (value, is_list) in enumerate(zip(outputs, shape.list_returns, strict=False)):
            if is_list and not isinstance(value, (tuple, list)):
                raise TypeError(
                    f"opreg: op '{qualname}': its vmap rule returned a {type(value).__name__} "
                    f"for output {index}, declared Tensor[] in the schema; expected a list of "
                    "tensors"
                )
        if not (out_dims is None or isinstance(out_dims, (int, tuple, list))):
            raise TypeError(
                f"opreg: op '{qualname}': its vmap rule returned out_dims {out_dims!r}; expected "
                "an int, None or one of them per output"
            )
        if shape.num_returns == 1 and isinstance(out_dims, (tuple, list)):
            if len(out_dims) == 1:  # one output's out_dims may come in a sequence of one
                out_dims = out_dims[0]
            if shape.single_list_return and isinstance(out_dims, (tuple, list)):
                out_dims = (out_dims,)  # a dim per tensor of the one output
        out_dims = _out_dims(out_dims, len(outputs))
        if not any(isinstance(dims, (tuple, list)) for dims in out_dims):
            return outputs, out_dims
        per_output = [
            _one_dim(qualname, index, value, dims, batch_size)
            if is_list and isinstance(dims, (tuple, list))
            else (value, dims)
            for index, (value, dims, is_list) in enumerate(
                zip(outputs, out_dims, shape.list_returns, strict=False)
            )
        ]
        return tuple(value for value, _ in per_output), tuple(dim for _, dim in per_output)

    return rule


def _one_dim(
    qualname: str, index: int, tensors: Sequence[Any], dims: Sequence[Any], batch_size: Any
) -> tuple[Sequence[Any], int | None]:
    """torch's out_dims for a Tensor[] output may give each tensor its own dim (None: unbatched);
    the core takes one dim for the whole list, so when they differ, each tensor gets the batch at
    dim 0 (an unbatched one expanded, a view), which is what torch.vmap gives the caller."""
    if len(dims) != len(tensors) or not all(
        d is None or (isinstance(d, int) and not isinstance(d, bool)) for d in dims
    ):
        raise TypeError(
            f"opreg: op '{qualname}': its vmap rule returned out_dims {dims!r} for output {index}, "
            f"a list of {len(tensors)} tensors; expected an int, None or one of them per tensor"
        )
    if len(set(dims)) <= 1:
        return tensors, dims[0] if dims else 0
    # Checked here, with the dims as the rule gave them: the core sees only dim 0.
    for position, (t, d) in enumerate(zip(tensors, dims, strict=True)):
        if not (isinstance(t, torch.Tensor) and d is not None):
            continue
        if not -t.dim() <= d < t.dim() or t.shape[d] != batch_size:
            raise TypeError(
                f"opreg: op '{qualname}': its vmap rule returned out_dims {dims!r} for output "
                f"{index}, but its tensor {position} of shape {tuple(t.shape)} has no dim {d} "
                f"of the batch size {batch_size}"
            )
    # Anything but a tensor is left for the core to refuse, naming it.
    return [
        t
        if not isinstance(t, torch.Tensor)
        else t.unsqueeze(0).expand(batch_size, *t.shape)
        if d is None
        else t.movedim(d, 0)
        for t, d in zip(tensors, dims, strict=True)
    ], 0


def check_rule_arguments(qualname: str, keyword: str, schema: torch._C.FunctionSchema) -> None:
    """A keyword-only tensor has no in_dims entry in a rule's call (torch.library's register_vmap
    refuses such ops too): refused at definition, naming the argument."""
    for argument in schema.arguments:
        if argument.kwarg_only and "Tensor" in str(argument.type):
            raise ValueError(
                f"opreg: op '{qualname}': {keyword} gets in_dims for positional arguments only, "
                f"but the tensor argument '{argument.name}' is keyword-only; make it positional "
                "in the schema, or vmap the op another way (vmap_fn, batch_polymorphic)"
            )


def _per_example(
    qualname: str, shape: RuleShape, batch_size: int, in_dims: Sequence[int | None], args: tuple
) -> tuple[tuple[Any, ...], tuple[int | None, ...]]:
    """The op called once per example, below this vmap level: each call records the op's own
    backward, as the eager call does."""
    op = op_overload(qualname)
    per_example = []
    for index in range(batch_size):
        example = [
            a
            if d is None
            else pytree.tree_map_only(torch.Tensor, lambda t, d=d, i=index: t.select(d, i), a)
            for a, d in zip(args, in_dims, strict=True)
        ]
        positional, keyword_only = shape.split(example)
        per_example.append(shape.outputs(op(*positional, **keyword_only)))
    outputs = tuple(
        _stack_examples(qualname, f"output {index}", list(values), is_list)
        for index, (values, is_list) in enumerate(
            zip(zip(*per_example, strict=True), shape.tensor_list_returns, strict=True)
        )
    )
    return outputs, tuple(
        0 if isinstance(o, torch.Tensor) or is_list else None
        for o, is_list in zip(outputs, shape.tensor_list_returns, strict=True)
    )


def _stack_examples(qualname: str, what: str, values: list[Any], is_list: bool) -> Any:
    """As the C++ loop does (src/core/vmap.cpp): tensors stacked, a list's tensors each on its
    own (None where every example gives None), any other value kept when every example gives
    it and refused otherwise."""
    first = values[0]
    if is_list:
        for index, value in enumerate(values):
            if len(value) != len(first):
                raise RuntimeError(
                    f"{qualname}: {what} holds {len(first)} tensors for example 0 and "
                    f"{len(value)} for example {index}, which vmap cannot batch"
                )
        return [
            _stack_examples(qualname, f"{what} element {e}", [v[e] for v in values], False)
            for e in range(len(first))
        ]
    if isinstance(first, torch.Tensor):
        for index, value in enumerate(values):
            if not isinstance(value, torch.Tensor):
                raise RuntimeError(
                    f"{qualname}: {what} is a tensor for some examples and not for others "
                    f"({_kind(value)}), which vmap cannot batch"
                )
            if value.shape != first.shape:
                raise RuntimeError(
                    f"{qualname}: {what} has shape {list(first.shape)} for example 0 and "
                    f"{list(value.shape)} for example {index}, which vmap cannot batch (it "
                    "stacks the examples' outputs)"
                )
        return torch.stack(values)
    for value in values:
        if isinstance(value, torch.Tensor) or not _same_value(value, first):
            raise RuntimeError(
                f"{qualname}: {what} ({_kind(first)}) differs between examples, and vmap "
                "batches only tensors"
            )
    return first


def _kind(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def _same_value(value: Any, first: Any) -> bool:
    """Equality in which NaN equals NaN, in lists too: the examples agree on it."""
    if isinstance(value, (list, tuple)) and isinstance(first, (list, tuple)):
        return len(value) == len(first) and all(map(_same_value, value, first))
    return value == first or (_is_nan(value) and _is_nan(first))


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


class _Pinned:
    """The serial of the companion's definition a vmap_fn's rule serves (0 until both are
    defined): state of this process, not of the code, so no part of torch.compile's keys."""

    __slots__ = ("serial",)
    opreg_process_state = True  # the compile key's mark

    def __init__(self) -> None:
        self.serial = 0


def vmap_fn_companion(
    qualname: str,
    signature: str,
    shape: RuleShape,
    *,
    vmap_fn: Callable[..., Any],
    fake_vmap_fn: Callable[..., Any] | None,
    vmap_wrap_inputs: Callable[..., Any] | None,
    vmap_out_dims: Any,
    replace: bool,
    origin: str,
    autograd: str = "fallback",
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

    def rule(
        batch_size: int, randomness: str, in_dims: list[int | None], args: tuple, _plain=False
    ):
        if random and randomness == "same":
            # vmap_fn computes the whole batch at once: nothing makes its draws repeat per example.
            raise RuntimeError(
                f"opreg: op '{qualname}': it is random and its vmap_fn draws for the whole "
                "batch, so torch.vmap's randomness='same' cannot be honoured; use "
                "randomness='different', or give the op a vmap rule"
            )
        if autograd != "fallback" and not _plain:
            # Note [Gradients through vmap] (src/core/vmap.cpp): vmap_fn stands for the fallback.
            tensors = [t for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor)]
            reverse, forward = _C.gradients_below(tensors)
            if autograd == "error" and (reverse or forward):
                raise RuntimeError(
                    f"{qualname}: under vmap, an input "
                    f"{'requires grad' if reverse else 'has a forward-mode tangent'}, but the op "
                    "has no backward and its autograd policy is 'error'; give it a backward "
                    "(backward=), or use the 'fallback' policy"
                )
            if autograd == "none" and (reverse or forward):
                with torch.no_grad(), _set_fwd_grad_enabled(False):
                    return rule(batch_size, randomness, in_dims, args, _plain=True)
            # A batch of no examples has none to call: vmap_fn's empty outputs keep the graph.
            if autograd == "backward" and reverse and batch_size > 0:
                if any(shape.view_returns):
                    output = shape.view_returns.index(True)
                    raise RuntimeError(
                        f"{qualname}: under vmap, an input requires grad, and the op's backward "
                        "needs it called once per example, whose outputs are stacked into new "
                        f"tensors; but its schema declares output {output} a view of an input, "
                        "which they cannot stay; give the op a vmap rule"
                    )
                # Called by name once per example: a replace racing the loop would mix two
                # definitions in one result.
                check_pinned()
                result = _per_example(qualname, shape, batch_size, in_dims, args)
                check_pinned()
                return result
        if not companion:
            companion.append(op_overload(companion_name))
        wrapped = wrap(VmapInfo(batch_size, randomness), in_dims, *args)
        if not isinstance(wrapped, (tuple, list)) or len(wrapped) != len(args):
            got = (
                f"{len(wrapped)} values"
                if isinstance(wrapped, (tuple, list))
                else type(wrapped).__name__
            )
            raise TypeError(
                f"opreg: op '{qualname}': its vmap_wrap_inputs must return a tuple of "
                f"{len(args)} values, one per argument; it returned {got}"
            )
        positional, keyword_only = shape.split(wrapped)
        check_pinned()
        serial = pinned.serial or _C.definition_serial(companion_name)
        try:
            outputs = shape.outputs(companion[0](*positional, **keyword_only))
        except RuntimeError as error:  # the companion undefined by a racing replace: say that
            if _C.definition_serial(companion_name) != serial:
                raise RuntimeError(replaced_while_called) from error
            raise
        check_pinned()
        out_dims = _out_dims(vmap_out_dims, len(outputs))
        _check_vmap_fn_batch(qualname, outputs, out_dims, batch_size)
        return outputs, out_dims

    # The op and its companion are two definitions: a call that started with this rule and
    # would reach another definition's companion (a replace raced it) refuses, not mixes them.
    pinned = _Pinned()

    replaced_while_called = (
        f"opreg: op '{qualname}' was replaced (or undefined) while this vmapped call ran, and the "
        "call would mix two definitions; call it again"
    )

    def check_pinned() -> None:
        if pinned.serial and _C.definition_serial(companion_name) != pinned.serial:
            raise RuntimeError(replaced_while_called)

    def pin() -> None:
        """Called once the op and this companion are defined."""
        pinned.serial = _C.definition_serial(companion_name)

    rule.pin = pin
    rule.opreg_piece = "the vmap_fn"  # what errors' notes call it

    declaration = OpDeclaration(
        schema=companion_name + signature,
        fallback=vmap_fn,
        fallback_label="vmap_fn",
        fallback_words=f"the vmap_fn of {qualname}",
        fake=fake_vmap_fn,
        vmap=rule,
        replace=replace,
        origin=origin,
        kernel_status="vmap_fn serves every device",
        companion_of=qualname,
    )
    return rule, declaration
