"""Ahead-of-time compiled Triton kernels launched from Python through opreg's C++ launcher.

``kernel[grid](*args)`` reads like a Triton JIT launch, but costs no Triton launcher, no JIT
warm-up and no compile: the binary was built by ``python -m opreg.aot``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from opreg import _C
from opreg._public import public
from opreg._registry import check_text, path_argument

Grid = int | Sequence[int] | Callable[[dict[str, object]], Sequence[int]]


@public
class AotKernel:
    """A Triton kernel compiled ahead of time, launched by name.

    >>> add = opreg.AotKernel("opreg_fused_add_f32")
    >>> add[(triton.cdiv(n, 1024),)](x, y, out, n)
    """

    def __init__(self, name: str) -> None:
        if not isinstance(name, str):
            raise TypeError(
                "opreg.AotKernel: 'name' must be a str (the kernel's name in its manifest), got "
                f"{type(name).__name__} {name!r:.80}"
            )
        check_text("opreg.AotKernel", "name", name, "; no kernel has one")
        self._kernel = _C.TritonKernel(name)

    @property
    def name(self) -> str:
        return self._kernel.name

    def available_on(self, device: torch.device | str | int) -> tuple[bool, str]:
        """Whether a binary fits this CUDA device, and if not, why."""
        if isinstance(device, bool) or not isinstance(device, torch.device | str | int):
            raise TypeError(
                f"opreg.AotKernel '{self.name}': available_on takes a CUDA device (an index, "
                f"'cuda:1' or a torch.device), got {type(device).__name__} {device!r:.80}"
            )
        if isinstance(device, int):
            if not -(2**31) <= device < 2**31:  # beyond a C int: no device has such an index
                return False, f"CUDA device index {device} out of range"
            return self._kernel.available_on(device)
        device = torch.device(device)
        if device.type != "cuda":
            return False, f"{device} is not a CUDA device"
        return self._kernel.available_on(device.index or 0)

    def variant_for(self, *args: object) -> str:
        """The binary a launch with these arguments would use, or why none fits."""
        return self._kernel.variant_for(*args)

    def launch(self, grid: int | Sequence[int], *args: object) -> None:
        self._kernel.launch(grid, *args)

    def __getitem__(self, grid: Grid) -> Callable[..., None]:
        if callable(grid):
            raise TypeError(
                f"opreg.AotKernel '{self.name}': give the grid as numbers; an AOT "
                "kernel's constexprs are fixed, so a meta-parameter grid has no meta"
            )
        launch, name = self._kernel.launch, self.name

        def launch_on_grid(*args: Any, **keywords: Any) -> None:
            if keywords:
                raise TypeError(
                    f"opreg.AotKernel '{name}': arguments are given by position, in the kernel's "
                    f"order (its constexprs are fixed at compile time); got keywords "
                    f"{sorted(keywords)}"
                )
            launch(grid, *args)

        return launch_on_grid


@public
def load_triton_bundle(path: str | Path) -> list[str]:
    """Register the kernels of a folder written by ``python -m opreg.aot``; returns their names."""
    folder = os.fsencode(path_argument("opreg.load_triton_bundle", path))  # need not be UTF-8
    return list(_C.triton_load_bundle_dir(folder))


@public
def triton_kernels() -> list[dict[str, object]]:
    """Every registered AOT Triton kernel, with its parameters and variants."""
    return list(_C.triton_describe_kernels())
