"""examples/deploy and docs/deploy.md: a model with opreg ops, exported with torch.export and
AOTInductor, runs in a C++ program that has no Python in it, and its outputs equal the eager
model's (the noise bit for bit). The documented commands are run as a user types them."""

from __future__ import annotations

import subprocess

import torch

from conftest import REPO, code_blocks, requires_cuda, run_shell

DOCS = REPO / "docs" / "deploy.md"


def documented_commands() -> str:
    (commands,) = [code for _, code in code_blocks(DOCS, "sh") if "run_model" in code]
    return commands


def test_the_example_readme_gives_the_documented_commands():
    ((_, readme),) = code_blocks(REPO / "examples" / "deploy" / "README.md", "sh")
    assert readme == documented_commands()


def run_documented_commands(tmp_path, device: str) -> str:
    commands = documented_commands()
    if device != "cpu":
        commands = commands.replace("model.py export out", f"model.py export out --device {device}")
        assert f"--device {device}" in commands
    result = run_shell(commands, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return result.stdout


def check_run(stdout: str, device: str, served_by: dict[str, str]) -> None:
    assert "Python in this process: no" in stdout, stdout
    assert "noise bitwise equal: True" in stdout, stdout
    for op, impl in served_by.items():
        assert f"run_model: {op} on {device}: {impl}\n" in stdout, stdout


def test_cpu_package_runs_from_cpp_without_python(tmp_path):
    stdout = run_documented_commands(tmp_path, "cpu")
    check_run(
        stdout,
        "cpu",
        {
            "opreg::philox_normal": "fallback",
            "opreg::fused_add": "fallback",
            "opreg_example::scale_add": "kernel:cpu_loop",
        },
    )
    deploy = tmp_path / "deploy"
    # Nothing of Python is linked either, not only not mapped in the run.
    linked = subprocess.run(
        ["ldd", str(deploy / "build" / "run_model")], capture_output=True, text=True, check=True
    ).stdout
    assert "libpython" not in linked and "libtorch_python" not in linked, linked

    # The batch size is dynamic in the package: other inputs, same package, same answers.
    run_and_check = documented_commands()[documented_commands().index("./build/run_model") :]
    rerun = run_shell("python3 model.py inputs out --batch 3\n" + run_and_check, cwd=deploy)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert "(batch 3, cpu)" in rerun.stdout and "noise bitwise equal: True" in rerun.stdout

    # An op library left out: a clear error, not a crash.
    missing = run_model(deploy, "out/model.pt2", "out/inputs.pt", "out/outputs.pt")
    assert missing.returncode == 1, missing
    assert "Could not find schema for opreg_example::scale_add" in missing.stderr, missing.stderr
    assert "--library PATH" in missing.stderr and "frame #" not in missing.stderr

    # A bad command line: the usage mistake, named.
    for args, message in [
        (("out/model.pt2", "--time"), "unknown option or missing value: --time"),
        (("out/model.pt2",), "expected PACKAGE INPUTS OUTPUTS, got 1 paths"),
        (("a", "b", "c", "--time", "abc"), "--time takes a number of runs (1 or more), got 'abc'"),
        (("a", "b", "c", "--time", "5x"), "--time takes a number of runs (1 or more), got '5x'"),
        (("a", "b", "c", "--time", "0"), "--time takes a number of runs (1 or more), got '0'"),
        (
            ("nope.pt2", "out/inputs.pt", "out/o.pt", "--library", "nope.so"),
            "cannot load 'nope.so'",
        ),
    ]:
        refused = run_model(deploy, *args)
        assert refused.returncode == 1 and message in refused.stderr, refused


def run_model(deploy, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["./build/run_model", *args], cwd=deploy, capture_output=True, text=True, timeout=300
    )


@requires_cuda
def test_cuda_package_runs_from_cpp_without_python(tmp_path):
    stdout = run_documented_commands(tmp_path, "cuda")
    check_run(
        stdout,
        f"cuda:{torch.cuda.current_device()}",
        {"opreg::philox_normal": "kernel:triton_aot", "opreg::fused_add": "kernel:triton_aot"},
    )
