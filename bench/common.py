"""Shared by the benchmarks: timing, the machine's description, and the result files
(bench/results/<name>.json with every figure's unit, the machine, the date, the peers and the
ratio to each; plus <name>.md, a table of the same)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

RESULTS = Path(os.environ.get("OPREG_BENCH_OUT", Path(__file__).parent / "results"))


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def host_us_per_call(
    fn: Callable[[], object], device: str, calls: int = 2000, repeats: int = 7
) -> float:
    """Host-side microseconds per call: median over `repeats` batches of `calls` calls, with a
    synchronize after each batch (the method of shared/notes/baselines.md)."""
    for _ in range(min(calls, 200)):
        fn()
    sync(device)
    batches = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync(device)
        batches.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(batches)


def host_us_per_call_interleaved(
    fns: dict[str, Callable[[], object]], device: str, calls: int = 2000, repeats: int = 7
) -> dict[str, float]:
    """host_us_per_call for several paths at once, their batches taken in turn (batch i of every
    path before batch i+1 of any), so that drift in the host's speed reaches each path alike."""
    for fn in fns.values():
        for _ in range(min(calls, 200)):
            fn()
    sync(device)
    batches: dict[str, list[float]] = {key: [] for key in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            sync(device)
            batches[key].append((time.perf_counter() - start) / calls * 1e6)
    return {key: statistics.median(values) for key, values in batches.items()}


def device_ms(fn: Callable[[], object], device: str, repeats: int = 50) -> float:
    """Median milliseconds of one call, timed with CUDA events (host timer on CPU)."""
    for _ in range(5):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            start_time = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start_time) * 1e3)
    return statistics.median(times)


def machine() -> dict[str, object]:
    info: dict[str, object] = {
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception as error:
        info["triton"] = f"unavailable: {error}"
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    return info


class Report:
    """Figures and comparisons of one benchmark, written as JSON and Markdown."""

    def __init__(self, name: str, title: str) -> None:
        self.name, self.title = name, title
        self.figures: dict[str, dict[str, object]] = {}
        self.comparisons: list[dict[str, object]] = []

    def figure(self, key: str, value: float, unit: str, what: str) -> float:
        self.figures[key] = {"value": round(value, 4), "unit": unit, "what": what}
        return value

    def compare(
        self, subject: str, peer: str, target: str | None = None, lower_is_better: bool = True
    ) -> float:
        ratio = self.figures[subject]["value"] / self.figures[peer]["value"]
        entry: dict[str, object] = {
            "subject": subject,
            "peer": peer,
            "ratio": float(f"{ratio:.3g}"),
        }
        if target is not None:
            op, bound = target[:2], float(target[2:])
            entry["target"] = target
            entry["met"] = ratio <= bound if op == "<=" else ratio >= bound
        entry["lower_is_better"] = lower_is_better
        self.comparisons.append(entry)
        return ratio

    def write(self) -> Path:
        RESULTS.mkdir(parents=True, exist_ok=True)
        data = {
            "benchmark": self.name,
            "title": self.title,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": machine(),
            "figures": self.figures,
            "comparisons": self.comparisons,
        }
        path = RESULTS / f"{self.name}.json"
        path.write_text(json.dumps(data, indent=1) + "\n")
        (RESULTS / f"{self.name}.md").write_text(markdown(data))
        print(markdown(data), flush=True)
        return path


def markdown(data: dict) -> str:
    m = data["machine"]
    lines = [
        f"# {data['title']}",
        "",
        f"{data['date']}; {m.get('gpu', 'CPU only')}, torch {m['torch']}, "
        f"triton {m['triton']}, Python {m['python']}, {m['cpu_count']} CPUs",
        "",
        "| figure | value | unit | what |",
        "|---|---|---|---|",
    ]
    for key, f in data["figures"].items():
        lines.append(f"| `{key}` | {f['value']} | {f['unit']} | {f['what']} |")
    if data["comparisons"]:
        lines += ["", "| subject | peer | ratio | target | met |", "|---|---|---|---|---|"]
        for c in data["comparisons"]:
            met = {True: "yes", False: "**no**"}.get(c.get("met"), "")
            lines.append(
                f"| `{c['subject']}` | `{c['peer']}` | {c['ratio']} | "
                f"{c.get('target', '')} | {met} |"
            )
    return "\n".join(lines) + "\n"
