"""Data-parallel training with opreg ops: one DistributedDataParallel step on 2 CPU processes
(gloo, started by torchrun as a user starts them) gives the gradients and parameters of one
single-process step over the whole batch, with the ops' explicit backwards running on each rank."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import ddp_training
import torch

from conftest import REPO

WORLD_SIZE = 2
# float64 throughout: the only differences are the order of the allreduce's sums.
TOLERANCE = {"rtol": 1e-12, "atol": 1e-14}


def run_torchrun(
    out_folder: Path, timeout: float = 120, backend: str = "gloo", script: str = "ddp_training.py"
) -> None:
    """torchrun --standalone runs tests/python/<script> OUT on WORLD_SIZE CPU processes, on a
    free localhost port; a hang is killed with its workers."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={WORLD_SIZE}",
        str(REPO / "tests" / "python" / script),
        str(out_folder),
    ]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", ddp_training.BACKEND_VARIABLE: backend}
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=environment,
        start_new_session=True,
    ) as launcher:
        try:
            output, _ = launcher.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            output, _ = launcher.communicate()
            message = f"torchrun did not finish in {timeout} s:\n{output[-3000:]}"
            raise AssertionError(message) from None
    assert launcher.returncode == 0, output[-3000:]


def labelled(where: str):
    return lambda message: f"{where}: {message}"


def single_process_step(native: bool = False) -> torch.nn.Module:
    model = ddp_training.Model(native=native)
    ddp_training.train_step(model, *ddp_training.global_batch())
    return model


def test_ddp_step_matches_a_single_process_step(tmp_path):
    run_torchrun(tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD_SIZE)]
    reference = single_process_step()
    expected_grads = {n: p.grad for n, p in reference.named_parameters()}
    expected_params = {n: p.detach() for n, p in reference.named_parameters()}

    for rank, saved in enumerate(ranks):
        assert saved["world_size"] == WORLD_SIZE
        assert saved["grads"].keys() == expected_grads.keys()
        for name, grad in saved["grads"].items():
            where = f"rank {rank}, {name}"
            torch.testing.assert_close(grad, expected_grads[name], **TOLERANCE, msg=labelled(where))
            torch.testing.assert_close(
                saved["params"][name], expected_params[name], **TOLERANCE, msg=labelled(where)
            )
            assert torch.equal(grad, ranks[0]["grads"][name]), "ranks must agree exactly"

        # Each rank ran both ops forward and through their explicit backwards.
        served = [(op, impl) for op, impl, _ in saved["trace"]]
        assert served == [
            ("opreg::fused_add", "fallback"),
            ("opreg_ddp_test::scaled_tanh", "kernel:triton"),
            ("opreg_ddp_test::scaled_tanh", "backward"),
            ("opreg::fused_add", "backward"),
        ], served
        assert saved["backward_calls"] == 1


def test_the_single_process_reference_equals_torch_native_ops():
    """The reference is itself right: the explicit backwards give autograd's gradients."""
    with_opreg, native = single_process_step(), single_process_step(native=True)
    for (name, ours), (_, theirs) in zip(
        with_opreg.named_parameters(), native.named_parameters(), strict=True
    ):
        torch.testing.assert_close(ours.grad, theirs.grad, **TOLERANCE, msg=labelled(name))
        torch.testing.assert_close(ours, theirs, **TOLERANCE, msg=labelled(name))
