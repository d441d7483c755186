"""pytest plugin (``-p evox_test_outcomes``) that writes each test's outcome to the JSON file named
by ``EVOX_SUITE_OUTCOMES``, rewritten after every test so a run cut short keeps what it did.

The file holds ``environment`` (Python, torch, Triton, CUDA, whether evox_opreg_switch is
installed), ``tests`` (node id -> outcome ``passed``/``failed``/``error``/``skipped``/``xfailed``/
``xpassed``, seconds, and for a test not passed the end of its report), ``collection_errors``
(file -> report) and ``switch_report`` (evox_opreg_switch.report() after the last test: where
EvoX's op-registration, backend and Philox modules came from, and ``evox.__file__``).

Tests whose node ids start with a line of ``EVOX_SUITE_SERIAL_TESTS`` run holding the file lock
``EVOX_SUITE_SERIAL_LOCK``, so two sessions side by side take turns for them.

With the switch installed, each test also runs inside ``opreg.trace()``; ``opreg_calls`` lists
each distinct (op, implementation, device) it made on the test's thread: the evidence that a test
reaches opreg's registered ops, and which implementation (fallback or kernel) served them.

Under pytest-xdist (``-n``) the workers run the tests and send the trace and their switch report
with each test's teardown report (``user_properties``); only the controller writes the file.
Tests whose node ids start with a line of ``EVOX_SUITE_SERIAL_TESTS`` run holding the file lock
``EVOX_SUITE_SERIAL_LOCK``, so sessions or workers side by side take turns for them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import sys
import time

import evox_opreg_switch
import pytest

_MESSAGE_CHARS = 3000

_results: dict[str, dict] = {}
_collection_errors: dict[str, str] = {}
_environment: dict[str, object] = {}
_switch_origins: dict[str, set[str]] = {}  # EvoX module -> where the test processes got it
_traces: dict[str, object] = {}  # node id -> its running opreg.trace()
_is_writer = True  # False in a pytest-xdist worker


def _output_path() -> str:
    path = os.environ.get("EVOX_SUITE_OUTCOMES")
    if not path:
        raise pytest.UsageError("evox_test_outcomes needs EVOX_SUITE_OUTCOMES=<file.json>")
    return path


def _merged_switch_report() -> dict[str, str] | None:
    """One origin per module ("not imported" only where no process imported it), or
    ``"mixed: ..."`` where processes got it from different places."""
    merged = {}
    for name, origins in _switch_origins.items():
        imported = sorted(origins - {"not imported"})
        merged[name] = "not imported" if not imported else "; ".join(imported)
        if len(imported) > 1:
            merged[name] = "mixed: " + merged[name]
    return merged or None


def _write() -> None:
    if not _is_writer:
        return
    document = {
        "environment": _environment,
        "tests": _results,
        "collection_errors": _collection_errors,
        "switch_report": _merged_switch_report(),
    }
    path = _output_path()
    temporary = path + ".part"
    with open(temporary, "w") as file:
        json.dump(document, file, indent=1, sort_keys=True)
    os.replace(temporary, path)


def pytest_configure(config):
    global _is_writer
    _is_writer = not hasattr(config, "workerinput")
    import torch

    _output_path()
    cuda = torch.cuda.is_available()
    try:
        import triton

        triton_version = triton.__version__
    except Exception as error:  # a broken Triton is a fact to report, not a reason to stop
        triton_version = f"not importable: {error!r}"
    _environment.update(
        python=platform.python_version(),
        executable=sys.executable,
        torch=torch.__version__,
        triton=triton_version,
        cuda_available=cuda,
        device_name=torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
        opreg_switch_installed=evox_opreg_switch.installed(),
        started=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    )
    _write()


def _short_report(report) -> str:
    """The error's own message (a long traceback buries it) and the report's end."""
    text = str(report.longrepr) if report.longrepr is not None else ""
    crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", "")
    tail = text[-_MESSAGE_CHARS:]
    return tail if not crash or crash in tail else crash[:_MESSAGE_CHARS] + "\n...\n" + tail


def _record(nodeid: str, outcome: str, seconds: float, message: str = "") -> None:
    entry = _results.setdefault(nodeid, {"outcome": "passed", "seconds": 0.0})
    entry["seconds"] = round(entry["seconds"] + seconds, 3)
    # The worst phase decides: an error in teardown after a pass is an error.
    rank = {"passed": 0, "skipped": 1, "xfailed": 1, "xpassed": 2, "failed": 3, "error": 4}
    if rank[outcome] >= rank[entry["outcome"]] and outcome != "passed":
        entry["outcome"] = outcome
        if message:
            entry["message"] = message


def pytest_runtest_logreport(report):
    if report.when == "call":
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        else:
            outcome = report.outcome  # passed / failed / skipped
    elif report.failed:
        outcome = "error"  # setup or teardown failed
    elif report.skipped:
        outcome = "skipped"
    else:
        outcome = "passed"
    _record(report.nodeid, outcome, report.duration, "" if report.passed else _short_report(report))
    for key, value in report.user_properties:
        if key == "opreg_calls":
            _results[report.nodeid]["opreg_calls"] = value
        elif key == "switch_report":
            _note_switch_report(value)
    if report.when == "teardown":
        _write()


def pytest_collectreport(report):
    if report.failed:
        _collection_errors[report.nodeid] = _short_report(report)


def _switch_report() -> dict[str, str]:
    where = evox_opreg_switch.report()
    evox = sys.modules.get("evox")
    where["evox"] = getattr(evox, "__file__", None) if evox is not None else "not imported"
    return where


def _note_switch_report(where: dict[str, str]) -> None:
    for name, origin in where.items():
        _switch_origins.setdefault(name, set()).add(origin)


@contextlib.contextmanager
def _serial_if_listed(nodeid: str):
    """Holds ``EVOX_SUITE_SERIAL_LOCK`` around the tests ``EVOX_SUITE_SERIAL_TESTS`` lists (node
    id prefixes, one a line), so runs side by side take turns for them."""
    prefixes = [p for p in os.environ.get("EVOX_SUITE_SERIAL_TESTS", "").splitlines() if p]
    lock_path = os.environ.get("EVOX_SUITE_SERIAL_LOCK")
    if not lock_path or not any(nodeid.startswith(prefix) for prefix in prefixes):
        yield
        return
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with _serial_if_listed(item.nodeid), contextlib.ExitStack() as stack:
        if evox_opreg_switch.installed():
            import opreg

            _traces[item.nodeid] = stack.enter_context(opreg.trace())
        yield
    _traces.pop(item.nodeid, None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when != "teardown":
        return
    report = outcome.get_result()
    extra = [("switch_report", _switch_report())]
    trace = _traces.get(item.nodeid)
    if trace is not None:
        calls = sorted({(r.op, r.impl, r.device) for r in trace.records})
        extra.append(("opreg_calls", [list(call) for call in calls]))
    report.user_properties = [*report.user_properties, *extra]


def pytest_sessionfinish(session, exitstatus):
    _note_switch_report(_switch_report())
    _environment["exit_status"] = int(exitstatus)
    _write()
