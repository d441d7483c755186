"""``python -m opreg demo``: the example op defined in C++ (examples/scale_add), called on each
available device, showing which implementation served each call."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import opreg
from opreg import _info


def _cases() -> list[tuple[str, object]]:
    cases: list[tuple[str, object]] = [
        ("cpu float32, same shape", lambda: (torch.randn(1000), torch.randn(1000))),
        ("cpu float64 (kernel declines)", lambda: (torch.randn(1000).double(),) * 2),
        ("cpu broadcast (kernel declines)", lambda: (torch.randn(4, 1), torch.randn(5))),
        ("meta", lambda: (torch.empty(8, device="meta"), torch.empty(8, device="meta"))),
    ]
    if torch.cuda.is_available():
        cases.append(("cuda float32", lambda: (torch.randn(1000, device="cuda"),) * 2))
        cases.append(("cuda bfloat16", lambda: (torch.randn(64, device="cuda").bfloat16(),) * 2))
    return cases


def run() -> str:
    opreg.load_library(opreg.example_library("scale_add"))
    scale_add = torch.ops.opreg_example.scale_add
    lines = ["opreg demo: opreg_example::scale_add(x, y, alpha) = x + alpha * y", ""]
    lines.append(f"{'call':34} {'served by':38} {'matches x + alpha*y'}")
    for label, make in _cases():
        x, y = make()
        with opreg.trace() as t:
            out = scale_add(x, y, 0.5)
        if out.device.type == "meta":
            ok = out.shape == torch.broadcast_shapes(x.shape, y.shape)
        else:
            ok = torch.allclose(out, x + 0.5 * y)
        lines.append(f"{label:34} {', '.join(t.impls()):38} {ok}")
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.randn(3, 5))
        with opreg.trace() as t:
            out = scale_add(x, x, 2.0)
    lines.append(f"{'FakeTensorMode':34} {', '.join(t.impls()):38} {tuple(out.shape) == (3, 5)}")
    lines.append("")
    lines.append(_info.format_op(opreg.describe_op("opreg_example::scale_add")))
    return "\n".join(lines)
