"""Eager cost per call of an add on 1024 float32 elements: opreg (AOT Triton kernel through the C++
launcher) against torch.add, a hand-written TORCH_LIBRARY op with a CUDA kernel, the EvoX-style
registration, torch.library.triton_op, and Triton's JIT launch; with and without requires-grad
inputs, and forward+backward against custom_op + register_autograd. Needs a CUDA GPU.

    python bench/eager_overhead.py        (from the repository root, opreg installed)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

import triton

sys.path.insert(0, str(Path(__file__).parent))
import opreg
from common import Report, host_us_per_call_interleaved
from peers import registrations as peers
from peers.triton_add import add_kernel


def main() -> None:
    load(
        name="opreg_peers_cpp",
        sources=[str(Path(__file__).parent / "peers" / "handwritten_add.cu")],
        extra_cuda_cflags=["-O3", "-gencode=arch=compute_90,code=sm_90"],
        is_python_module=False,
        verbose=False,
    )
    device = "cuda"
    x, y = torch.randn(1024, device=device), torch.randn(1024, device=device)
    out = torch.empty_like(x)
    aot = opreg.AotKernel("opreg_fused_add_f32")
    fused_add = torch.ops.opreg.fused_add.default
    handwritten = torch.ops.opreg_peers_cpp.handwritten_add.default
    for fn in (fused_add, handwritten, peers.evox_add, peers.triton_op_add):
        torch.testing.assert_close(fn(x, y), x + y)

    from peers import front_ops

    for fn in (front_ops.front_jit_add, front_ops.front_aot_add, front_ops.front_aot_declared_add):
        torch.testing.assert_close(fn(x, y), x + y)

    paths: dict[str, tuple[str, Callable[[], object]]] = {}
    t = lambda key, what, fn: paths.__setitem__(key, (what, fn))  # noqa: E731
    t("torch_add", "torch.add(x, y)", lambda: torch.add(x, y))
    t("aten_add", "torch.ops.aten.add.Tensor(x, y)", lambda: torch.ops.aten.add.Tensor(x, y))
    t(
        "handwritten_torch_library_cuda",
        "hand-written TORCH_LIBRARY op, CUDA <<<>>> kernel",
        lambda: handwritten(x, y),
    )
    t(
        "opreg_fused_add",
        "torch.ops.opreg.fused_add (AOT Triton kernel, C++ launcher)",
        lambda: fused_add(x, y),
    )
    t(
        "opreg_aot_launch_python",
        "opreg.AotKernel[grid](...) from Python, output preallocated",
        lambda: aot[(1,)](x, y, out, 1024),
    )
    t(
        "triton_jit_launch",
        "Triton JIT launch from Python, output preallocated",
        lambda: add_kernel[(1,)](x, y, out, 1024, BLOCK_SIZE=1024),
    )
    t(
        "evox_style",
        "custom_op + register_kernel('cuda', JIT Triton launch)",
        lambda: peers.evox_add(x, y),
    )
    t("triton_op", "torch.library.triton_op + wrap_triton", lambda: peers.triton_op_add(x, y))
    t(
        "seed_triton_fn_direct",
        "the seed's triton_fn called directly, no op around it (floor of any wrapper of it)",
        lambda: peers.triton_add(x, y),
    )
    t(
        "opreg_front_jit",
        "seed fused_add via opreg.register_triton_op, Triton JIT launch",
        lambda: front_ops.front_jit_add(x, y),
    )
    t(
        "opreg_front_aot",
        "seed fused_add via opreg.register_triton_op, AOT kernel via the C++ launcher",
        lambda: front_ops.front_aot_add(x, y),
    )

    t(
        "opreg_front_aot_declared",
        "seed fused_add via opreg.register_triton_op(aot=opreg.AotLaunch(...)): launched in C++",
        lambda: front_ops.front_aot_declared_add(x, y),
    )

    xg = x.clone().requires_grad_()
    t(
        "torch_add_requires_grad",
        "torch.add with a requires-grad input (forward)",
        lambda: torch.add(xg, y),
    )
    t(
        "opreg_fused_add_requires_grad",
        "opreg fused_add with a requires-grad input (forward)",
        lambda: fused_add(xg, y),
    )
    t(
        "evox_style_requires_grad",
        "EvoX style with a requires-grad input (forward)",
        lambda: peers.evox_add(xg, y),
    )
    grad = torch.ones_like(x)
    t(
        "opreg_forward_backward",
        "opreg fused_add forward + backward (explicit C++ backward)",
        lambda: fused_add(xg, y).backward(grad),
    )
    t(
        "custom_op_autograd_forward_backward",
        "custom_op + register_autograd forward + backward (same Triton kernel)",
        lambda: peers.autograd_add(xg, y).backward(grad),
    )
    t(
        "torch_add_forward_backward",
        "torch.add forward + backward",
        lambda: torch.add(xg, y).backward(grad),
    )

    r = Report("eager_overhead", "Eager cost per call, 1024-element float32 add")
    us = "us/call (host, median of 7 x 2000, batches of all paths in turn)"
    timings = host_us_per_call_interleaved({key: fn for key, (_, fn) in paths.items()}, device)
    for key, (what, _) in paths.items():
        r.figure(key, timings[key], us, what)
    print("front_jit:", opreg.kernel_status("opreg_bench::front_jit_add"))

    r.compare("opreg_fused_add", "handwritten_torch_library_cuda", "<=1.1")
    r.compare("opreg_fused_add", "evox_style", "<=0.3333")
    r.compare("opreg_fused_add", "torch_add")
    r.compare("opreg_aot_launch_python", "triton_jit_launch")
    r.compare("opreg_fused_add", "triton_op")
    r.compare("opreg_front_jit", "evox_style", "<=0.5")
    r.compare("opreg_front_aot", "evox_style")  # AotKernel called from Python: no target
    r.compare("opreg_front_jit", "seed_triton_fn_direct")
    r.compare("seed_triton_fn_direct", "evox_style")
    r.compare("opreg_front_aot_declared", "evox_style", "<=0.35")
    r.compare("opreg_fused_add_requires_grad", "torch_add_requires_grad", "<=1.3")
    r.compare("opreg_forward_backward", "custom_op_autograd_forward_backward", "<=0.5")
    r.compare("opreg_forward_backward", "torch_add_forward_backward")
    r.write()


if __name__ == "__main__":
    triton.__version__  # noqa: B018  (fail early without Triton)
    main()
