"""Shared fixtures: the example and test-op libraries, built on demand, and device parameters;
the code blocks of the docs, and running their shell commands as a user would."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

# Without a GPU, Triton kernels run in Triton's interpreter on CPU tensors. Set before any test
# module defines a @triton.jit kernel (the decorator reads it).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import opreg

REPO = Path(__file__).resolve().parents[2]
TEST_OPS_BUILD = REPO / "build" / "tests"


def _build_test_ops() -> Path:
    library = TEST_OPS_BUILD / "libopreg_test_ops.so"
    if library.exists():
        return library
    subprocess.run(
        [
            "cmake",
            "-S",
            str(REPO / "tests"),
            "-B",
            str(TEST_OPS_BUILD),
            f"-DCMAKE_PREFIX_PATH={opreg.cmake_dir()}",
        ],
        check=True,
        stdout=sys.stderr,
    )
    subprocess.run(
        ["cmake", "--build", str(TEST_OPS_BUILD), "--target", "opreg_test_ops"],
        check=True,
        stdout=sys.stderr,
    )
    return library


def _load_libraries() -> Path:
    given = os.environ.get("OPREG_TEST_OPS")
    library = Path(given) if given else _build_test_ops()
    opreg.load_library(library)
    opreg.load_library(opreg.example_library("scale_add"))
    return library


# Loaded at import, so that test modules can name torch.ops.opreg_test.* at their top level.
TEST_OPS_LIBRARY = _load_libraries()


@pytest.fixture(scope="session")
def test_ops_library() -> Path:
    return TEST_OPS_LIBRARY


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# Where the Python front's Triton kernels run in the tests: CUDA, or the CPU under the interpreter.
TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def run_interpreted(script: str) -> str:
    """Runs `script` in a fresh interpreter beside the tests, where it can `import
    triton_interpreter` to run opreg's Triton kernels on the CPU; its stdout."""
    pytest.importorskip("triton")
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).parent,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def code_blocks(path: Path, language: str) -> list[tuple[str, str]]:
    """The fenced blocks of one language in a Markdown file: (the fence's info after the
    language, the code)."""
    return [
        (match.group(2).strip(), match.group(3))
        for match in FENCE.finditer(path.read_text())
        if match.group(1) == language
    ]


def run_shell(commands: str, cwd: Path) -> subprocess.CompletedProcess:
    """Runs documented shell commands in `cwd` as a user would, with this interpreter as
    `python3` and C++ warnings as errors, as in the test suite's own builds."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "CXXFLAGS": "-Wall -Wextra -Werror -Wno-unused-parameter",
    }
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", commands],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.fixture(scope="session")
def aot_bundle(tmp_path_factory) -> Path:
    """tests/kernel_sources compiled by `python3 -m opreg.aot` (sm_80 and sm_90), loaded for
    launching."""
    out = tmp_path_factory.mktemp("aot")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "opreg.aot",
            str(REPO / "tests" / "kernel_sources" / "triton_kernels.toml"),
            "--out",
            str(out),
            "--cache",
            str(REPO / "build" / "aot-test-cache"),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    opreg.load_triton_bundle(out)
    return out


def run_with_test_ops(
    script: str, library=None, timeout: int = 180, args: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """Runs `script` (dedented, given `args`) in a fresh interpreter with OPREG_TEST_OPS set to
    `library` when given: a probe that could crash or hang fails the test instead of ending the
    run."""
    env = dict(os.environ) if library is None else {**os.environ, "OPREG_TEST_OPS": str(library)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
