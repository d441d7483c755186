"""Philox random numbers at [4096, 65536] float32, one run, side by side: torch.rand, torch.randn,
opreg::philox_uniform and opreg::philox_normal (AOT Triton kernels), timed with CUDA events; plus
the agreement of the kernel with the fallback (CUDA fallback on every value, CPU fallback on the
first rows) and philox_normal's error against a float64 Box-Muller of the same uniforms.
Needs a CUDA GPU."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import opreg
from common import Report, device_ms
from opreg import _C

POP, N = 4096, 65536
CPU_ROWS = 32  # rows also checked against the CPU fallback (~2M values)
TARGETS = {"uniform": ">=1.5", "normal": ">=1.2"}


def ordered(t: torch.Tensor) -> torch.Tensor:
    bits = t.contiguous().view(torch.int32).long()
    return torch.where(bits < 0, -(bits & 0x7FFFFFFF), bits)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest number of float32 steps between a and b (0 for bitwise equal, +0 vs -0 too)."""
    return int((ordered(a) - ordered(b.to(a.device))).abs().max().item())


def float64_normal(uniform: torch.Tensor) -> torch.Tensor:
    """Box-Muller in float64 on the same uniforms; sin/cos(2 pi u2) as sin/cos(pi/2 f) after the
    exact split 4 u2 = q + f, so that angles on an axis give exact zeros."""
    u1 = uniform[:, 0::2].double().clamp_min(1.0000000133514320e-10)
    turns = (uniform[:, 1::2].double() * 4).contiguous()
    q = torch.round(turns)  # q + 1/2 never occurs: u2 has 24 bits
    f = (turns - q) * (torch.pi / 2)
    s, c = torch.sin(f), torch.cos(f)
    q = q.long() & 3
    sin = torch.where(q % 2 == 1, c, s) * torch.where(q >= 2, -1.0, 1.0)
    cos = torch.where(q % 2 == 1, s, c) * torch.where((q == 1) | (q == 2), -1.0, 1.0)
    radius = torch.sqrt(-2 * torch.log(u1))
    return torch.stack([radius * cos, radius * sin], -1).reshape(uniform.shape)


def error_vs_float64(normal: torch.Tensor, uniform: torch.Tensor) -> tuple[float, float]:
    """(max |z - ref|, max |z - ref| in float32 ulps of ref) over row blocks."""
    worst_abs = worst_ulps = 0.0
    for rows in range(0, normal.shape[0], 256):
        ref = float64_normal(uniform[rows : rows + 256])
        error = (normal[rows : rows + 256].double() - ref).abs()
        ulp = torch.ldexp(torch.ones_like(ref), torch.frexp(ref.float()).exponent - 24).double()
        worst_abs = max(worst_abs, error.max().item())
        worst_ulps = max(worst_ulps, (error / ulp.clamp_min(2.0**-149)).max().item())
    return worst_abs, worst_ulps


def timings(report: Report, seeds: torch.Tensor) -> None:
    paths = {
        "torch_rand": ("torch.rand(4096, 65536)", lambda: torch.rand(POP, N, device="cuda")),
        "opreg_philox_uniform": (
            "opreg::philox_uniform (AOT Triton kernel)",
            lambda: torch.ops.opreg.philox_uniform(seeds, N, 0),
        ),
        "torch_randn": ("torch.randn(4096, 65536)", lambda: torch.randn(POP, N, device="cuda")),
        "opreg_philox_normal": (
            "opreg::philox_normal (AOT Triton kernel)",
            lambda: torch.ops.opreg.philox_normal(seeds, N, 0),
        ),
    }
    rounds: dict[str, list[float]] = {key: [] for key in paths}
    for _ in range(3):  # rounds in turn, so drift reaches every path alike
        for key, (_, fn) in paths.items():
            rounds[key].append(device_ms(fn, "cuda"))
    for key, (what, _) in paths.items():
        ms = statistics.median(rounds[key])
        spread = ", ".join(f"{m:.3f}" for m in rounds[key])
        report.figure(
            key,
            POP * N / ms / 1e6,
            "G elements/s",
            f"{what}; median {ms:.3f} ms per call (3 rounds of 50 calls: {spread} ms)",
        )
    report.compare("opreg_philox_uniform", "torch_rand", TARGETS["uniform"], lower_is_better=False)
    report.compare("opreg_philox_normal", "torch_randn", TARGETS["normal"], lower_is_better=False)
    report.compare("opreg_philox_normal", "torch_rand", lower_is_better=False)


def fallback_figures(
    report: Report, key: str, values: torch.Tensor, cuda_fallback, cpu_fallback, counter: int
) -> None:
    """`key`_vs_cuda_fallback_max_ulps over every value, `key`_vs_cpu_fallback_max_ulps over the
    first CPU_ROWS rows."""
    report.figure(
        f"{key}_vs_cuda_fallback_max_ulps",
        ulp_distance(values, cuda_fallback),
        "float32 ulps",
        f"max over all {values.numel()} values, seeds {POP} random int64, counter {counter}",
    )
    report.figure(
        f"{key}_vs_cpu_fallback_max_ulps",
        ulp_distance(values[:CPU_ROWS], cpu_fallback),
        "float32 ulps",
        f"max over the first {CPU_ROWS} rows ({CPU_ROWS * N} values)",
    )


def accuracy_figures(report: Report, key: str, normal: torch.Tensor, uniform: torch.Tensor) -> None:
    """`key`_max_abs_error_vs_float64 and `key`_max_error_vs_float64_ulps of normals against a
    float64 Box-Muller of the same uniforms."""
    worst_abs, worst_ulps = error_vs_float64(normal, uniform)
    report.figure(
        f"{key}_max_abs_error_vs_float64",
        worst_abs * 1e6,
        "1e-6 (absolute)",
        f"max |normal - float64 Box-Muller of the same uniforms| over {normal.numel()} values",
    )
    report.figure(
        f"{key}_max_error_vs_float64_ulps",
        worst_ulps,
        "float32 ulps of the reference",
        "max |normal - float64 reference| / ulp(reference), same values",
    )


def agreement(report: Report, seeds: torch.Tensor) -> None:
    with opreg.trace() as t:
        uniform = torch.ops.opreg.philox_uniform(seeds, N, 5)
        normal = torch.ops.opreg.philox_normal(seeds, N, 5)
    assert t.impls() == ["kernel:triton_aot"] * 2, t.impls()
    for name, kernel_out in [("uniform", uniform), ("normal", normal)]:
        op = f"opreg::philox_{name}"
        cuda_fallback = _C.call_fallback(op, [seeds, N, 5], {})[0]
        cpu_fallback = _C.call_fallback(op, [seeds[:CPU_ROWS].cpu(), N, 5], {})[0]
        fallback_figures(report, f"{name}_kernel", kernel_out, cuda_fallback, cpu_fallback, 5)
    accuracy_figures(report, "normal", normal, uniform)


def main() -> None:
    generator = torch.Generator().manual_seed(0)
    seeds = torch.randint(-(2**63), 2**63 - 1, (POP,), dtype=torch.int64, generator=generator)
    seeds = seeds.cuda()
    report = Report("philox", "Philox random numbers, [4096, 65536] float32")
    timings(report, seeds)
    agreement(report, seeds)
    report.write()


if __name__ == "__main__":
    main()
