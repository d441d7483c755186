"""opreg::lowrank_delta_output and opreg::lowrank_gradient: the fallback against a float64
materialising reference built from opreg.philox_normal (EvoX's lora_noise formulas), shapes,
errors, fake, vmap, autograd through the fallback, opcheck; the Triton kernels in Triton's
interpreter on the CPU, and on a GPU against the fallback."""

from __future__ import annotations

import pytest
import torch

import opreg
from conftest import DEVICES, requires_cuda, run_interpreted
from opreg.philox import philox_normal

delta_output = torch.ops.opreg.lowrank_delta_output
gradient = torch.ops.opreg.lowrank_gradient


def factors(seeds, rank, d, k, counter):
    """EvoX's generate_lora_factors: A (..., rank, k) from counter, B (..., d, rank) from
    counter + ceil4(rank k), both float32 philox_normal streams."""
    a = philox_normal(seeds, rank * k, counter).reshape(*seeds.shape, rank, k)
    b_counter = counter + (rank * k + 3) // 4 * 4
    b = philox_normal(seeds, d * rank, b_counter).reshape(*seeds.shape, d, rank)
    return a, b


def reference_delta(x, seeds, rank, d, sigma, counter=0):
    a, b = factors(seeds, rank, d, x.shape[-1], counter)
    return sigma * (x.double() @ a.double().mT) @ b.double().mT


def reference_gradient(fitness, seeds, rank, d, k, sigma, counter=0):
    a, b = factors(seeds, rank, d, k, counter)
    total = torch.einsum("...i,...ijk,...ikl->...jl", fitness.double(), b.double(), a.double())
    return total / (seeds.shape[-1] * sigma)


def assert_float32_close(actual, expected):
    """Within float32 accumulation error of a float64 result (scaled by its largest value)."""
    assert actual.dtype == torch.float32 and actual.shape == expected.shape
    scale = max(expected.abs().max().item(), 1.0)
    torch.testing.assert_close(actual.double().cpu(), expected.cpu(), rtol=1e-5, atol=2e-6 * scale)


def random_seeds(*shape, generator):
    return torch.randint(-(2**63), 2**63 - 1, shape, dtype=torch.int64, generator=generator)


# (lead shape, batch, k, d, rank, counter): k not a multiple of 4, odd ranks, a counter near 2^64.
CASES = [
    ((5,), 3, 12, 20, 4, 0),
    ((4,), 1, 7, 9, 3, 11),
    ((2, 3), 2, 16, 8, 1, 2**40 + 3),
    ((3,), 17, 8, 33, 2, -5),
    ((), 2, 5, 3, 2, 1),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_delta_output_is_evox_s_materialised_formula(device, case):
    lead, batch, k, d, rank, counter = case
    generator = torch.Generator().manual_seed(1)
    seeds = random_seeds(*lead, generator=generator).to(device)
    x = torch.randn(*lead, batch, k, generator=generator).to(device)
    out = delta_output(x, seeds, rank, d, 0.25, counter)
    assert out.shape == (*lead, batch, d) and out.device == x.device
    assert_float32_close(out, reference_delta(x, seeds, rank, d, 0.25, counter))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [c for c in CASES if c[0]], ids=str)
def test_gradient_is_evox_s_materialised_formula(device, case):
    lead, _, k, d, rank, counter = case
    generator = torch.Generator().manual_seed(2)
    seeds = random_seeds(*lead, generator=generator).to(device)
    fitness = torch.randn(*lead, generator=generator).to(device)
    out = gradient(fitness, seeds, rank, d, k, 0.1, counter)
    assert out.shape == (*lead[:-1], d, k)
    assert_float32_close(out, reference_gradient(fitness, seeds, rank, d, k, 0.1, counter))


def test_factors_are_the_documented_streams():
    # Entry (j, l) of A_i is value j k + l of philox_normal(seed_i, ., counter): check the op's
    # delta on one-hot inputs, which reads single columns of A back through B.
    seeds = torch.tensor([3, -(2**40)], dtype=torch.int64)
    rank, d, k = 2, 3, 5
    a, b = factors(seeds, rank, d, k, 9)
    eye = torch.eye(k).expand(2, k, k).contiguous()
    out = delta_output(eye, seeds, rank, d, 1.0, 9)  # row l: sum_j A[j, l] B[:, j]
    torch.testing.assert_close(out, (b @ a).mT.contiguous(), rtol=1e-6, atol=1e-6)


def test_zero_sizes():
    seeds = torch.arange(3)
    assert delta_output(torch.randn(3, 0, 4), seeds, 2, 5, 1.0).shape == (3, 0, 5)
    assert delta_output(torch.randn(3, 2, 4), seeds, 2, 0, 1.0).shape == (3, 2, 0)
    torch.testing.assert_close(
        delta_output(torch.randn(3, 2, 0), seeds, 2, 4, 1.0), torch.zeros(3, 2, 4)
    )
    assert gradient(torch.ones(3), seeds, 2, 0, 4, 1.0).shape == (0, 4)


def test_argument_errors_name_the_op_and_the_argument():
    seeds, x, ones = torch.arange(3), torch.randn(3, 2, 4), torch.ones(3)
    op = "opreg::lowrank_delta_output: "
    cases = [
        (lambda: delta_output(x, seeds, 0, 4, 1.0), op + "argument 'rank' must be >= 1, got 0"),
        (lambda: delta_output(x, seeds, 2, -1, 1.0), "'out_features' must be >= 0, got -1"),
        (
            lambda: delta_output(x, torch.arange(4), 2, 4, 1.0),
            r"argument 'x' of shape \[3, 2, 4\] must be seeds.shape \+ \(batch, in_features\)",
        ),
        (lambda: delta_output(torch.randn(4), seeds, 2, 4, 1.0), "argument 'x' must be"),
        (lambda: delta_output(x, seeds, 2**62, 2**62, 1.0), "is too large"),
        (lambda: gradient(ones, seeds, 2, 4, 4, 0.0), "argument 'sigma' must not be 0"),
        (
            lambda: gradient(torch.ones(4), seeds, 2, 4, 4, 1.0),
            r"argument 'fitness' of shape \[4\] must have the shape of 'seeds'",
        ),
        (lambda: gradient(ones[:0], seeds[:0], 2, 4, 4, 1.0), "needs at least one individual"),
        (lambda: gradient(ones[0], seeds[0], 2, 4, 4, 1.0), r"must be \[..., pop\]"),
        (lambda: gradient(ones, seeds, 2, 4, -4, 1.0), "in_features must be >= 0, got -4"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    # On meta tensors (the fake), the message said in_features 0 whatever x's.
    with pytest.raises(
        ValueError, match=r"rank 2 times in_features 4 or out_features 4611686018427387904 "
    ):
        delta_output(x.to("meta"), seeds.to("meta"), 2, 2**62, 1.0)
    with pytest.raises(TypeError, match="argument 'x' has dtype Half, expected one of: Float, Do"):
        delta_output(x.half(), seeds, 2, 4, 1.0)
    with pytest.raises(TypeError, match="argument 'seeds' has dtype Int, expected one of: Long"):
        gradient(torch.ones(3), seeds.int(), 2, 4, 4, 1.0)


def test_fake_and_compile():
    meta = delta_output(
        torch.empty(4, 3, 8, device="meta"),
        torch.empty(4, dtype=torch.int64, device="meta"),
        2,
        6,
        1.0,
    )
    assert meta.shape == (4, 3, 6) and meta.dtype == torch.float32
    grad_meta = gradient(
        torch.empty(2, 4, device="meta"),
        torch.empty(2, 4, dtype=torch.int64, device="meta"),
        2,
        6,
        8,
        1.0,
    )
    assert grad_meta.shape == (2, 6, 8)
    seeds, x = torch.arange(4), torch.randn(4, 3, 8)
    compiled = torch.compile(
        lambda x, s: delta_output(x, s, 2, 6, 0.5, 3) + 1, fullgraph=True, dynamic=True
    )
    torch.testing.assert_close(compiled(x, seeds), delta_output(x, seeds, 2, 6, 0.5, 3) + 1)


def test_vmap_is_one_batch_polymorphic_call():
    generator = torch.Generator().manual_seed(4)
    seeds = random_seeds(3, 5, generator=generator)
    x = torch.randn(3, 5, 2, 8, generator=generator)
    fitness = torch.randn(3, 5, generator=generator)
    with opreg.trace() as t:
        batched = torch.vmap(lambda x, s: delta_output(x, s, 2, 6, 0.5))(x, seeds)
    assert "vmap:batch-polymorphic" in t.impls()
    torch.testing.assert_close(batched, delta_output(x, seeds, 2, 6, 0.5))
    # Only x batched: every example uses the same individuals.
    shared = torch.vmap(lambda x: delta_output(x, seeds[0], 2, 6, 0.5))(x)
    torch.testing.assert_close(shared[1], delta_output(x[1], seeds[0], 2, 6, 0.5))
    # The gradient contracts the last dim; vmap gives one estimate per example.
    per_example = torch.vmap(lambda f, s: gradient(f, s, 2, 6, 8, 0.1))(fitness, seeds)
    torch.testing.assert_close(per_example[2], gradient(fitness[2], seeds[2], 2, 6, 8, 0.1))


def test_autograd_runs_the_fallback_under_autograd():
    # No backward of its own: the fallback's matmuls carry the gradient with respect to x.
    generator = torch.Generator().manual_seed(5)
    seeds = random_seeds(4, generator=generator)
    x = torch.randn(4, 3, 8, generator=generator, requires_grad=True)
    delta_output(x, seeds, 2, 6, 0.5).square().sum().backward()
    a, b = factors(seeds, 2, 6, 8, 0)
    expected_x = x.detach().clone().requires_grad_()
    (0.5 * (expected_x @ a.mT) @ b.mT).square().sum().backward()
    torch.testing.assert_close(x.grad, expected_x.grad)
    fitness = torch.randn(4, generator=generator, requires_grad=True)
    gradient(fitness, seeds, 2, 6, 8, 0.1).sum().backward()
    assert fitness.grad is not None and fitness.grad.shape == (4,)


def test_float64_runs_the_fallback_in_float64():
    seeds, x, fitness = torch.arange(3), torch.randn(3, 2, 8, dtype=torch.float64), torch.ones(3)
    out = delta_output(x, seeds, 2, 5, 0.5)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, reference_delta(x, seeds, 2, 5, 0.5))
    grad = gradient(fitness.double(), seeds, 2, 5, 8, 0.5)
    assert grad.dtype == torch.float64
    torch.testing.assert_close(grad, reference_gradient(fitness, seeds, 2, 5, 8, 0.5))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    generator = torch.Generator().manual_seed(6)
    seeds = random_seeds(3, generator=generator).to(device)
    x = torch.randn(3, 2, 8, generator=generator).to(device)
    torch.library.opcheck(delta_output.default, (x, seeds, 2, 5, 0.5, 7))
    fitness = torch.randn(3, generator=generator).to(device)
    torch.library.opcheck(gradient.default, (fitness, seeds, 2, 5, 8, 0.5, 7))
    # opreg's opcheck adds kernel against fallback and float64 gradients through the fallback.
    delta_samples = [(x, seeds, 2, 5, 0.5, 7), (x[:, :1], seeds, 1, 3, -1.0, -2)]
    assert not opreg.opcheck(delta_output, delta_samples, devices=[device]).failures
    grid = (fitness.expand(2, 3), seeds.expand(2, 3), 4, 4, 8, 2.0)
    gradient_samples = [(fitness, seeds, 2, 5, 8, 0.5, 7), grid]
    assert not opreg.opcheck(gradient, gradient_samples, devices=[device]).failures


# ---- the Triton kernels -----------------------------------------------------------------------

# The kernels' source in Triton's interpreter on the CPU, with small tiles, against the fallback.
INTERPRETED_KERNELS = """
import triton_interpreter
import torch
import opreg
from opreg.kernels import philox as kernels

generator = torch.Generator().manual_seed(7)
for rank, (pop, batch, k, d, counter) in [(4, (3, 5, 12, 20, 2**64 - 9)), (1, (2, 1, 8, 6, 5))]:
    seeds = torch.randint(-(2**63), 2**63 - 1, (pop,), dtype=torch.int64, generator=generator)
    x = torch.randn(pop, batch, k, generator=generator)
    fitness = torch.randn(pop, generator=generator)
    counter = counter - 2**64 if counter >= 2**63 else counter
    b_counter = (counter + rank * k) % 2**64
    b_counter = b_counter - 2**64 if b_counter >= 2**63 else b_counter
    out = torch.full((pop, batch, d), float("nan"))
    kernels.lowrank_delta_output_kernel[(pop, -(-batch // 4))](
        x, seeds, out, batch, k, d, counter, b_counter, 0.3, R=rank, BLOCK_B=4, BLOCK_K=8,
        BLOCK_D=8)
    expected = torch.ops.opreg.lowrank_delta_output(x, seeds, rank, d, 0.3, counter)
    print("delta", (out - expected).abs().max().item() <= 1e-5 * expected.abs().max().item())
    grad = torch.full((d, k), float("nan"))
    kernels.lowrank_gradient_kernel[(-(-d // 16), -(-k // 16), 1)](
        fitness, seeds, grad, pop, k, d, counter, b_counter, pop * 0.1, R=rank, BLOCK_P=2,
        BLOCK_D=16, BLOCK_K=16)
    expected = torch.ops.opreg.lowrank_gradient(fitness, seeds, rank, d, k, 0.1, counter)
    print("gradient", (grad - expected).abs().max().item() <= 1e-5 * expected.abs().max().item())
"""


def test_interpreted_kernels_agree_with_the_fallback():
    stdout = run_interpreted(INTERPRETED_KERNELS)
    assert stdout.split() == ["delta", "True", "gradient", "True"] * 2, stdout


@requires_cuda
@pytest.mark.parametrize("rank", [1, 2, 4, 8, 16])
def test_cuda_kernels_agree_with_the_fallback(rank):
    generator = torch.Generator().manual_seed(rank)
    for lead, batch, k, d, counter in [((37,), 1, 64, 100, 0), ((2, 9), 19, 132, 65, 2**64 - 3)]:
        counter = counter - 2**64 if counter >= 2**63 else counter
        seeds = random_seeds(*lead, generator=generator)
        x = torch.randn(*lead, batch, k, generator=generator)
        fitness = torch.randn(*lead, generator=generator)
        with opreg.trace() as t:
            out = delta_output(x.cuda(), seeds.cuda(), rank, d, 0.3, counter)
            grad = gradient(fitness.cuda(), seeds.cuda(), rank, d, k, 0.1, counter)
        assert t.impls() == ["kernel:triton_aot"] * 2
        assert_float32_close(out, reference_delta(x, seeds, rank, d, 0.3, counter))
        assert_float32_close(grad, reference_gradient(fitness, seeds, rank, d, k, 0.1, counter))


@requires_cuda
def test_cuda_kernels_decline_what_they_do_not_handle():
    seeds, fitness = torch.arange(4, device="cuda"), torch.randn(4, device="cuda")
    for rank, k in [(3, 8), (2, 6), (32, 8)]:  # rank not a power of two <= 16, k % 4 != 0
        x = torch.randn(4, 2, k, device="cuda")
        with opreg.trace() as t:
            out = delta_output(x, seeds, rank, 5, 1.0)
            grad = gradient(fitness, seeds, rank, 5, k, 1.0)
        lowrank_impls = t.impls("opreg::lowrank_delta_output") + t.impls("opreg::lowrank_gradient")
        # (the fallbacks' own philox_normal calls run its CUDA kernel: not counted)
        assert lowrank_impls == ["fallback(declined by kernel:triton_aot)"] * 2, t.records()
        assert out.shape == (4, 2, 5) and grad.shape == (5, k)
