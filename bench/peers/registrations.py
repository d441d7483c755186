"""Peers: the same add registered the ways users do today, each with Triton's JIT launch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import triton
from peers.triton_add import add_kernel


def seed_triton_fn(kernel: Any) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The seed's triton_fn, launching `kernel` (each registration gets its own kernel object,
    so that one's launches never pass through another's)."""

    def triton_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n = x.numel()
        kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)](x, y, out, n, BLOCK_SIZE=1024)
        return out

    return triton_add


triton_add = seed_triton_fn(add_kernel)


# EvoX style: custom_op with the fallback, register_kernel("cuda", triton_fn), a fake.
@torch.library.custom_op("opreg_peers::evox_add", mutates_args=())
def evox_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


evox_add.register_kernel("cuda")(triton_add)
evox_add.register_fake(lambda x, y: torch.empty_like(x))


# The same with register_autograd: the backward PyTorch's docs suggest.
@torch.library.custom_op("opreg_peers::autograd_add", mutates_args=())
def autograd_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


autograd_add.register_kernel("cuda")(triton_add)
autograd_add.register_fake(lambda x, y: torch.empty_like(x))
autograd_add.register_autograd(
    lambda ctx, grad: (grad, grad), setup_context=lambda ctx, inputs, output: None
)


# torch.library.triton_op + wrap_triton.
@torch.library.triton_op("opreg_peers::triton_op_add", mutates_args=())
def triton_op_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    torch.library.wrap_triton(add_kernel)[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK_SIZE=1024)
    return out


# A plain custom op without a vmap rule: torch.vmap falls to its per-example loop.
@torch.library.custom_op("opreg_peers::plain_add", mutates_args=())
def plain_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


plain_add.register_kernel("cuda")(triton_add)
plain_add.register_fake(lambda x, y: torch.empty_like(x))
