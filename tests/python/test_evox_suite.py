"""tests/evox_suite, the runner of EvoX's own tests against opreg: its import switch serves
exactly EvoX's op-registration, backend and Philox modules from opreg and leaves the others
EvoX's; the runner tells a test that passes only with EvoX's modules from one that passes with
both, and excuses a private-state test only when its source shows it. A small package laid out
like EvoX stands in for it; with ``OPREG_EVOX_SRC=<EvoX checkout>`` the real EvoX is checked too."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "tests" / "evox_suite"


def _load_runner():
    spec = importlib.util.spec_from_file_location("run_evox_tests", SUITE / "run_evox_tests.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


runner = _load_runner()

# A package laid out like EvoX: the four modules the switch serves, each marking itself as
# EvoX's own, a module that must stay EvoX's, and re-exports as EvoX's __init__ files make them.
FAKE_EVOX = {
    "src/evox/__init__.py": "from . import utils, triton_kernels, workflows\n",
    "src/evox/utils/__init__.py": "from .op_register import VmapInfo, register_vmap_op\n",
    "src/evox/utils/op_register.py": (
        "VmapInfo = 'evox'\ndef register_vmap_op(fn=None, /, **kwargs):\n    return 'evox'\n"
    ),
    "src/evox/triton_kernels/__init__.py": (
        "from .backend import has_triton, register_triton_device_type, triton_device_types, "
        "triton_supports_device\n"
        "from .kernels import philox_normal, philox_uniform\n"
        "from .op_register import register_triton_op\n"
    ),
    "src/evox/triton_kernels/backend.py": (
        "_triton_device_types = {'cuda'}\n"
        "def has_triton(): return 'evox'\n"
        "def triton_device_types(): return 'evox'\n"
        "def triton_supports_device(device): return 'evox'\n"
        "def register_triton_device_type(device_type): return 'evox'\n"
    ),
    "src/evox/triton_kernels/op_register.py": (
        "from ..utils.op_register import register_vmap_op\n"
        "def register_triton_op(**kwargs): return 'evox'\n"
    ),
    "src/evox/triton_kernels/kernels/__init__.py": (
        "from .philox import philox_normal, philox_uniform\n"
    ),
    "src/evox/triton_kernels/kernels/philox.py": (
        "def philox_uniform(seeds, n, counter=0): return 'evox'\n"
        "def philox_normal(seeds, n, counter=0): return 'evox'\n"
    ),
    "src/evox/workflows.py": "from evox.utils import register_vmap_op\nMARK = 'evox'\n",
    "unit_test/test_fake.py": textwrap.dedent(
        """
        import evox.triton_kernels.backend as triton_backend
        from evox import triton_kernels, workflows


        def test_kept_module():
            assert workflows.MARK == "evox"


        def test_evox_own_register():
            assert triton_kernels.register_triton_op() == "evox"


        def test_private_state():
            original = set(triton_backend._triton_device_types)
            assert "cuda" in original
        """
    ),
}


@pytest.fixture
def fake_evox(tmp_path) -> Path:
    for relative, text in FAKE_EVOX.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def _python(code: str, evox: Path, switch: bool) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("EVOX_OPREG_SWITCH", None)
    if switch:
        env["EVOX_OPREG_SWITCH"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(SUITE / "pythonpath"), str(evox / "src")])
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        cwd=evox,
        timeout=600,
    )


SWITCHED_NAMES_ARE_OPREGS = textwrap.dedent(
    """
    import opreg, opreg.philox
    import evox, evox.triton_kernels.backend as backend
    import evox.triton_kernels.op_register, evox.utils.op_register
    import evox_opreg_switch

    assert evox.utils.op_register.register_vmap_op is opreg.register_vmap_op
    assert evox.utils.register_vmap_op is opreg.register_vmap_op
    assert evox.utils.VmapInfo is opreg.VmapInfo
    assert evox.triton_kernels.op_register.register_triton_op is opreg.register_triton_op
    assert evox.triton_kernels.register_triton_op is opreg.register_triton_op
    for name in ("has_triton", "triton_device_types", "triton_supports_device",
                 "register_triton_device_type"):
        assert getattr(backend, name) is getattr(opreg, name), name
        assert getattr(evox.triton_kernels, name) is getattr(opreg, name), name
    assert evox.triton_kernels.kernels.philox.philox_uniform is opreg.philox.philox_uniform
    assert evox.triton_kernels.philox_normal is opreg.philox.philox_normal
    assert set(evox_opreg_switch.report().values()) == {"opreg", "opreg.philox"}
    try:
        backend._triton_device_types
    except AttributeError as error:
        assert "private module state" in str(error), error
    else:
        raise AssertionError("EvoX's private state reached through the switch")
    """
)


def test_the_switch_serves_the_four_modules_from_opreg(fake_evox):
    result = _python(
        SWITCHED_NAMES_ARE_OPREGS + "assert evox.workflows.MARK == 'evox'\n", fake_evox, True
    )
    assert result.returncode == 0, result.stderr


def test_without_the_switch_evox_keeps_its_modules(fake_evox):
    result = _python(
        """
        import evox, evox_opreg_switch
        assert evox.triton_kernels.register_triton_op() == "evox"
        assert evox.triton_kernels.kernels.philox.philox_uniform(None, 1) == "evox"
        assert all(where.startswith("evox file ") for where in evox_opreg_switch.report().values())
        """,
        fake_evox,
        False,
    )
    assert result.returncode == 0, result.stderr


def test_installing_after_evox_is_imported_is_refused(fake_evox):
    result = _python(
        """
        import evox, evox_opreg_switch
        try:
            evox_opreg_switch.install()
        except RuntimeError as error:
            assert "evox.triton_kernels.backend" in str(error) and "too late" in str(error), error
        else:
            raise AssertionError("installed after import")
        """,
        fake_evox,
        False,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("workers", [0, 2], ids=["one process", "xdist workers"])
def test_runner_fails_a_test_that_passes_only_with_evox_modules(fake_evox, tmp_path, workers):
    if workers and importlib.util.find_spec("xdist") is None:
        pytest.skip("pytest-xdist is not installed")
    out = tmp_path / "results"
    options = ["--workers", str(workers), "--parallel"] if workers else []
    status = runner.main([str(fake_evox), "unit_test", "--out", str(out), *options])
    summary = json.loads((out / "summary.json").read_text())
    verdicts = {row["test"].split("::")[-1]: row["verdict"] for row in summary["tests"]}
    assert verdicts["test_kept_module"] == "passed with both"
    assert verdicts["test_evox_own_register"] == "FAIL: passes with EvoX's modules only"
    # Not listed in PRIVATE_STATE_TESTS: a private-state test is excused by name only.
    assert verdicts["test_private_state"] == "FAIL: passes with EvoX's modules only"
    assert summary["switch_problems"] == []
    assert summary["runs"]["opreg"]["switch_report"]["evox.triton_kernels.backend"] == "opreg"
    assert status == 1
    assert "test_evox_own_register" in (out / "summary.md").read_text()


def test_private_state_excuse_needs_the_line_and_a_failure_naming_the_state(fake_evox):
    test_id = "unit_test/test_fake.py::test_private_state"
    listed = runner.PrivateStateTest(test_id, "triton_backend._triton_device_types")
    originals = {"tests": {test_id: {"outcome": "passed"}}}
    named = {"tests": {test_id: {"outcome": "failed", "message": "has no '_triton_device_types'"}}}
    # The source line shows in every traceback; only the switch's AttributeError excuses.
    unnamed = {
        "tests": {
            test_id: {"outcome": "failed", "message": "set(x._triton_device_types)\nE 1 != 2"}
        }
    }
    original_list = runner.PRIVATE_STATE_TESTS
    try:
        runner.PRIVATE_STATE_TESTS = (listed,)
        verdict, evidence = runner.verdict_of(fake_evox, test_id, originals, named)
        assert verdict == f"allowed: {runner.PRIVATE_STATE_REASON}"
        assert evidence == (
            "unit_test/test_fake.py:15: original = set(triton_backend._triton_device_types)"
        )
        verdict, _ = runner.verdict_of(fake_evox, test_id, originals, unnamed)
        assert verdict.startswith("FAIL")
        runner.PRIVATE_STATE_TESTS = (
            runner.PrivateStateTest(
                "unit_test/test_fake.py::test_kept_module", listed.private_name
            ),
        )
        kept = "unit_test/test_fake.py::test_kept_module"
        verdict, _ = runner.verdict_of(
            fake_evox,
            kept,
            {"tests": {kept: {"outcome": "passed"}}},
            {"tests": {kept: {"outcome": "failed", "message": "has no '_triton_device_types'"}}},
        )
        assert verdict.startswith("FAIL"), "excused a test whose source does not reach the state"
    finally:
        runner.PRIVATE_STATE_TESTS = original_list


def test_must_pass_tests_fail_the_run_even_when_evox_fails_them_too(fake_evox):
    test_id = runner.MUST_PASS_WITH_OPREG[0] + "::TestPhiloxUniform::test_determinism"
    failed = {"tests": {test_id: {"outcome": "failed"}}}
    verdict, _ = runner.verdict_of(fake_evox, test_id, failed, failed)
    assert verdict == "FAIL: must pass with opreg's Philox"
    passed = {"tests": {test_id: {"outcome": "passed"}}}
    assert runner.verdict_of(fake_evox, test_id, failed, passed)[0] == "passes only with opreg"


EVOX_SRC = os.environ.get("OPREG_EVOX_SRC")


@pytest.mark.skipif(not EVOX_SRC, reason="set OPREG_EVOX_SRC to an EvoX checkout")
def test_the_switch_on_evox_itself():
    result = _python(
        SWITCHED_NAMES_ARE_OPREGS
        + textwrap.dedent(
            """
    import torch
    import evox.workflows.eval_monitor as eval_monitor
    assert eval_monitor.__file__.endswith("src/evox/workflows/eval_monitor.py")
    x, y = torch.randn(5), torch.randn(5)
    with opreg.trace() as trace:
        assert torch.equal(evox.triton_kernels.fused_add(x, y), x + y)
    assert trace.impls("opreg_py::fused_add") == ["fallback"], trace.records
    """
        ),
        Path(EVOX_SRC),
        True,
    )
    assert result.returncode == 0, result.stderr
