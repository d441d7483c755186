"""Diagnostic, not a benchmark (prints text, keeps no result): host cost of the parts of the
front's Triton JIT path (an op whose triton_fn launches a JIT kernel, the same op with no launch,
the seed's triton_fn called directly), for A/B comparisons of builds run one after the other
(bench/results/jit_direct_launch_ab.md). 1024 float32 elements; needs CUDA and opreg installed.

    python bench/diag/front_jit_ab.py   (from the repository root)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd() / "bench"))
import torch

import opreg
from common import host_us_per_call
from peers import front_ops
from peers.registrations import triton_add

x, y = torch.randn(1024, device="cuda"), torch.randn(1024, device="cuda")


@opreg.register_triton_op(
    fake_fn=lambda x, y: torch.empty_like(x),
    triton_fn=lambda x, y: torch.empty_like(x),
    name="diag::no_launch",
)
def no_launch(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


@opreg.register_vmap_op(fake_fn=lambda x, y: torch.empty_like(x), name="diag::fallback_only")
def fallback_only(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def us(f):
    return host_us_per_call(f, "cuda", calls=4000)


parts = {
    "torch.empty_like": lambda: torch.empty_like(x),
    "torch.add": lambda: torch.add(x, y),
    "front op, triton_fn=empty_like": lambda: no_launch(x, y),
    "front op, fallback only (empty_like)": lambda: fallback_only(x, y),
    "front op, seed triton_fn (JIT)": lambda: front_ops.front_jit_add(x, y),
    "seed triton_fn direct": lambda: triton_add(x, y),
}
for f in parts.values():
    f()
for name, f in parts.items():
    print(f"{name:40s} {us(f):7.2f} us", flush=True)
