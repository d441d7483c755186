"""opreg ops on DTensors sharded over a CPU DeviceMesh, for tests/python/test_dtensor.py. Under
`torchrun --nproc_per_node N dtensor_sharding.py OUT` each rank runs a small model (opreg's
shipped fused_add, the example library's scale_add, and Python-front ops) on DTensors sharded on
dim 0, one step forward and backward, and saves to OUT/rank<r>.pt what came out: placements,
local shapes, the shapes the Python fallback saw, full tensors, gradients and error messages.
The test imports the same model and inputs for the single-process reference.

The order exercises each way an op gets its strategy: the shipped and the Python-front ops when
torch.distributed.tensor is first imported (after opreg and the definitions), the example
library's when opreg.load_library loads it, a replaced Python-front op at its definition."""

from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist

import opreg

ROWS, COLUMNS = 8, 6
DTYPE = torch.float64

# The shapes each call of a Python fallback saw: a rank computing its shard sees its local rows.
seen_shapes: list[tuple[str, tuple[int, ...]]] = []


def _record(name: str, x: torch.Tensor) -> None:
    seen_shapes.append((name, tuple(x.shape)))


def _tanh_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0])
    ctx.scale = inputs[1]


@opreg.register_triton_op(
    fake_fn=lambda x, scale: torch.empty_like(x),
    triton_fn=None,
    name="opreg_dtensor_test::scaled_tanh",
    batch_polymorphic=True,
    sharding="pointwise",  # elementwise: each rank computes its shard
    setup_context=_tanh_setup,
    backward=lambda ctx, grad: (
        grad * ctx.scale * (1 - torch.tanh(ctx.saved_tensors[0]) ** 2),
        None,
    ),
)
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    _record("scaled_tanh", x)
    return torch.tanh(x) * scale


def _softmax_sharding(x, dim):
    """A per-row softmax shards on every dim but the one it normalizes (torch's docs example)."""
    from torch.distributed.tensor import Replicate, Shard

    dim = dim % len(x.shape)
    choices = [([Replicate()], [Replicate(), None])]
    choices += [([Shard(d)], [Shard(d), None]) for d in range(len(x.shape)) if d != dim]
    return choices


@opreg.register_triton_op(
    fake_fn=lambda x, dim: torch.empty_like(x),
    triton_fn=None,
    name="opreg_dtensor_test::softmax",
    batch_polymorphic=True,  # but not elementwise: pointwise would be wrong
    sharding=_softmax_sharding,
)
def softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    _record("softmax", x)
    return torch.softmax(x, dim)


@opreg.register_triton_op(
    fake_fn=lambda x: torch.empty_like(x),
    triton_fn=None,
    name="opreg_dtensor_test::unsharded",
    batch_polymorphic=True,
    sharding="none",
)
def unsharded(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(ROWS, COLUMNS, dtype=DTYPE, generator=generator)
    shift = torch.randn(COLUMNS, dtype=DTYPE, generator=generator)
    return x, shift


def forward(x: torch.Tensor, shift: torch.Tensor) -> dict[str, torch.Tensor]:
    """The model: every opreg op on the rows of x (sharded or whole)."""
    shifted = torch.ops.opreg.fused_add(x, shift)  # shift broadcast over the rows
    squashed = scaled_tanh(shifted, 1.5)
    scaled = torch.ops.opreg_example.scale_add(squashed, x, 0.5)
    # softmax has no backward: called with inputs that need grad, its fallback would run under
    # autograd on the DTensors (DTensor shards its ATen ops); detached, DTensor asks its strategy.
    return {
        "shifted": shifted,
        "squashed": squashed,
        "scaled": scaled,
        "rows": softmax(scaled.detach(), -1),  # sharded on dim 0: no redistribution
        "columns": softmax(scaled.detach(), 0),  # normalizes dim 0: the strategy moves shards
    }


def loss_of(outputs: dict[str, torch.Tensor]) -> torch.Tensor:
    return (outputs["scaled"] ** 2).sum()


def replace_scaled_tanh_with_replicate() -> None:
    opreg.register_triton_op(
        fake_fn=lambda x, scale: torch.empty_like(x),
        triton_fn=None,
        name="opreg_dtensor_test::scaled_tanh",
        batch_polymorphic=True,
        schema="(Tensor x, float scale) -> Tensor",
        sharding="replicate",
        replace=True,
    )(lambda x, scale: torch.tanh(x) * scale)


def main(out_folder: str) -> None:
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import register_sharding

    assert "torch.distributed.tensor" in sys.modules
    opreg.load_library(opreg.example_library("scale_add"))  # after DTensor's import: at load

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world_size,))
    x, shift = inputs()
    x = distribute_tensor(x, mesh, [Shard(0)]).requires_grad_()
    shift = distribute_tensor(shift, mesh, [Replicate()]).requires_grad_()

    seen_shapes.clear()
    with opreg.trace() as trace:
        outputs = forward(x, shift)
        loss_of(outputs).backward()
    assert all(isinstance(t, DTensor) for t in outputs.values())
    saved: dict[str, object] = {
        "world_size": world_size,
        "placements": {name: [repr(p) for p in t.placements] for name, t in outputs.items()},
        "local_shapes": {name: tuple(t.to_local().shape) for name, t in outputs.items()},
        "full": {name: t.full_tensor().detach() for name, t in outputs.items()},
        "grads": {"x": x.grad.full_tensor(), "shift": shift.grad.full_tensor()},
        "seen_shapes": list(seen_shapes),
        "trace": [tuple(r) for r in trace.records],
    }

    errors = {}
    try:
        unsharded(x.detach())
    except Exception as error:
        errors["unsharded"] = f"{type(error).__name__}: {error}"
    try:  # philox is not elementwise: no strategy, so DTensor refuses it, naming it
        torch.ops.opreg.philox_uniform(distribute_tensor(torch.arange(4), mesh, [Shard(0)]), 3)
    except Exception as error:
        errors["philox_uniform"] = f"{type(error).__name__}: {error}"
    saved["errors"] = errors

    # Replacing an op with another sharding: the next call, with inputs of the same specs as a
    # call before (so DTensor's cached propagation would answer), follows the new definition.
    before = scaled_tanh(x.detach(), 1.5).placements
    replace_scaled_tanh_with_replicate()
    after = scaled_tanh(x.detach(), 1.5)
    # A strategy of the user's serves until the op is defined again, with any sharding: even the
    # one it declared before (sweep 31 A-F1: the user's strategy went on serving).
    register_sharding(torch.ops.opreg_dtensor_test.scaled_tanh.default)(
        lambda x, scale: [([Shard(0)], [Shard(0), None])]
    )
    # Inputs of specs not seen before: DTensor caches a propagation and register_sharding keeps it.
    other = distribute_tensor(torch.ones(2 * world_size, 3), mesh, [Shard(0)])
    by_user = scaled_tanh(other, 1.5).placements
    replace_scaled_tanh_with_replicate()
    saved["replaced"] = {
        "before": [repr(p) for p in before],
        "after": [repr(p) for p in after.placements],
        "after_local_shape": tuple(after.to_local().shape),
        "by_user": [repr(p) for p in by_user],
        "defined_again": [repr(p) for p in scaled_tanh(other, 1.5).placements],
    }

    torch.save(saved, os.path.join(out_folder, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    # Interpreter shutdown can race a gloo thread still freeing a backward's collective (it holds
    # a Python object and cannot take the GIL then): the process aborts, seen in CI about once in
    # ten runs under load. Everything is saved by now, so the process ends without that phase.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
