"""Philox4x32-10 (Salmon et al., SC'11) in Triton: the kernels of opreg::philox_uniform and
opreg::philox_normal. Row r of the output uses the key (low 32 bits, high 32 bits) of seeds[r];
Philox call j uses the counter words (low32(counter + j), high32(counter + j), 0, 0) and yields
the 4 words at positions 4j..4j+3."""

import triton.language as tl

import triton

PHILOX_M0 = tl.constexpr(0xD2511F53)
PHILOX_M1 = tl.constexpr(0xCD9E8D57)
PHILOX_W0 = tl.constexpr(0x9E3779B9)
PHILOX_W1 = tl.constexpr(0xBB67AE85)


@triton.jit
def _philox4x32_10(c0, c1, c2, c3, k0, k1):
    # uint32 constants built from int64 literals: 0xD2511F53 does not fit int32.
    m0 = tl.full(c0.shape, PHILOX_M0, tl.uint64).to(tl.uint32)
    m1 = tl.full(c0.shape, PHILOX_M1, tl.uint64).to(tl.uint32)
    w0 = tl.full(c0.shape, PHILOX_W0, tl.uint64).to(tl.uint32)
    w1 = tl.full(c0.shape, PHILOX_W1, tl.uint64).to(tl.uint32)
    for r in tl.static_range(10):
        if r > 0:
            k0 = k0 + w0
            k1 = k1 + w1
        hi0 = tl.umulhi(m0, c0)
        lo0 = m0 * c0
        hi1 = tl.umulhi(m1, c2)
        lo1 = m1 * c2
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


@triton.jit
def _words(seeds_ptr, counter, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    calls = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    seed = tl.load(seeds_ptr + row)
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    ctr = counter.to(tl.uint64) + calls.to(tl.uint64)  # 64-bit: wraps mod 2^64
    c0 = (ctr & 0xFFFFFFFF).to(tl.uint32)
    c1 = (ctr >> 32).to(tl.uint32)
    zero = tl.zeros(c0.shape, tl.uint32)
    return _philox4x32_10(c0, c1, zero, zero, k0, k1)


@triton.jit
def _to_unit(word):
    return (word >> 8).to(tl.float32) * 5.9604644775390625e-08  # 2^-24


@triton.jit
def _store4(out_ptr, n, v0, v1, v2, v3, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    # Interleave to positions 4j..4j+3, then one contiguous store.
    values = tl.reshape(tl.join(tl.join(v0, v2), tl.join(v1, v3)), [4 * BLOCK])
    offsets = tl.program_id(1).to(tl.int64) * (4 * BLOCK) + tl.arange(0, 4 * BLOCK)
    tl.store(out_ptr + row * n + offsets, values, mask=offsets < n)


@triton.jit
def philox_uniform_kernel(seeds_ptr, out_ptr, n, counter, BLOCK: tl.constexpr):
    u0, u1, u2, u3 = _words(seeds_ptr, counter, BLOCK)
    _store4(out_ptr, n, _to_unit(u0), _to_unit(u1), _to_unit(u2), _to_unit(u3), BLOCK)


@triton.jit
def _box_muller(u1, u2):
    # float64, rounded to float32 at the end, as the fallback does: agreement to rounding.
    u1 = tl.maximum(u1.to(tl.float64), 1e-10)
    theta = u2.to(tl.float64) * 6.283185307179586
    r = tl.sqrt(-2.0 * tl.log(u1))
    return (r * tl.cos(theta)).to(tl.float32), (r * tl.sin(theta)).to(tl.float32)


@triton.jit
def philox_normal_kernel(seeds_ptr, out_ptr, n, counter, BLOCK: tl.constexpr):
    u0, u1, u2, u3 = _words(seeds_ptr, counter, BLOCK)
    z0, z1 = _box_muller(_to_unit(u0), _to_unit(u1))
    z2, z3 = _box_muller(_to_unit(u2), _to_unit(u3))
    _store4(out_ptr, n, z0, z1, z2, z3, BLOCK)
