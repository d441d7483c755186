"""opcheck samples of the shipped ops whose arguments the schema cannot describe: the low-rank
noise ops need `x` of rank 3 whose population matches `seeds`, and sizes that agree with `rank`
and `out_features` (opreg.register_samples)."""

from __future__ import annotations

import torch

from opreg._opcheck import Sample, register_samples


def _seeds(population: int, device: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(population)
    return torch.randint(0, 2**62, (population,), generator=generator).to(device)


def _delta_output_samples(device: str) -> list[Sample]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, 8, generator=generator).to(device)
    seeds = _seeds(3, device)
    return [
        Sample((x, seeds, 2, 5, 0.5, 7), label="pop 3, batch 2, k 8, rank 2"),
        Sample((x[:, :1], seeds, 1, 3, -1.0, -2), label="batch 1, rank 1, counter -2"),
        Sample((x.double(), seeds, 4, 4, 2.0), label="float64, rank 4"),
    ]


def _gradient_samples(device: str) -> list[Sample]:
    generator = torch.Generator().manual_seed(1)
    fitness = torch.randn(3, generator=generator).to(device)
    seeds = _seeds(3, device)
    return [
        Sample((fitness, seeds, 2, 5, 8, 0.5, 7), label="pop 3, rank 2, 5x8"),
        Sample((fitness.expand(2, 3), seeds.expand(2, 3), 4, 4, 8, 2.0), label="2 x pop 3"),
        Sample((fitness.double(), seeds, 1, 3, 2, -1.0), label="float64, rank 1"),
    ]


register_samples(torch.ops.opreg.lowrank_delta_output, _delta_output_samples)
register_samples(torch.ops.opreg.lowrank_gradient, _gradient_samples)
