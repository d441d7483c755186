"""A Triton kernel with unsigned 8- and 16-bit scalar parameters, which the runtime must load and
pack (tests/kernel_sources/unsigned_kernels.toml)."""

import triton.language as tl

import triton


@triton.jit
def fill_sum_kernel(out_ptr, a, b, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    value = a.to(tl.float32) + b.to(tl.float32)
    tl.store(out_ptr + offsets, tl.zeros((BLOCK,), tl.float32) + value, mask=offsets < n)
