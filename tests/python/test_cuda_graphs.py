"""CUDA graphs and streams: the cuda_graph_unsafe flag tags an op's schema (and a replace keeps
the tags true to the current definition); opcheck's cuda_graph and stream checks are skipped with
the reason off CUDA, pass for well-behaved ops on CUDA and fail for an op that launches on
another stream than the current one; shipped ops are captured and replayed, and compile with
mode="reduce-overhead" runs a model with opreg ops and keeps a side-effect op out of its graphs."""

from __future__ import annotations

import pytest
import torch

import opreg
from conftest import requires_cuda


def define_counter(name: str, calls: list, **flags):
    @opreg.register_triton_op(
        fake_fn=lambda token: torch.empty_like(token), triton_fn=None, name=name, **flags
    )
    def counter(token: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return token + 1

    return counter


def tags(name: str) -> list:
    namespace, op = name.split("::")
    return getattr(getattr(torch.ops, namespace), op).default.tags


def test_cuda_graph_unsafe_tags_the_op_and_a_replace_follows_the_definition():
    define_counter("graphs_test::tagged", [], cuda_graph_unsafe=True)
    assert torch.Tag.cudagraph_unsafe in tags("graphs_test::tagged")
    assert opreg.describe_op("graphs_test::tagged").flags["cuda_graph_unsafe"]
    define_counter("graphs_test::tagged", [], replace=True)
    assert torch.Tag.cudagraph_unsafe not in tags("graphs_test::tagged")
    define_counter("graphs_test::tagged", [], cuda_graph_unsafe=True, replace=True)
    assert torch.Tag.cudagraph_unsafe in tags("graphs_test::tagged")
    # A failed replace leaves the tags as they were.
    with pytest.raises(ValueError, match="graphs_test::tagged"):
        opreg.register_triton_op(
            fake_fn=None, triton_fn=None, name="graphs_test::tagged", schema="(", replace=True
        )(lambda token: token)
    assert torch.Tag.cudagraph_unsafe in tags("graphs_test::tagged")
    assert torch.ops.graphs_test.tagged(torch.zeros(1)).item() == 1


def test_ops_without_the_flag_carry_no_tag():
    define_counter("graphs_test::plain", [])
    assert torch.Tag.cudagraph_unsafe not in tags("graphs_test::plain")
    assert torch.Tag.cudagraph_unsafe not in torch.ops.opreg.fused_add.default.tags


def test_opcheck_skips_the_cuda_checks_off_cuda_with_the_reason():
    report = opreg.opcheck(torch.ops.opreg.fused_add, devices=["cpu"])
    rows = [r for r in report.rows if r.check in ("cuda_graph", "stream")]
    assert rows and all(r.skipped and r.passed for r in rows)
    assert {r.message for r in rows} == {"needs a CUDA device: skipped"}


@requires_cuda
@pytest.mark.parametrize(
    "name",
    [
        "opreg::fused_add",
        "opreg::philox_uniform",
        "opreg::philox_normal",
        "opreg::lowrank_delta_output",
        "opreg::lowrank_gradient",
    ],
)
def test_shipped_ops_pass_the_cuda_graph_and_stream_checks(name):
    namespace, op = name.split("::")
    report = opreg.opcheck(
        getattr(getattr(torch.ops, namespace), op),
        devices=["cuda"],
        checks=["cuda_graph", "stream"],
    )
    assert report.rows and not report.failures
    assert not all(r.skipped for r in report.rows), str(report)


@requires_cuda
def test_the_stream_check_fails_an_op_that_launches_on_another_stream():
    def on_the_default_stream(x):
        with torch.cuda.stream(torch.cuda.default_stream()):
            return x * 2  # reads x on the default stream, ignoring the current one

    def reference(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    opreg.register_triton_op(
        fake_fn=lambda x: torch.empty_like(x),
        triton_fn=on_the_default_stream,
        name="graphs_test::wrong_stream",
    )(reference)
    with pytest.raises(opreg.OpcheckError, match=r"stream failed .*a call on a side stream"):
        opreg.opcheck(
            torch.ops.graphs_test.wrong_stream,
            [(torch.randn(1 << 20, device="cuda"),)],
            devices=["cuda"],
            checks=["stream"],
        )


@requires_cuda
def test_the_cuda_graph_check_skips_an_op_that_declares_cuda_graph_unsafe():
    define_counter("graphs_test::unsafe_cuda", [], cuda_graph_unsafe=True)
    report = opreg.opcheck(
        torch.ops.graphs_test.unsafe_cuda, devices=["cuda"], checks=["cuda_graph"]
    )
    assert {r.message for r in report.rows} == {"the op declares cuda_graph_unsafe: skipped"}


@requires_cuda
def test_shipped_ops_are_captured_and_replayed_with_new_inputs():
    x, y = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
    seeds = torch.arange(8, device="cuda")

    def step():
        noise = torch.ops.opreg.philox_normal(seeds, 512)
        return torch.ops.opreg.fused_add(x, y), noise

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        total, noise = step()
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        seeds.copy_(torch.randint(0, 2**62, (8,), device="cuda"))
        graph.replay()
        torch.testing.assert_close(total, x + y, rtol=0, atol=0)
        torch.testing.assert_close(noise, torch.ops.opreg.philox_normal(seeds, 512), rtol=0, atol=0)


@requires_cuda
def test_reduce_overhead_compile_of_a_model_with_opreg_ops():
    calls: list = []
    define_counter("graphs_test::recorded", calls, cuda_graph_unsafe=True)
    seeds = torch.arange(16, device="cuda")

    def model(x):
        h = torch.ops.opreg.fused_add(torch.relu(x), torch.ops.opreg.philox_normal(seeds, 64))
        return torch.ops.graphs_test.recorded(h.sum(0)), h

    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    for step in range(5):
        x = torch.randn(16, 64, device="cuda")
        got, want = compiled(x), model(x)
        torch.testing.assert_close(got[1], want[1])
        torch.testing.assert_close(got[0], want[0])
        # The side-effect op ran on this step's compiled call too: it was left out of the graphs.
        assert len(calls) == 2 * (step + 1)
