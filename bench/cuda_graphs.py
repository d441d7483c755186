"""A chain of 20 small opreg ops (opreg::fused_add on 4096 float32 elements; the C++ op with its
AOT Triton kernel) replayed from a CUDA graph, against the same chain called eagerly. CUDA only.

    python3 bench/cuda_graphs.py"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import opreg  # noqa: F401 (defines the shipped ops)
from common import Report, host_us_per_call

CHAIN = 20


def chain(x: torch.Tensor, ys: list[torch.Tensor]) -> torch.Tensor:
    for y in ys:
        x = torch.ops.opreg.fused_add(x, y)
    return x


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("bench/cuda_graphs.py needs a CUDA device")
    x = torch.randn(4096, device="cuda")
    ys = [torch.randn(4096, device="cuda") for _ in range(CHAIN)]
    want = chain(x, ys)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        chain(x, ys)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = chain(x, ys)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, want, rtol=0, atol=0)

    r = Report("cuda_graphs", f"a chain of {CHAIN} opreg::fused_add calls, 4096 float32")
    unit = "us per chain (host)"
    r.figure(
        "graph_replay_us",
        host_us_per_call(graph.replay, "cuda", 500),
        unit,
        f"torch.cuda.CUDAGraph.replay() of the captured chain of {CHAIN} calls",
    )
    r.figure(
        "eager_us",
        host_us_per_call(lambda: chain(x, ys), "cuda", 500),
        unit,
        f"the chain of {CHAIN} calls, eager",
    )
    r.compare("graph_replay_us", "eager_us")
    r.write()


if __name__ == "__main__":
    main()
