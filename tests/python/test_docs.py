"""Documentation cannot drift from the code: every Python block of README.md and docs/ runs
(blocks fenced as `python gpu` only with CUDA), and every C++ block quoted between
`[name.begin]`/`[name.end]` markers equals the source region with those markers."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
MARKER = re.compile(r"// \[(\w+)\.begin\]")
SOURCES = [*REPO.glob("examples/**/*.cpp"), *REPO.glob("src/**/*.cpp")]


def blocks(language: str):
    for path in DOCS:
        for match in FENCE.finditer(path.read_text()):
            if match.group(1) == language:
                yield path, match.group(2).strip(), match.group(3)


PYTHON = list(blocks("python"))
CPP = [b for b in blocks("cpp") if MARKER.search(b[2])]


def test_there_are_examples_to_check():
    assert len(PYTHON) >= 4 and len(CPP) >= 2


@pytest.mark.parametrize(
    ("path", "info", "code"),
    PYTHON,
    ids=[f"{p.relative_to(REPO)}#{i}" for i, (p, _, _) in enumerate(PYTHON)],
)
def test_python_example_runs(path, info, code, tmp_path):
    if info == "gpu" and not torch.cuda.is_available():
        pytest.skip("a GPU example")
    script = tmp_path / "example.py"
    script.write_text(code)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert result.returncode == 0, f"{path}:\n{code}\n{result.stderr[-3000:]}"


def region(name: str) -> str:
    pattern = re.compile(rf"^[ \t]*// \[{name}\.begin\]\n.*?// \[{name}\.end\]", re.M | re.S)
    for source in SOURCES:
        found = pattern.search(source.read_text())
        if found:
            return found.group(0).strip()
    raise AssertionError(f"no source has the region [{name}]")


@pytest.mark.parametrize(
    ("path", "info", "code"),
    CPP,
    ids=[f"{p.relative_to(REPO)}#{i}" for i, (p, _, _) in enumerate(CPP)],
)
def test_cpp_quotes_match_the_source(path, info, code):
    name = MARKER.search(code).group(1)
    assert code.strip() == region(name), f"{path} quotes [{name}] out of date"
