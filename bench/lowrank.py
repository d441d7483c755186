"""Low-rank noise at pop 1024, d = k = 1024, rank 4, one run, side by side: the fused ops
(opreg::lowrank_delta_output at batch 1 and 16, opreg::lowrank_gradient; AOT Triton kernels that
generate the factors in registers) against EvoX's materialising helpers written on opreg's
philox_normal (A and B drawn into memory, then bmm / einsum). For each: device time per call
(CUDA events, median of 3 rounds of 50 calls, rounds in turn), working memory beyond the inputs
and the output (torch.cuda.max_memory_allocated during one call, less what was allocated before
and less the output), and the largest difference between the two. Targets: >= 3x faster,
>= 10x less working memory. Then, bench-only, the same kernels through Triton's JIT with other
tile sizes (the shipped ones first), to choose the AOT configuration. Needs a CUDA GPU."""

from __future__ import annotations

import functools
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import opreg
from common import Report, device_ms
from opreg.kernels import philox as kernels
from opreg.philox import philox_normal

POP, D, K, RANK, SIGMA, COUNTER = 1024, 1024, 1024, 4, 0.02, 12
BATCHES = (1, 16)
TARGETS = {"time": "<=0.333", "memory": "<=0.1"}  # fused / materialised


def materialised_factors(seeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a = philox_normal(seeds, RANK * K, COUNTER).reshape(POP, RANK, K)
    b_counter = COUNTER + (RANK * K + 3) // 4 * 4
    b = philox_normal(seeds, D * RANK, b_counter).reshape(POP, D, RANK)
    return a, b


def materialised_delta(x: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    a, b = materialised_factors(seeds)
    return SIGMA * torch.bmm(torch.bmm(x, a.transpose(-1, -2)), b.transpose(-1, -2))


def materialised_gradient(fitness: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    a, b = materialised_factors(seeds)
    return torch.einsum("i,ijk,ikl->jl", fitness, b, a) / (POP * SIGMA)


def working_mib(fn: Callable[[], torch.Tensor]) -> float:
    """Peak memory of one call beyond what was allocated before it and its output, in MiB."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return (peak - before - out.untyped_storage().nbytes()) / 2**20


# (BLOCK_B, BLOCK_K, BLOCK_D, num_warps) and (BLOCK_P, BLOCK_D, BLOCK_K, num_warps); the first of
# each is kernels.toml's for rank 4.
DELTA_TILES = [(16, 128, 128, 4), (16, 64, 64, 4), (16, 128, 128, 8), (4, 256, 256, 4)]
DELTA_TILES += [(2, 256, 128, 4)]
GRADIENT_TILES = [(8, 64, 64, 8), (8, 64, 64, 4), (8, 128, 64, 8), (4, 128, 128, 8)]
GRADIENT_TILES += [(8, 128, 128, 8)]


def jit_figure(report: Report, key: str, kernel, grid, args, tiles: dict, warps: int) -> None:
    """ms per call of `kernel` launched through Triton's JIT with the tile constexprs `tiles`."""
    launch = functools.partial(kernel[grid], *args, R=RANK, **tiles, num_warps=warps, num_stages=1)
    sizes = ", ".join(f"{name} {value}" for name, value in tiles.items())
    report.figure(
        key, device_ms(launch, "cuda"), "ms per call", f"via Triton JIT, {sizes}, {warps} warps"
    )


def tile_figures(report: Report, seeds, fitness, xs) -> None:
    b_counter = COUNTER + RANK * K
    for batch, x in xs.items():
        out = torch.empty(POP, batch, D, device="cuda")
        args = (x, seeds, out, batch, K, D, COUNTER, b_counter, SIGMA)
        for block_b, block_k, block_d, warps in DELTA_TILES:
            tiles = {"BLOCK_B": block_b, "BLOCK_K": block_k, "BLOCK_D": block_d}
            key = f"jit_delta_b{batch}_tile{block_b}x{block_k}x{block_d}_w{warps}_ms"
            grid = (POP, -(-batch // block_b))
            jit_figure(report, key, kernels.lowrank_delta_output_kernel, grid, args, tiles, warps)
    grad = torch.empty(D, K, device="cuda")
    args = (fitness, seeds, grad, POP, K, D, COUNTER, b_counter, POP * SIGMA)
    for block_p, block_d, block_k, warps in GRADIENT_TILES:
        tiles = {"BLOCK_P": block_p, "BLOCK_D": block_d, "BLOCK_K": block_k}
        key = f"jit_gradient_tile{block_p}x{block_d}x{block_k}_w{warps}_ms"
        grid = (-(-D // block_d), -(-K // block_k), 1)
        jit_figure(report, key, kernels.lowrank_gradient_kernel, grid, args, tiles, warps)


def main() -> None:
    generator = torch.Generator().manual_seed(0)
    seeds = torch.randint(-(2**63), 2**63 - 1, (POP,), dtype=torch.int64, generator=generator)
    seeds = seeds.cuda()
    fitness = torch.randn(POP, generator=generator).cuda()
    report = Report("lowrank", "Low-rank noise, pop 1024, d = k = 1024, rank 4, float32")
    paths: dict[str, tuple[str, Callable[[], torch.Tensor]]] = {}
    xs = {batch: torch.randn(POP, batch, K, generator=generator).cuda() for batch in BATCHES}
    for batch, x in xs.items():
        paths[f"fused_delta_b{batch}"] = (
            f"opreg::lowrank_delta_output, x [1024, {batch}, 1024] (AOT Triton kernel)",
            lambda x=x: torch.ops.opreg.lowrank_delta_output(x, seeds, RANK, D, SIGMA, COUNTER),
        )
        paths[f"materialised_delta_b{batch}"] = (
            f"EvoX's lora_delta_output on philox_normal factors, x [1024, {batch}, 1024]",
            lambda x=x: materialised_delta(x, seeds),
        )
    paths["fused_gradient"] = (
        "opreg::lowrank_gradient (AOT Triton kernel)",
        lambda: torch.ops.opreg.lowrank_gradient(fitness, seeds, RANK, D, K, SIGMA, COUNTER),
    )
    paths["materialised_gradient"] = (
        "EvoX's lora_gradient (einsum) on philox_normal factors",
        lambda: materialised_gradient(fitness, seeds),
    )

    with opreg.trace() as t:
        for key in paths:
            if key.startswith("fused"):
                paths[key][1]()
    assert set(t.impls()) == {"kernel:triton_aot"}, t.impls()

    rounds: dict[str, list[float]] = {key: [] for key in paths}
    for _ in range(3):
        for key, (_, fn) in paths.items():
            rounds[key].append(device_ms(fn, "cuda"))
    for key, (what, _) in paths.items():
        ms = statistics.median(rounds[key])
        spread = ", ".join(f"{m:.4f}" for m in rounds[key])
        report.figure(
            f"{key}_ms", ms, "ms per call", f"{what}; median of 3 rounds of 50 ({spread})"
        )
    for key, (_, fn) in paths.items():
        report.figure(
            f"{key}_working_memory",
            working_mib(fn),
            "MiB",
            "peak allocated during one call, less inputs and output",
        )
    for name in [f"delta_b{batch}" for batch in BATCHES] + ["gradient"]:
        fused, materialised = paths[f"fused_{name}"][1](), paths[f"materialised_{name}"][1]()
        scale = materialised.abs().max().item()
        report.figure(
            f"{name}_max_relative_difference",
            (fused - materialised).abs().max().item() / scale * 1e6,
            "1e-6 of max |materialised|",
            "max |fused - materialised| / max |materialised|",
        )
    for name in [f"delta_b{batch}" for batch in BATCHES] + ["gradient"]:
        report.compare(f"fused_{name}_ms", f"materialised_{name}_ms", TARGETS["time"])
        report.compare(
            f"fused_{name}_working_memory",
            f"materialised_{name}_working_memory",
            TARGETS["memory"],
        )
    report.write()  # the targets' figures first, in case the exploration fails
    tile_figures(report, seeds, fitness, xs)
    report.write()


if __name__ == "__main__":
    main()
