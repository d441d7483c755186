"""Host cost per call of an opreg op whose triton_fn launches a Triton JIT kernel (the seed's
1024-element float32 add), with the JIT launch cache (python/opreg/_jit_cache.py) off, on with
its hits through Triton's compiled launcher (the cached key alone), and on with its hits
launched from C++ (src/python/jit_cache/direct_launch.cpp). `direct_launch_gain` is what the
direct half saves per call: under 1 us/call, it is not worth its code. Needs a CUDA GPU.

    python bench/jit_cache.py [--calls 2000] [--repeats 7] [--numel 1024]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

# The switches each op is defined under (read when an op is defined): off, cached key only,
# cached key and direct launch.
MODES = {
    "cache_off": ({"OPREG_JIT_LAUNCH_CACHE": "0"}, "cache off: Triton's launcher"),
    "cache_key_only": (
        {"OPREG_JIT_LAUNCH_CACHE": "1", "OPREG_JIT_DIRECT_LAUNCH": "0"},
        "cache on, hits through Triton's compiled launcher",
    ),
    "cache_direct": (
        {"OPREG_JIT_LAUNCH_CACHE": "1", "OPREG_JIT_DIRECT_LAUNCH": "1"},
        "cache on, hits launched from C++",
    ),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed batch")
    parser.add_argument("--repeats", type=int, default=7, help="batches per path (median kept)")
    parser.add_argument("--numel", type=int, default=1024, help="elements of x and y")
    return parser.parse_args(argv)


def define_op(mode: str) -> tuple[Callable[..., torch.Tensor], object]:
    """The seed's add as an opreg op over its own kernel object, defined under `mode`'s
    switches; returns the op and the kernel."""
    import opreg
    import triton
    from peers.registrations import seed_triton_fn
    from peers.triton_add import add_kernel

    switches, _ = MODES[mode]
    saved = {name: os.environ.get(name) for name in switches}
    os.environ.update(switches)
    try:
        kernel = triton.jit(add_kernel.fn)  # never the peers' kernel object: never adopted

        @opreg.register_triton_op(
            fake_fn=lambda x, y: torch.empty_like(x),
            triton_fn=seed_triton_fn(kernel),
            name=f"opreg_bench_jit_cache::add_{mode}",
        )
        def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x + y

    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return add, kernel


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench/jit_cache.py needs a CUDA GPU")
    import opreg
    from common import Report, host_us_per_call_interleaved
    from opreg import _jit_cache

    device = "cuda"
    x, y = torch.randn(args.numel, device=device), torch.randn(args.numel, device=device)
    ops = {mode: define_op(mode) for mode in MODES}
    expected = ops["cache_off"][0](x, y)
    for mode, (op, _) in ops.items():
        assert torch.equal(op(x, y), expected), f"{mode}: output differs from the cache off"

    paths = {mode: (lambda op=op: op(x, y)) for mode, (op, _) in ops.items()}
    times = host_us_per_call_interleaved(paths, device, args.calls, args.repeats)

    # Each path took the route it names.
    caches = {mode: _jit_cache.cache_of(kernel) for mode, (_, kernel) in ops.items()}
    assert caches["cache_off"] is None, "the cache-off op's kernel was adopted"
    key_only, direct = caches["cache_key_only"].native, caches["cache_direct"].native
    assert key_only.hits > 0 and key_only.direct_hits == 0, key_only.indirect_reasons
    assert direct.hits > 0 and direct.direct_hits == direct.hits, direct.indirect_reasons

    unit = f"us/call (host, median of {args.repeats} x {args.calls})"
    report = Report("jit_cache", f"JIT launch cache, {args.numel}-element float32 add op")
    for mode, (_, what) in MODES.items():
        report.figure(mode, times[mode], unit, f"opreg op (seed's triton_fn), {what}")
    report.figure(
        "direct_launch_gain",
        times["cache_key_only"] - times["cache_direct"],
        "us/call",
        "cache_key_only - cache_direct: what launching from C++ saves (keep it if >= 1)",
    )
    report.figure(
        "cached_key_gain",
        times["cache_off"] - times["cache_key_only"],
        "us/call",
        "cache_off - cache_key_only: what the cached key saves",
    )
    report.compare("cache_direct", "cache_key_only")
    report.compare("cache_key_only", "cache_off")
    report.compare("cache_direct", "cache_off")
    report.write()
    for mode in MODES:
        print(f"{mode}: {opreg.kernel_status(f'opreg_bench_jit_cache::add_{mode}')}")


if __name__ == "__main__":
    main()
