"""The shipped ops: opreg::fused_add (torch.add's semantics, AOT Triton kernel on CUDA) and
opreg::philox_uniform / philox_normal (Philox4x32-10, bitwise between fallback and kernel):
reference values from the published algorithm, edge cases, statistics, autograd, vmap, opcheck."""

from __future__ import annotations

import math

import philox_reference as ref
import pytest
import torch

import opreg
from conftest import DEVICES, requires_cuda, run_interpreted

fused_add = torch.ops.opreg.fused_add
philox_uniform = torch.ops.opreg.philox_uniform
philox_normal = torch.ops.opreg.philox_normal

# ---- fused_add --------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("x_shape", "y_shape", "x_dtype", "y_dtype"),
    [
        ((5, 123, 123), (5, 123, 123), torch.float32, torch.float32),
        ((4, 1), (3,), torch.float32, torch.float64),
        ((7,), (), torch.int32, torch.float16),
        ((2, 3), (2, 3), torch.bfloat16, torch.bfloat16),
    ],
)
def test_fused_add_has_torch_add_semantics(device, x_shape, y_shape, x_dtype, y_dtype):
    x = (torch.randn(x_shape, device=device) * 10).to(x_dtype)
    y = (torch.randn(y_shape, device=device) * 10).to(y_dtype)
    out = fused_add(x, y)
    expected = torch.add(x, y)
    assert out.dtype == expected.dtype and out.shape == expected.shape
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    xt = x.transpose(0, -1)  # a non-contiguous layout, preserved as torch.add does
    assert fused_add(xt, xt).stride() == torch.add(xt, xt).stride()
    torch.testing.assert_close(fused_add(xt, xt), torch.add(xt, xt), rtol=0, atol=0)


def test_fused_add_backward_and_vmap():
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    y = torch.randn(4, dtype=torch.float32, requires_grad=True)
    assert torch.autograd.gradcheck(fused_add, (x, y.double().detach().requires_grad_()))
    fused_add(x, y).sum().backward()
    assert y.grad.dtype == torch.float32
    torch.testing.assert_close(y.grad, torch.full((4,), 3.0))
    with opreg.trace() as t:
        out = torch.vmap(fused_add)(torch.ones(6, 5), torch.ones(6, 5))
    assert t.impls()[0] == "vmap:batch-polymorphic"
    torch.testing.assert_close(out, torch.full((6, 5), 2.0))


@pytest.mark.parametrize("device", DEVICES)
def test_fused_add_opcheck(device):
    x, y = torch.randn(5, 7, device=device), torch.randn(5, 7, device=device)
    torch.library.opcheck(fused_add.default, (x, y))
    torch.library.opcheck(fused_add.default, (x.t(), y.t()[:1].double()))
    torch.library.opcheck(fused_add.default, (x.requires_grad_(), y))


# ---- philox: reference values ---------------------------------------------------------------


def test_reference_reproduces_the_published_known_answers():
    assert ref.philox4x32_10([0, 0, 0, 0], [0, 0]) == [
        0x6627E8D5,
        0xE169C58D,
        0xBC57AC4C,
        0x9B00DBD8,
    ]
    assert ref.philox4x32_10([ref.MASK32] * 4, [ref.MASK32] * 2) == [
        0x408F276D,
        0x41C83B0E,
        0xA20BC7C6,
        0x6D5451FD,
    ]
    assert ref.philox4x32_10(
        [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0]
    ) == [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


EDGE_SEEDS = [0, 1, -1, 2**31, 2**32, 2**32 + 5, -(2**63), 2**63 - 1, 123456789012345]
EDGE_COUNTERS = [0, 1, 2**31, 2**31 + 3, 2**32 - 2, 2**32, 2**63 - 2, -1, -3]  # -k: 2^64 - k


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("counter", EDGE_COUNTERS)
def test_uniform_matches_the_reference_bitwise(device, counter):
    seeds = torch.tensor(EDGE_SEEDS, dtype=torch.int64, device=device)
    for n in (0, 1, 3, 4, 9):
        out = philox_uniform(seeds, n, counter)
        assert out.device == seeds.device and out.dtype == torch.float32
        expected = torch.tensor(
            [ref.uniform(s, n, counter) for s in EDGE_SEEDS], dtype=torch.float32
        ).reshape(len(EDGE_SEEDS), n)
        assert torch.equal(out.cpu(), expected), (n, counter)


def test_uniform_keeps_evox_layout_when_the_low_word_does_not_wrap():
    # EvoX: call j uses (low32(counter) + j, high32(counter)); equal while low32 + j < 2^32.
    counter = (7 << 32) + 100
    seed = 42
    evox = []
    for j in range(3):
        evox += ref.philox4x32_10([(counter & ref.MASK32) + j, counter >> 32, 0, 0], [seed, 0])
    out = philox_uniform(torch.tensor([seed]), 12, counter)[0]
    assert out.tolist() == [(w >> 8) * 2.0**-24 for w in evox]


def test_normal_is_box_muller_on_consecutive_pairs():
    seeds = torch.tensor(EDGE_SEEDS[:4], dtype=torch.int64)
    n, counter = 7, 2**32 - 1
    out = philox_normal(seeds, n, counter)
    for row, seed in enumerate(EDGE_SEEDS[:4]):
        u = ref.uniform(seed, n + 1, counter)
        expected = []
        for i in range(0, n + 1, 2):
            r = math.sqrt(-2.0 * math.log(max(u[i], 1e-10)))
            expected += [r * math.cos(2 * math.pi * u[i + 1]), r * math.sin(2 * math.pi * u[i + 1])]
        torch.testing.assert_close(
            out[row].double(), torch.tensor(expected[:n], dtype=torch.float64), rtol=1e-5, atol=1e-5
        )


def test_statistics():
    seeds = torch.arange(64, dtype=torch.int64) * 7919 - 1000
    u = philox_uniform(seeds, 16384, 5).flatten().double()
    assert abs(u.mean().item() - 0.5) < 2e-3
    assert abs(u.var().item() - 1 / 12) < 1e-3
    assert u.min().item() >= 0 and u.max().item() < 1
    counts = torch.histc(u, bins=100, min=0, max=1)
    expected = u.numel() / 100
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 160  # 99 degrees of freedom: p ~ 1e-4 beyond 160
    z = philox_normal(seeds, 16384, 5).flatten().double()
    assert abs(z.mean().item()) < 5e-3 and abs(z.std().item() - 1) < 5e-3
    assert abs((z**3).mean().item()) < 0.02 and abs((z**4).mean().item() - 3) < 0.05


def test_deterministic_and_different_per_seed_and_counter():
    seeds = torch.tensor([3, 4])
    a, b = philox_uniform(seeds, 8), philox_uniform(seeds, 8)
    assert torch.equal(a, b) and not torch.equal(a[0], a[1])
    assert not torch.equal(a, philox_uniform(seeds, 8, 1))


def test_philox_is_not_differentiable_vmaps_over_seeds_and_has_a_fake():
    seeds = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    batched = torch.vmap(lambda s: philox_uniform(s, 5, 9))(seeds)
    torch.testing.assert_close(batched, philox_uniform(seeds.reshape(-1), 5, 9).reshape(2, 3, 5))
    meta = philox_normal(torch.empty(4, dtype=torch.int64, device="meta"), 10)
    assert meta.shape == (4, 10) and meta.dtype == torch.float32
    assert opreg.describe_op("opreg::philox_uniform").autograd is opreg.AutogradSupport.NONE
    compiled = torch.compile(lambda s: philox_uniform(s, 6, 2) * 2, fullgraph=True, dynamic=True)
    torch.testing.assert_close(
        compiled(seeds.reshape(-1)), philox_uniform(seeds.reshape(-1), 6, 2) * 2
    )


@pytest.mark.parametrize("device", DEVICES)
def test_philox_opcheck(device):
    seeds = torch.tensor(EDGE_SEEDS, dtype=torch.int64, device=device)
    torch.library.opcheck(philox_uniform.default, (seeds, 13, 2**32 - 1))
    torch.library.opcheck(philox_normal.default, (seeds, 13, 7))


def test_philox_argument_errors():
    with pytest.raises(
        TypeError,
        match="opreg::philox_uniform: argument 'seeds' has dtype Int, expected one of: Long",
    ):
        philox_uniform(torch.tensor([1], dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="opreg::philox_normal: argument 'n' must be >= 0, got -2"):
        philox_normal(torch.tensor([1]), -2)


# ---- philox on a GPU --------------------------------------------------------------------------


def float32_ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    def ordered(t):
        bits = t.contiguous().view(torch.int32).long()
        return torch.where(bits < 0, -(bits & 0x7FFFFFFF), bits)

    return (ordered(a) - ordered(b)).abs()


@requires_cuda
def test_cuda_kernel_agrees_with_the_fallback_on_random_seeds_and_counters():
    generator = torch.Generator().manual_seed(0)
    seeds = torch.randint(-(2**63), 2**63 - 1, (4096,), dtype=torch.int64, generator=generator)
    for counter in [0, 2**31 - 7, 2**32 - 3, 2**40 + 11, -(2**31), -5]:
        for n in (1, 7, 1024, 4099):
            with opreg.trace() as t:
                gpu = philox_uniform(seeds.cuda(), n, counter)
                normal_gpu = philox_normal(seeds.cuda(), n, counter).cpu()
            assert t.impls() == ["kernel:triton_aot"] * 2
            assert torch.equal(gpu.cpu(), philox_uniform(seeds, n, counter)), (counter, n)
            # Note [Float32 Box-Muller]: the same float32 operations; the bound the docs promise.
            assert float32_ulps(normal_gpu, philox_normal(seeds, n, counter)).max() <= 2


# The kernel's source run by Triton's interpreter on the CPU, its three PTX instructions given
# their IEEE meaning (triton_interpreter.py), must give the fallback's bits: the two compute the
# same float32 operations in the same order.
INTERPRETED_KERNEL = """
import triton_interpreter
import torch
import opreg
from opreg.kernels import philox as kernels

generator = torch.Generator().manual_seed(1)
seeds = torch.randint(-(2**63), 2**63 - 1, (6,), dtype=torch.int64, generator=generator)
seeds[0] = 0
n, block = 8192 + 3, 2048
for name, counter in [("uniform", 2**32 - 700), ("normal", 12345)]:
    out = torch.full((len(seeds), n), float("nan"))
    kernel = getattr(kernels, f"philox_{name}_kernel")
    modes = {"MODE": 0} if name == "normal" else {}
    kernel[(len(seeds), -(-n // 4 // block))](seeds, out, n, counter, BLOCK=block, **modes)
    fallback = getattr(torch.ops.opreg, f"philox_{name}")(seeds, n, counter)
    same = torch.equal(out.view(torch.int32), fallback.view(torch.int32))
    print(name, "same" if same else "differ", (out - fallback).abs().max().item())
"""


def test_interpreted_kernel_gives_the_fallbacks_bits():
    stdout = run_interpreted(INTERPRETED_KERNEL)
    assert stdout.split("\n")[:2] == ["uniform same 0.0", "normal same 0.0"], stdout
