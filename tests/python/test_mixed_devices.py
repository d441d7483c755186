"""Calls whose tensor arguments are on several devices, as torch.library's ops take them: a kernel
(device-specific) declines such a call and the fallback serves it, unless the op declares
allow_mixed_devices; a side-effect op in EvoX's style (CPU data, CUDA token) runs exactly once per
call under eager, torch.compile and vmap. The CUDA tests skip without a GPU; the CPU tests reach
the same paths with a meta tensor in a call dispatched to the CPU kernel."""

from __future__ import annotations

import pytest
import torch

import opreg

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CPU_KEY = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def _op_with_cpu_kernel(name: str, **flags: bool) -> tuple[object, list[str]]:
    served: list[str] = []

    def kernel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        served.append("kernel")
        return x * y.dim()  # no data of y needed: it may be a meta tensor

    @opreg.register_triton_op(
        fake_fn=lambda x, y: torch.empty_like(x),
        triton_fn=kernel,
        triton_device_types=("cpu",),
        name=name,
        **flags,
    )
    def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        served.append("fallback")
        return x * y.dim()

    return add, served


def test_a_kernel_declines_a_call_across_devices_and_the_fallback_serves_it():
    add, served = _op_with_cpu_kernel("mixed_test::declines")
    x = torch.ones(3)
    add(x, x)
    assert served == ["kernel"]
    out = torch.ops.mixed_test.declines.default.redispatch(CPU_KEY, x, torch.ones(3, device="meta"))
    assert served == ["kernel", "fallback"]
    assert out.device.type == "cpu"


def test_allow_mixed_devices_lets_the_kernel_serve_calls_across_devices():
    _, served = _op_with_cpu_kernel("mixed_test::kernel_takes_mixed", allow_mixed_devices=True)
    torch.ops.mixed_test.kernel_takes_mixed.default.redispatch(
        CPU_KEY, torch.ones(3), torch.ones(3, device="meta")
    )
    assert served == ["kernel"]


def test_a_zero_dim_cpu_tensor_beside_others_is_not_a_device_mix():
    add, served = _op_with_cpu_kernel("mixed_test::scalar_tensor")
    add(torch.ones(3), torch.tensor(2.0))
    assert served == ["kernel"]


def test_a_call_with_a_meta_tensor_runs_the_fake_as_torch_library_does():
    @opreg.register_vmap_op(fake_fn=lambda x, y: torch.empty_like(y), name="mixed_test::to_meta")
    def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y

    out = add(torch.ones(2), torch.ones(2, device="meta"))
    assert out.device.type == "meta"


class Sink:
    """EvoX's EvalMonitor pattern: an op that records `data` (kept on its own device) and returns
    `token + 1`, so that the calls stay ordered in a compiled graph."""

    def __init__(self, name: str) -> None:
        self.records: list[torch.Tensor] = []
        self.kernel_calls = 0

        # Under k vmap levels the token (0-dim) comes with k leading dims of size 1.
        def vmap_sink(data: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
            self.records.append(data.clone())  # the whole batch at once
            return (token + 1).expand(data.shape[: token.dim()]).clone()

        def triton_sink(data: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
            self.kernel_calls += 1
            return token + 1

        @opreg.register_triton_op(
            fake_fn=lambda data, token: torch.empty_like(token),
            triton_fn=triton_sink,
            vmap_fn=vmap_sink,
            fake_vmap_fn=lambda data, token: token.new_empty(data.shape[: token.dim()]),
            max_vmap_level=2,
            name=name,
        )
        def sink(data: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
            self.records.append(data.clone())
            return token + 1

        self.op = sink


def _sink_everywhere(sink: Sink, data_device: str, token_device: str) -> None:
    data = torch.arange(6.0, device=data_device).reshape(2, 3)
    token = torch.zeros((), device=token_device)

    token = sink.op(data, token)
    assert token.item() == 1 and len(sink.records) == 1
    assert sink.records[-1].device.type == data_device
    torch.testing.assert_close(sink.records[-1], data)

    @torch.compile(fullgraph=True)
    def step(data: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        return sink.op(data * 2, token) * 3

    for calls in (2, 3):  # the first call traces with the fake: nothing recorded then
        out = step(data, token)
        assert len(sink.records) == calls
        torch.testing.assert_close(sink.records[-1], data * 2)
        assert out.item() == 6 and out.device.type == token_device

    batched = torch.vmap(sink.op, in_dims=(0, None))(data, token)
    assert len(sink.records) == 4 and batched.shape == (2,)
    torch.testing.assert_close(sink.records[-1], data)
    assert batched.tolist() == [2.0, 2.0]

    nested = torch.vmap(torch.vmap(sink.op, in_dims=(0, None)), in_dims=(0, None))
    cube = data.reshape(1, 2, 3)
    assert nested(cube, token).shape == (1, 2)
    assert len(sink.records) == 5
    torch.testing.assert_close(sink.records[-1], cube)


def test_a_side_effect_op_runs_once_per_call_on_cpu():
    sink = Sink("mixed_test::sink_cpu")
    _sink_everywhere(sink, "cpu", "cpu")


@cuda
def test_a_side_effect_op_with_cpu_data_and_a_cuda_token_runs_once_per_call():
    sink = Sink("mixed_test::sink_cuda")
    _sink_everywhere(sink, "cpu", "cuda")
    assert sink.kernel_calls == 0  # every call was across devices: the fallback served it
    sink.op(torch.ones(2, device="cuda"), torch.zeros((), device="cuda"))
    assert sink.kernel_calls == 1


@cuda
def test_a_shipped_op_across_devices_gets_the_fallbacks_answer():
    # fused_add's fallback is x + y: ATen refuses CPU and CUDA tensors of more than 0 dims
    x, y = torch.ones(4), torch.full((4,), 2.0, device="cuda")
    with pytest.raises(RuntimeError, match="in the fallback of opreg::fused_add"):
        torch.ops.opreg.fused_add(x, y)
