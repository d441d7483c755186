"""Peers: the same add registered the ways users do today, each with Triton's JIT launch."""

from __future__ import annotations

import torch

import triton
from peers.triton_add import add_kernel


def triton_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)](x, y, out, n, BLOCK_SIZE=1024)
    return out


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
