"""Throughput of opreg::philox_uniform / philox_normal producing [4096, 65536] float32 against
torch.rand / torch.randn of that shape, timed with CUDA events. Needs a CUDA GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import opreg  # noqa: F401
from common import Report, device_ms


def main() -> None:
    pop, n = 4096, 65536
    seeds = torch.arange(pop, device="cuda", dtype=torch.int64) * 1000003 + 17
    assert torch.equal(
        torch.ops.opreg.philox_uniform(seeds[:8], 1000, 5).cpu(),
        torch.ops.opreg.philox_uniform(seeds[:8].cpu(), 1000, 5),
    )
    r = Report("philox", "Philox random numbers, [4096, 65536] float32")
    elements = pop * n
    for key, what, fn in [
        ("torch_rand", "torch.rand(4096, 65536)", lambda: torch.rand(pop, n, device="cuda")),
        (
            "opreg_philox_uniform",
            "opreg::philox_uniform (AOT Triton kernel)",
            lambda: torch.ops.opreg.philox_uniform(seeds, n, 0),
        ),
        ("torch_randn", "torch.randn(4096, 65536)", lambda: torch.randn(pop, n, device="cuda")),
        (
            "opreg_philox_normal",
            "opreg::philox_normal (AOT Triton kernel)",
            lambda: torch.ops.opreg.philox_normal(seeds, n, 0),
        ),
    ]:
        ms = device_ms(fn, "cuda")
        r.figure(key, elements / ms / 1e6, "G elements/s", f"{what}; median {ms:.3f} ms per call")
    r.compare("opreg_philox_uniform", "torch_rand", ">=1.0", lower_is_better=False)
    r.compare("opreg_philox_normal", "torch_randn", lower_is_better=False)
    r.write()


if __name__ == "__main__":
    main()
