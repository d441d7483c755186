"""A Triton JIT kernel with every kind of parameter the C++ launch path packs (pointers, a None
pointer, fp32 and int64 scalars, constexprs passed by position), served by an opreg op."""

from __future__ import annotations

import torch
import triton.language as tl

import triton
from opreg import register_triton_op


@triton.jit
def _axpby_kernel(
    x_ptr,
    y_ptr,
    out_ptr,
    n,
    alpha,
    beta,
    offset: tl.int64,
    bias_ptr,
    BLOCK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    result = alpha * tl.load(x_ptr + offs, mask=m) + beta * tl.load(y_ptr + offs, mask=m) + offset
    if HAS_BIAS:
        result += tl.load(bias_ptr + offs, mask=m)
    tl.store(out_ptr + offs, result, mask=m)


def axpby_triton_fn(kernel):
    """A triton_fn launching `kernel` (an _axpby_kernel): each op its own kernel object."""

    def triton_axpby(x, y, alpha, beta, offset, bias):
        out = torch.empty_like(x)
        n = x.numel()
        block = 128 if n < 4096 else 1024  # a constexpr given by position, changing with n
        has_bias = bias is not None
        kernel[(triton.cdiv(n, block),)](x, y, out, n, alpha, beta, offset, bias, block, has_bias)
        return out

    return triton_axpby


def _fake(x, y, alpha, beta, offset, bias):
    return torch.empty_like(x)


def axpby_reference(
    x: torch.Tensor,
    y: torch.Tensor,
    alpha: float,
    beta: float,
    offset: int,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    result = alpha * x + beta * y + offset
    return result if bias is None else result + bias


axpby = register_triton_op(
    fake_fn=_fake, triton_fn=axpby_triton_fn(_axpby_kernel), name="opreg_test_jit::axpby"
)(axpby_reference)


@triton.jit
def affine_half_kernel(
    x_ptr, out_ptr, n, alpha: tl.float16, beta: tl.bfloat16, BLOCK: tl.constexpr
):
    """out = x * alpha + beta, with half-precision scalars (packed as 16-bit parameters)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    tl.store(out_ptr + offs, x * tl.cast(alpha, tl.float32) + tl.cast(beta, tl.float32), mask=m)
