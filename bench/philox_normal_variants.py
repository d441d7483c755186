"""Candidate philox_normal kernels at [4096, 65536] float32 against torch.randn, one run: the
shipped AOT kernel and the same Triton source (python/opreg/kernels/philox.py) run through
Triton's JIT with MODE 0 (as shipped: every float operation rounded on its own), 1 (polynomial
steps as FMAs, the rest contractable) and 2 (as 1, approximate sqrt), each at a few tile sizes.
For each: time per call (CUDA events around 20 back-to-back calls, so launch cost is hidden as
for the AOT op), and its distance in float32 ulps from the op's fallback over every value (CUDA
fallback) and over the first rows (CPU fallback), and its error against a float64 Box-Muller of
the same uniforms. The target: >= 1.2x torch.randn within 2 ulps of the fallback. Needs a CUDA GPU.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from philox import CPU_ROWS, POP, N, accuracy_figures, fallback_figures

import opreg
from common import Report
from opreg import _C
from opreg.kernels import philox as kernels

COUNTER = 5
CALLS = 20  # per timed batch
MODES = {0: "as shipped", 1: "FMA", 2: "FMA, approximate sqrt"}
TILES = [(512, 4), (1024, 4), (1024, 8), (2048, 8), (256, 2)]  # (BLOCK, num_warps)


def batch_ms(fn) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(CALLS):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / CALLS


def jit_normal(seeds: torch.Tensor, mode: int, block: int, warps: int):
    out = torch.empty(POP, N, device="cuda")
    grid = (POP, triton_cdiv(triton_cdiv(N, 4), block))

    def run():
        kernels.philox_normal_kernel[grid](
            seeds, out, N, COUNTER, BLOCK=block, MODE=mode, num_warps=warps, num_stages=1
        )
        return out

    return run


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def main() -> None:
    generator = torch.Generator().manual_seed(0)
    seeds = torch.randint(-(2**63), 2**63 - 1, (POP,), dtype=torch.int64, generator=generator)
    seeds = seeds.cuda()
    report = Report(
        "philox_normal_variants", "philox_normal kernel candidates, [4096, 65536] float32"
    )
    paths = {
        "torch_randn": ("torch.randn(4096, 65536)", lambda: torch.randn(POP, N, device="cuda")),
        "shipped_aot": (
            "opreg::philox_normal (shipped AOT kernel, BLOCK 512, 4 warps, MODE 0)",
            lambda: torch.ops.opreg.philox_normal(seeds, N, COUNTER),
        ),
    }
    for mode, words in MODES.items():
        for block, warps in TILES:
            paths[f"jit_mode{mode}_block{block}_w{warps}"] = (
                f"Triton JIT, MODE {mode} ({words}), BLOCK {block}, {warps} warps",
                jit_normal(seeds, mode, block, warps),
            )
    for _, fn in paths.values():  # compile and warm up
        fn()
    torch.cuda.synchronize()
    rounds: dict[str, list[float]] = {key: [] for key in paths}
    for _ in range(5):
        for key, (_, fn) in paths.items():
            rounds[key].append(batch_ms(fn))

    with opreg.trace() as t:
        uniform = torch.ops.opreg.philox_uniform(seeds, N, COUNTER)
    assert t.impls() == ["kernel:triton_aot"], t.impls()
    cuda_fallback = _C.call_fallback("opreg::philox_normal", [seeds, N, COUNTER], {})[0]
    cpu_fallback = _C.call_fallback(
        "opreg::philox_normal", [seeds[:CPU_ROWS].cpu(), N, COUNTER], {}
    )[0]
    for key, (what, fn) in paths.items():
        ms = statistics.median(rounds[key])
        spread = ", ".join(f"{m:.3f}" for m in rounds[key])
        report.figure(
            f"{key}_ms",
            ms,
            "ms per call",
            f"{what}; median of 5 batches of {CALLS} calls ({spread} ms)",
        )
        if key == "torch_randn":
            continue
        values = fn().clone()
        fallback_figures(report, key, values, cuda_fallback, cpu_fallback, COUNTER)
        accuracy_figures(report, key, values, uniform)
        del values
    for key in paths:
        if key != "torch_randn":
            # Speed-up over torch.randn: randn's time over the candidate's (>= 1.2 wanted).
            report.compare("torch_randn_ms", f"{key}_ms", ">=1.2", lower_is_better=False)
    report.write()


if __name__ == "__main__":
    main()
