"""One data-parallel training step of a model built on opreg ops with explicit backwards, for
tests/python/test_distributed.py. Under `torchrun --nproc_per_node N ddp_training.py OUT` each
rank trains on its shard of the global batch with DistributedDataParallel (gloo on CPU, or NCCL
with one GPU per rank when OPREG_DDP_BACKEND=nccl) and saves
its gradients, parameters and what served the opreg calls to OUT/rank<r>.pt; the test imports
the same model and batch for the single-process reference."""

from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist

import opreg

GLOBAL_BATCH = 16
FEATURES = 8
HIDDEN = 16
DTYPE = torch.float64  # no float32 summation-order noise, so the comparison can be tight
LEARNING_RATE = 0.1

BACKEND_VARIABLE = "OPREG_DDP_BACKEND"

backward_calls = 0


def _scaled_tanh_kernel(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.tanh(x) * scale  # stands in for a Triton launch, so this runs on any CPU


def _save_for_backward(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0])
    ctx.scale = inputs[1]


def _scaled_tanh_backward(ctx, grad: torch.Tensor):
    global backward_calls
    backward_calls += 1
    (x,) = ctx.saved_tensors
    return grad * ctx.scale * (1 - torch.tanh(x) ** 2), None


@opreg.register_triton_op(
    fake_fn=lambda x, scale: torch.empty_like(x),
    triton_fn=_scaled_tanh_kernel,
    triton_device_types="cpu",
    name="opreg_ddp_test::scaled_tanh",
    setup_context=_save_for_backward,
    backward=_scaled_tanh_backward,
)
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.tanh(x) * scale


class Model(torch.nn.Module):
    """Linear -> opreg::fused_add with a learned shift (broadcast over the batch, so its
    backward reduces) -> scaled_tanh -> Linear. `native=True` computes the same function with
    torch ops only, to check the explicit backwards themselves."""

    def __init__(self, native: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = torch.nn.Linear(FEATURES, HIDDEN, dtype=DTYPE)
        self.shift = torch.nn.Parameter(torch.randn(HIDDEN, dtype=DTYPE))
        self.last = torch.nn.Linear(HIDDEN, 1, dtype=DTYPE)
        self.native = native

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.first(x)
        if self.native:
            hidden = torch.tanh(hidden + self.shift) * 1.5
        else:
            hidden = scaled_tanh(torch.ops.opreg.fused_add(hidden, self.shift), 1.5)
        return self.last(hidden)


def global_batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(GLOBAL_BATCH, FEATURES, dtype=DTYPE, generator=generator)
    targets = torch.randn(GLOBAL_BATCH, 1, dtype=DTYPE, generator=generator)
    return inputs, targets


def train_step(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> None:
    """Forward, mean-squared-error backward and one SGD step, leaving the gradients in place."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(inputs), targets).backward()
    optimizer.step()


def main(out_folder: str) -> None:
    backend = os.environ.get(BACKEND_VARIABLE, "gloo")
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    assert GLOBAL_BATCH % world_size == 0, "equal shards make the mean of means the global mean"
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    model = torch.nn.parallel.DistributedDataParallel(
        Model().to(device), device_ids=[device] if device.type == "cuda" else None
    )
    inputs, targets = (t.chunk(world_size)[rank].to(device) for t in global_batch())
    with opreg.trace() as trace:
        train_step(model, inputs, targets)
    torch.save(
        {
            "device": str(device),
            "grads": {n: p.grad.cpu() for n, p in model.module.named_parameters()},
            "params": {n: p.detach().cpu() for n, p in model.module.named_parameters()},
            "trace": [tuple(r) for r in trace.records],
            "backward_calls": backward_calls,
            "world_size": world_size,
        },
        os.path.join(out_folder, f"rank{rank}.pt"),
    )
    # The gloo thread that ran the last all-reduce may still be freeing it, and with it the
    # Python context the backward stashed: at interpreter exit that thread cannot take the GIL,
    # and the process aborts (seen under load, 1 run in 10). The barrier lets it finish.
    del model
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    # Interpreter shutdown can race a gloo thread still freeing a backward's collective (it holds
    # a Python object and cannot take the GIL then): the process aborts, seen in CI about once in
    # ten runs under load. Everything is saved by now, so the process ends without that phase.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
