"""torch.vmap of a batch-polymorphic opreg op with a kernel (fused_add), 1024 elements per
example, at batch 64 and 1024: against torch.vmap of the same computation in built-in ops, and
PyTorch's per-example loop on the same op registered without opreg (a custom_op with no vmap
rule). On CUDA when present, and on the CPU (where the fallback serves)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import opreg  # noqa: F401
from common import Report, host_us_per_call


def main() -> None:
    from peers import registrations as peers

    warnings.filterwarnings("ignore", message=".*performance drop.*")
    r = Report("vmap", "vmap of a batch-polymorphic op, 1024 elements per example")
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    opreg_vmap = torch.vmap(torch.ops.opreg.fused_add)
    builtin_vmap = torch.vmap(lambda a, b: a + b)
    loop_vmap = torch.vmap(peers.plain_add)
    for device in devices:
        for batch in (64, 1024):
            x = torch.randn(batch, 1024, device=device)
            y = torch.randn(batch, 1024, device=device)
            torch.testing.assert_close(opreg_vmap(x, y), x + y)
            torch.testing.assert_close(loop_vmap(x, y), x + y)
            us = "us/call (host)"
            key = f"{device}_b{batch}"
            r.figure(
                f"opreg_{key}",
                host_us_per_call(lambda x=x, y=y: opreg_vmap(x, y), device, 500),
                us,
                f"torch.vmap(opreg fused_add), {device}, batch {batch}",
            )
            r.figure(
                f"builtin_{key}",
                host_us_per_call(lambda x=x, y=y: builtin_vmap(x, y), device, 500),
                us,
                f"torch.vmap(lambda a, b: a + b), {device}, batch {batch}",
            )
            calls = 20 if batch == 64 else 3
            r.figure(
                f"loop_{key}",
                host_us_per_call(lambda x=x, y=y: loop_vmap(x, y), device, calls, repeats=3),
                us,
                f"torch.vmap of a custom_op without a vmap rule (per-example loop), {device}, "
                f"batch {batch}",
            )
            r.compare(f"opreg_{key}", f"builtin_{key}", "<=1.2")
            r.compare(f"opreg_{key}", f"loop_{key}", "<=0.0667" if batch == 64 else "<=0.01")
    r.write()


if __name__ == "__main__":
    main()
