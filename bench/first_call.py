"""First call in a fresh process (after `import torch` and CUDA init): opreg's AOT kernel (module
load + launch) against Triton's JIT (compile + launch with an empty cache, and with the compiled
kernel already in Triton's disk cache). Median of 3 fresh processes each. Needs a CUDA GPU."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import Report

PROLOGUE = """
import json, sys, time, torch
sys.path.insert(0, {bench!r})
x = torch.randn(1024, device="cuda"); y = torch.randn(1024, device="cuda")
torch.cuda.synchronize()
"""
OPREG = (
    PROLOGUE
    + """
import opreg
start = time.perf_counter()
out = torch.ops.opreg.fused_add(x, y); torch.cuda.synchronize()
first = time.perf_counter() - start
start = time.perf_counter()
torch.ops.opreg.fused_add(x, y); torch.cuda.synchronize()
print(json.dumps([first * 1e3, (time.perf_counter() - start) * 1e3]))
"""
)
TRITON = (
    PROLOGUE
    + """
from peers.registrations import triton_add
start = time.perf_counter()
out = triton_add(x, y); torch.cuda.synchronize()
first = time.perf_counter() - start
start = time.perf_counter()
triton_add(x, y); torch.cuda.synchronize()
print(json.dumps([first * 1e3, (time.perf_counter() - start) * 1e3]))
"""
)


def run(code: str, env: dict[str, str]) -> list[float]:
    import os

    text = code.format(bench=str(Path(__file__).parent))
    result = subprocess.run(
        [sys.executable, "-c", text],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    r = Report("first_call", "First call in a fresh process, 1024-element float32 add")
    opreg_runs = [run(OPREG, {}) for _ in range(3)]
    cold, warm = [], []
    for _ in range(3):
        with tempfile.TemporaryDirectory() as cache:
            cold.append(run(TRITON, {"TRITON_CACHE_DIR": cache}))
            warm.append(run(TRITON, {"TRITON_CACHE_DIR": cache}))
    med = lambda runs, i: statistics.median(run[i] for run in runs)  # noqa: E731
    r.figure("opreg_first_call", med(opreg_runs, 0), "ms", "opreg fused_add: module load + launch")
    r.figure(
        "triton_jit_first_call_empty_cache",
        med(cold, 0),
        "ms",
        "Triton JIT, empty cache: compile + launch",
    )
    r.figure(
        "triton_jit_first_call_warm_cache",
        med(warm, 0),
        "ms",
        "Triton JIT, kernel in the disk cache: load + launch",
    )
    r.figure("opreg_second_call", med(opreg_runs, 1), "ms", "opreg fused_add, second call")
    r.figure("triton_jit_second_call", med(warm, 1), "ms", "Triton JIT, second call")
    r.compare("opreg_first_call", "triton_jit_first_call_empty_cache")
    r.compare("opreg_first_call", "triton_jit_first_call_warm_cache")
    r.write()


if __name__ == "__main__":
    main()
