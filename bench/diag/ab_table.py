"""Turns the runs of an eager-overhead A/B (bench/diag/eager_ab.sh) into
bench/results/<name>.json and .md: each comparison's ratio per run of each build, and the median
of the new runs over the median of the base runs; the same for each path's host time.

    python bench/diag/ab_table.py NAME "TITLE" "METHOD" --new A.json B.json --base C.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("title")
    parser.add_argument("method")
    parser.add_argument("--new", nargs="+", required=True, type=Path)
    parser.add_argument("--base", nargs="+", required=True, type=Path)
    args = parser.parse_args()
    new = [json.loads(p.read_text()) for p in args.new]
    base = [json.loads(p.read_text()) for p in args.base]

    def over(a: list[float], b: list[float]) -> float:
        return round(statistics.median(a) / statistics.median(b), 3)

    # A run on a busy moment is slower on every path (seen: +45% across the board); the fastest
    # run of each build is the least disturbed estimate of what its code costs.
    def fastest_over(a: list[float], b: list[float]) -> float:
        return round(min(a) / min(b), 3)

    rows = []
    for i, comparison in enumerate(new[0]["comparisons"]):
        new_runs = [run["comparisons"][i]["ratio"] for run in new]
        base_runs = [run["comparisons"][i]["ratio"] for run in base]
        rows.append(
            {
                "subject": comparison["subject"],
                "peer": comparison["peer"],
                "target": comparison.get("target") or "",
                "unit": "ratio (us/call over us/call of the peer, host time)",
                "new_runs": new_runs,
                "base_runs": base_runs,
                "median_new_over_median_base": over(new_runs, base_runs),
            }
        )
    figures = {}
    for key, figure in new[0]["figures"].items():
        new_runs = [run["figures"][key]["value"] for run in new]
        base_runs = [run["figures"][key]["value"] for run in base]
        figures[key] = {
            "unit": figure["unit"],
            "what": figure["what"],
            "new_runs": new_runs,
            "base_runs": base_runs,
            "median_new_over_median_base": over(new_runs, base_runs),
            "fastest_new_over_fastest_base": fastest_over(new_runs, base_runs),
        }
    result = {
        "benchmark": args.name,
        "title": args.title,
        "date": new[0]["date"],
        "machine": new[0]["machine"],
        "method": args.method,
        "peers": sorted({row["peer"] for row in rows}),
        "rows": rows,
        "figures": figures,
    }
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")

    machine = result["machine"]
    lines = [
        f"# {args.title}",
        "",
        f"{result['date']}; {machine['gpu']}, torch {machine['torch']}, "
        f"triton {machine['triton']}, Python {machine['python']}, {machine['cpu_count']} CPUs",
        "",
        args.method,
        "",
        "| subject | peer | target | new runs | base runs | median new / median base |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| `{row['subject']}` | `{row['peer']}` | {row['target']} | "
            f"{', '.join(map(str, row['new_runs']))} | {', '.join(map(str, row['base_runs']))} | "
            f"{row['median_new_over_median_base']} |"
        )
    lines += [
        "",
        "Absolute host time per call (us), same runs:",
        "",
        "| path | new runs | base runs | median new / median base | fastest new / fastest base |",
        "|---|---|---|---|---|",
    ]
    for key, figure in figures.items():
        lines.append(
            f"| `{key}` | {', '.join(f'{v:.2f}' for v in figure['new_runs'])} | "
            f"{', '.join(f'{v:.2f}' for v in figure['base_runs'])} | "
            f"{figure['median_new_over_median_base']} | "
            f"{figure['fastest_new_over_fastest_base']} |"
        )
    (RESULTS / f"{args.name}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
