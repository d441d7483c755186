"""opreg ops on a machine with several GPUs: a call launches on the device of its tensors whatever
device is current (AOT kernels, the shipped ops and a Python-front op whose Triton kernel launches
through the JIT launch cache), two threads drive two devices at once, tensors on two GPUs in one
call are served by the fallback as other calls across devices, and one DistributedDataParallel
step over NCCL (2 processes, one GPU each, torchrun) gives the single-process gradients. Every
test needs two CUDA devices and skips without them; tests/python/test_mixed_devices.py and
test_distributed.py are their counterparts on one device and on CPU."""

from __future__ import annotations

import threading

import pytest
import torch

import opreg

two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
fused_add = torch.ops.opreg.fused_add.default
philox_normal = torch.ops.opreg.philox_normal.default


def _jit_add_op():
    """A Python-front op whose triton_fn launches a @triton.jit kernel (through the JIT cache)."""
    import triton.language as tl

    import triton

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, x + tl.load(y_ptr + offsets, mask=mask), mask=mask)

    def launch(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        add_kernel[(triton.cdiv(x.numel(), 256),)](x, y, out, x.numel(), BLOCK=256)
        return out

    @opreg.register_triton_op(
        fake_fn=lambda x, y: torch.empty_like(x),
        triton_fn=launch,
        name="multi_gpu_test::jit_add",
        replace=True,
    )
    def jit_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y

    return jit_add


@two_gpus
@pytest.mark.parametrize("current", [0, 1])
def test_a_call_launches_on_the_device_of_its_tensors_whatever_device_is_current(current):
    jit_add = _jit_add_op()
    seeds = torch.arange(64)
    for device in ("cuda:0", "cuda:1"):
        x, y = (torch.randn(5000, generator=torch.Generator().manual_seed(s)) for s in (1, 2))
        with torch.cuda.device(current), opreg.trace() as t:
            out_add = fused_add(x.to(device), y.to(device))
            out_normal = philox_normal(seeds.to(device), 1000)
            out_jit = jit_add(x.to(device), y.to(device))
        torch.cuda.synchronize(device)
        assert t.impls() == ["kernel:triton_aot", "kernel:triton_aot", "kernel:triton"], device
        for out in (out_add, out_normal, out_jit):
            assert out.device == torch.device(device)
        assert torch.equal(out_add.cpu(), x + y)  # fused_add is bitwise torch.add
        assert torch.equal(out_jit.cpu(), x + y)
        assert torch.equal(out_normal.cpu(), philox_normal(seeds, 1000))  # bitwise, any device
        assert torch.cuda.current_device() == current


@two_gpus
def test_two_threads_drive_two_devices_at_once():
    jit_add = _jit_add_op()
    seeds = torch.arange(256)
    expected_normal = philox_normal(seeds, 4096)
    x, y = torch.randn(1 << 16), torch.randn(1 << 16)
    failures: list[BaseException] = []
    start = threading.Barrier(2)

    def drive(device: str) -> None:
        try:
            torch.cuda.set_device(device)
            xs, ys, ss = x.to(device), y.to(device), seeds.to(device)
            start.wait()
            for _ in range(200):
                added, normal, jitted = fused_add(xs, ys), philox_normal(ss, 4096), jit_add(xs, ys)
            assert torch.equal(added.cpu(), x + y) and torch.equal(jitted.cpu(), x + y)
            assert torch.equal(normal.cpu(), expected_normal)
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=drive, args=(f"cuda:{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a thread hung"
    assert not failures, failures


@two_gpus
def test_tensors_on_two_gpus_in_one_call_go_to_the_fallback():
    jit_add = _jit_add_op()
    x, y = torch.randn(100, device="cuda:0"), torch.randn(100, device="cuda:1")
    for op in (fused_add, jit_add):
        with opreg.trace() as t:
            try:
                out = op(x, y)
            except RuntimeError as error:  # the fallback's x + y refuses, as torch.add does
                with pytest.raises(RuntimeError) as torch_error:
                    torch.add(x, y)
                assert str(torch_error.value).split("\n")[0] in str(error)
            else:
                torch.testing.assert_close(out, torch.add(x, y))
        assert t.impls() and all(impl.startswith("fallback") for impl in t.impls()), t.impls()


@two_gpus
def test_ddp_over_nccl_gives_the_single_process_gradients(tmp_path):
    import test_distributed
    from test_distributed import WORLD_SIZE, labelled, run_torchrun, single_process_step

    if not torch.distributed.is_nccl_available():
        pytest.skip("this PyTorch has no NCCL")
    run_torchrun(tmp_path, backend="nccl", timeout=300)
    reference = single_process_step()  # on the CPU, one process, the whole batch
    # float64 on two devices: tanh may differ in the last bit between CPU and GPU.
    tolerance = {"rtol": 1e-10, "atol": 1e-12}
    assert test_distributed.TOLERANCE["rtol"] <= tolerance["rtol"]
    for rank in range(WORLD_SIZE):
        saved = torch.load(tmp_path / f"rank{rank}.pt")
        assert saved["device"] == f"cuda:{rank}" and saved["world_size"] == WORLD_SIZE
        for name, parameter in reference.named_parameters():
            where = labelled(f"rank {rank}, {name}")
            torch.testing.assert_close(saved["grads"][name], parameter.grad, **tolerance, msg=where)
            torch.testing.assert_close(
                saved["params"][name], parameter.detach(), **tolerance, msg=where
            )
        ops = [(op, impl == "backward") for op, impl, _ in saved["trace"]]
        assert ops == [
            ("opreg::fused_add", False),
            ("opreg_ddp_test::scaled_tanh", False),
            ("opreg_ddp_test::scaled_tanh", True),
            ("opreg::fused_add", True),
        ], saved["trace"]
