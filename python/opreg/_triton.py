"""Triton from the Python front: whether it works, the device types its kernels serve,
``wrap_triton`` launches that torch.compile can trace, and :class:`AotLaunch` (an AOT-compiled
kernel attached by declaration and launched from C++)."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
import torch.utils._pytree as pytree

from opreg import _C
from opreg._public import public
from opreg._registry import (
    accelerated_device_types,
    check_text,
    register_accelerated_device_type,
)

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
def triton_device_types() -> frozenset[str]:
    """The device types whose calls Triton kernels serve by default, as EvoX's
    ``evox.triton_kernels.triton_device_types``: a frozenset, initially ``{"cuda"}``.
    :func:`opreg.accelerated_device_types` gives them in registration order."""
    return frozenset(accelerated_device_types())


@public
def register_triton_device_type(device_type: str) -> None:
    """Add a device type for Triton kernels, as EvoX's
    ``evox.triton_kernels.backend.register_triton_device_type``: stripped and lower-cased, an
    empty name ignored, None returned. Ops defined earlier serve it too; a type this PyTorch
    build does not know is kept, and each op's report (``python3 -m opreg info``) says why its
    kernel skips it. :func:`opreg.register_accelerated_device_type` returns the normalised name
    and refuses an empty one."""
    if not isinstance(device_type, str):
        raise TypeError(
            "opreg.register_triton_device_type: device_type must be a str such as 'npu', got "
            f"{type(device_type).__name__}"
        )
    if device_type.strip():
        register_accelerated_device_type(device_type)


@public
def triton_supports_device(device: torch.device | str) -> bool:
    """Whether a Triton kernel can run on ``device`` (a ``torch.device`` or a device string), as
    EvoX's ``evox.triton_kernels.triton_supports_device``: Triton works, the device's type (the
    string before ``:``, stripped, case kept) is one of :func:`triton_device_types`, and for
    ``cuda`` a CUDA device is available. Any string is answered, unknown ones with False;
    anything else is a TypeError."""
    if isinstance(device, torch.device):
        device_type = device.type
    elif isinstance(device, str):
        device_type = device.split(":", 1)[0].strip()
    else:
        raise TypeError(
            "opreg.triton_supports_device: device must be a torch.device or a str such as "
            f"'cuda:0', got {type(device).__name__}"
        )
    if not has_triton() or device_type not in triton_device_types():
        return False
    return torch.cuda.is_available() if device_type == "cuda" else True


# ---- traceable Triton launches ------------------------------------------------------------------

_decomposing: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "opreg_decomposing", default=False
)
_faking: contextvars.ContextVar[bool] = contextvars.ContextVar("opreg_faking", default=False)


@contextlib.contextmanager
def faking_launches() -> Iterator[None]:
    """Within: opreg.wrap_triton launches do nothing (a fake computes no values; torch's fake
    of its launch higher-order op does nothing either)."""
    token = _faking.set(True)
    try:
        yield
    finally:
        _faking.reset(token)


@public
@runtime_checkable
class TritonKernelLike(Protocol):
    """What ``opreg.wrap_triton`` returns: index by the grid, then call with the arguments."""

    def __getitem__(self, grid: Any) -> Callable[..., Any]: ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


def _skip_launch(*args: Any, **kwargs: Any) -> None:
    return None


def _traced() -> bool:
    """Whether this launch is being traced: inside an op's decomposition under torch.compile, or
    under a dispatch mode (make_fx, export, fake tensors) outside torch's and opreg's kernels,
    which turn torch.library.wrap_triton's tracing off."""
    if _decomposing.get():
        return True
    if torch._C._len_torch_dispatch_stack() == 0:
        return False
    from torch._library.triton import is_wrap_triton_enabled

    return is_wrap_triton_enabled()


class _WrappedTriton:
    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        if _faking.get():
            return _skip_launch
        if _traced():
            return torch.library.wrap_triton(self.kernel)[grid]
        return self.kernel[grid]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _faking.get():
            return None
        if _traced():
            return torch.library.wrap_triton(self.kernel)(*args, **kwargs)
        return self.kernel(*args, **kwargs)


_triton_kernel_types: tuple[type, ...] = ()


def _is_triton_kernel(kernel: Any) -> bool:
    """What torch.library.wrap_triton accepts: @triton.jit, @triton.autotune, and either under
    Triton's interpreter. (The types are looked up once: this runs on every launch.)"""
    global _triton_kernel_types
    if not _triton_kernel_types:
        from triton.runtime.autotuner import Autotuner
        from triton.runtime.jit import JITFunction

        try:
            from triton.runtime.interpreter import InterpretedFunction
        except ImportError:
            InterpretedFunction = JITFunction
        _triton_kernel_types = (JITFunction, Autotuner, InterpretedFunction)
    return isinstance(kernel, _triton_kernel_types)


@public
def wrap_triton(triton_kernel: Any, /) -> TritonKernelLike:
    """Launch a ``@triton.jit`` or ``@triton.autotune`` kernel, as ``torch.library.wrap_triton``:
    ``wrap_triton(kernel)[grid](*args)``. Traced launches (an opreg op under torch.compile or
    torch.export, make_fx, a dispatch mode) are torch's launch higher-order op, which the
    compiler sees; a fake skips the launch; an eager call launches the kernel directly, with no
    tracing machinery. Anything else is a RuntimeError, as in torch."""
    if torch.compiler.is_dynamo_compiling():
        # Dynamo traces torch's wrapper (which checks the kernel itself), not opreg's checks:
        # it cannot follow a ContextVar or isinstance on its model of a Triton kernel.
        return torch.library.wrap_triton(triton_kernel)
    usable, why = triton_status()
    if not usable:
        raise RuntimeError(f"opreg.wrap_triton: {why}")
    if not _is_triton_kernel(triton_kernel):
        raise RuntimeError(
            "opreg.wrap_triton only works on functions annotated with triton.jit or "
            f"triton.autotune, got {type(triton_kernel).__name__}"
        )
    if torch.compiler.is_compiling() and not _faking.get():
        return torch.library.wrap_triton(triton_kernel)  # dynamo knows torch's wrapper
    return _WrappedTriton(triton_kernel)


def uses_wrap_triton(triton_fn: Callable[..., Any] | None) -> bool:
    """Whether ``triton_fn`` launches through opreg.wrap_triton (then compile can trace it)."""
    code = getattr(triton_fn, "__code__", None)
    return triton_fn is not None and "wrap_triton" in getattr(code, "co_names", ())


def functional_tensor_mode() -> type:
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    return FunctionalTensorMode


def decomposition(
    triton_fn: Callable[..., Any],
    fallback: Callable[..., Any],
    device_types: list[str] | None,
    current: Callable[[], bool],
) -> Callable[..., Any]:
    """Under AOT dispatch (torch.compile), run the implementation itself, so that triton_fn's
    wrap_triton launches become graph nodes the compiler sees (as torch.library.triton_op), or
    the fallback's ATen ops on devices the kernel does not serve (and under Triton's interpreter,
    whose kernels cannot be traced). Once ``current()`` says the op was defined again (from C++),
    the op stays whole."""

    def decompose(mode, op, types, args, kwargs):
        from torch.export._trace import custom_triton_ops_decomposition_disabled

        # torch.export keeps the op whole
        if custom_triton_ops_decomposition_disabled() or not current():
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

    def __post_init__(self) -> None:
        # The C++ launch checks each field's type (a TypeError naming the field and what came).
        for field_name in ("kernel", "grid", "arguments", "outputs"):
            value = getattr(self, field_name)
            for text in value if isinstance(value, list | tuple) else [value]:
                if isinstance(text, str):
                    check_text("opreg.AotLaunch", f"field '{field_name}'", text)
        _C.AotLaunch(self.kernel, self.grid, self.arguments, self.outputs)
