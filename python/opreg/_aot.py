"""Ahead-of-time compiled Triton kernels launched from Python through opreg's C++ launcher.

``kernel[grid](*args)`` reads like a Triton JIT launch, but costs no Triton launcher, no JIT
warm-up and no compile: the binary was built by ``python -m opreg.aot``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from opreg import _C
from opreg._public import public

Grid = int | Sequence[int] | Callable[[dict[str, object]], Sequence[int]]


@public
class AotKernel:
    """A Triton kernel compiled ahead of time, launched by name.

    >>> add = opreg.AotKernel("opreg_fused_add_f32")
    >>> add[(triton.cdiv(n, 1024),)](x, y, out, n)
    """

    def __init__(self, name: str) -> None:
        self._kernel = _C.TritonKernel(name)

    @property
    def name(self) -> str:
        return self._kernel.name

    def available_on(self, device: torch.device | int) -> tuple[bool, str]:
        """Whether a binary fits this CUDA device, and if not, why."""
        index = device if isinstance(device, int) else (device.index or 0)
        return self._kernel.available_on(index)

    def variant_for(self, *args: object) -> str:
        """The binary a launch with these arguments would use, or why none fits."""
        return self._kernel.variant_for(*args)

    def launch(self, grid: Sequence[int], *args: object) -> None:
        self._kernel.launch(list(grid), *args)

    def __getitem__(self, grid: Grid) -> Callable[..., None]:
        if callable(grid):
            raise TypeError(
                f"opreg.AotKernel '{self.name}': give the grid as numbers; an AOT "
                "kernel's constexprs are fixed, so a meta-parameter grid has no meta"
            )
        dims = [grid] if isinstance(grid, int) else list(grid)
        launch = self._kernel.launch
        return lambda *args: launch(dims, *args)


@public
def load_triton_bundle(path: str | Path) -> list[str]:
    """Register the kernels of a folder written by ``python -m opreg.aot``; returns their names."""
    return list(_C.triton_load_bundle_dir(str(path)))


@public
def triton_kernels() -> list[dict[str, object]]:
    """Every registered AOT Triton kernel, with its parameters and variants."""
    return list(_C.triton_describe_kernels())
