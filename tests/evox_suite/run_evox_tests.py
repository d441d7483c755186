"""Run EvoX's own unit tests twice, with EvoX's modules and with opreg's, and compare each test.

    python3 tests/evox_suite/run_evox_tests.py /path/to/evox --out evox-suite-results

``/path/to/evox`` is a checkout of EvoX (``EMI-Group/evox``: ``src/evox``, ``unit_test``); nothing
in it is edited. pytest runs its tests in two subprocesses, from the checkout, with ``src`` and
``pythonpath/`` (next to this file) in front of ``PYTHONPATH``:

1. ``originals``: EvoX as it is;
2. ``opreg``: with ``EVOX_OPREG_SWITCH=1``, so ``pythonpath/sitecustomize.py`` installs
   ``evox_opreg_switch`` in every Python process before EvoX is imported: EvoX's
   ``evox.utils.op_register``, ``evox.triton_kernels.op_register``, ``evox.triton_kernels.backend``
   and ``evox.triton_kernels.kernels.philox`` are then served by opreg's
   ``register_vmap_op``/``register_triton_op``, backend functions and ``opreg.philox``; all of
   EvoX's other modules stay EvoX's. Each test runs inside ``opreg.trace()``, which records the
   opreg ops it reached.

By default the tests are all of ``unit_test`` but the files of :data:`NEEDS_DOWNLOADS`, those of
:data:`REACHING_OPS_FIRST` first; paths after the checkout (relative to it) choose others.
``--parallel`` runs the two side by side (the tests of :data:`SERIAL_TESTS` take turns);
``--timeout-s`` cuts each run (a test the other run reached is marked); ``--workers N`` spreads
each run over N pytest-xdist workers. ``--out`` receives
``summary.json`` and ``summary.md`` (every test id, its outcome in each run, its verdict, the
opreg ops it reached and which implementation served them), each run's raw outcomes
(``outcomes-<run>.json``) and pytest's log (``pytest-<run>.log``).

The exit status is 1 when opreg falls short: a test that passes with EvoX's modules does not pass
with opreg's (unless :data:`PRIVATE_STATE_TESTS` lists it, its source has the line that reaches
into EvoX's private module state and its failure names that state); a test of
:data:`MUST_PASS_WITH_OPREG` (Philox, LoRA noise, virtual LoRA) does not pass with opreg's; or a
run did not get the modules it should have (``switch_report``). Else it is 2 when a run timed out
or recorded no test, and 0 when all is well.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYTHONPATH_DIR = HERE / "pythonpath"
RUNS = ("originals", "opreg")

#: EvoX test files left out by default: they need Brax, MuJoCo Playground or torchvision with
#: downloaded data sets, which a machine without network lacks.
NEEDS_DOWNLOADS = (
    "unit_test/problems/test_brax.py",
    "unit_test/problems/test_mujoco.py",
    "unit_test/problems/test_supervised_learning.py",
)

#: Test files that reach registered ops (directly, or through EvalMonitor's ``_data_sink`` and
#: non-dominated sorting's ranks): the default selection runs them first, so that a run cut short
#: by ``--timeout-s`` has them.
REACHING_OPS_FIRST = (
    "unit_test/triton_kernels/test_philox.py",
    "unit_test/triton_kernels/test_lora_noise.py",
    "unit_test/triton_kernels/test_virtual_lora_es.py",
    "unit_test/problems/neuroevolution/test_virtual_lora_problem.py",
    "unit_test/test_triton_kernels.py",
    "unit_test/operators/test_non_dominate.py",
    "unit_test/workflows/test_std_workflow.py",
    "unit_test/workflows/test_std_workflow_virtual.py",
    "unit_test/algorithms/test_moea.py",
    "unit_test/problems/test_hpo_wrapper.py",
)

#: Test files whose every test must pass with opreg's modules, whatever EvoX's own do (EvoX's
#: Philox Triton kernel does not compile on Triton 3.6, so on CUDA these fail with EvoX's module).
MUST_PASS_WITH_OPREG = (
    "unit_test/triton_kernels/test_philox.py",
    "unit_test/triton_kernels/test_lora_noise.py",
    "unit_test/triton_kernels/test_virtual_lora_es.py",
    "unit_test/problems/neuroevolution/test_virtual_lora_problem.py",
)


@dataclass(frozen=True)
class PrivateStateTest:
    """A test that reads or assigns a module global of EvoX's that is no public API."""

    test_id: str
    private_name: str  # as the test's source writes it, e.g. "triton_backend._triton_device_types"


#: Tests that bind a fixed TCP port (``MASTER_PORT=29501``): with ``--parallel`` the two runs
#: take turns for them, under a file lock.
SERIAL_TESTS = ("unit_test/workflows/test_std_workflow.py::TestDistributedStdWorkflow",)

PRIVATE_STATE_REASON = "reaches into EvoX's private module state"

PRIVATE_STATE_TESTS = (
    PrivateStateTest(
        "unit_test/test_triton_kernels.py::TestTritonKernels::test_register_triton_device_type",
        "triton_backend._triton_device_types",
    ),
)

PASSED = ("passed", "xfailed")
TIMED_OUT = "timed out"
NOT_RUN_IN_TIME = "not run in time"
#: pytest's configuration files, in its order of search, with the section that makes each one.
PYTEST_CONFIG_FILES = (
    ("pytest.toml", ""),
    (".pytest.toml", ""),
    ("pytest.ini", ""),
    (".pytest.ini", ""),
    ("pyproject.toml", "[tool.pytest"),
    ("tox.ini", "[pytest]"),
    ("setup.cfg", "[tool:pytest]"),
)


def pytest_config_options(evox: Path) -> list[str]:
    """``-c`` with the file pytest would take its configuration from in the checkout (its
    pyproject.toml when none has a pytest section), so none is taken from folders above it."""
    for name, section in PYTEST_CONFIG_FILES:
        path = evox / name
        if path.exists() and section in path.read_text():
            return ["-c", str(path)]
    return ["-c", str(evox / "pyproject.toml")] if (evox / "pyproject.toml").exists() else []


def default_tests(evox: Path) -> list[str]:
    """Every ``unit_test/**/test_*.py`` of the checkout but :data:`NEEDS_DOWNLOADS`, those of
    :data:`REACHING_OPS_FIRST` first (pytest keeps the order of paths that do not overlap)."""
    found = {p.relative_to(evox).as_posix() for p in (evox / "unit_test").rglob("test_*.py")}
    found -= set(NEEDS_DOWNLOADS)
    first = [path for path in REACHING_OPS_FIRST if path in found]
    return first + sorted(found - set(first))


def start_pytest(run: str, evox: Path, tests: list[str], out: Path) -> subprocess.Popen:
    """Starts one run's pytest subprocess on ``tests`` (pytest arguments: options, then paths),
    its output going to ``out/pytest-<run>.log``."""
    outcomes = out / f"outcomes-{run}.json"
    outcomes.unlink(missing_ok=True)
    env = dict(os.environ)
    env.pop("EVOX_OPREG_SWITCH", None)
    if run == "opreg":
        env["EVOX_OPREG_SWITCH"] = "1"
    env["EVOX_SUITE_OUTCOMES"] = str(outcomes)
    env["EVOX_SUITE_SERIAL_TESTS"] = "\n".join(SERIAL_TESTS)
    env["EVOX_SUITE_SERIAL_LOCK"] = str(out / "serial-tests.lock")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(PYTHONPATH_DIR), str(evox / "src"), *filter(None, [env.get("PYTHONPATH")])]
    )
    ignores = [f"--ignore={path}" for path in NEEDS_DOWNLOADS]
    # EvoX's own pytest configuration, and no conftest or configuration from folders above the
    # checkout (it may sit inside another project, as in the GPU run's carried copy).
    command = [
        sys.executable, "-m", "pytest", "-p", "evox_test_outcomes", "-p", "no:cacheprovider",
        "-q", "-rfEs", "--rootdir", str(evox), *pytest_config_options(evox),
        "--confcutdir", str(evox), *ignores, *tests,
    ]  # fmt: skip
    with open(out / f"pytest-{run}.log", "w") as log:
        log.write(" ".join(command) + "\n\n")
        log.flush()
        process = subprocess.Popen(
            command, cwd=evox, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    process.started = time.monotonic()  # for the run's seconds, whoever waits for it when
    return process


def finish_pytest(run: str, process: subprocess.Popen, out: Path, deadline: float | None) -> dict:
    """Waits for a run until ``deadline`` (then kills its process group); returns its outcomes
    file's content, with ``pytest_status`` and ``seconds`` (empty ``tests`` if it wrote none)."""
    try:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        status: int | str = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        status = TIMED_OUT
    outcomes = out / f"outcomes-{run}.json"
    document = json.loads(outcomes.read_text()) if outcomes.exists() else {}
    document.setdefault("tests", {})
    document["pytest_status"] = status
    document["seconds"] = round(time.monotonic() - process.started, 1)
    print(f"[{run}] pytest status {status}, log {out / f'pytest-{run}.log'}", flush=True)
    return document


def run_both(evox: Path, tests: list[str], out: Path, timeout_s: float | None, parallel: bool):
    """The two runs, one after the other or side by side; ``timeout_s`` bounds each run."""
    if parallel:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        processes = {run: start_pytest(run, evox, tests, out) for run in RUNS}
        return {run: finish_pytest(run, processes[run], out, deadline) for run in RUNS}
    runs = {}
    for run in RUNS:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        runs[run] = finish_pytest(run, start_pytest(run, evox, tests, out), out, deadline)
    return runs


def source_lines_of_test(evox: Path, test_id: str) -> list[tuple[int, str]]:
    """The numbered source lines of the test function that ``test_id`` names."""
    path, *names = test_id.split("::")
    source = (evox / path).read_text()
    body: list[ast.stmt] = ast.parse(source).body
    node = None
    for name in names:
        node = next(
            (n for n in body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == name),
            None,
        )
        if node is None:
            return []
        body = node.body
    lines = source.splitlines()
    return [(i, lines[i - 1]) for i in range(node.lineno, node.end_lineno + 1)]


def private_state_evidence(evox: Path, test_id: str, opreg_result: dict) -> str | None:
    """``path:line: code`` where a :data:`PRIVATE_STATE_TESTS` test reaches into EvoX's private
    state, if that line is in this checkout and the failure with opreg names that state."""
    for listed in PRIVATE_STATE_TESTS:
        if listed.test_id != test_id:
            continue
        # The failure must be the switch's AttributeError for that name, not any other.
        attribute = listed.private_name.rsplit(".", 1)[-1]
        if f"has no {attribute!r}" not in opreg_result.get("message", ""):
            return None
        path = test_id.split("::")[0]
        for number, line in source_lines_of_test(evox, test_id):
            if listed.private_name in line:
                return f"{path}:{number}: {line.strip()}"
    return None


def outcome_of(document: dict, test_id: str) -> str:
    if test_id in document["tests"]:
        return document["tests"][test_id]["outcome"]
    path = test_id.split("::")[0]
    if path in document.get("collection_errors", {}):
        return "collection error"
    if document.get("pytest_status") == TIMED_OUT:
        return NOT_RUN_IN_TIME
    return "not run"


def verdict_of(evox: Path, test_id: str, originals: dict, opreg: dict) -> tuple[str, str]:
    """(verdict, evidence); a verdict starting with "FAIL" makes the exit status 1."""
    before, after = outcome_of(originals, test_id), outcome_of(opreg, test_id)
    if NOT_RUN_IN_TIME in (before, after):
        return "INCOMPLETE: a run timed out before this test", ""
    must_pass = any(test_id.startswith(path + "::") for path in MUST_PASS_WITH_OPREG)
    if after in PASSED:
        if before in PASSED:
            return "passed with both", ""
        return "passes only with opreg", ""
    if before in PASSED or must_pass:
        evidence = private_state_evidence(evox, test_id, opreg["tests"].get(test_id, {}))
        if evidence:
            return f"allowed: {PRIVATE_STATE_REASON}", evidence
        if before in PASSED:
            return "FAIL: passes with EvoX's modules only", ""
        return "FAIL: must pass with opreg's Philox", ""
    if before == after:
        return f"{after} with both", ""
    return "not passed with either", ""


def switch_problems(run: str, document: dict) -> list[str]:
    """What is wrong with where a run got EvoX's modules from."""
    where = document.get("switch_report")
    if not where:
        return [f"{run}: no switch report (the pytest session did not finish)"]
    problems = []
    if where.get("evox") in (None, "not imported"):
        problems.append(f"{run}: evox was not imported")
    for name, origin in where.items():
        if name == "evox" or origin == "not imported":
            continue
        if run == "opreg" and origin not in ("opreg", "opreg.philox"):
            problems.append(f"{run}: {name} came from {origin}, not from opreg")
        if run == "originals" and not origin.startswith("evox file "):
            problems.append(f"{run}: {name} came from {origin}, not from EvoX's file")
    return problems


def compare(evox: Path, runs: dict[str, dict]) -> dict:
    originals, opreg = runs["originals"], runs["opreg"]
    test_ids = sorted(set(originals["tests"]) | set(opreg["tests"]))
    rows = []
    for test_id in test_ids:
        verdict, evidence = verdict_of(evox, test_id, originals, opreg)
        opreg_calls = opreg["tests"].get(test_id, {}).get("opreg_calls", [])
        rows.append(
            {
                "test": test_id,
                "originals": outcome_of(originals, test_id),
                "opreg": outcome_of(opreg, test_id),
                "verdict": verdict,
                "evidence": evidence,
                "opreg_ops": sorted({call[0] for call in opreg_calls}),
                "opreg_impls": sorted(
                    {f"{op} {impl} {device}" for op, impl, device in opreg_calls}
                ),
                "message_originals": originals["tests"].get(test_id, {}).get("message", ""),
                "message_opreg": opreg["tests"].get(test_id, {}).get("message", ""),
            }
        )
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["verdict"]] = counts.get(row["verdict"], 0) + 1
    problems = [p for run in RUNS for p in switch_problems(run, runs[run])]
    failures = [row["test"] for row in rows if row["verdict"].startswith("FAIL")]
    incomplete = [row["test"] for row in rows if row["verdict"].startswith("INCOMPLETE")]
    return {
        "evox_checkout": str(evox),
        "runs": {
            run: {
                key: runs[run].get(key)
                for key in (
                    "environment",
                    "switch_report",
                    "collection_errors",
                    "pytest_status",
                    "seconds",
                )
            }
            for run in RUNS
        },
        "counts": counts,
        "reaching_opreg_ops": sum(1 for row in rows if row["opreg_ops"]),
        "switch_problems": problems,
        "failures": failures,
        "incomplete": incomplete,
        "tests": rows,
    }


def markdown(summary: dict) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["# EvoX's unit tests with EvoX's modules and with opreg's", ""]
    lines.append(f"EvoX checkout: `{summary['evox_checkout']}`")
    lines.append("")
    for run, info in summary["runs"].items():
        env = info.get("environment") or {}
        lines.append(
            f"- **{run}**: pytest status {info.get('pytest_status')} in {info.get('seconds')} s; "
            f"Python {env.get('python')}, torch {env.get('torch')}, Triton {env.get('triton')}, "
            f"CUDA {env.get('cuda_available')} ({env.get('device_name')})"
        )
        for name, origin in (info.get("switch_report") or {}).items():
            lines.append(f"  - `{name}`: {origin}")
        for path, message in (info.get("collection_errors") or {}).items():
            lines.append(f"  - collection error in `{path}`: {cell(message[-300:])}")
    lines += ["", "| verdict | tests |", "|---|---|"]
    lines += [f"| {verdict} | {n} |" for verdict, n in sorted(summary["counts"].items())]
    lines.append(f"| (tests that reached opreg ops) | {summary['reaching_opreg_ops']} |")
    lines.append("")
    for problem in summary["switch_problems"]:
        lines.append(f"- **switch problem**: {problem}")
    differing = [row for row in summary["tests"] if row["originals"] != row["opreg"]]
    lines += ["", f"## Tests whose outcome differs ({len(differing)})", ""]
    for row in differing:
        lines.append(f"### `{row['test']}`: {row['originals']} -> {row['opreg']}: {row['verdict']}")
        if row["evidence"]:
            lines.append(f"\nThe line: `{row['evidence']}`")
        for run in RUNS:
            if row[f"message_{run}"]:
                message = row[f"message_{run}"]
                excerpt = (
                    message
                    if len(message) <= 2500
                    else message[:1200] + "\n...\n" + message[-1200:]
                )
                lines += ["", f"{run}:", "```", excerpt.strip(), "```"]
        lines.append("")
    lines += ["## Every test", "", "| test | originals | opreg | verdict | opreg ops reached |"]
    lines.append("|---|---|---|---|---|")
    for row in summary["tests"]:
        ops = ", ".join(row["opreg_impls"]) or "none"
        lines.append(
            f"| `{row['test']}` | {row['originals']} | {row['opreg']} | {cell(row['verdict'])} "
            f"| {cell(ops)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("evox", type=Path, help="an EvoX checkout (with src/evox and unit_test)")
    parser.add_argument("tests", nargs="*", help="test paths or ids, relative to the checkout")
    parser.add_argument("--out", type=Path, default=Path("evox-suite-results"))
    parser.add_argument("--timeout-s", type=float, default=None, help="per pytest run")
    parser.add_argument(
        "--parallel", action="store_true", help="run the two pytest runs side by side"
    )
    parser.add_argument(
        "--workers", type=int, default=0, help="pytest-xdist workers per run (-n); 0: none"
    )
    args = parser.parse_intermixed_args(argv)
    evox = args.evox.resolve()
    if not (evox / "src" / "evox" / "__init__.py").exists():
        parser.error(f"{evox} is not an EvoX checkout: it has no src/evox/__init__.py")
    args.out.mkdir(parents=True, exist_ok=True)
    pytest_options = ["-n", str(args.workers)] if args.workers else []
    tests = pytest_options + (args.tests or default_tests(evox))
    runs = run_both(evox, tests, args.out, args.timeout_s, args.parallel)
    summary = compare(evox, runs)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    (args.out / "summary.md").write_text(markdown(summary))
    print(json.dumps({key: summary[key] for key in ("counts", "failures", "incomplete")}, indent=1))
    print("\n".join(summary["switch_problems"]))
    print(f"summary: {args.out / 'summary.md'}")
    if summary["failures"] or summary["switch_problems"]:
        return 1
    incomplete = any(runs[run]["pytest_status"] == TIMED_OUT for run in RUNS)
    return 2 if incomplete or not all(runs[run]["tests"] for run in RUNS) else 0


if __name__ == "__main__":
    sys.exit(main())
