"""Documentation cannot drift from the code: every Python block of README.md and docs/ runs
(blocks fenced as `python gpu` only with CUDA), every C++ block quoted between
`[name.begin]`/`[name.end]` markers equals the source region with those markers, the complete C++
file of docs/cpp-ops.md builds with the README's CMakeLists.txt and commands against the installed
opreg, and the README names every command of `python3 -m opreg`."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from conftest import REPO, code_blocks, run_shell

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
MARKER = re.compile(r"// \[(\w+)\.begin\]")
SOURCES = [*REPO.glob("examples/**/*.cpp"), *REPO.glob("src/**/*.cpp")]


def blocks(language: str):
    for path in DOCS:
        for info, code in code_blocks(path, language):
            yield path, info, code


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


def test_cpp_ops_file_builds_with_the_readme_cmakelists(tmp_path):
    """The README's CMakeLists.txt and build commands, with docs/cpp-ops.md's complete file as
    the library's source, build against the installed opreg, and the library loads."""
    (complete_file,) = [
        code for _, code in code_blocks(REPO / "docs" / "cpp-ops.md", "cpp") if "#include" in code
    ]
    ((_, cmakelists),) = code_blocks(REPO / "README.md", "cmake")
    (commands,) = [code for _, code in code_blocks(REPO / "README.md", "sh") if "cmake" in code]
    source = re.search(r"add_library\(\w+ SHARED (\S+)\)", cmakelists).group(1)
    (tmp_path / "CMakeLists.txt").write_text(cmakelists)
    (tmp_path / source).write_text(complete_file)
    result = run_shell(commands, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_readme_names_every_command_line_command():
    usage = subprocess.run(
        [sys.executable, "-m", "opreg", "--help"], capture_output=True, text=True, check=True
    ).stdout
    commands = set(re.search(r"\{([\w,-]+)\}", usage).group(1).split(","))
    readme = set(re.findall(r"python3 -m opreg ([\w-]+)", (REPO / "README.md").read_text()))
    assert commands == readme, f"--help: {sorted(commands)}, README: {sorted(readme)}"
