"""Philox4x32-10 written from the published algorithm (Salmon et al., SC'11) with Python ints,
independent of opreg's implementations: the reference the Philox tests compare with."""

MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
WEYL = (0x9E3779B9, 0xBB67AE85)
MASK32 = 0xFFFFFFFF
MASK64 = (1 << 64) - 1


def philox4x32_10(counter: list[int], key: list[int]) -> list[int]:
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for round_index in range(10):
        if round_index:
            k0, k1 = (k0 + WEYL[0]) & MASK32, (k1 + WEYL[1]) & MASK32
        p0, p1 = MULTIPLIERS[0] * c0, MULTIPLIERS[1] * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & MASK32
    return [c0, c1, c2, c3]


def words(seed: int, n: int, counter: int) -> list[int]:
    """EvoX's layout with a 64-bit counter: call j uses counter words (lo, hi) of counter + j."""
    seed &= MASK64
    key = [seed & MASK32, seed >> 32]
    out: list[int] = []
    for j in range((n + 3) // 4):
        c = (counter + j) & MASK64
        out += philox4x32_10([c & MASK32, c >> 32, 0, 0], key)
    return out[:n]


def uniform(seed: int, n: int, counter: int) -> list[float]:
    return [(w >> 8) * 2.0**-24 for w in words(seed, n, counter)]
