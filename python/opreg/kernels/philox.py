"""Philox4x32-10 (Salmon et al., SC'11) in Triton: the kernels of opreg::philox_uniform and
opreg::philox_normal. Row r of the output uses the key (low 32 bits, high 32 bits) of seeds[r];
Philox call j uses the counter words (low32(counter + j), high32(counter + j), 0, 0) and yields
the 4 words at positions 4j..4j+3.

The normals are float32 Box-Muller computed from +, -, *, a correctly rounded sqrt, integer and
bit operations only, each float operation rounded on its own (see Note [Float32 Box-Muller] in
src/ops/philox.cpp, whose fallback performs the same operations in the same order with the same
constants: change both together)."""

import triton.language as tl

import triton

PHILOX_M0 = tl.constexpr(0xD2511F53)
PHILOX_M1 = tl.constexpr(0xCD9E8D57)
PHILOX_W0 = tl.constexpr(0x9E3779B9)
PHILOX_W1 = tl.constexpr(0xBB67AE85)

# float32 values written exactly (each is a float32 number), as in src/ops/philox.cpp.
# log(1 + f) = f - f^2/2 + f^3 * P(f), f in [sqrt(1/2) - 1, sqrt(2) - 1]; P highest degree first.
LOG_P7 = tl.constexpr(-0.07634492963552475)
LOG_P6 = tl.constexpr(0.12761574983596802)
LOG_P5 = tl.constexpr(-0.13160182535648346)
LOG_P4 = tl.constexpr(0.14201758801937103)
LOG_P3 = tl.constexpr(-0.16623356938362122)
LOG_P2 = tl.constexpr(0.20001226663589478)
LOG_P1 = tl.constexpr(-0.2500081956386566)
LOG_P0 = tl.constexpr(0.3333333134651184)
LN2_HI = tl.constexpr(0.693359375)  # 9 significant bits: k * LN2_HI is exact
LN2_LO = tl.constexpr(-0.00021219444170128554)
SQRT_HALF_BITS = tl.constexpr(0x3F3504F3)
U1_FLOOR = tl.constexpr(1.0000000133514320e-10)  # float32(1e-10)
# sin(pi/2 f) = f * S(f^2), cos(pi/2 f) = C(f^2), f in [-1/2, 1/2].
SIN_S3 = tl.constexpr(-0.004602177068591118)
SIN_S2 = tl.constexpr(0.07968022674322128)
SIN_S1 = tl.constexpr(-0.6459634900093079)
SIN_S0 = tl.constexpr(1.5707963705062866)
COS_C4 = tl.constexpr(0.0009036316769197583)
COS_C3 = tl.constexpr(-0.02086007222533226)
COS_C2 = tl.constexpr(0.25366920232772827)
COS_C1 = tl.constexpr(-1.2337005138397217)


@triton.jit
def _philox4x32_10(c0, c1, c2, c3, k0, k1):
    for r in tl.static_range(10):
        if r > 0:
            k0 = k0 + PHILOX_W0
            k1 = k1 + PHILOX_W1
        # One 32x32 -> 64-bit product gives both halves (a single wide multiply on the GPU).
        p0 = c0.to(tl.uint64) * PHILOX_M0
        p1 = c2.to(tl.uint64) * PHILOX_M1
        hi0, lo0 = (p0 >> 32).to(tl.uint32), p0.to(tl.uint32)
        hi1, lo1 = (p1 >> 32).to(tl.uint32), p1.to(tl.uint32)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


@triton.jit
def _key(seed):
    # The Philox key of int64 seeds: (low 32 bits, high 32 bits).
    return (seed & 0xFFFFFFFF).to(tl.uint32), ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)


@triton.jit
def _philox_calls(k0, k1, counter, calls):
    # The 4 words of Philox calls counter + calls (int64 tensor, any shape; keys broadcast).
    ctr = counter.to(tl.uint64) + calls.to(tl.uint64)  # 64-bit: wraps mod 2^64
    c0 = (ctr & 0xFFFFFFFF).to(tl.uint32)
    c1 = (ctr >> 32).to(tl.uint32)
    zero = tl.zeros(c0.shape, tl.uint32)
    return _philox4x32_10(c0, c1, zero, zero, k0, k1)


@triton.jit
def _words(seeds_ptr, counter, BLOCK: tl.constexpr):
    k0, k1 = _key(tl.load(seeds_ptr + tl.program_id(0)))
    calls = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    return _philox_calls(k0, k1, counter, calls)


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


# Rounded float32 operations that the compiler may not contract into an FMA (PTX: an instruction
# with an explicit rounding modifier is never fused), so each rounds as ATen's separate op does.
# MODE, a constexpr of the normal kernels (0 in kernels.toml), picks the float arithmetic of
# Box-Muller: 0 as the fallback computes it (Note [Float32 Box-Muller] in src/ops/philox.cpp);
# 1 the polynomial steps as FMAs and the other operations left for the compiler to contract;
# 2 as 1 with an approximate sqrt. Modes 1 and 2 are candidates measured by
# bench/philox_normal_variants.py, which reports their distance from the fallback in ulps.
@triton.jit
def _mul(a, b, MODE: tl.constexpr):
    if MODE == 0:
        product = tl.inline_asm_elementwise(
            "mul.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        product = a * b
    return product


@triton.jit
def _add(a, b, MODE: tl.constexpr):
    if MODE == 0:
        total = tl.inline_asm_elementwise(
            "add.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        total = a + b
    return total


@triton.jit
def _sub(a, b, MODE: tl.constexpr):
    if MODE == 0:
        difference = tl.inline_asm_elementwise(
            "sub.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        difference = a - b
    return difference


@triton.jit
def _horner(acc, x, c, MODE: tl.constexpr):
    # One Horner step acc * x + c: rounded twice (mode 0) or once, as an FMA.
    return _add(_mul(acc, x, MODE), c, MODE) if MODE == 0 else tl.fma(acc, x, c)


@triton.jit
def _log(x, MODE: tl.constexpr):
    # x = 2^k * m with m in [sqrt(1/2), sqrt(2)), read from the bits; then log(m) = log1p(m - 1).
    bits = x.to(tl.int32, bitcast=True)
    k = (bits - SQRT_HALF_BITS) >> 23
    f = _sub((bits - (k << 23)).to(tl.float32, bitcast=True), 1.0, MODE)  # exact
    z = _mul(f, f, MODE)
    p = _horner(LOG_P7, f, LOG_P6, MODE)
    p = _horner(p, f, LOG_P5, MODE)
    p = _horner(p, f, LOG_P4, MODE)
    p = _horner(p, f, LOG_P3, MODE)
    p = _horner(p, f, LOG_P2, MODE)
    p = _horner(p, f, LOG_P1, MODE)
    p = _horner(p, f, LOG_P0, MODE)
    t = _mul(_mul(p, f, MODE), z, MODE)
    kf = k.to(tl.float32)
    t = _add(t, _mul(kf, LN2_LO, MODE), MODE)
    t = _sub(t, _mul(z, 0.5, MODE), MODE)
    return _add(_add(f, t, MODE), _mul(kf, LN2_HI, MODE), MODE)


@triton.jit
def _sincos_turn(word, MODE: tl.constexpr):
    # sin and cos of 2 pi (word >> 8) 2^-24: quadrant q and f in [-1/2, 1/2] from the integer,
    # exactly, so the angle is (pi/2)(q + f) with no rounding.
    k = (word >> 8).to(tl.int32)
    q = (k + (1 << 21)) >> 22
    f = _mul((k - (q << 22)).to(tl.float32), 2.384185791015625e-07, MODE)  # 2^-22
    z = _mul(f, f, MODE)
    s = _horner(SIN_S3, z, SIN_S2, MODE)
    s = _horner(s, z, SIN_S1, MODE)
    s = _mul(_horner(s, z, SIN_S0, MODE), f, MODE)
    c = _horner(COS_C4, z, COS_C3, MODE)
    c = _horner(c, z, COS_C2, MODE)
    c = _horner(c, z, COS_C1, MODE)
    c = _horner(c, z, 1.0, MODE)
    swap = (q & 1) != 0
    sin = tl.where(swap, c, s)
    cos = tl.where(swap, s, c)
    sin = tl.where((q & 2) != 0, -sin, sin)
    cos = tl.where(((q + 1) & 2) != 0, -cos, cos)
    return sin, cos


@triton.jit
def _box_muller(word1, word2, MODE: tl.constexpr):
    u1 = tl.maximum(_to_unit(word1), U1_FLOOR)
    radius_squared = _mul(_log(u1, MODE), -2.0, MODE)
    r = tl.sqrt(radius_squared) if MODE == 2 else tl.sqrt_rn(radius_squared)
    sin, cos = _sincos_turn(word2, MODE)
    return _mul(r, cos, MODE), _mul(r, sin, MODE)


@triton.jit
def philox_normal_kernel(seeds_ptr, out_ptr, n, counter, BLOCK: tl.constexpr, MODE: tl.constexpr):
    w0, w1, w2, w3 = _words(seeds_ptr, counter, BLOCK)
    z0, z1 = _box_muller(w0, w1, MODE)
    z2, z3 = _box_muller(w2, w3, MODE)
    _store4(out_ptr, n, z0, z1, z2, z3, BLOCK)

