"""Ops defined the EvoX way (register_triton_op / register_vmap_op, every parameter used), with
the import switched to opreg. Their Triton kernels serve TRITON_DEVICE: CUDA, or the CPU under
Triton's interpreter."""

from __future__ import annotations

import torch
import triton.language as tl

import opreg
import triton
from conftest import TRITON_DEVICE
from opreg import register_triton_op, register_vmap_op


@triton.jit
def scale_rows_kernel(x_ptr, out_ptr, n_cols, factor, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    values = tl.load(x_ptr + row * n_cols + cols, mask=mask)
    tl.store(out_ptr + row * n_cols + cols, values * factor, mask=mask)


def _scale_rows_triton(x: torch.Tensor, factor: float) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    n_cols = x.shape[-1]
    rows = x.numel() // max(n_cols, 1)
    if rows:
        block = triton.next_power_of_2(max(n_cols, 1))
        opreg.wrap_triton(scale_rows_kernel)[(rows,)](x, out, n_cols, factor, BLOCK=block)
    return out


calls: list[str] = []


def _scale_rows_vmap(x: torch.Tensor, factor: float) -> torch.Tensor:
    """The batched computation: x has leading batch dims; one kernel launch for all of them."""
    calls.append(f"vmap_fn{tuple(x.shape)}")
    return _scale_rows_triton(x, factor)


def _wrap_inputs(info, in_dims, *args):
    calls.append(f"wrap(batch={info.batch_size}, in_dims={tuple(in_dims)})")
    return opreg.default_vmap_wrap_inputs(info, in_dims, *args)


@register_triton_op(
    fake_fn=lambda x, factor: torch.empty_like(x),
    triton_fn=_scale_rows_triton,
    vmap_fn=_scale_rows_vmap,
    fake_vmap_fn=lambda x, factor: torch.empty_like(x),
    vmap_wrap_inputs=_wrap_inputs,
    vmap_out_dims=0,
    max_vmap_level=2,
    name="evox_test::scale_rows",
    mutates_args=(),
    device_types=None,
    triton_device_types=TRITON_DEVICE,
    schema="(Tensor x, float factor) -> Tensor",
)
def scale_rows(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


@register_triton_op(
    fake_fn=lambda x, y: None,
    triton_fn=None,
    name="evox_test::add_into",
    mutates_args=("x",),
)
def add_into(x: torch.Tensor, y: torch.Tensor) -> None:
    x.add_(y)


def _row_norm(x: torch.Tensor) -> torch.Tensor:
    return x.pow(2).sum(-1).sqrt()


# register_vmap_op called on a function (not as a decorator), with a vmap_fn that handles any
# number of leading dims.
row_norm = register_vmap_op(
    _row_norm,
    fake_fn=lambda x: x.new_empty(x.shape[:-1]),
    vmap_fn=_row_norm,
    fake_vmap_fn=lambda x: x.new_empty(x.shape[:-1]),
    name="evox_test::row_norm",
)


@register_vmap_op(fake_fn=lambda x: torch.empty_like(x), name="evox_test::softsign")
def softsign(x: torch.Tensor) -> torch.Tensor:
    return x / (1 + x.abs())
