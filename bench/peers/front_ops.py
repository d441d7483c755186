"""The seed's fused_add defined through opreg's Python front: once with its Triton JIT launch
(EvoX's code, import switched), once launching the AOT binary through opreg's C++ launcher."""

from __future__ import annotations

import torch

import opreg
import triton
from peers.registrations import seed_triton_fn
from peers.triton_add import add_kernel

# The same kernel source, its own JIT kernel object: opreg adopts this one, not the peers'.
front_add_kernel = triton.jit(add_kernel.fn)


@opreg.register_triton_op(
    fake_fn=lambda x, y: torch.empty_like(x),
    triton_fn=seed_triton_fn(front_add_kernel),
    name="opreg_bench::front_jit_add",
)
def front_jit_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


_aot_add = opreg.AotKernel("opreg_fused_add_f32")


def _aot_triton_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    _aot_add[(triton.cdiv(n, 1024),)](x, y, out, n)
    return out


@opreg.register_triton_op(
    fake_fn=lambda x, y: torch.empty_like(x),
    triton_fn=_aot_triton_add,
    name="opreg_bench::front_aot_add",
)
def front_aot_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


@opreg.register_triton_op(
    fake_fn=lambda x, y: torch.empty_like(x),
    triton_fn=None,
    aot=opreg.AotLaunch(
        "opreg_fused_add_f32",
        ("cdiv(numel(x), 1024)",),
        ("x", "y", "out0", "numel(x)"),
        "like:x",
    ),
    name="opreg_bench::front_aot_declared_add",
)
def front_aot_declared_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y
