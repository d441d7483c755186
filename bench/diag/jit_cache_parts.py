"""Diagnostic, not a benchmark (prints text, keeps no result): host cost of the parts of an
opreg op whose triton_fn launches a Triton JIT kernel (python/opreg/_jit_cache.py), against
Triton's own launch of the same kernel; 1024 float32 elements. Needs CUDA and opreg installed.

    python bench/diag/jit_cache_parts.py
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
import torch

from opreg import _jit_cache
from peers import front_ops
from peers.front_ops import front_add_kernel
from peers.registrations import seed_triton_fn, triton_add
from peers.triton_add import add_kernel  # the peers' kernel: never adopted

x, y = torch.randn(1024, device="cuda"), torch.randn(1024, device="cuda")
out = torch.empty_like(x)
front_ops.front_jit_add(x, y)
cache = front_add_kernel._opreg_launches
cached_triton_add = seed_triton_fn(front_add_kernel)


def us(f, n=3000):
    r = []
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            f()
        torch.cuda.synchronize()
        r.append((time.perf_counter() - t) / n * 1e6)
    return sorted(r)[2]


a, kw = (x, y, out, 1024), {"BLOCK_SIZE": 1024}
parts = {
    "triton kernel[(1,)]": lambda: add_kernel[(1,)](*a, **kw),
    "triton_fn (seed), Triton's launch": lambda: triton_add(x, y),
    "torch.empty_like": lambda: torch.empty_like(x),
    "opreg front op (seed)": lambda: front_ops.front_jit_add(x, y),
}
for name, f in parts.items():
    print(f"{name:40s} {us(f):7.2f} us")
with _jit_cache.inside_op():
    front_add_kernel[(1,)](*a, **kw)
    for name, f in {
        "cached kernel[(1,)]": lambda: front_add_kernel[(1,)](*a, **kw),
        "cached kernel[lambda grid]": lambda: front_add_kernel[lambda m: (1,)](*a, **kw),
        "triton_fn (seed), cached launch": lambda: cached_triton_add(x, y),
    }.items():
        print(f"{name:40s} {us(f):7.2f} us")
print(cache.describe())
