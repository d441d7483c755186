"""The examples installed with the package (`opreg.example_source`): the repository's examples/
files, an unknown name answered with the names there are, and each example's README commands,
which copy the installed sources and build them against the installed opreg, work."""

from __future__ import annotations

import subprocess
import sys

import pytest

import opreg
from conftest import REPO, code_blocks, run_shell

EXAMPLES = sorted(path.name for path in (REPO / "examples").iterdir() if path.is_dir())


def files_under(folder):
    # pip byte-compiles the installed Python files: their __pycache__ is not a source.
    return {
        path.relative_to(folder).as_posix(): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_sources_are_installed(name):
    installed = opreg.example_source(name)
    assert installed.is_dir() and not installed.is_relative_to(REPO), installed
    assert files_under(installed) == files_under(REPO / "examples" / name)
    assert {"CMakeLists.txt", "README.md"} <= set(files_under(installed))


def test_unknown_example_is_a_value_error_listing_the_examples():
    with pytest.raises(ValueError, match=f"no example named 'nope'; available: {EXAMPLES[0]}"):
        opreg.example_source("nope")


def test_command_line_prints_the_example_folder():
    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "opreg", *args], capture_output=True, text=True, timeout=300
        )

    found = cli("example-source", "scale_add")
    assert found.returncode == 0 and found.stdout.strip() == str(opreg.example_source("scale_add"))
    unknown = cli("example-source", "nope")
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr, unknown
    assert unknown.stderr.startswith("python -m opreg example-source: "), unknown.stderr
    assert "no example named 'nope'; available: deploy, scale_add" in unknown.stderr


def test_readme_commands_build_the_installed_example_and_call_its_op(tmp_path):
    (commands,) = [
        code
        for _, code in code_blocks(REPO / "examples" / "scale_add" / "README.md", "sh")
        if "cmake --build" in code
    ]
    result = run_shell(commands, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "tensor([1.5000, 1.5000, 1.5000])" in result.stdout, result.stdout
