"""EvoX's Philox names served by opreg's ops: ``from opreg.philox import philox_uniform,
philox_normal`` in place of ``from evox.triton_kernels.kernels.philox import ...``.

``philox_uniform(seeds, n, counter=0)`` and ``philox_normal(seeds, n, counter=0)`` take int64
``seeds`` (EvoX passes a 1-D ``(pop_size,)`` tensor; any shape ``[...]`` works) and return float32
``[..., n]`` on the seeds' device: row r is the stream of ``seeds[r]``, Philox call j of it uses the
counter ``counter + j`` and yields values 4j..4j+3, so ``counter + m`` starts 4m values further on
(EvoX's jump-ahead). ``counter`` is any Python int, read mod 2^64 as EvoX does. They are
``torch.ops.opreg.philox_uniform`` / ``philox_normal`` (docs/ops/philox.md): the AOT Triton kernel
on CUDA, the fallback elsewhere, fake tensors, vmap and ``torch.compile`` included.

Differences from EvoX's module (docs/ops/philox.md, "Coming from EvoX"): the counter carries into
its high word where EvoX's wraps the low word alone (the streams differ only past 2^32 - low
calls); normals are float32 Box-Muller with opreg's own log/sin/cos, so they differ from EvoX's
(torch.log/sin/cos) by a few float32 ulp; the CPU and CUDA results agree (uniforms bit for bit).
"""

from __future__ import annotations

import torch

import opreg  # noqa: F401  (loads the shipped ops)

__all__ = [
    "MASK",
    "PHILOX_W32_0",
    "PHILOX_W32_1",
    "PHILOX_M4x32_0",
    "PHILOX_M4x32_1",
    "philox_normal",
    "philox_uniform",
]

#: Philox4x32-10's multipliers and key increments, and the 32-bit mask, under EvoX's names.
PHILOX_M4x32_0 = 0xD2511F53
PHILOX_M4x32_1 = 0xCD9E8D57
PHILOX_W32_0 = 0x9E3779B9
PHILOX_W32_1 = 0xBB67AE85
MASK = 0xFFFFFFFF

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _counter_bits(counter: int) -> int:
    # The op takes the counter's 64 bits as an int64 (two's complement): 2^64 - k is passed as -k.
    if isinstance(counter, int) and not _INT64_MIN <= counter <= _INT64_MAX:
        counter %= 2**64
        return counter - 2**64 if counter > _INT64_MAX else counter
    return counter


def philox_uniform(seeds: torch.Tensor, n: int, counter: int = 0) -> torch.Tensor:
    """Uniform float32 in [0, 1): ``(word >> 8) * 2^-24`` of each Philox4x32-10 output word.

    :param seeds: int64 tensor of per-individual seeds, e.g. ``(pop_size,)``.
    :param n: values per seed.
    :param counter: starting Philox counter (jump-ahead: ``counter + m`` skips ``4 m`` values).
    :return: float32 ``seeds.shape + (n,)`` on ``seeds.device``.
    """
    return torch.ops.opreg.philox_uniform(seeds, n, _counter_bits(counter))


def philox_normal(seeds: torch.Tensor, n: int, counter: int = 0) -> torch.Tensor:
    """Standard normal float32: Box-Muller on consecutive pairs of :func:`philox_uniform`'s
    stream (an odd ``n`` drops the last value of the last pair).

    :param seeds: int64 tensor of per-individual seeds, e.g. ``(pop_size,)``.
    :param n: values per seed.
    :param counter: starting Philox counter (jump-ahead: ``counter + m`` skips ``4 m`` values).
    :return: float32 ``seeds.shape + (n,)`` on ``seeds.device``.
    """
    return torch.ops.opreg.philox_normal(seeds, n, _counter_bits(counter))
