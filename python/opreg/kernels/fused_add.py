"""out = x + y over contiguous same-shape tensors: the kernel of opreg::fused_add."""

import triton.language as tl

import triton


@triton.jit
def fused_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # 64-bit offsets: tensors may have more than 2^31 elements.
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)
