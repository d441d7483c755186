"""Bandwidth of opreg::fused_add at 2^28 float32 elements against torch.add (3 x 1 GiB of traffic
per call: two reads, one write), timed with CUDA events. Needs a CUDA GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import opreg  # noqa: F401
from common import Report, device_ms


def main() -> None:
    n = 2**28
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    torch.testing.assert_close(torch.ops.opreg.fused_add(x, y), x + y, rtol=0, atol=0)
    traffic = 3 * 4 * n
    r = Report("bandwidth", "fused_add bandwidth, 2^28 float32 elements")
    for key, what, fn in [
        ("torch_add", "torch.add", lambda: torch.add(x, y)),
        (
            "opreg_fused_add",
            "opreg::fused_add (AOT Triton kernel)",
            lambda: torch.ops.opreg.fused_add(x, y),
        ),
        ("device_copy", "a 2 GiB device-to-device copy (the practical ceiling)", lambda: x.clone()),
    ]:
        ms = device_ms(fn, "cuda")
        bytes_moved = traffic if key != "device_copy" else 2 * 4 * n
        r.figure(key, bytes_moved / ms / 1e6, "GB/s", f"{what}; median {ms:.3f} ms per call")
    r.compare("opreg_fused_add", "torch_add", ">=0.95", lower_is_better=False)
    r.compare("opreg_fused_add", "device_copy", lower_is_better=False)
    r.write()


if __name__ == "__main__":
    main()
