"""opreg: PyTorch operators from one reference implementation plus accelerated kernels.

Importing opreg loads its C++ core; ops defined in C++ libraries (loaded with
:func:`load_library`) are then callable as ``torch.ops.<namespace>.<name>``.
"""

from __future__ import annotations

import torch  # noqa: F401  (loads libtorch before the core library)

from opreg import _C, _dtensor, _registry
from opreg._aot import AotKernel, load_triton_bundle, triton_kernels
from opreg._declaration import AutogradContext, kernel_status
from opreg._front import register_triton_op, register_vmap_op
from opreg._library import (
    CustomOpDef,
    capture_triton,
    custom_op,
    opcheck,
    register_autograd,
    register_fake,
    register_kernel,
    register_torch_dispatch,
    register_vmap,
    triton_op,
)
from opreg._opcheck import CheckRow, OpcheckError, OpcheckReport, Sample, register_samples
from opreg._registry import (
    AutogradSupport,
    DeviceServing,
    FakeSource,
    OpReport,
    ServingKind,
    Sharding,
    VmapSupport,
    accelerated_device_types,
    cmake_dir,
    describe_op,
    describe_ops,
    example_library,
    example_source,
    load_library,
    register_accelerated_device_type,
)
from opreg._trace import TraceRecord, trace
from opreg._triton import (
    AotLaunch,
    TritonKernelLike,
    has_triton,
    register_triton_device_type,
    triton_device_types,
    triton_supports_device,
    wrap_triton,
)
from opreg._vmap import VmapInfo, default_vmap_wrap_inputs

__all__ = [
    "AotKernel",
    "AotLaunch",
    "AutogradContext",
    "AutogradSupport",
    "CheckRow",
    "CustomOpDef",
    "DeviceServing",
    "FakeSource",
    "OpReport",
    "OpcheckError",
    "OpcheckReport",
    "Sample",
    "ServingKind",
    "Sharding",
    "TraceRecord",
    "TritonKernelLike",
    "VmapInfo",
    "VmapSupport",
    "accelerated_device_types",
    "capture_triton",
    "cmake_dir",
    "custom_op",
    "default_vmap_wrap_inputs",
    "describe_op",
    "describe_ops",
    "example_library",
    "example_source",
    "has_triton",
    "kernel_status",
    "load_library",
    "load_triton_bundle",
    "opcheck",
    "register_accelerated_device_type",
    "register_autograd",
    "register_fake",
    "register_kernel",
    "register_samples",
    "register_torch_dispatch",
    "register_triton_device_type",
    "register_triton_op",
    "register_vmap",
    "register_vmap_op",
    "trace",
    "triton_device_types",
    "triton_kernels",
    "triton_op",
    "triton_supports_device",
    "wrap_triton",
]

__version__: str = _C.version  # project(opreg VERSION ...) in CMakeLists.txt

# The shipped ops (torch.ops.opreg.*), defined in C++ through the same API users have.
load_library(_registry.shipped_ops_library())
from opreg import _shipped_samples  # noqa: E402, F401  (their opcheck samples)

# DTensor strategies of every op: now if torch.distributed.tensor is imported, else at its import.
_dtensor.install()
del _C
