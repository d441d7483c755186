"""examples/deploy's NoisyMLP, one call: the AOTInductor package run from C++ with no Python
(run_model --time) against the eager model called from Python, on the device given (CPU, or CUDA
when present). Both time whole calls with the first output copied to the host, median of many.

    python3 bench/deploy.py [--device cpu|cuda] [--runs N] [--name NAME]

Builds the example in a temporary folder from the installed sources, as docs/deploy.md does."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import opreg
from common import Report


def run(args: list[str], cwd: Path) -> str:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{result.stdout}{result.stderr}")
    return result.stdout


def eager_ms_per_call(device: str, runs: int, deploy: Path) -> float:
    sys.path.insert(0, str(deploy))
    import model as deploy_model

    deploy_model.load_ops()
    module = deploy_model.build_model(device)
    inputs = deploy_model.example_inputs(device)
    times = []
    with torch.no_grad():
        for _ in range(20):
            module(*inputs)[0].cpu()
        for _ in range(runs):
            start = time.perf_counter()
            module(*inputs)[0].cpu()
            times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--name", default="deploy")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="opreg_deploy_bench_"))
    deploy = work / "deploy"
    run(["cp", "-r", str(opreg.example_source("deploy")), str(deploy)], work)
    run([sys.executable, "model.py", "export", "out", "--device", args.device], deploy)
    run(["cmake", "-S", ".", "-B", "build", f"-DCMAKE_PREFIX_PATH={opreg.cmake_dir()}"], deploy)
    run(["cmake", "--build", "build"], deploy)
    library = str(opreg.example_library("scale_add"))
    files = ["out/model.pt2", "out/inputs.pt", "out/outputs.pt"]
    cpp = run(["./build/run_model", *files, "--library", library, "--time", str(args.runs)], deploy)
    assert "Python in this process: no" in cpp, cpp
    cpp_ms = float(re.search(r"median ([\d.e+-]+) ms per run", cpp).group(1))
    run([sys.executable, "model.py", "check", "out"], deploy)  # the package computed the model

    eager_ms = eager_ms_per_call(args.device, args.runs, deploy)

    r = Report(args.name, f"examples/deploy NoisyMLP, batch 8, one call ({args.device})")
    what = f"median of {args.runs} calls, first output copied to the host; {args.device}"
    r.figure("aoti_cpp_ms", cpp_ms, "ms per call", f"run_model (C++, no Python): {what}")
    r.figure("eager_python_ms", eager_ms, "ms per call", f"the eager model from Python: {what}")
    r.compare("aoti_cpp_ms", "eager_python_ms")
    r.write()


if __name__ == "__main__":
    main()
