"""opreg.opcheck: one call checks everything an op promises, on each sample and device.

Checks: torch.library.opcheck's own tests; every kernel against the fallback (equal when the op
declares bitwise, else within the C++ core's per-dtype tolerance, opreg::testing::tolerance); fake
against real (shapes, dtypes, strides, devices; a vmap_fn op's fake_vmap_fn too); gradcheck in
float64 and the kernel path's gradients against the fallback's; vmap against a loop of single calls
(each combination of batched arguments, depths 1 to 3); torch.compile(fullgraph=True) against
eager, with dynamic shapes; on CUDA, a CUDA graph's replay with new input values against eager
(cuda_graph), and a call on a side stream whose inputs are still being written there (stream).
Checks that do not apply to an op are reported as skipped, with the reason.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import re
import sys
import types
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode

from opreg import _C
from opreg._declaration import check_positional, registration_of
from opreg._fork import new_rlock
from opreg._public import public
from opreg._registry import AutogradSupport, check_text, describe_op, op_namespace

CHECKS = (
    "torch_opcheck",
    "kernel_vs_fallback",
    "fake_vs_real",
    "gradients",
    "vmap",
    "compile",
    "cuda_graph",
    "stream",
)

# The C++ core's names of dtypes (c10::ScalarType), as describe_op's dtypes give them.
_DTYPES = {
    "Float": torch.float32,
    "Double": torch.float64,
    "Half": torch.float16,
    "BFloat16": torch.bfloat16,
    "ComplexHalf": torch.complex32,
    "ComplexFloat": torch.complex64,
    "ComplexDouble": torch.complex128,
    "Byte": torch.uint8,
    "Char": torch.int8,
    "Short": torch.int16,
    "Int": torch.int32,
    "Long": torch.int64,
    "UInt16": torch.uint16,
    "UInt32": torch.uint32,
    "UInt64": torch.uint64,
    "Bool": torch.bool,
    **{
        name: getattr(torch, name.lower())
        for name in ("Float8_e5m2", "Float8_e4m3fn", "Float8_e5m2fnuz", "Float8_e4m3fnuz")
        if hasattr(torch, name.lower())
    },
}


@public
@dataclass
class Sample:
    """Arguments of one call, positional then keyword."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    label: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.args, list):
            self.args = tuple(self.args)
        if not isinstance(self.args, tuple):
            raise TypeError(
                "opreg.Sample: args must be a tuple of the op's positional arguments, got "
                f"{type(self.args).__name__} (one argument x is written (x,))"
            )
        if not isinstance(self.kwargs, dict) or not all(isinstance(k, str) for k in self.kwargs):
            raise TypeError(
                "opreg.Sample: kwargs must be a dict of the op's keyword arguments by name, got "
                f"{type(self.kwargs).__name__}"
            )
        if not isinstance(self.label, str):
            raise TypeError(f"opreg.Sample: label must be a str, got {type(self.label).__name__}")
        # A report naming the sample must print (sweep 33 A-F5: UnicodeEncodeError then).
        check_text("opreg.Sample", "label", self.label)


@public
@dataclass
class CheckRow:
    check: str
    op: str
    device: str
    sample: str
    passed: bool
    max_error: float = 0.0
    message: str = ""
    skipped: bool = False  # the check does not apply (message says why); passed is True


@public
class OpcheckError(AssertionError):
    """Raised by opreg.opcheck when a check fails; the message names each failure."""


class _Skipped(Exception):
    """Raised by a check that does not apply to the op or the sample; the message says why."""


@public
@dataclass
class OpcheckReport:
    rows: list[CheckRow]

    @property
    def failures(self) -> list[CheckRow]:
        return [r for r in self.rows if not r.passed]

    def __str__(self) -> str:
        lines = [f"{'check':20} {'device':8} {'sample':28} {'result':6} {'max error':>10}"]
        for r in self.rows:
            status = "skip" if r.skipped else "pass" if r.passed else "FAIL"
            lines.append(
                f"{r.check:20} {r.device:8} {r.sample[:28]:28} {status:6} "
                f"{r.max_error:10.3g}" + (f"  {r.message}" if r.message else "")
            )
        return "\n".join(lines)


# ---- samples from the schema ------------------------------------------------------------------


def _declared_dtypes(op_name: str) -> dict[str, list[torch.dtype]]:
    declared = {}
    for arg, dtypes in describe_op(op_name).dtypes:
        unknown = [d for d in dtypes if d not in _DTYPES]
        if unknown:
            raise TypeError(
                f"opreg.opcheck: op '{op_name}' declares dtype {unknown[0]} for argument "
                f"'{arg}', of which opcheck cannot make random samples; pass samples="
            )
        declared[arg] = [_DTYPES[d] for d in dtypes]
    return declared


def _random_tensor(shape: Sequence[int], dtype: torch.dtype, device: str) -> torch.Tensor:
    if dtype.is_complex:
        return torch.randn(shape, device=device, dtype=torch.complex128).to(dtype)
    if dtype.is_floating_point:
        return torch.randn(shape, device=device).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, device=device) > 0.5
    info = torch.iinfo(dtype)  # drawn as int64: randint has no kernel for some unsigned types
    low, high = max(info.min, -(2**62)), min(info.max, 2**62)
    return torch.randint(low, high, shape, dtype=torch.int64, device=device).to(dtype)


def _takes_tensors(op: torch._ops.OpOverload) -> bool:
    return any(str(a.type).startswith("Tensor") for a in op._schema.arguments)


_ENUM_SAMPLES = {
    "ScalarType": torch.float32,
    "Layout": torch.strided,
    "MemoryFormat": torch.contiguous_format,
}


def _scalar_value(op: torch._ops.OpOverload, arg: Any, ints: int) -> Any:
    """A value for a non-tensor argument: its default, else `ints` for ints, 0.75, True."""
    type_name = str(arg.type)
    if arg.has_default_value():  # None too (`float? eps=None`)
        return arg.default_value
    if str(arg.real_type) in _ENUM_SAMPLES:  # its type reads as int: not any int is one
        return _ENUM_SAMPLES[str(arg.real_type)]
    if type_name in ("int", "SymInt"):
        return ints
    if type_name in ("float", "bool"):
        return 0.75 if type_name == "float" else True
    raise TypeError(
        f"opreg.opcheck: {op._schema.name}: cannot generate a value for argument '{arg.name}' "
        f"of '{op._schema}'; pass samples= or register_samples()"
    )


def _scalar_samples(op: torch._ops.OpOverload) -> list[Sample]:
    """An op without tensor arguments: one sample per int value 0, 1 and 5."""
    samples = []
    for n in (0, 1, 5):
        args, kwargs = [], {}
        for arg in op._schema.arguments:
            value = _scalar_value(op, arg, n)
            (kwargs.__setitem__(arg.name, value) if arg.kwarg_only else args.append(value))
        samples.append(Sample(tuple(args), kwargs, f"ints = {n}"))
    return samples


def _overload(api: str, op: Any) -> torch._ops.OpOverload:
    if isinstance(op, torch._library.custom_ops.CustomOpDef):  # torch.library.custom_op's
        op = op._opoverload
    if isinstance(op, torch._ops.OpOverloadPacket):
        op = op.default
    if not isinstance(op, torch._ops.OpOverload):
        raise TypeError(
            f"{api}: op must be an op (torch.ops.<namespace>.<name>, or what "
            f"register_triton_op or custom_op returns), got {type(op).__name__}"
        )
    return op


# Samples registered for ops whose arguments the schema cannot describe (ranks and sizes that
# must agree), by qualified name: opcheck uses them when it is given none.
_REGISTERED_SAMPLES: dict[str, Callable[[str], Iterable[Sample | tuple]]] = {}


@public
def register_samples(op: Any, samples: Callable[[str], Iterable[Sample | tuple]]) -> None:
    """The samples :func:`opreg.opcheck` (and ``python3 -m opreg check``) uses for ``op`` when it
    is given none: ``samples(device)`` returns them (``opreg.Sample`` or argument tuples) on that
    device. For ops whose arguments must agree in ways the schema does not say."""
    op = _overload("opreg.register_samples", op)
    describe_op(_qualified(op))  # an op opreg defines (its error says so), as opcheck needs
    if not callable(samples):
        raise TypeError(
            f"opreg.register_samples: {_qualified(op)}: samples must be a function of the device "
            f"returning samples, got {type(samples).__name__}"
        )
    check_positional(_qualified(op), "samples", samples, ["device"])
    _REGISTERED_SAMPLES[_qualified(op)] = samples


def _default_samples(op: torch._ops.OpOverload, device: str) -> list[Sample]:
    registered = _REGISTERED_SAMPLES.get(_qualified(op))
    if registered is None:
        return generate_samples(op, device)
    try:
        given = registered(device)
        wrong_kind = isinstance(given, str | torch.Tensor | Sample)
        wrong_kind = wrong_kind or not isinstance(given, Iterable)
        samples = [] if wrong_kind else list(given)
    except Exception as error:
        raise RuntimeError(
            f"opreg.opcheck: {_qualified(op)}: its registered samples function raised on "
            f"{device}: {type(error).__name__}: {error}"
        ) from error
    if wrong_kind:
        raise TypeError(
            f"opreg.opcheck: {_qualified(op)}: its registered samples function must return a "
            f"list of opreg.Sample or of argument tuples, got {type(given).__name__}"
        )
    if not samples:
        raise ValueError(
            f"opreg.opcheck: {_qualified(op)}: its registered samples function gave no sample "
            f"on {device}"
        )
    return [_as_sample(op, sample, index) for index, sample in enumerate(samples)]


def generate_samples(op: torch._ops.OpOverload, device: str) -> list[Sample]:
    """Random samples from the schema: sizes 0, 1 and odd, a non-contiguous and an offset view,
    every dtype the op declares (float32 and float64 otherwise); for ops without tensor
    arguments, ints 0, 1 and 5."""
    if not _takes_tensors(op):
        return _scalar_samples(op)
    schema = op._schema
    declared = _declared_dtypes(
        schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
    )
    layouts = [
        ("size 0", (0,), None),
        ("size 1", (1,), None),
        ("odd 5x7", (5, 7), None),
        ("transposed 7x5", (5, 7), "t"),
        ("offset view 33", (34,), "offset"),
    ]
    dtype_sets = set()
    for arg in schema.arguments:
        dtype_sets.update(declared.get(arg.name, []))
    dtypes = sorted(dtype_sets, key=str) or [torch.float32, torch.float64]
    samples = []
    for (label, shape, view), dtype in itertools.product(layouts, dtypes):
        args, kwargs = [], {}
        for arg in schema.arguments:
            type_name = str(arg.type)
            if type_name.startswith("Tensor"):
                arg_dtype = (
                    dtype if dtype in declared.get(arg.name, [dtype]) else declared[arg.name][0]
                )
                value = _random_tensor(shape, arg_dtype, device)
                if view == "t":
                    value = value.t()
                elif view == "offset":
                    value = value[1:]
            else:
                value = _scalar_value(op, arg, 5)
            (kwargs.__setitem__(arg.name, value) if arg.kwarg_only else args.append(value))
        samples.append(Sample(tuple(args), kwargs, f"{label} {str(dtype).removeprefix('torch.')}"))
    return samples


# ---- helpers ----------------------------------------------------------------------------------


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _outputs(tree: Any) -> list[Any]:
    """An op's outputs, flat: tensors and numbers (an op returning () gives none)."""
    return [leaf for leaf in pytree.tree_leaves(tree) if leaf is not None]


def _clone(sample: Sample, *, detach: bool = False) -> Sample:
    """Copies of the sample's values; `detach`: tensors out of autograd (the gradients check needs
    them in), each with its sample's layout (strides, offset, the memory it shares with another
    argument), as opreg::testing::check makes them: a kernel that reads a layout wrongly must
    meet the sample's own."""
    copies: dict[tuple[int, torch.device], torch.UntypedStorage] = {}

    def same_layout(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.layout != torch.strided or tensor.is_meta or tensor.is_nested:
            return tensor.detach().clone()
        storage = tensor.untyped_storage()
        key = (storage.data_ptr(), tensor.device)
        if key not in copies:
            copies[key] = storage.clone()
        same = torch.empty(0, dtype=tensor.dtype, device=tensor.device).set_(
            copies[key], tensor.storage_offset(), tensor.shape, tensor.stride()
        )
        same = same.conj() if tensor.is_conj() else same
        return torch._neg_view(same) if tensor.is_neg() else same

    def clone(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return copy.copy(value)
        return same_layout(value) if detach else value.clone()

    return Sample(
        pytree.tree_map(clone, sample.args), pytree.tree_map(clone, sample.kwargs), sample.label
    )


def _wide(tensor: torch.Tensor) -> torch.Tensor:
    """For comparing values: complex128 for complex tensors (.double() drops the imaginary
    part), float64 otherwise."""
    return tensor.to(torch.complex128) if tensor.is_complex() else tensor.double()


def _max_error(got: Any, want: Any) -> float:
    errors = [0.0]
    for a, b in zip(_tensors(got), _tensors(want), strict=True):
        if a.numel():
            errors.append((_wide(a) - _wide(b).to(a.device)).abs().nan_to_num(0).max().item())
    return max(errors)


def _call_fallback(op: torch._ops.OpOverload, sample: Sample) -> Any:
    outputs = _C.call_fallback(_qualified(op), list(sample.args), sample.kwargs)
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def _qualified(op: torch._ops.OpOverload) -> str:
    schema = op._schema
    return schema.name + (f".{schema.overload_name}" if schema.overload_name else "")


def _differentiable_tensor(value: Any) -> bool:
    """A tensor with a derivative: floating or complex (gradcheck takes complex as PyTorch's
    autograd does, by Wirtinger calculus)."""
    return isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex())


def _to_double(sample: Sample) -> Sample:
    def up(t):
        if not _differentiable_tensor(t):
            return t
        return t.to(torch.complex128) if t.is_complex() else t.double()

    return Sample(
        pytree.tree_map(up, sample.args), pytree.tree_map(up, sample.kwargs), sample.label
    )


def _tolerance(dtype: torch.dtype, bitwise: bool) -> tuple[float, float]:
    """(atol, rtol) of kernel_vs_fallback: the C++ core's table, so both languages agree."""
    return (0.0, 0.0) if bitwise else tuple(_C.testing_tolerance(dtype))


# ---- the checks -------------------------------------------------------------------------------


# torch.library.opcheck's default test_utils.
_TORCH_OPCHECK_TESTS = (
    "test_schema",
    "test_autograd_registration",
    "test_faketensor",
    "test_aot_dispatch_dynamic",
)


def _check_torch_opcheck(op, sample, device):
    tests = _TORCH_OPCHECK_TESTS
    note = ""
    if _returns_str(op):  # AOTAutograd compares outputs as tensors: a str meets an assert
        tests = tuple(t for t in tests if t != "test_aot_dispatch_dynamic")
        note = " (test_aot_dispatch_dynamic skipped: AOTAutograd does not trace str outputs)"
    elif _returns_alias(op):
        tests = tuple(t for t in tests if t != "test_aot_dispatch_dynamic")
        note = f" (test_aot_dispatch_dynamic skipped: {_ALIASED_OUTPUT})"
        if _views_list_elements(op):
            tests = tuple(t for t in tests if t != "test_schema")
            note = (
                f" (test_aot_dispatch_dynamic skipped: {_ALIASED_OUTPUT}; test_schema: "
                f"{_LIST_ALIAS}, so opreg checks the writes alone)"
            )
    results = torch.library.opcheck(
        op, sample.args, sample.kwargs, test_utils=tests, raise_exception=False
    )
    failed = {k: v for k, v in results.items() if v != "SUCCESS"}
    if "test_schema" not in tests and (written := _undeclared_write(op, sample)):
        failed["test_schema"] = f"Argument {written} is not defined as mutable but was mutated"
    return (not failed, 0.0, "; ".join(f"{k}: {v}" for k, v in failed.items()) + note)


def _values_comparable(op) -> bool:
    """Random ops give other values on every call: only their metadata can be compared."""
    return not describe_op(_qualified(op)).flags["random"]


def _same_value(a: Any, b: Any) -> bool:
    """Non-tensor outputs alike: equal, NaN where the other is NaN (a float, or in a list)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(map(_same_value, a, b))
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    if isinstance(a, complex) and isinstance(b, complex):
        return _same_value(a.real, b.real) and _same_value(a.imag, b.imag)
    return type(a) is type(b) and a == b


def _compared_values(op, sample: Sample, outputs: Any) -> list[tuple[str, Any]]:
    """(what, value) for each output, then each tensor of the arguments the op wrote."""
    compared = [(f"output {index}", value) for index, value in enumerate(_outputs(outputs))]
    for name, value in zip(_written_arguments(op), _written(op, sample), strict=True):
        written = _outputs(value)
        compared += [
            (f"argument '{name}'" + (f"[{i}]" if len(written) > 1 else "") + " (written)", v)
            for i, v in enumerate(written)
        ]
    return compared


def _count_difference(op, got: Any, want: Any) -> str:
    """Which output holds another number of values than the fallback's (a list's elements)."""
    single = len(op._schema.returns) == 1
    for index, (a, b) in enumerate(zip(*((o,) if single else o for o in (got, want)), strict=True)):
        if len(_outputs(a)) != len(_outputs(b)):
            return (
                f"output {index} has {len(_outputs(a))} values, the fallback's {len(_outputs(b))}"
            )
    return f"{len(_outputs(got))} values, the fallback gives {len(_outputs(want))}"


def _nested_components(got: list, want: list) -> tuple[list, str]:
    """(what, kernel's, fallback's) for each value compared, a nested tensor's components one by
    one; or why the two cannot be compared so."""
    pairs = []
    for (what, a), (_, b) in zip(got, want, strict=True):
        nested = [isinstance(value, torch.Tensor) and value.is_nested for value in (a, b)]
        if not any(nested):
            pairs.append((what, a, b))
            continue
        if not all(nested):
            kinds = ["a nested tensor" if n else "not nested" for n in nested]
            return [], f"{what} is {kinds[0]}, the fallback's {kinds[1]}"
        if a.layout != b.layout:
            return [], f"{what} has layout {a.layout}, the fallback's {b.layout}"
        components = a.unbind(), b.unbind()
        if len(components[0]) != len(components[1]):
            counts = [len(c) for c in components]
            return [], f"{what} has {counts[0]} components, the fallback's {counts[1]}"
        pairs += [
            (f"{what} component {i}", *pair) for i, pair in enumerate(zip(*components, strict=True))
        ]
    return pairs, ""


def _check_kernel_vs_fallback(op, sample, device):
    report = describe_op(_qualified(op))
    # A sample that requires grad would send the call to the fallback (autograd="fallback"),
    # which would then be compared with itself.
    called, by_fallback = _clone(sample, detach=True), _clone(sample, detach=True)
    got_outputs = op(*called.args, **called.kwargs)
    want_outputs = _call_fallback(op, by_fallback)
    got = _compared_values(op, called, got_outputs)
    want = _compared_values(op, by_fallback, want_outputs)
    if len(got) != len(want):
        return False, 0.0, _count_difference(op, got_outputs, want_outputs)
    pairs, why = _nested_components(got, want)
    if why:
        return False, 0.0, why
    error = 0.0
    for what, a, b in pairs:
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            if not _same_value(a, b):
                return False, error, f"{what} is {a!r}, the fallback's {b!r}"
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            return (
                False,
                error,
                f"{what} is {a.dtype}{tuple(a.shape)}, the fallback's {b.dtype}{tuple(b.shape)}",
            )
        if a.layout != b.layout:
            return False, error, f"{what} has layout {a.layout}, the fallback's {b.layout}"
        if a.is_quantized and b.is_quantized:  # by the values they stand for
            a, b = a.dequantize(), b.dequantize()
        if a.is_quantized or b.is_quantized:
            why = "which the checks do not compare with a plain one"
            return False, error, f"{what} is a quantized tensor, {why}"
        if a.layout != torch.strided:  # a sparse tensor: its values, where it stores none as 0
            a, b = a.to_dense(), b.to_dense()
        error = max(error, _max_error(a, b))
        if report.flags["random"] or not a.numel():
            continue
        b = b.to(a.device)
        if (a.is_floating_point() or a.is_complex()) and not torch.equal(a.isnan(), b.isnan()):
            return False, error, f"{what} has NaN at other positions than the fallback's"
        atol, rtol = _tolerance(a.dtype, report.flags["bitwise"])
        close = torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
        if close.all():
            if not report.flags["bitwise"] or _same_zero_signs(a, b):
                continue
            why = "has -0.0 where the fallback's has +0.0, or the reverse (the op declares bitwise)"
            return False, error, f"{what} {why}"
        # Where a value is infinite the difference is no number (inf+1j against inf+0j: NaN), and
        # the largest difference says nothing; the first such element is shown instead.
        infinite_apart = ((a.isinf() | b.isinf()) & ~close).flatten()
        if not report.flags["bitwise"] and infinite_apart.any():
            flat = int(infinite_apart.nonzero()[0, 0])
            index = [int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape)]
            got, want = a.flatten()[flat].item(), b.flatten()[flat].item()
            why = "a difference where a value is infinite"
            return False, error, f"{what} at index {index} is {got}, the fallback's {want} ({why})"
        if report.flags["bitwise"]:
            why = "is not bitwise equal to the fallback's (the op declares bitwise)"
        elif atol == rtol == 0:
            why = f"({a.dtype}) is not equal to the fallback's"
        else:
            why = (
                f"differs from the fallback's by up to {error:.3g}, more than atol {atol:g} + "
                f"rtol {rtol:g} * |fallback| ({a.dtype})"
            )
        return False, error, f"{what} {why}"
    return True, error, ""


def _same_zero_signs(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values of a bitwise op's outputs have one sign too: -0.0 == +0.0 in isclose, not in
    bits. NaN positions (equal already) are left out: NaN's sign bit is no result."""
    if not (a.is_floating_point() or a.is_complex()):
        return True
    a, b = (torch.view_as_real(t) if t.is_complex() else t for t in (a, b))
    numbers = ~a.isnan()
    return torch.equal(a.signbit() & numbers, b.signbit() & numbers)


def _unbacked(value: Any) -> bool:
    """A size the fake made data-dependent (get_ctx().new_dynamic_size()): any real one fits."""
    if not isinstance(value, torch.SymInt):
        return False
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return bool(free_unbacked_symbols(value))


def _kind(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return "a tensor"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)}"
    return "a number" if isinstance(value, int | float | torch.SymInt | torch.SymFloat) else "other"


def _compare_fake(op, fake: Any, real: Any, what: str) -> tuple[bool, float, str]:
    # Each declared output's kind first: a Tensor? the fake leaves None (or a Tensor[] of another
    # length) would otherwise shift the flat comparison below onto other outputs.
    count = len(op._schema.returns)
    fakes, reals = ((fake,), (real,)) if count == 1 else (fake or (), real or ())
    for index, (f, r) in enumerate(zip(fakes, reals, strict=False)):
        if _kind(f) != _kind(r):
            return (
                False,
                0.0,
                f"{what}output {index} ({op._schema.returns[index].type}): the fake gives "
                f"{_kind(f)}, the real op {_kind(r)}",
            )
    for index, (f, r) in enumerate(zip(_outputs(fake), _outputs(real), strict=False)):
        if not isinstance(r, torch.Tensor) and not _unbacked(f) and not _same_value(f, r):
            return False, 0.0, f"{what}output {index}: the fake gives {f!r}, the real op {r!r}"
    for index, (f, r) in enumerate(zip(_tensors(fake), _tensors(real), strict=True)):
        if f.dim() != r.dim():
            return (
                False,
                0.0,
                f"{what}output {index}: the fake has {f.dim()} dims, the real {r.dim()}",
            )
        shape = tuple(
            r_size if _unbacked(f_size) else f_size
            for f_size, r_size in zip(f.shape, r.shape, strict=True)
        )
        for kind, fv, rv in (
            ("shape", shape, tuple(r.shape)),
            ("dtype", f.dtype, r.dtype),
            ("device", f.device, r.device),
            ("layout", f.layout, r.layout),
        ):
            if fv != rv:
                return False, 0.0, f"{what}output {index}: the fake's {kind} is {fv}, the real {rv}"
        if r.layout != torch.strided:  # no strides
            continue
        strides_known = not any(_unbacked(size) for size in (*f.shape, *f.stride()))
        # The stride of a dim of size 1 moves to no element.
        laid_out = [
            (fs, rs) for fs, rs, n in zip(f.stride(), r.stride(), r.shape, strict=True) if n > 1
        ]
        if strides_known and r.numel() > 1 and any(fs != rs for fs, rs in laid_out):
            return (
                False,
                0.0,
                f"{what}output {index}: the fake's strides are {f.stride()}, "
                f"the real ones {r.stride()}",
            )
    return True, 0.0, ""


def _run_fake(fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    # A ShapeEnv lets a data-dependent fake make its sizes; the inputs' sizes stay static. Imported
    # here: it brings in sympy, a second of `import opreg` that only opcheck needs.
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv(), static_shapes=True)
    fake_args, fake_kwargs = pytree.tree_map_only(torch.Tensor, mode.from_tensor, (args, kwargs))
    with mode:
        return fn(*fake_args, **fake_kwargs)


def _check_fake_vs_real(op, sample, device):
    real = op(*_clone(sample).args, **_clone(sample).kwargs)
    cloned = _clone(sample)
    result = _compare_fake(op, _run_fake(op, cloned.args, cloned.kwargs), real, "")
    registration = registration_of(_qualified(op))
    if not result[0] or getattr(registration, "companion", None) is None:
        return result
    # A vmap_fn op's batched calls reach its fake_vmap_fn under tracing: compared as the op's
    # fake is, on the sample with every positional tensor batched, once and nested (one
    # fake_vmap_fn serves every depth, seeing all batch dims in front).
    if not op._schema.returns or _non_tensor_returns(op):
        return result  # torch.vmap maps only functions returning tensors
    if not any(isinstance(a, torch.Tensor) for a in sample.args):
        return result
    in_dims = tuple(0 if isinstance(a, torch.Tensor) else None for a in sample.args)
    for depth in (1, 2):
        batched = list(_clone(sample).args)
        vmapped = lambda *a, **k: op(*a, **k)  # noqa: E731
        for _ in range(depth):
            batched = [_batch(a, 2) for a in batched]
            vmapped = torch.vmap(
                vmapped, in_dims=in_dims, out_dims=_out_dims(real), randomness="different"
            )
        cloned = _clone(Sample(tuple(batched), sample.kwargs))
        real_batched = vmapped(*cloned.args, **cloned.kwargs)
        cloned = _clone(Sample(tuple(batched), sample.kwargs))
        what = f"under {'nested ' * (depth - 1)}vmap (fake_vmap_fn), "
        try:
            fake = _run_fake(vmapped, cloned.args, cloned.kwargs)
        except Exception as error:
            return False, 0.0, f"{what}the fake run failed: {type(error).__name__}: {error}"
        result = _compare_fake(op, fake, real_batched, what)
        if not result[0]:
            return result
    return result


def _differentiable(op) -> bool:
    autograd = describe_op(_qualified(op)).autograd
    return autograd not in (AutogradSupport.NONE, AutogradSupport.ERROR)


def _cuda_devices_of(tensors: Sequence[torch.Tensor]) -> list[int]:
    return sorted({t.device.index or 0 for t in tensors if t.device.type == "cuda"})


def _signed_weights(output: torch.Tensor, index: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(index)
    return torch.randn(output.shape, generator=generator, dtype=torch.float64).to(output.device)


def _weighted_sum(output: torch.Tensor, index: int) -> torch.Tensor:
    """A real number that every element of `output` reaches, with its own weight (the real and
    imaginary parts of a complex output with different ones: a conjugated gradient differs)."""
    if output.is_complex():
        parts = torch.view_as_real(output.to(torch.complex128))
        return (parts * _signed_weights(parts, index)).sum()
    return (output.double() * _signed_weights(output, index)).sum()


def _lacks_double(names: Sequence[str], complex_: bool) -> bool:
    """Whether declared dtypes `names` hold a floating (complex_: complex) one but not its
    64-bit kind, which gradcheck needs."""
    kind = (lambda d: d.is_complex) if complex_ else (lambda d: d.is_floating_point)
    double = "ComplexDouble" if complex_ else "Double"
    return double not in names and any(name in _DTYPES and kind(_DTYPES[name]) for name in names)


_WIDE_DTYPES = (torch.float64, torch.complex128)


def _check_gradients(op, sample, device):
    if not _differentiable(op) or not any(map(_differentiable_tensor, _tensors(sample.args))):
        raise _Skipped("not differentiable")
    if not op._schema.returns:
        raise _Skipped("no outputs (an in-place op)")
    outputs = _tensors(op(*_clone(sample).args, **_clone(sample).kwargs))
    if not any(map(_differentiable_tensor, outputs)):
        raise _Skipped("no floating outputs (nothing to differentiate)")
    if any(o.is_nested for o in outputs):  # PyTorch's "NestedTensorImpl doesn't support sizes"
        raise _Skipped("a nested output, which torch.autograd.gradcheck does not take")
    double = _to_double(_clone(sample))
    inputs = [t for t in _tensors(double.args) if _differentiable_tensor(t) and t.numel()]
    for t in inputs:
        t.requires_grad_(True)
    if not inputs:
        raise _Skipped("no floating inputs")
    flat, spec = pytree.tree_flatten(double.args)

    random = not _values_comparable(op)
    # Arguments declared with floating (or complex) dtypes, their 64-bit kind not among them.
    no_double = [
        f"'{arg}' does not take {'complex128' if complex_ else 'float64'}"
        for arg, names in describe_op(_qualified(op)).dtypes
        for complex_ in (False, True)
        if _lacks_double(names, complex_)
    ]

    def fn(*diff):
        it = iter(diff)  # cloned: an op that mutates an input must not write into a leaf
        leaves = [
            next(it).clone() if isinstance(x, torch.Tensor) and x.requires_grad else x for x in flat
        ]
        with contextlib.ExitStack() as stack:
            if random:
                # A random op is a function of its inputs once its draws are fixed: every
                # evaluation of gradcheck starts from the same seed.
                stack.enter_context(torch.random.fork_rng(devices=_cuda_devices_of(inputs)))
                torch.manual_seed(0)
            out = op(*pytree.tree_unflatten(leaves, spec), **double.kwargs)
        # Only what has a derivative: a (Tensor, int) op's int is no output of gradcheck's.
        return tuple(o for o in _tensors(out) if _differentiable_tensor(o))

    # gradcheck needs float64 outputs too: an op whose output dtype comes from an argument (a
    # cast) keeps it, and gets the comparison below alone.
    if not no_double:
        with torch.no_grad():
            probe = _tensors(op(*_clone(double).args, **_clone(double).kwargs))
        narrow = [
            o.dtype for o in probe if _differentiable_tensor(o) and o.dtype not in _WIDE_DTYPES
        ]
        if narrow:
            no_double = [f"an output is {narrow[0]} with float64 inputs"]
    # gradcheck needs float64; an op that refuses it gets the comparison below alone.
    gradcheck_note = ""
    if no_double:
        gradcheck_note = f"gradcheck skipped: {no_double[0]}"
    else:
        try:
            torch.autograd.gradcheck(fn, tuple(inputs), raise_exception=True, fast_mode=True)
        except Exception as error:
            return False, 0.0, f"gradcheck: {str(error).splitlines()[0]}"
    if random:  # the kernel draws other numbers than the fallback: nothing to compare
        if no_double:
            raise _Skipped(f"{gradcheck_note}, and a random op's kernel draws its own numbers")
        return True, 0.0, "gradcheck with fixed draws; kernel vs fallback not comparable (random)"
    # The kernel path's gradients against the fallback's (PyTorch's autograd of its ATen ops).
    kernel_inputs = [
        t.detach().clone().requires_grad_(True)
        for t in _tensors(sample.args)
        if _differentiable_tensor(t) and t.numel()
    ]
    fallback_inputs = [t.detach().clone().requires_grad_(True) for t in kernel_inputs]

    def run(call, ins):
        it = iter(ins)  # cloned: an op that mutates an input must not write into a leaf
        leaves = [
            next(it).clone() if _differentiable_tensor(x) and x.numel() else x
            for x in pytree.tree_flatten(sample.args)[0]
        ]
        out = call(pytree.tree_unflatten(leaves, pytree.tree_flatten(sample.args)[1]))
        # Weights of both signs, the same for both paths: with all-positive grad_outputs (ones,
        # as gradcheck's fast mode also draws) a backward taking grad.abs() passed (seen).
        total = sum(
            _weighted_sum(o, index)
            for index, o in enumerate(_tensors(out))
            if _differentiable_tensor(o)
        )
        if not isinstance(total, torch.Tensor) or not total.requires_grad:
            return (None,) * len(ins)  # outputs not connected to the inputs: no gradient flows
        return torch.autograd.grad(total, ins, allow_unused=True)

    kernel_grads = run(lambda args: op(*args, **sample.kwargs), kernel_inputs)
    fallback_grads = run(
        lambda args: _C.call_fallback(_qualified(op), list(args), sample.kwargs), fallback_inputs
    )
    # An input the fallback reaches outside autograd (numpy) has no gradient of the fallback's
    # to compare the op's with: taken for zeros, a right backward failed, saying only that they
    # differ. gradcheck checks the op's backward for it against the op's own numbers.
    unconnected = [
        index
        for index, (kg, fg) in enumerate(zip(kernel_grads, fallback_grads, strict=True))
        if fg is None and kg is not None
    ]
    error = 0.0
    for index, (kg, fg, t) in enumerate(
        zip(kernel_grads, fallback_grads, kernel_inputs, strict=True)
    ):
        if (kg is None and fg is None) or index in unconnected:
            continue
        kg = torch.zeros_like(t) if kg is None else kg
        error = max(error, _max_error(kg, fg))
        if not torch.allclose(_wide(kg), _wide(fg), rtol=1e-3, atol=1e-4):
            return (
                False,
                error,
                f"the op's gradients differ from the fallback's: tensor input #{index}'s by up to "
                f"{error:.3g}",
            )
    if not unconnected:
        return True, error, gradcheck_note
    if len(unconnected) == len(kernel_inputs):
        why = (
            "the fallback's outputs are not connected to its inputs (computed outside autograd), "
            "so the op's backward has no gradient of the fallback's to be compared with"
        )
    else:
        why = (
            f"the fallback's outputs are not connected to tensor input "
            f"{', '.join(f'#{index}' for index in unconnected)} (computed outside autograd, or "
            "not used), so the op's gradient for it has none of the fallback's to be compared with"
        )
    if gradcheck_note:  # nothing checked the backward there
        raise _Skipped(f"{gradcheck_note}, and {why}")
    return True, error, f"{why}; gradcheck checked it"


def _batch(value: Any, size: int) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    if value.is_floating_point():  # drawn in float32: randn has no float8 kernel
        draws = [torch.randn(value.shape, device=value.device) for _ in range(size - 1)]
        return torch.stack([value] + [d.to(value.dtype) for d in draws])
    # Integer tensors are often indices: the other examples hold the same values, moved around,
    # so that every one stays valid (value + i went out of bounds).
    flat = value.flatten()
    return torch.stack([flat.roll(i).reshape(value.shape) for i in range(size)])


def _tensor_list(value: Any) -> bool:
    """A Tensor[] or Tensor?[] argument holding a tensor: vmap batches it as a whole."""
    return (
        isinstance(value, (list, tuple))
        and any(isinstance(t, torch.Tensor) for t in value)
        and all(t is None or isinstance(t, torch.Tensor) for t in value)
    )


def _check_vmap(op, sample, device, depths=(1, 2, 3)):
    positions = [
        i for i, a in enumerate(sample.args) if isinstance(a, torch.Tensor) or _tensor_list(a)
    ]
    if not positions:
        raise _Skipped("no tensor arguments")
    if not op._schema.returns:
        raise _Skipped("no outputs (an in-place op)")
    other = _non_tensor_returns(op)
    if other:
        raise _Skipped(f"returns {', '.join(other)}: torch.vmap maps only functions of tensors")
    out_dims = _out_dims(op(*_clone(sample).args, **_clone(sample).kwargs))
    error = 0.0
    # An argument the op writes must be batched whenever another is: vmap cannot write a batch
    # into one example's tensor (torch refuses it for its own in-place ops too).
    written = {
        i
        for i, a in enumerate(op._schema.arguments[: len(sample.args)])
        if a.alias_info is not None and a.alias_info.is_write and i in positions
    }  # a written Tensor? given None, or an empty list, is not written
    # The batch in front at every depth, and once as the last dim: a rule must honour in_dims.
    layouts = [(depth, 0) for depth in depths] + [(1, -1)]
    for depth, batch_dim in layouts:
        for mask in itertools.product((True, False), repeat=len(positions)):
            batched_positions = {p for p, m in zip(positions, mask, strict=True) if m}
            if not batched_positions or not written <= batched_positions:
                continue
            args = list(_clone(sample).args)
            in_dims = [None] * len(args)
            for pos, batched in zip(positions, mask, strict=True):
                if batched:
                    for _ in range(depth):
                        args[pos] = pytree.tree_map_only(
                            torch.Tensor,
                            lambda t, b=batch_dim: _batch(t, 2).movedim(0, b),
                            args[pos],
                        )
                    in_dims[pos] = batch_dim
            fn = lambda *a: op(*a, **sample.kwargs)  # noqa: E731
            randomness = "error" if _values_comparable(op) else "different"
            # torch.vmap takes no in_dim for a None in a Tensor?[]: such a list gets one per entry.
            vmap_in_dims = tuple(
                type(a)(None if e is None else d for e in a)
                if d is not None and _tensor_list(a) and any(e is None for e in a)
                else d
                for a, d in zip(args, in_dims, strict=True)
            )
            for _ in range(depth):
                fn = torch.vmap(fn, in_dims=vmap_in_dims, out_dims=out_dims, randomness=randomness)
            # The op may write its arguments: each run gets its own.
            looped_args = pytree.tree_map_only(torch.Tensor, torch.Tensor.clone, args)
            got = fn(*args)

            def loop(level_args, level, in_dims=tuple(in_dims)):
                if level == 0:
                    return op(*level_args, **sample.kwargs)
                outs = [
                    loop(
                        [
                            a
                            if d is None
                            else pytree.tree_map_only(
                                torch.Tensor, lambda t, d=d, i=i: t.select(d, i), a
                            )
                            for a, d in zip(level_args, in_dims, strict=True)
                        ],
                        level - 1,
                    )
                    for i in range(2)
                ]
                return pytree.tree_map(
                    lambda *xs: None if xs[0] is None else torch.stack(xs), *outs
                )

            want = loop(looped_args, depth)
            # What the op wrote is compared too, as its outputs are.
            got = (got, [args[i] for i in sorted(written)])
            want = (want, [looped_args[i] for i in sorted(written)])
            where = (
                f"vmap depth {depth}, batched arguments "
                f"{[p for p, m in zip(positions, mask, strict=True) if m]}"
                f"{' (batch as the last dim)' if batch_dim else ''}"
            )
            got_tensors, want_tensors = _tensors(got), _tensors(want)
            if len(got_tensors) != len(want_tensors):
                return (
                    False,
                    error,
                    f"{where}: the vmapped call gave {len(got_tensors)} tensors, a loop of "
                    f"single calls {len(want_tensors)}",
                )
            for g, w in zip(got_tensors, want_tensors, strict=True):
                if g.shape != w.shape or g.dtype != w.dtype:
                    return (
                        False,
                        error,
                        f"{where} differ from a loop of single calls: a tensor of shape "
                        f"{list(g.shape)} and dtype {g.dtype}, the loop's {list(w.shape)} and "
                        f"{w.dtype}",
                    )
            error = max(error, _max_error(got, want))
            for g, w in zip(got_tensors, want_tensors, strict=True):
                values_differ = _values_comparable(op) and not torch.allclose(
                    _wide(g), _wide(w), rtol=1e-4, atol=1e-5, equal_nan=True
                )
                if values_differ:
                    return False, error, f"{where} differ from a loop of single calls"
    return True, error, ""


def _non_tensor_returns(op) -> list[str]:
    """The op's outputs that are not a Tensor, a Tensor? or a Tensor[] (which vmap maps)."""
    tensor_like = ("Tensor", "Optional[Tensor]", "List[Tensor]")
    return [str(r.type) for r in op._schema.returns if str(r.type) not in tensor_like]


def _out_dims(outputs: Any) -> Any:
    """torch.vmap's out_dims for an op whose call gave `outputs`: 0 for each, None for a Tensor?
    output that is None (vmap refuses a batch dim for it)."""
    if isinstance(outputs, tuple):
        return tuple(None if o is None else 0 for o in outputs)
    return None if outputs is None else 0


def _returns_str(op) -> bool:
    return any(re.search(r"\bstr\b", str(r.type)) for r in op._schema.returns)


# AOTAutograd's functionalization refuses a custom op whose outputs alias its inputs ("Found a
# custom (non-ATen) operator whose output has alias annotations"), torch.library's ops alike.
_ALIASED_OUTPUT = "an output aliasing an input, which AOTAutograd does not take from a custom op"


def _returns_alias(op) -> bool:
    return any(r.alias_info is not None for r in op._schema.returns)


# PyTorch's schema check reads an argument's own alias sets, not its elements' (`Tensor(a)[] xs`
# holds them on its element type): it took a declared view of xs[0] for an undeclared alias,
# torch.library's ops alike.
_LIST_ALIAS = (
    "PyTorch's schema check reads no Tensor(a)[] element's alias set, and takes a declared view "
    "of an element for an undeclared alias"
)


def _views_list_elements(op) -> bool:
    """Whether an output is declared a view of a Tensor(a)[] element: its alias set is none of
    the arguments' own (a list argument holds its sets on its element type, which Python does
    not show)."""
    own = set().union(*(a.alias_info.before_set for a in op._schema.arguments if a.alias_info))
    lists = any(a.alias_info and isinstance(a.type, torch.ListType) for a in op._schema.arguments)
    return lists and any(
        r.alias_info and not r.alias_info.before_set <= own for r in op._schema.returns
    )


def _undeclared_write(op, sample: Sample) -> str | None:
    """The name of an argument the op changed without declaring the write (Tensor(a!)), as
    PyTorch's schema check tells, on a copy of the sample; None if there is none."""
    copy = _clone(sample)
    names = [a.name for a in op._schema.arguments]
    values = dict(zip(names, copy.args, strict=False)) | copy.kwargs
    declared = {a.name for a in op._schema.arguments if a.alias_info and a.alias_info.is_write}
    before = {
        name: [(t, t.detach().clone()) for t in _tensors(value)]
        for name, value in values.items()
        if name not in declared
    }
    op(*copy.args, **copy.kwargs)
    for name, tensors in before.items():
        if not all(_unchanged(old, now) for now, old in tensors):
            return name
    return None


def _unchanged(old: torch.Tensor, now: torch.Tensor) -> bool:
    if old.shape != now.shape or old.layout != now.layout or old.dtype != now.dtype:
        return False
    if old.layout != torch.strided or old.is_meta:
        return True  # no values to compare cheaply
    if old.stride() != now.stride():
        return False
    same = old == now
    if old.is_floating_point() or old.is_complex():
        same |= old.isnan() & now.isnan()
    return bool(same.all())


def _check_compile(op, sample, device, backend="aot_eager"):
    other = _non_tensor_returns(op)
    # Dynamo refuses ("torch.* op returned non-Tensor") an op with a str anywhere in its outputs,
    # and one whose one output is an integer (an int?, a bool, a ScalarType, Layout or
    # MemoryFormat too); a float, an int[], or an integer beside a tensor, it traces.
    integers = ("int", "SymInt", "bool", "ScalarType", "Layout", "MemoryFormat")
    alone = len(op._schema.returns) == 1 and other
    if _returns_str(op) or (alone and other[0].removeprefix("Optional[").rstrip("]") in integers):
        raise _Skipped(
            f"returns {', '.join(other)}: Dynamo cannot put a custom op's non-tensor outputs in "
            "a full graph"
        )
    if _returns_alias(op):
        raise _Skipped(_ALIASED_OUTPUT)
    eager = op(*_clone(sample).args, **_clone(sample).kwargs)
    error = 0.0
    for dynamic in (False, True):
        compiled = torch.compile(
            _fresh_code(lambda *a, **k: op(*a, **k)),
            fullgraph=True,
            dynamic=dynamic,
            backend=backend,
        )
        got = compiled(*_clone(sample).args, **_clone(sample).kwargs)
        error = max(error, _max_error(got, eager))
        for g, e in zip(_tensors(got), _tensors(eager), strict=True):
            if g.shape != e.shape or (
                _values_comparable(op)
                and not torch.allclose(_wide(g), _wide(e), rtol=1e-5, atol=1e-6, equal_nan=True)
            ):
                return (
                    False,
                    error,
                    (f"torch.compile(fullgraph=True, dynamic={dynamic}) output differs from eager"),
                )
        numbers = [
            [v for v in _outputs(out) if not isinstance(v, torch.Tensor)] for out in (got, eager)
        ]
        if _values_comparable(op) and not _same_value(numbers[0], numbers[1]):
            return (
                False,
                error,
                f"torch.compile(fullgraph=True, dynamic={dynamic}) gives the non-tensor outputs "
                f"{numbers[0]}, eager {numbers[1]}",
            )
    return True, error, ""


def _fresh_code(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with a code object of its own. torch.compile keeps compiled code per code object, so
    each check compiles afresh; torch._dynamo.reset() would too, but it drops every thread's
    compiled code, and the user's threads running compiled code then crashed (sweep 33 B-F3)."""
    return types.FunctionType(
        fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )


# CUDA graphs and streams. Note [Checking stream use]: a kernel must run on PyTorch's current
# stream. A launch on another stream is a race that usually goes unseen, so the stream check
# makes it visible: the inputs are written on a side stream behind a long pending computation,
# poisoned until then, and the op is called on that side stream without waiting. A kernel on the
# side stream reads the values; one on another stream reads the poison.


def _needs_cuda(device: str) -> None:
    if torch.device(device).type != "cuda":
        raise _Skipped("needs a CUDA device")


def _new_values(tensor: torch.Tensor) -> torch.Tensor:
    """Other values of the kind the op was given: fresh random floats, the same integers (or
    booleans) in another order, so that they stay values the op accepts."""
    if tensor.is_floating_point() or tensor.is_complex():
        return _random_tensor(tensor.shape, tensor.dtype, tensor.device)
    flat = tensor.reshape(-1)
    return flat[torch.randperm(flat.numel(), device=tensor.device)].reshape(tensor.shape)


def _poison(tensor: torch.Tensor) -> None:
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.fill_(float("nan"))
    elif tensor.dtype == torch.bool:
        tensor.logical_not_()
    else:
        tensor.fill_(-1)


def _compare_outputs(op, got: Any, want: Any, what: str) -> tuple[bool, float, str]:
    """The op against itself on the same values: equal within kernel_vs_fallback's tolerance
    (exactly, for an op that declares bitwise), NaN where NaN."""
    got, want = _outputs(got), _outputs(want)
    tensors = lambda values: [v for v in values if isinstance(v, torch.Tensor)]  # noqa: E731
    error = _max_error(tensors(got), tensors(want))
    bitwise = describe_op(_qualified(op)).flags["bitwise"]
    for index, (g, w) in enumerate(zip(got, want, strict=True)):
        if not isinstance(g, torch.Tensor):
            same = g == w
        elif g.shape != w.shape or g.dtype != w.dtype:
            same = False
        elif not _values_comparable(op) or not g.numel():
            same = True
        else:
            atol, rtol = _tolerance(g.dtype, bitwise)
            same = bool(
                torch.isclose(g, w.to(g.device), rtol=rtol, atol=atol, equal_nan=True).all()
            )
        if not same:
            return False, error, f"output {index}: {what} differs from eager on the same inputs"
    return True, error, ""


def _written_arguments(op) -> list[str]:
    return [
        a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write
    ]


def _written(op, sample: Sample) -> list[Any]:
    """The values of the arguments the op writes, by the schema's alias annotations."""
    names = [a.name for a in op._schema.arguments]
    values = dict(zip(names, sample.args, strict=False)) | sample.kwargs
    return [values.get(name) for name in _written_arguments(op)]


def _check_cuda_graph(op, sample, device):
    _needs_cuda(device)
    if describe_op(_qualified(op)).flags["cuda_graph_unsafe"]:
        raise _Skipped("the op declares cuda_graph_unsafe")
    static = _clone(sample)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up first, as torch.cuda.graphs asks
        for _ in range(2):
            op(*_clone(static).args, **_clone(static).kwargs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = op(*static.args, **static.kwargs)
    inputs = _tensors((static.args, static.kwargs))
    with torch.no_grad():
        for tensor in inputs:
            if tensor.numel():
                tensor.copy_(_new_values(tensor))
    fresh = _clone(static)  # the new values, before the replay writes any mutated input
    graph.replay()
    torch.cuda.synchronize()
    eager = op(*fresh.args, **fresh.kwargs)
    passed, error, message = _compare_outputs(op, captured, eager, "the graph's replay")
    for name, replayed, called in zip(
        _written_arguments(op), _written(op, static), _written(op, fresh), strict=True
    ):
        if passed and not _compare_outputs(op, replayed, called, "")[0]:
            passed, message = False, f"argument '{name}' (written by the op): the graph's replay "
            message += "leaves other values in it than eager does"
    return passed, error, message


def _check_stream(op, sample, device):
    _needs_cuda(device)
    want = op(*_clone(sample).args, **_clone(sample).kwargs)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        given = _clone(sample)  # on the side stream: the buffers belong to it
        sources = [t.clone() for t in _tensors((given.args, given.kwargs))]
        for tensor in _tensors((given.args, given.kwargs)):
            _poison(tensor)
        # Long enough that a kernel on another stream runs before the values below arrive.
        pending = torch.randn(2048, 2048, device=device)
        for _ in range(8):
            pending = torch.tanh(pending @ pending)
        for tensor, source in zip(_tensors((given.args, given.kwargs)), sources, strict=True):
            tensor.copy_(source)
        got = op(*given.args, **given.kwargs)
    side.synchronize()
    return _compare_outputs(op, got, want, "a call on a side stream")


_RUNNERS: dict[str, Callable[..., tuple[bool, float, str]]] = {
    "torch_opcheck": _check_torch_opcheck,
    "kernel_vs_fallback": _check_kernel_vs_fallback,
    "fake_vs_real": _check_fake_vs_real,
    "gradients": _check_gradients,
    "vmap": _check_vmap,
    "compile": _check_compile,
    "cuda_graph": _check_cuda_graph,
    "stream": _check_stream,
}


def _devices(devices: Iterable[str] | None) -> list[tuple[str, str]]:
    """(device, why it cannot be checked here or ""); ValueError for what is not a device."""
    if devices is None:
        return [("cpu", "")] + ([("cuda", "")] if torch.cuda.is_available() else [])
    if isinstance(devices, str | torch.device):
        devices = [devices]
    if not isinstance(devices, Iterable):
        raise TypeError(
            "opreg.opcheck: devices must be a device name or a list of them (e.g. ['cpu', "
            f"'cuda']), got {type(devices).__name__}"
        )
    checked = []
    for given in devices:
        try:
            device = torch.device(given)
        except (RuntimeError, TypeError, ValueError):
            raise ValueError(
                f"opreg.opcheck: devices: {given!r} is not a device (expected names like "
                "'cpu', 'cuda' or 'cuda:1')"
            ) from None
        if device.type == "meta":
            raise ValueError(
                "opreg.opcheck: devices: 'meta' holds no values to compare, so no check could "
                "fail there; the fake is checked on every device given (e.g. ['cpu', 'cuda'])"
            )
        checked.append((str(given), _unavailable(device)))
    if not checked:
        raise ValueError(
            "opreg.opcheck: devices= is empty, so nothing would be checked; name at least one "
            "device (e.g. ['cpu']), or leave devices out for the CPU and CUDA when there is one"
        )
    return checked


def _unavailable(device: torch.device) -> str:
    """Why no tensor can be made on `device` in this process, or ""."""
    if device.type in ("cpu", "meta"):
        return ""
    module = getattr(torch, device.type, None)
    if module is None or not hasattr(module, "is_available"):
        # A type PyTorch names but serves with no backend here (hpu, lazy, ipu, ...): a tensor
        # there says whether it works.
        try:
            torch.empty(0, device=device)
        except Exception as error:  # ModuleNotFoundError, NotImplementedError, RuntimeError
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            return f"no {device.type} device here ({type(error).__name__}: {first[:160]})"
        return ""
    if not module.is_available():
        return f"no {device.type} device (torch.{device.type}.is_available() is False)"
    count = module.device_count() if hasattr(module, "device_count") else None
    if device.index is not None and count is not None and device.index >= count:
        return f"{device} does not exist ({count} {device.type} device(s))"
    return ""


def _as_sample(op: torch._ops.OpOverload, given: Any, index: int) -> Sample:
    """`given` as a Sample whose arguments fit the schema; TypeError naming the sample if not."""
    name = _qualified(op)
    if isinstance(given, Sample):
        sample = given
    elif isinstance(given, tuple | list):
        sample = Sample(tuple(given), {}, f"#{index}")
    else:
        raise TypeError(
            f"opreg.opcheck: {name}: samples[{index}] must be an opreg.Sample or a tuple of "
            f"arguments, got {type(given).__name__} {given!r}"
        )
    leaves = pytree.tree_leaves((sample.args, sample.kwargs))
    if any(isinstance(value, torch.Tensor) and value.is_meta for value in leaves):
        raise ValueError(
            f"opreg.opcheck: {name}: samples[{index}] holds meta tensors; opcheck runs the op on "
            "real data (and its fake on fake copies), so give tensors on a real device"
        )
    arguments = op._schema.arguments
    positional = [a.name for a in arguments if not a.kwarg_only]
    if len(sample.args) > len(positional):
        raise TypeError(
            f"opreg.opcheck: {name}: samples[{index}] gives {len(sample.args)} positional "
            f"arguments, the op takes {len(positional)} ({', '.join(positional)})"
        )
    given_names = set(positional[: len(sample.args)]) | set(sample.kwargs)
    unknown = sorted(set(sample.kwargs) - {a.name for a in arguments})
    missing = [a.name for a in arguments if a.name not in given_names and not a.has_default_value()]
    if unknown or missing:
        raise TypeError(
            f"opreg.opcheck: {name}: samples[{index}] "
            + (f"names no argument {unknown}" if unknown else f"lacks arguments {missing}")
            + f" (the schema: {op._schema})"
        )
    return sample


def _to_device(sample: Sample, device: str) -> Sample:
    move = lambda t: t.to(device) if isinstance(t, torch.Tensor) else t  # noqa: E731
    return Sample(
        pytree.tree_map(move, sample.args), pytree.tree_map(move, sample.kwargs), sample.label
    )


@public
def opcheck(
    op: Any,
    samples: Iterable[Sample | tuple] | None = None,
    *,
    devices: Iterable[str] | None = None,
    checks: Iterable[str] = CHECKS,
    raise_on_failure: bool = True,
    progress: Callable[[str], None] | None = None,
) -> OpcheckReport:
    """Check an opreg op on every sample and device; raise OpcheckError naming each failure.

    ``samples``: ``opreg.Sample(args, kwargs)`` or argument tuples; when omitted, those of
    :func:`opreg.register_samples`, else generated from the schema (sizes 0, 1 and odd,
    non-contiguous and offset views, declared dtypes).
    """
    op = _overload("opreg.opcheck", op)
    name = _qualified(op)
    if not isinstance(checks, str | Iterable):
        raise TypeError(
            f"opreg.opcheck: {name}: checks must be a check's name or a list of them (known: "
            f"{CHECKS}), got {type(checks).__name__}"
        )
    checks = (checks,) if isinstance(checks, str) else tuple(checks)
    if not checks:
        raise ValueError(
            f"opreg.opcheck: {name}: checks= is empty, so nothing would be checked; name at "
            f"least one of {CHECKS}, or leave checks out for all of them"
        )
    unknown = [check for check in checks if check not in CHECKS]
    if unknown:
        raise ValueError(f"opreg.opcheck: {name}: unknown checks {unknown!r}; known: {CHECKS}")
    if samples is not None and (
        isinstance(samples, str | torch.Tensor | Sample) or not isinstance(samples, Iterable)
    ):
        raise TypeError(
            f"opreg.opcheck: {name}: samples must be a list of opreg.Sample or of argument "
            f"tuples, got {type(samples).__name__}"
        )
    if progress is not None and not callable(progress):
        raise TypeError(
            f"opreg.opcheck: {name}: progress must be a function taking one str (or None), "
            f"got {type(progress).__name__}"
        )
    if not isinstance(raise_on_failure, bool):
        raise TypeError(
            f"opreg.opcheck: {name}: raise_on_failure must be a bool, "
            f"got {type(raise_on_failure).__name__}"
        )
    given_samples = None if samples is None else list(samples)
    if given_samples == []:
        raise ValueError(
            f"opreg.opcheck: {name}: samples= is empty, so nothing would be checked; pass at "
            "least one sample, or leave samples out to generate them from the schema"
        )
    if given_samples is not None:
        given_samples = [_as_sample(op, s, i) for i, s in enumerate(given_samples)]
    with _one_opcheck_at_a_time:
        report = OpcheckReport(_rows(op, name, checks, given_samples, devices, progress))
    if raise_on_failure and report.failures:
        lines = [
            f"{r.check} failed for {r.op} on {r.device}, sample '{r.sample}': {r.message}"
            for r in report.failures
        ]
        raise OpcheckError("opreg.opcheck:\n  " + "\n  ".join(lines))
    return report


# Held while opcheck runs its checks: they compile (torch.compile, AOTAutograd), which PyTorch
# does not make safe for two threads at once (seen: false failures, and a process whose later
# compiles all failed).
_one_opcheck_at_a_time = new_rlock()


def _rows(
    op: torch._ops.OpOverload,
    name: str,
    checks: tuple[str, ...],
    given_samples: list[Sample] | None,
    devices: Iterable[str] | None,
    progress: Callable[[str], None] | None,
) -> list[CheckRow]:
    rows = []
    for device, unavailable in _devices(devices):
        if not unavailable and not _takes_tensors(op) and torch.device(device).type != "cpu":
            unavailable = "no tensor argument carries the device (the op is checked on cpu)"
        if unavailable:
            rows += [
                CheckRow(check, name, device, "-", True, 0.0, f"{unavailable}: skipped", True)
                for check in checks
            ]
            continue
        if given_samples is None:
            device_samples = _default_samples(op, device)
        else:
            device_samples = [_to_device(s, device) for s in given_samples]
        for index, sample in enumerate(device_samples):
            label = sample.label or f"#{index}"
            for check in checks:
                if progress:
                    progress(f"{name} {device} {label}: {check}")
                passed, error, message, skipped = _run_check(op, check, sample, device)
                if not passed and check in _FAKE_ROWS and _nested_output(op, sample):
                    message = (
                        f"{name} returns a nested tensor, which PyTorch cannot make on fake or "
                        "meta tensors: FakeTensorMode and torch.export fail on this op, and "
                        "torch.compile runs it outside its graph (a graph break)"
                    )
                rows.append(CheckRow(check, name, device, label, passed, error, message, skipped))
    return rows


_RUNS_A_REPLACE_MAY_INTERRUPT = 3


def _run_check(op, check: str, sample: Sample, device: str) -> tuple[bool, float, str, bool]:
    """(passed, error, message, skipped) of one check of one sample. A run that a replace of the
    op on another thread interrupted compared two definitions: it runs again, up to three times,
    as opreg::testing::check's samples do."""
    qualname = _qualified(op)
    for _ in range(_RUNS_A_REPLACE_MAY_INTERRUPT):
        serial = _C.definition_serial(qualname)
        skipped = False
        try:
            passed, error, message = _RUNNERS[check](op, sample, device)
        except _Skipped as skip:
            passed, error, message, skipped = True, 0.0, f"{skip}: skipped", True
        except Exception as failure:
            passed, error, message = False, 0.0, f"{type(failure).__name__}: {failure}"
        if _C.definition_serial(qualname) == serial:
            return passed, error, message, skipped
    return (
        False,
        0.0,
        f"{qualname} was replaced on another thread during each of "
        f"{_RUNS_A_REPLACE_MAY_INTERRUPT} runs of this check: not checked",
        False,
    )


# Rows that run the op on fake tensors, which PyTorch never makes nested: on an op with a nested
# output they fail by that limit, which PyTorch words as internal asserts.
_FAKE_ROWS = ("torch_opcheck", "fake_vs_real", "compile")


def _nested_output(op, sample: Sample) -> bool:
    try:
        outputs = _tensors(op(*_clone(sample).args, **_clone(sample).kwargs))
    except Exception:
        return False
    return any(o.is_nested and o.layout == torch.strided for o in outputs)


def _resolve(name: str, opreg_ops: set[str]) -> torch._ops.OpOverload:
    """The overload `name` (``namespace::op`` or ``namespace::op.overload``) names; ValueError
    with one line saying why when it names no opreg op."""
    namespace, sep, rest = name.partition("::")
    base, _, overload = rest.partition(".")
    if not (sep and namespace and base):
        raise ValueError(f"'{name}' is not a qualified op name (namespace::name)")
    if f"{namespace}::{base}" not in opreg_ops:
        raise ValueError(
            f"no opreg op named '{namespace}::{base}' (python -m opreg info lists them)"
        )
    if not isinstance(getattr(torch.ops, namespace, torch.ops.aten), torch._ops._OpNamespace):
        raise ValueError(
            f"'{namespace}::{base}' is in a namespace that torch.ops holds an attribute of its own "
            f"for (torch.ops.{namespace}), so PyTorch's tools (opcheck, FakeTensorMode, "
            "torch.compile) cannot reach the op: define it in another namespace"
        )
    packet = getattr(op_namespace(namespace), base)
    try:
        return getattr(packet, overload or "default")
    except AttributeError:
        raise ValueError(f"'{namespace}::{base}' has no overload '{overload}'") from None


def main(names: list[str]) -> int:
    """`python -m opreg check [ops...]`: every opreg op (or those named), with a progress line.
    Returns 1 when a check fails, 2 when a name is not an opreg op (nothing is checked then)."""
    import opreg

    opreg_ops = {r.name for r in opreg.describe_ops()}
    ops = []
    for name in names or sorted(opreg_ops):
        try:
            ops.append((name, _resolve(name, opreg_ops)))
        except ValueError as error:
            print(f"python -m opreg check: {error}", file=sys.stderr)
            return 2
    failed = 0
    for index, (name, op) in enumerate(ops, 1):

        def progress(message, index=index):
            sys.stderr.write(f"\r[{index}/{len(ops)}] {message[:100]:100}")
            sys.stderr.flush()

        try:
            report = opcheck(op, progress=progress, raise_on_failure=False)
        except TypeError as error:  # no samples can be generated for this schema
            print(f"\n{name}: skipped ({error})")
            continue
        sys.stderr.write("\n")
        print(f"{name}: {len(report.rows) - len(report.failures)}/{len(report.rows)} checks passed")
        for row in report.failures:
            failed += 1
            print(f"  FAIL {row.check} {row.device} '{row.sample}': {row.message}")
    return 1 if failed else 0
