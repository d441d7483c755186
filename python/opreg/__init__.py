"""opreg: PyTorch operators from one reference implementation plus accelerated kernels.

Importing opreg loads its C++ core; ops defined in C++ libraries (loaded with
:func:`load_library`) are then callable as ``torch.ops.<namespace>.<name>``.
"""

from __future__ import annotations

import torch  # noqa: F401  (loads libtorch before the core library)

from opreg import _C
from opreg._registry import (
    DeviceServing,
    OpReport,
    accelerated_device_types,
    cmake_dir,
    describe_op,
    describe_ops,
    example_library,
    load_library,
    register_accelerated_device_type,
)
from opreg._trace import TraceRecord, trace

__all__ = [
    "DeviceServing",
    "OpReport",
    "TraceRecord",
    "accelerated_device_types",
    "cmake_dir",
    "describe_op",
    "describe_ops",
    "example_library",
    "load_library",
    "register_accelerated_device_type",
    "trace",
]

__version__ = "0.1.0"
del _C
