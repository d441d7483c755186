"""opreg.opcheck: one call checks everything an op promises, on each sample and device.

Checks: torch.library.opcheck's own tests; every kernel against the fallback (bitwise when the op
declares it, else against a float64 run of the fallback); fake against real (shapes, dtypes,
strides, devices); gradcheck in float64 and the kernel path's gradients against the fallback's;
vmap against a loop of single calls (each combination of batched arguments, depths 1 to 3); and
torch.compile(fullgraph=True) against eager, with dynamic shapes.
"""

from __future__ import annotations

import copy
import itertools
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode

from opreg import _C
from opreg._public import public
from opreg._registry import AutogradSupport, describe_op

CHECKS = ("torch_opcheck", "kernel_vs_fallback", "fake_vs_real", "gradients", "vmap", "compile")

_DTYPES = {
    "Float": torch.float32,
    "Double": torch.float64,
    "Half": torch.float16,
    "BFloat16": torch.bfloat16,
    "Long": torch.int64,
    "Int": torch.int32,
    "Bool": torch.bool,
}


@public
@dataclass
class Sample:
    """Arguments of one call, positional then keyword."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    label: str = ""


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


@public
class OpcheckError(AssertionError):
    """Raised by opreg.opcheck when a check fails; the message names each failure."""


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
            status = "pass" if r.passed else "FAIL"
            lines.append(
                f"{r.check:20} {r.device:8} {r.sample[:28]:28} {status:6} "
                f"{r.max_error:10.3g}" + (f"  {r.message}" if r.message else "")
            )
        return "\n".join(lines)


# ---- samples from the schema ------------------------------------------------------------------


def _declared_dtypes(op_name: str) -> dict[str, list[torch.dtype]]:
    return {
        arg: [_DTYPES[d] for d in dtypes if d in _DTYPES]
        for arg, dtypes in describe_op(op_name).dtypes
    }


def _random_tensor(shape: Sequence[int], dtype: torch.dtype, device: str) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape, device=device).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, device=device) > 0.5
    info = torch.iinfo(dtype)
    return torch.randint(
        max(info.min, -(2**62)), min(info.max, 2**62), shape, dtype=dtype, device=device
    )


def generate_samples(op: torch._ops.OpOverload, device: str) -> list[Sample]:
    """Random samples from the schema: sizes 0, 1 and odd, a non-contiguous and an offset view,
    every dtype the op declares (float32 and float64 otherwise)."""
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
            elif arg.default_value is not None:
                value = arg.default_value
            elif type_name == "int" or type_name == "SymInt":
                value = 5
            elif type_name == "float":
                value = 0.75
            elif type_name == "bool":
                value = True
            else:
                raise TypeError(
                    f"opreg.opcheck: cannot generate an argument of type {type_name} "
                    f"for {schema.name}; pass samples="
                )
            (kwargs.__setitem__(arg.name, value) if arg.kwarg_only else args.append(value))
        samples.append(Sample(tuple(args), kwargs, f"{label} {str(dtype).removeprefix('torch.')}"))
    return samples


# ---- helpers ----------------------------------------------------------------------------------


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _clone(sample: Sample) -> Sample:
    clone = lambda t: t.clone() if isinstance(t, torch.Tensor) else copy.copy(t)  # noqa: E731
    return Sample(
        pytree.tree_map(clone, sample.args), pytree.tree_map(clone, sample.kwargs), sample.label
    )


def _max_error(got: Any, want: Any) -> float:
    errors = [0.0]
    for a, b in zip(_tensors(got), _tensors(want), strict=True):
        if a.numel():
            errors.append((a.double() - b.double().to(a.device)).abs().nan_to_num(0).max().item())
    return max(errors)


def _call_fallback(op: torch._ops.OpOverload, sample: Sample) -> Any:
    outputs = _C.call_fallback(_qualified(op), list(sample.args), sample.kwargs)
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def _qualified(op: torch._ops.OpOverload) -> str:
    schema = op._schema
    return schema.name + (f".{schema.overload_name}" if schema.overload_name else "")


def _to_double(sample: Sample) -> Sample:
    up = lambda t: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
    return Sample(
        pytree.tree_map(up, sample.args), pytree.tree_map(up, sample.kwargs), sample.label
    )


def _tolerance(dtype: torch.dtype) -> float:
    return {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1.3e-6}.get(dtype, 1e-7)


# ---- the checks -------------------------------------------------------------------------------


def _check_torch_opcheck(op, sample, device):
    results = torch.library.opcheck(op, sample.args, sample.kwargs, raise_exception=False)
    failed = {k: v for k, v in results.items() if v != "SUCCESS"}
    return (not failed, 0.0, "; ".join(f"{k}: {v}" for k, v in failed.items()))


def _values_comparable(op) -> bool:
    """Random ops give other values on every call: only their metadata can be compared."""
    return not describe_op(_qualified(op)).flags["random"]


def _check_kernel_vs_fallback(op, sample, device):
    report = describe_op(_qualified(op))
    got = _tensors(op(*_clone(sample).args, **_clone(sample).kwargs))
    want = _tensors(_call_fallback(op, _clone(sample)))
    error = _max_error(got, want)
    references = None
    for index, (a, b) in enumerate(zip(got, want, strict=True)):
        if a.shape != b.shape or a.dtype != b.dtype:
            return (
                False,
                error,
                (
                    f"output {index} is {a.dtype}{tuple(a.shape)}, the fallback's "
                    f"{b.dtype}{tuple(b.shape)}"
                ),
            )
        if report.flags["random"]:
            continue
        if report.flags["bitwise"] or not a.is_floating_point():
            if not torch.equal(a.nan_to_num(0), b.nan_to_num(0)):
                why = "the op declares bitwise" if report.flags["bitwise"] else "integer output"
                return (
                    False,
                    error,
                    f"output {index} is not bitwise equal to the fallback's ({why})",
                )
            continue
        # Allowed error: twice the fallback's own error against a float64 run of the fallback.
        if references is None:
            references = _tensors(_call_fallback(op, _to_double(_clone(sample))))
        ref = references[index].double()
        if not a.numel():
            continue
        fallback_error = (b.double() - ref).abs().nan_to_num(0).max().item()
        kernel_error = (a.double() - ref).abs().nan_to_num(0).max().item()
        scale = max(1.0, ref.abs().nan_to_num(0).max().item())
        allowed = 2 * fallback_error + _tolerance(a.dtype) * scale
        if kernel_error > allowed:
            return (
                False,
                error,
                (
                    f"output {index}: error {kernel_error:.3g} against float64 "
                    f"exceeds {allowed:.3g} (twice the fallback's own "
                    f"{fallback_error:.3g})"
                ),
            )
    return True, error, ""


def _check_fake_vs_real(op, sample, device):
    real = op(*_clone(sample).args, **_clone(sample).kwargs)
    cloned = _clone(sample)
    mode = FakeTensorMode()
    fake_args = pytree.tree_map_only(torch.Tensor, mode.from_tensor, (cloned.args, cloned.kwargs))
    with mode:
        fake = op(*fake_args[0], **fake_args[1])
    for index, (f, r) in enumerate(zip(_tensors(fake), _tensors(real), strict=True)):
        for what, fv, rv in (
            ("shape", tuple(f.shape), tuple(r.shape)),
            ("dtype", f.dtype, r.dtype),
            ("device", f.device, r.device),
        ):
            if fv != rv:
                return False, 0.0, f"output {index}: the fake's {what} is {fv}, the real {rv}"
        if r.numel() > 1 and f.stride() != r.stride():
            return (
                False,
                0.0,
                (
                    f"output {index}: the fake's strides are {f.stride()}, "
                    f"the real ones {r.stride()}"
                ),
            )
    return True, 0.0, ""


def _differentiable(op) -> bool:
    autograd = describe_op(_qualified(op)).autograd
    return autograd not in (AutogradSupport.NONE, AutogradSupport.ERROR)


def _check_gradients(op, sample, device):
    if not _differentiable(op) or not any(t.is_floating_point() for t in _tensors(sample.args)):
        return True, 0.0, "not differentiable: skipped"
    if not op._schema.returns:
        return True, 0.0, "no outputs (an in-place op): skipped"
    outputs = _tensors(op(*_clone(sample).args, **_clone(sample).kwargs))
    if not any(o.is_floating_point() or o.is_complex() for o in outputs):
        return True, 0.0, "no floating outputs (nothing to differentiate): skipped"
    double = _to_double(_clone(sample))
    inputs = [t for t in _tensors(double.args) if t.is_floating_point() and t.numel()]
    for t in inputs:
        t.requires_grad_(True)
    if not inputs:
        return True, 0.0, "no floating inputs: skipped"
    flat, spec = pytree.tree_flatten(double.args)

    def fn(*diff):
        it = iter(diff)  # cloned: an op that mutates an input must not write into a leaf
        leaves = [
            next(it).clone() if isinstance(x, torch.Tensor) and x.requires_grad else x for x in flat
        ]
        return op(*pytree.tree_unflatten(leaves, spec), **double.kwargs)

    try:
        torch.autograd.gradcheck(fn, tuple(inputs), raise_exception=True, fast_mode=True)
    except Exception as error:
        return False, 0.0, f"gradcheck: {str(error).splitlines()[0]}"
    # The kernel path's gradients against the fallback's (PyTorch's autograd of its ATen ops).
    kernel_inputs = [
        t.detach().clone().requires_grad_(True)
        for t in _tensors(sample.args)
        if t.is_floating_point() and t.numel()
    ]
    fallback_inputs = [t.detach().clone().requires_grad_(True) for t in kernel_inputs]

    def run(call, ins):
        it = iter(ins)
        leaves = [
            next(it) if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() else x
            for x in pytree.tree_flatten(sample.args)[0]
        ]
        out = call(pytree.tree_unflatten(leaves, pytree.tree_flatten(sample.args)[1]))
        total = sum(o.double().sum() for o in _tensors(out) if o.is_floating_point())
        return torch.autograd.grad(total, ins, allow_unused=True)

    kernel_grads = run(lambda args: op(*args, **sample.kwargs), kernel_inputs)
    fallback_grads = run(
        lambda args: _C.call_fallback(_qualified(op), list(args), sample.kwargs), fallback_inputs
    )
    error = 0.0
    for kg, fg, t in zip(kernel_grads, fallback_grads, kernel_inputs, strict=True):
        if kg is None and fg is None:
            continue
        kg = torch.zeros_like(t) if kg is None else kg
        fg = torch.zeros_like(t) if fg is None else fg
        error = max(error, _max_error(kg, fg))
        if not torch.allclose(kg.double(), fg.double(), rtol=1e-3, atol=1e-4):
            return False, error, "the op's gradients differ from the fallback's"
    return True, error, ""


def _batch(value: Any, size: int) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    if value.is_floating_point():
        return torch.stack([value] + [torch.randn_like(value) for _ in range(size - 1)])
    return torch.stack([value + i if value.dtype != torch.bool else value for i in range(size)])


def _check_vmap(op, sample, device, depths=(1, 2, 3)):
    positions = [i for i, a in enumerate(sample.args) if isinstance(a, torch.Tensor)]
    if not positions:
        return True, 0.0, "no tensor arguments: skipped"
    if not op._schema.returns:
        return True, 0.0, "no outputs (an in-place op): skipped"
    error = 0.0
    for depth in depths:
        for mask in itertools.product((True, False), repeat=len(positions)):
            if not any(mask):
                continue
            args = list(sample.args)
            in_dims = [None] * len(args)
            for pos, batched in zip(positions, mask, strict=True):
                if batched:
                    for _ in range(depth):
                        args[pos] = _batch(args[pos], 2)
                    in_dims[pos] = 0
            fn = lambda *a: op(*a, **sample.kwargs)  # noqa: E731
            randomness = "error" if _values_comparable(op) else "different"
            for _ in range(depth):
                fn = torch.vmap(fn, in_dims=tuple(in_dims), randomness=randomness)
            got = fn(*args)

            def loop(level_args, level, in_dims=tuple(in_dims)):
                if level == 0:
                    return op(*level_args, **sample.kwargs)
                outs = [
                    loop(
                        [
                            a[i] if d is not None else a
                            for a, d in zip(level_args, in_dims, strict=True)
                        ],
                        level - 1,
                    )
                    for i in range(2)
                ]
                return pytree.tree_map(lambda *xs: torch.stack(xs), *outs)

            want = loop(args, depth)
            error = max(error, _max_error(got, want))
            for g, w in zip(_tensors(got), _tensors(want), strict=True):
                values_differ = _values_comparable(op) and not torch.allclose(
                    g.double(), w.double(), rtol=1e-4, atol=1e-5, equal_nan=True
                )
                if g.shape != w.shape or values_differ:
                    return (
                        False,
                        error,
                        (
                            f"vmap depth {depth}, batched arguments "
                            f"{[p for p, m in zip(positions, mask, strict=True) if m]}"
                            " differ from a loop of single calls"
                        ),
                    )
    return True, error, ""


def _check_compile(op, sample, device, backend="aot_eager"):
    eager = op(*_clone(sample).args, **_clone(sample).kwargs)
    error = 0.0
    for dynamic in (False, True):
        torch._dynamo.reset()
        compiled = torch.compile(
            lambda *a, **k: op(*a, **k), fullgraph=True, dynamic=dynamic, backend=backend
        )
        got = compiled(*_clone(sample).args, **_clone(sample).kwargs)
        error = max(error, _max_error(got, eager))
        for g, e in zip(_tensors(got), _tensors(eager), strict=True):
            if g.shape != e.shape or (
                _values_comparable(op)
                and not torch.allclose(g.double(), e.double(), rtol=1e-5, atol=1e-6, equal_nan=True)
            ):
                return (
                    False,
                    error,
                    (f"torch.compile(fullgraph=True, dynamic={dynamic}) output differs from eager"),
                )
    return True, error, ""


_RUNNERS: dict[str, Callable[..., tuple[bool, float, str]]] = {
    "torch_opcheck": _check_torch_opcheck,
    "kernel_vs_fallback": _check_kernel_vs_fallback,
    "fake_vs_real": _check_fake_vs_real,
    "gradients": _check_gradients,
    "vmap": _check_vmap,
    "compile": _check_compile,
}


def _devices(devices: Iterable[str] | None) -> list[str]:
    if devices is not None:
        return list(devices)
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


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

    ``samples``: ``opreg.Sample(args, kwargs)`` or argument tuples; generated from the schema
    when omitted (sizes 0, 1 and odd, non-contiguous and offset views, declared dtypes).
    """
    if isinstance(op, torch._ops.OpOverloadPacket):
        op = op.default
    if not isinstance(op, torch._ops.OpOverload):
        raise TypeError(
            "opreg.opcheck: op must be an op (torch.ops.<namespace>.<name>, or what "
            f"register_triton_op returns), got {type(op).__name__}"
        )
    name = _qualified(op)
    unknown = set(checks) - set(CHECKS)
    if unknown:
        raise ValueError(f"opreg.opcheck: unknown checks {sorted(unknown)}; known: {CHECKS}")
    rows = []
    for device in _devices(devices):
        if samples is None:
            device_samples = generate_samples(op, device)
        else:
            device_samples = [
                _to_device(s if isinstance(s, Sample) else Sample(tuple(s), {}, f"#{i}"), device)
                for i, s in enumerate(samples)
            ]
        for index, sample in enumerate(device_samples):
            label = sample.label or f"#{index}"
            for check in checks:
                if progress:
                    progress(f"{name} {device} {label}: {check}")
                try:
                    passed, error, message = _RUNNERS[check](op, sample, device)
                except Exception as failure:
                    passed, error, message = False, 0.0, f"{type(failure).__name__}: {failure}"
                rows.append(CheckRow(check, name, device, label, passed, error, message))
    report = OpcheckReport(rows)
    if raise_on_failure and report.failures:
        lines = [
            f"{r.check} failed for {r.op} on {r.device}, sample '{r.sample}': {r.message}"
            for r in report.failures
        ]
        raise OpcheckError("opreg.opcheck:\n  " + "\n  ".join(lines))
    return report


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
    packet = getattr(getattr(torch.ops, namespace), base)
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
