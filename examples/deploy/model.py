"""examples/deploy/model.py: the model that examples/deploy runs from C++ without Python, and the
two steps around that run that need Python: exporting it, and checking what C++ computed.

    python3 model.py export OUT [--device cpu|cuda]   # OUT/model.pt2, inputs.pt, expected.pt
    ./build/run_model OUT/model.pt2 OUT/inputs.pt OUT/outputs.pt --library <scale_add library>
    python3 model.py check OUT                        # OUT/outputs.pt against OUT/expected.pt
    python3 model.py inputs OUT --batch 3             # other inputs for the same package

NoisyMLP is a small MLP block with a noise injection: ATen's linear and relu, opreg::philox_normal
(counter-based noise: the same seeds give the same numbers on every device and in every process),
opreg::fused_add (a C++-defined op with an AOT Triton kernel on CUDA) and the C++ example op
opreg_example::scale_add for the residual. The batch size is dynamic in the exported program.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import opreg

WIDTH = 64
HIDDEN = 256
BATCH = 8


class NoisyMLP(torch.nn.Module):
    def __init__(self, width: int = WIDTH, hidden: int = HIDDEN, noise_scale: float = 0.1):
        super().__init__()
        self.up = torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, width)
        self.noise_scale = noise_scale

    def forward(self, x: torch.Tensor, seeds: torch.Tensor):
        hidden = torch.relu(self.up(x))
        noise = torch.ops.opreg.philox_normal(seeds, hidden.shape[-1])
        hidden = torch.ops.opreg.fused_add(hidden, noise * self.noise_scale)
        return torch.ops.opreg_example.scale_add(x, self.down(hidden), 0.5), noise


def example_inputs(device: str, batch: int = BATCH):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(batch, WIDTH, generator=generator).to(device)
    seeds = torch.randint(0, 2**62, (batch,), generator=generator).to(device)
    return x, seeds


def load_ops() -> None:
    """Loads the example op library; the shipped ops (opreg::*) come with `import opreg`."""
    opreg.load_library(opreg.example_library("scale_add"))


def build_model(device: str) -> NoisyMLP:
    torch.manual_seed(0)  # the same weights in every step
    return NoisyMLP().to(device).eval()


def export(out: Path, device: str) -> None:
    model = build_model(device)
    batch = torch.export.Dim("batch", min=1, max=4096)
    program = torch.export.export(
        model, example_inputs(device), dynamic_shapes={"x": {0: batch}, "seeds": {0: batch}}
    )
    out.mkdir(parents=True, exist_ok=True)
    torch._inductor.aoti_compile_and_package(program, package_path=str(out / "model.pt2"))
    print(f"wrote {out / 'model.pt2'} ({device})")
    write_inputs(out, device, BATCH)


def write_inputs(out: Path, device: str, batch: int) -> None:
    """OUT/inputs.pt for the C++ run, and OUT/expected.pt, the eager model's outputs on them."""
    inputs = example_inputs(device, batch)
    with torch.no_grad():
        expected = build_model(device)(*inputs)
    torch.save(list(inputs), out / "inputs.pt")
    torch.save(list(expected), out / "expected.pt")
    print(f"wrote {out / 'inputs.pt'} and {out / 'expected.pt'} (batch {batch}, {device})")


def check(out: Path) -> bool:
    """The C++ run's outputs against the eager model's: the noise bit for bit, the rest within
    float32 tolerance (AOTInductor's generated code may round differently from eager ATen)."""
    outputs = torch.load(out / "outputs.pt")
    expected = torch.load(out / "expected.pt")
    (y, noise), (y_expected, noise_expected) = outputs, expected
    noise_equal = torch.equal(noise.cpu(), noise_expected.cpu())
    y_close = torch.allclose(y.cpu(), y_expected.cpu(), rtol=1e-5, atol=1e-5)
    y_difference = (y.cpu() - y_expected.cpu()).abs().max().item()
    print(f"noise bitwise equal: {noise_equal}; output max |difference|: {y_difference:.3g}")
    return noise_equal and y_close


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="model.py", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    export_parser = commands.add_parser("export", help="export and compile the model")
    export_parser.add_argument("out", type=Path)
    export_parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    inputs_parser = commands.add_parser("inputs", help="new inputs (another batch size)")
    inputs_parser.add_argument("out", type=Path)
    inputs_parser.add_argument("--batch", type=int, required=True)
    inputs_parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    check_parser = commands.add_parser("check", help="compare the C++ run's outputs")
    check_parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    load_ops()
    if args.command == "export":
        export(args.out, args.device)
    elif args.command == "inputs":
        write_inputs(args.out, args.device, args.batch)
    else:
        return 0 if check(args.out) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
