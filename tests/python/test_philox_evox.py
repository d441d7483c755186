"""opreg.philox as EvoX's Philox module: the properties EvoX's own tests ask of
evox.triton_kernels.kernels.philox and of the LoRA-noise and virtual-LoRA code built on it
(determinism, jump-ahead, per-seed streams, shapes, range and moments, low-rank factors drawn from
disjoint counter ranges, an ES gradient from them), written afresh, on CPU and on CUDA."""

from __future__ import annotations

import math

import philox_reference as ref
import pytest
import torch

from conftest import DEVICES
from opreg.philox import (
    MASK,
    PHILOX_W32_0,
    PHILOX_W32_1,
    PHILOX_M4x32_0,
    PHILOX_M4x32_1,
    philox_normal,
    philox_uniform,
)

GENERATORS = [philox_uniform, philox_normal]


def population_seeds(pop: int, device: str, stride: int = 12345) -> torch.Tensor:
    return torch.arange(1, pop + 1, dtype=torch.int64, device=device) * stride + 7


def test_constants_are_philox4x32_10s():
    assert (PHILOX_M4x32_0, PHILOX_M4x32_1) == ref.MULTIPLIERS
    assert (PHILOX_W32_0, PHILOX_W32_1) == ref.WEYL
    assert MASK == 2**32 - 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("generate", GENERATORS, ids=lambda f: f.__name__)
def test_same_seeds_and_counter_give_the_same_values(device, generate):
    seeds = population_seeds(100, device)
    for counter in (0, 12345):
        first = generate(seeds, 100, counter=counter)
        assert torch.equal(first, generate(seeds, 100, counter=counter))
        assert first.device == seeds.device


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("generate", GENERATORS, ids=lambda f: f.__name__)
def test_seeds_and_counters_select_different_streams(device, generate):
    seeds = population_seeds(100, device)
    base = generate(seeds, 100)
    assert not torch.equal(base, generate(seeds, 100, counter=1))
    assert not torch.equal(base, generate(population_seeds(100, device) + 12345, 100))
    # Every row is its own stream: no two individuals share values.
    rows = base.cpu()
    assert len({tuple(row.tolist()) for row in rows}) == len(rows)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("generate", GENERATORS, ids=lambda f: f.__name__)
def test_counter_plus_m_starts_4m_values_further(device, generate):
    # EvoX's LoRA factors draw B at counter + ceil4(r k): the stream must continue, not restart.
    seeds = population_seeds(6, device)
    long = generate(seeds, 4 * 5 + 9, counter=40)
    torch.testing.assert_close(generate(seeds, 9, counter=45), long[:, 20:], rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("generate", GENERATORS, ids=lambda f: f.__name__)
def test_shape_dtype_and_device_for_any_population_and_length(device, generate):
    for pop in (1, 3, 10):
        for n in (0, 1, 2, 3, 4, 5, 7, 100, 257):
            out = generate(torch.arange(pop, dtype=torch.int64, device=device) + 1, n)
            assert out.shape == (pop, n) and out.dtype == torch.float32
            assert out.device.type == device
    assert generate(torch.tensor([[1, 2], [3, 4]], device=device), 3).shape == (2, 2, 3)


@pytest.mark.parametrize("device", DEVICES)
def test_uniform_range_and_moments(device):
    u = philox_uniform(population_seeds(1000, device), 1000).double()
    assert u.min().item() >= 0.0 and u.max().item() < 1.0
    assert abs(u.mean().item() - 0.5) < 2e-3  # 1e6 samples: standard error 2.9e-4
    assert abs(u.var().item() - 1 / 12) < 1e-3


@pytest.mark.parametrize("device", DEVICES)
def test_normal_moments_and_tails(device):
    z = philox_normal(population_seeds(1000, device), 1000).double()
    assert torch.isfinite(z).all()
    assert abs(z.mean().item()) < 5e-3 and abs(z.std().item() - 1) < 5e-3
    # Tail mass beyond 3 sigma: 0.27% for a standard normal (1e6 samples: +-0.015%).
    assert abs((z.abs() > 3).double().mean().item() - 0.0026998) < 3e-4


def test_counter_is_any_python_int_read_mod_2_64():
    seeds = torch.tensor([5, 6])
    for counter, wrapped in [(2**64 - 3, -3), (2**64 + 7, 7), (-(2**64) + 1, 1), (2**63, -(2**63))]:
        torch.testing.assert_close(
            philox_uniform(seeds, 9, counter), philox_uniform(seeds, 9, wrapped), rtol=0, atol=0
        )
    expected = torch.tensor([ref.uniform(5, 9, 2**64 - 3)], dtype=torch.float32)
    assert torch.equal(philox_uniform(seeds[:1], 9, 2**64 - 3), expected)


# ---- low-rank noise as EvoX's lora_noise / VirtualLoRAES draw it ----------------------------


def lora_factors(seeds, d, k, rank, counter):
    """A (pop, rank, k) from `counter`, B (pop, d, rank) from counter + ceil4(rank k)."""
    a_count = rank * k
    a = philox_normal(seeds, a_count, counter).reshape(-1, rank, k)
    b = philox_normal(seeds, d * rank, counter + (a_count + 3) // 4 * 4).reshape(-1, d, rank)
    return a, b


@pytest.mark.parametrize("device", DEVICES)
def test_lora_factors_come_from_disjoint_ranges_of_one_stream(device):
    seeds = population_seeds(10, device, stride=777)
    a, b = lora_factors(seeds, d=4, k=3, rank=2, counter=0)
    assert a.shape == (10, 2, 3) and b.shape == (10, 4, 2)
    assert torch.bmm(b, a).shape == (10, 4, 3)
    stream = philox_normal(seeds, 4 * 8 + 8, 0)  # B starts at counter 8: value 32
    assert torch.equal(a.reshape(10, -1), stream[:, :6])
    assert torch.equal(b.reshape(10, -1), stream[:, 32:40])


@pytest.mark.parametrize("device", DEVICES)
def test_low_rank_es_gradient_and_descent(device):
    pop, d, k, rank, sigma = 32, 10, 10, 2, 0.1
    generator = torch.Generator().manual_seed(3)
    seeds = torch.randint(0, 2**31, (pop,), generator=generator).to(device)
    a, b = lora_factors(seeds, d, k, rank, counter=0)
    fitness = torch.randn(pop, generator=generator).to(device)
    gradient = torch.einsum("i,ijk,ikl->jl", fitness, b, a) / (pop * sigma)
    manual = sum(fitness[i] * (b[i] @ a[i]) for i in range(pop)) / (pop * sigma)
    torch.testing.assert_close(gradient, manual, rtol=1e-5, atol=1e-5)

    # Centered quadratic: the ES step along low-rank noise shrinks the center.
    center = torch.randn(d * k, generator=generator).to(device) * 3
    start = center.norm().item()
    for _ in range(30):
        seeds = torch.randint(0, 2**31, (pop,), generator=generator).to(device)
        a, b = lora_factors(seeds, d, k, rank, counter=0)
        delta = torch.bmm(b, a).reshape(pop, -1)
        fitness = 0.5 * ((center + sigma * delta) ** 2).sum(1) - 0.5 * (center**2).sum()
        center = center - 0.05 * torch.einsum("i,ij->j", fitness, delta) / (pop * sigma)
    assert torch.isfinite(center).all() and center.norm().item() < 0.9 * start


# ---- agreement with EvoX's formulas --------------------------------------------------------


def test_normal_is_evox_box_muller_up_to_float32_rounding():
    seeds = population_seeds(64, "cpu")
    u = philox_uniform(seeds, 2048).double()
    u1, u2 = u[:, 0::2].clamp_min(1e-10), u[:, 1::2]
    radius = torch.sqrt(-2 * torch.log(u1))
    evox = torch.stack([radius * torch.cos(2 * math.pi * u2), radius * torch.sin(2 * math.pi * u2)])
    evox = evox.permute(1, 2, 0).reshape(64, 2048)
    ours = philox_normal(seeds, 2048).double()
    assert (ours - evox).abs().max().item() < 2e-6
