"""Runs the C++ launch benchmark (bench/cpp, built beforehand) and records its figures: an AOT
Triton launch through opreg's C++ launcher against a raw CUDA <<<>>> launch of the same work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import Report


def main(binary: str) -> None:
    data = json.loads(
        subprocess.run([binary], check=True, capture_output=True, text=True)
        .stdout.strip()
        .splitlines()[-1]
    )
    assert data["correct"], "the AOT kernel's output differs from x + y"
    r = Report("launch_cpp", "Launch cost from C++, 1024-element float32 add")
    unit = "us/call (host, median of 7 x 2000)"
    r.figure("raw_cuda_launch", data["raw_cuda_launch_us"], unit, "CUDA <<<>>> launch (the floor)")
    r.figure(
        "opreg_aot_launch",
        data["opreg_aot_launch_us"],
        unit,
        f"opreg::triton::Kernel::launch, variant {data['variant']}",
    )
    r.figure(
        "opreg_fused_add_dispatcher",
        data["opreg_fused_add_dispatcher_us"],
        unit,
        "opreg::fused_add(x, y) through the dispatcher (allocates the output)",
    )
    r.figure("at_add", data["at_add_us"], unit, "at::add(x, y) through the dispatcher")
    r.compare("opreg_aot_launch", "raw_cuda_launch", "<=1.2")
    r.compare("opreg_fused_add_dispatcher", "at_add")
    r.write()


if __name__ == "__main__":
    main(sys.argv[1])
