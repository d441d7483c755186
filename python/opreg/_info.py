"""The text of ``python3 -m opreg info``."""

from __future__ import annotations

import torch

import opreg
from opreg import _C
from opreg._declaration import python_kernel_status


def _device_availability() -> list[str]:
    lines = []
    for device_type in opreg.accelerated_device_types():
        module = getattr(torch, device_type, None)
        is_available = getattr(module, "is_available", None)
        if is_available is None:
            lines.append(f"  {device_type}: no torch.{device_type} module in this PyTorch build")
        else:
            count = module.device_count() if is_available() else 0
            lines.append(f"  {device_type}: {count} device(s) available")
    return lines


def format_info() -> str:
    lines = [
        f"opreg {opreg.__version__}, torch {torch.__version__}",
        "accelerated device types (kernels' default):",
        *_device_availability(),
    ]
    driver_ok, why = _C.triton_driver_available()
    lines.append(f"CUDA driver for AOT Triton kernels: {'available' if driver_ok else why}")
    for kernel in opreg.triton_kernels():
        archs = sorted({v["arch"] for v in kernel["variants"]})
        lines.append(
            f"  triton kernel {kernel['name']}: {len(kernel['variants'])} variants, "
            f"sm_{', sm_'.join(map(str, archs))}"
        )
    ops = opreg.describe_ops()
    if not ops:
        lines.append("no opreg ops defined (load a library with --load, or --examples)")
    for op in ops:
        lines.append("")
        lines.append(format_op(op))
    return "\n".join(lines)


def format_op(op: opreg.OpReport) -> str:
    lines = [op.describe()]
    status = python_kernel_status(op.name)
    if status is not None:
        lines.append(f"  triton:   {status}")
    return "\n".join(lines)
