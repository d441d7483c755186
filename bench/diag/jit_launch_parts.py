"""Diagnostic, not a benchmark (prints text, keeps no result): host cost of the parts of a
cached Triton JIT launch (python/opreg/_jit_launch.py) against Triton's own launch of the same
kernel, 1024 float32 elements, tuple grid. Needs CUDA and opreg installed.

    python bench/diag/jit_launch_parts.py
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
import torch

from opreg import _C, _jit_launch
from peers import front_ops
from peers.triton_add import add_kernel

x, y = torch.randn(1024, device="cuda"), torch.randn(1024, device="cuda")
out = torch.empty_like(x)
front_ops.front_jit_add(x, y)
cache = add_kernel._opreg_launches


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


a, kw, salt = (x, y, out, 1024), {"BLOCK_SIZE": 1024}, (False, "")
add_kernel[(1,)](*a, **kw)
tok = _jit_launch._inside_op.set(True)
add_kernel[(1,)](*a, **kw)
print("entries", len(cache.native), cache.describe())
for name, f in [
    ("key", lambda: _C.triton_launch_key(0, a, kw, salt)),
    ("native.launch tuple", lambda: cache.native.launch((1,), a, kw, salt)),
    ("declined", lambda: cache._declined()),
    ("cached kernel[(1,)]", lambda: add_kernel[(1,)](*a, **kw)),
    ("cur dev", lambda: torch.cuda.current_device()),
]:
    print(f"{name:24s} {us(f):7.2f}")
_jit_launch._inside_op.reset(tok)
print(f"{'triton kernel[(1,)]':24s} {us(lambda: add_kernel[(1,)](*a, **kw)):7.2f}")
