"""Philox4x32-10 (Salmon et al., SC'11) in Triton: the kernels of opreg::philox_uniform,
opreg::philox_normal and of the low-rank noise ops opreg::lowrank_delta_output and
opreg::lowrank_gradient (src/ops/lowrank.cpp), which generate philox_normal's values in registers.
Row r of the output uses the key (low 32 bits, high 32 bits) of seeds[r];
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


# ---- low-rank noise: philox_normal's values generated in registers, never stored -----------
# Individual i's factors are its philox_normal stream: A (R, k) from counter a_counter, B (d, R)
# from b_counter = a_counter + ceil4(R k) (EvoX's lora_noise layout). Both kernels need k % 4 == 0
# and R a power of two, so that every row segment they generate starts a Philox call.


@triton.jit
def _interleave4(z0, z1, z2, z3):
    # Values of Philox calls (..., C) to stream order (..., C, 4): call c's 4 values are 4c..4c+3.
    return tl.join(tl.join(z0, z2), tl.join(z1, z3))


@triton.jit
def _normals(k0, k1, counter, calls):
    # philox_normal's 4 values of each Philox call counter + calls: shape calls.shape + (4,).
    w0, w1, w2, w3 = _philox_calls(k0, k1, counter, calls)
    z0, z1 = _box_muller(w0, w1, 0)
    z2, z3 = _box_muller(w2, w3, 0)
    return _interleave4(z0, z1, z2, z3)


@triton.jit
def lowrank_delta_output_kernel(
    x_ptr,
    seeds_ptr,
    out_ptr,
    batch,
    k,
    d,
    a_counter,
    b_counter,
    sigma,
    R: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # out[i, b, :] = sigma * (x[i, b, :] @ A_i^T) @ B_i^T for BLOCK_B rows b of individual i.
    individual = tl.program_id(0).to(tl.int64)
    k0, k1 = _key(tl.load(seeds_ptr + individual))
    rows = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < batch
    x_rows = x_ptr + (individual * batch + rows) * k
    ranks = tl.arange(0, R)
    # t = x A^T, (BLOCK_B, R): A's rows j in column blocks of BLOCK_K.
    t = tl.zeros((BLOCK_B, R), tl.float32)
    for start in range(0, k, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        x = tl.load(
            x_rows[:, None] + cols[None, :], mask=row_ok[:, None] & (cols[None, :] < k), other=0.0
        )
        calls = (ranks[:, None] * k + start) // 4 + tl.arange(0, BLOCK_K // 4)[None, :]
        a = tl.reshape(_normals(k0, k1, a_counter, calls), [R, BLOCK_K])
        # Past column k, a holds the next row's values; x is 0 there.
        t += tl.sum(x[:, None, :] * a[None, :, :], axis=2)
    # out = sigma * t B^T: B's rows e in blocks of BLOCK_D (R * BLOCK_D values of the stream each).
    out_rows = out_ptr + (individual * batch + rows) * d
    for start in range(0, d, BLOCK_D):
        calls = start // 4 * R + tl.arange(0, BLOCK_D * R // 4)
        b = tl.reshape(_normals(k0, k1, b_counter, calls), [BLOCK_D, R])
        out = tl.sum(t[:, None, :] * b[None, :, :], axis=2) * sigma
        cols = start + tl.arange(0, BLOCK_D)
        tl.store(out_rows[:, None] + cols[None, :], out, mask=row_ok[:, None] & (cols[None, :] < d))


@triton.jit
def lowrank_gradient_kernel(
    fitness_ptr,
    seeds_ptr,
    out_ptr,
    pop,
    k,
    d,
    a_counter,
    b_counter,
    denominator,
    R: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # out[g, e, l] = sum_i fitness[g, i] (B_i A_i)[e, l] / denominator over a (BLOCK_D, BLOCK_K)
    # tile: a contraction over pop * R, BLOCK_P individuals (BLOCK_P * R terms) per step, their
    # factors' tiles generated for each step.
    group = tl.program_id(2).to(tl.int64)
    row0 = tl.program_id(0) * BLOCK_D
    col0 = tl.program_id(1) * BLOCK_K
    ranks = tl.arange(0, R)
    b_calls = row0 // 4 * R + tl.arange(0, BLOCK_D * R // 4)
    a_calls = (ranks[:, None] * k + col0) // 4 + tl.arange(0, BLOCK_K // 4)[None, :]
    acc = tl.zeros((BLOCK_D, BLOCK_K), tl.float32)
    for start in range(0, pop, BLOCK_P):
        individuals = start + tl.arange(0, BLOCK_P)
        ok = individuals < pop
        seed = tl.load(seeds_ptr + group * pop + individuals, mask=ok, other=0)
        weight = tl.load(fitness_ptr + group * pop + individuals, mask=ok, other=0.0)
        k0, k1 = _key(seed)
        b = tl.reshape(
            _normals(k0[:, None], k1[:, None], b_counter, b_calls[None, :]), [BLOCK_P, BLOCK_D, R]
        )
        b = tl.reshape(tl.permute(b * weight[:, None, None], (1, 0, 2)), [BLOCK_D, BLOCK_P * R])
        a = tl.reshape(
            _normals(k0[:, None, None], k1[:, None, None], a_counter, a_calls[None, :, :]),
            [BLOCK_P * R, BLOCK_K],
        )
        # tf32x3: three tensor-core products whose sum has float32's accuracy.
        acc = tl.dot(b, a, acc, input_precision="tf32x3")
    rows = row0 + tl.arange(0, BLOCK_D)
    cols = col0 + tl.arange(0, BLOCK_K)
    tl.store(
        out_ptr + (group * d + rows[:, None]) * k + cols[None, :],
        acc / denominator,
        mask=(rows[:, None] < d) & (cols[None, :] < k),
    )
