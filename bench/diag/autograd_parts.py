"""Diagnostic, not a benchmark (prints text, keeps no result): forward+backward of a 1024-element
float32 add through opreg's fused_add (explicit C++ backward), custom_op + register_autograd and
torch.add, timed in interleaved rounds (so that drift hits each alike), then the CUDA runtime and
driver calls each makes per iteration (torch.profiler). Needs CUDA and opreg installed.

    python bench/diag/autograd_parts.py
"""

import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
import torch
from torch.profiler import ProfilerActivity, profile

import opreg  # noqa: F401  (loads opreg::fused_add)
from peers import registrations as peers

x, y = torch.randn(1024, device="cuda"), torch.randn(1024, device="cuda")
xg, grad = x.clone().requires_grad_(), torch.ones_like(x)
fused_add = torch.ops.opreg.fused_add.default
paths = {
    "opreg fused_add fwd+bwd": lambda: fused_add(xg, y).backward(grad),
    "custom_op+register_autograd fwd+bwd": lambda: peers.autograd_add(xg, y).backward(grad),
    "torch.add fwd+bwd": lambda: torch.add(xg, y).backward(grad),
    "opreg fused_add fwd (requires grad)": lambda: fused_add(xg, y),
    "torch.add fwd (requires grad)": lambda: torch.add(xg, y),
}
for f in paths.values():
    for _ in range(200):
        f()
torch.cuda.synchronize()
times: dict[str, list[float]] = {name: [] for name in paths}
for _ in range(7):
    for name, f in paths.items():
        start = time.perf_counter()
        for _ in range(2000):
            f()
        torch.cuda.synchronize()
        times[name].append((time.perf_counter() - start) / 2000 * 1e6)
for name, values in times.items():
    print(f"{name:40s} median {statistics.median(values):7.2f} us  (min {min(values):.2f})")

for name, f in list(paths.items())[:3]:
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(50):
            f()
        torch.cuda.synchronize()
    calls = Counter()
    for event in prof.events():
        if event.name.startswith(("cuda", "cu")) or "Backward" in event.name:
            calls[event.name] += 1
    print(f"\n{name}: calls per iteration")
    for call, count in calls.most_common(14):
        print(f"  {count / 50:6.2f}  {call}")
