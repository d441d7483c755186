"""Compile @triton.jit kernels ahead of time into artifacts that opreg's C++ runtime launches.

Runs at build time, on a machine without a GPU, with Triton installed; imports nothing from the
rest of opreg (CMake runs this file as a script before the package exists). Input: a TOML spec

    targets = ["sm_80", "sm_90"]
    [[kernel]]
    name = "opreg_fused_add"                    # the name C++ and Python launch it by
    source = "kernels/fused_add.py:add_kernel"  # file (relative to the spec) or module:function
    signature = { x = "*fp32", y = "*fp32", out = "*fp32", n = "i32" }
    constexprs = { BLOCK = 1024 }
    equal_to_1 = ["n"]                          # ints that also get an ==1 variant (dropped param)
    do_not_specialize = []                      # args that never get divisibility assumptions
    configs = [{ num_warps = 4, num_stages = 3 }]

Output, per kernel: `<name>.json` (the manifest: parameters and, per variant, its assumptions,
GPU arch and launch metadata) and one `.cubin` per variant, plus `index.txt` listing the
manifests (what `opreg.load_triton_bundle(dir)` reads); with --emit-cpp, one C++ source that
embeds them all and registers them with the runtime at load time.

Variants follow Triton's JIT specialization: pointers 16-byte aligned or not; each int divisible
by 16 or not (every combination); ints listed in equal_to_1 also as the constant 1. The runtime
picks the most specialized variant whose assumptions hold for the actual arguments.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import itertools
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

FORMAT = "opreg-triton-aot/1"
CACHE_VERSION = 2  # bump when what the cache stores per variant changes
POINTER_ALIGNMENT = 16


@dataclass
class KernelSpec:
    name: str
    source: str
    signature: dict[str, str]
    constexprs: dict[str, object] = field(default_factory=dict)
    equal_to_1: list[str] = field(default_factory=list)
    do_not_specialize: list[str] = field(default_factory=list)
    configs: list[dict[str, int]] = field(default_factory=lambda: [{"num_warps": 4}])
    targets: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Variant:
    assumptions: tuple[tuple[str, str], ...]  # (param name, "aligned16" | "div16" | "equals1")
    config: tuple[tuple[str, int], ...]
    arch: int


class SpecError(ValueError):
    pass


def load_spec(path: Path) -> tuple[list[KernelSpec], Path]:
    data = tomllib.loads(path.read_text())
    targets = data.get("targets", ["sm_80", "sm_90"])
    kernels = []
    for raw in data.get("kernel", []):
        unknown = set(raw) - set(KernelSpec.__dataclass_fields__)
        if unknown:
            raise SpecError(
                f"{path}: kernel {raw.get('name', '?')}: unknown keys {sorted(unknown)}"
            )
        raw.setdefault("targets", targets)
        kernels.append(KernelSpec(**raw))
    if not kernels:
        raise SpecError(f"{path}: no [[kernel]] entries")
    return kernels, path.parent


def load_function(source: str, base: Path):
    location, sep, function = source.rpartition(":")
    if not sep:
        raise SpecError(f"source '{source}' must be 'file.py:function' or 'module:function'")
    if location.endswith(".py"):
        path = (base / location).resolve()
        module_name = "opreg_aot_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise SpecError(f"cannot load kernel source {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(location)
    try:
        return getattr(module, function)
    except AttributeError:
        raise SpecError(f"{location} has no function '{function}'") from None


def parse_arch(target: str) -> int:
    digits = target.removeprefix("sm_").removeprefix("cuda:")
    if not digits.isdigit():
        raise SpecError(f"GPU target '{target}' is not of the form sm_90")
    return int(digits)


def runtime_params(spec: KernelSpec, arg_names: list[str]) -> list[dict[str, str]]:
    """The arguments a caller passes, in the kernel's declaration order."""
    missing = [a for a in arg_names if a not in spec.signature and a not in spec.constexprs]
    if missing:
        raise SpecError(
            f"kernel {spec.name}: arguments {missing} need a type in signature or a "
            "value in constexprs"
        )
    extra = [a for a in [*spec.signature, *spec.constexprs] if a not in arg_names]
    if extra:
        raise SpecError(
            f"kernel {spec.name}: {extra} are not arguments of the kernel (it has {arg_names})"
        )
    for name in spec.equal_to_1:
        if not spec.signature.get(name, "").startswith(("i", "u")):
            raise SpecError(f"kernel {spec.name}: equal_to_1 lists '{name}', not an int argument")
    return [{"name": a, "type": spec.signature[a]} for a in arg_names if a in spec.signature]


def variants(spec: KernelSpec, params: list[dict[str, str]]) -> list[Variant]:
    pointers = [
        p["name"]
        for p in params
        if p["type"].startswith("*") and p["name"] not in spec.do_not_specialize
    ]
    ints = [
        p["name"]
        for p in params
        if p["type"][0] in "iu" and p["type"] != "i1" and p["name"] not in spec.do_not_specialize
    ]
    choices = []
    for aligned in (True, False):
        base = [(p, "aligned16") for p in pointers] if aligned else []
        for mask in itertools.product((True, False), repeat=len(ints)):
            divisible = [(name, "div16") for name, on in zip(ints, mask, strict=True) if on]
            choices.append(tuple(base + divisible))
            for one in spec.equal_to_1:
                rest = [a for a in base + divisible if a[0] != one]
                choices.append(tuple([*rest, (one, "equals1")]))
    unique = list(dict.fromkeys(choices))
    unique.sort(key=lambda a: -len(a))  # most specialized first
    return [
        Variant(assumptions=a, config=tuple(sorted(c.items())), arch=parse_arch(t))
        for t in spec.targets
        for c in spec.configs
        for a in unique
    ]


def compile_variant(fn, spec: KernelSpec, params, variant: Variant):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile

    arg_names = list(fn.arg_names)
    signature = {}
    constexprs = dict(spec.constexprs)
    kinds = dict(variant.assumptions)
    for name in arg_names:
        if name in spec.constexprs:
            signature[name] = "constexpr"
        elif kinds.get(name) == "equals1":
            signature[name] = "constexpr"
            constexprs[name] = 1
        else:
            signature[name] = spec.signature[name]
    attrs = {
        (arg_names.index(name),): [["tt.divisibility", 16]]
        for name, kind in variant.assumptions
        if kind in ("aligned16", "div16")
    }
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    options = dict(variant.config)
    compiled = triton_compile(source, target=GPUTarget("cuda", variant.arch, 32), options=options)
    return source, compiled


def content_hash(fn, spec: KernelSpec, variant: Variant) -> str:
    import triton

    key = json.dumps(
        {
            "fn": fn.cache_key,
            "signature": spec.signature,
            "constexprs": repr(spec.constexprs),
            "variant": repr(variant),
            "triton": triton.__version__,
            "format": FORMAT,
            "cache": CACHE_VERSION,
        },
        sort_keys=True,
    )
    return hashlib.sha256(key.encode()).hexdigest()[:20]


def build_kernel(spec: KernelSpec, base: Path, out: Path, cache: Path, progress) -> Path:
    fn = load_function(spec.source, base)
    params = runtime_params(spec, list(fn.arg_names))
    index = {p["name"]: i for i, p in enumerate(params)}
    manifest = {
        "format": FORMAT,
        "kernel": spec.name,
        "source": spec.source,
        "params": params,
        "variants": [],
    }
    for variant in variants(spec, params):
        digest = content_hash(fn, spec, variant)
        cubin_name = f"{spec.name}.{digest}.sm{variant.arch}.cubin"
        meta_path = cache / f"{digest}.json"
        if (cache / cubin_name).exists() and meta_path.exists():
            meta = json.loads(meta_path.read_text())
            progress(f"{spec.name} sm_{variant.arch} {describe(variant)} (cached)")
        else:
            progress(f"{spec.name} sm_{variant.arch} {describe(variant)}")
            _, compiled = compile_variant(fn, spec, params, variant)
            md = compiled.metadata
            meta = {
                "entry": md.name,
                "num_warps": md.num_warps,
                "num_ctas": md.num_ctas,
                "shared": md.shared,
                "global_scratch_size": md.global_scratch_size,
                "global_scratch_align": md.global_scratch_align,
                "profile_scratch_size": md.profile_scratch_size,
                "profile_scratch_align": md.profile_scratch_align,
                "launch_pdl": bool(md.launch_pdl),
                "launch_cooperative_grid": bool(md.launch_cooperative_grid),
            }
            meta["param_sizes"] = ptx_param_sizes(compiled.asm["ptx"], md.name)
            if md.tensordesc_meta:
                raise SpecError(
                    f"kernel {spec.name}: tensor-descriptor arguments are not supported"
                )
            (cache / cubin_name).write_bytes(compiled.asm["cubin"])
            meta_path.write_text(json.dumps(meta))
        (out / cubin_name).write_bytes((cache / cubin_name).read_bytes())
        manifest["variants"].append(
            {
                "arch": variant.arch,
                "file": cubin_name,
                "config": dict(variant.config),
                "assumptions": [{"param": index[n], "kind": k} for n, k in variant.assumptions],
                **meta,
            }
        )
    path = out / f"{spec.name}.json"
    path.write_text(json.dumps(manifest, indent=1))
    return path


PTX_PARAM = re.compile(r"\.param\s+\.([a-z]+)(\d+)")


def ptx_param_sizes(ptx: str, entry: str) -> list[int]:
    """Byte size of each parameter of the entry, read from the PTX: the layout the launcher must
    pack (checked by the C++ runtime when it loads the manifest)."""
    start = ptx.index(f".entry {entry}(")
    header = ptx[start : ptx.index(")", start)]
    return [int(bits) // 8 for _, bits in PTX_PARAM.findall(header)]


def describe(variant: Variant) -> str:
    parts = [f"{n}:{k}" for n, k in variant.assumptions] or ["generic"]
    return f"[{', '.join(parts)}] {dict(variant.config)}"


def emit_cpp(manifests: list[Path], out: Path, spec_path: Path) -> None:
    """One C++ source embedding every manifest and cubin, registered at load time."""
    lines = [
        f"// Generated by opreg/aot/compile.py from {spec_path.name}; do not edit.",
        "#include <opreg/triton.h>",
        "",
        "namespace {",
    ]
    blobs = []
    for m, manifest_path in enumerate(manifests):
        manifest = json.loads(manifest_path.read_text())
        lines.append(f"const unsigned char kManifest{m}[] = {{{bytes_literal(manifest_path)}}};")
        for v, variant in enumerate(manifest["variants"]):
            symbol = f"kBlob{m}_{v}"
            lines.append(
                f"const unsigned char {symbol}[] = "
                f"{{{bytes_literal(manifest_path.parent / variant['file'])}}};"
            )
            blobs.append((m, variant["file"], symbol))
    for m in range(len(manifests)):
        entries = [f'{{"{f}", {s}, sizeof({s})}}' for mm, f, s in blobs if mm == m]
        lines.append(f"const opreg::triton::EmbeddedFile kFiles{m}[] = {{{', '.join(entries)}}};")
        lines.append(
            f"const bool kRegistered{m} = opreg::triton::register_embedded_bundle("
            f"reinterpret_cast<const char*>(kManifest{m}), sizeof(kManifest{m}), kFiles{m}, "
            f"sizeof(kFiles{m}) / sizeof(kFiles{m}[0]));"
        )
    lines += ["}  // namespace", ""]
    out.write_text("\n".join(lines))


def bytes_literal(path: Path) -> str:
    return ",".join(str(b) for b in path.read_bytes())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opreg.aot", description=__doc__.split("\n")[0])
    parser.add_argument("spec", type=Path, help="the TOML spec of the kernels")
    parser.add_argument("--out", type=Path, required=True, help="folder for manifests and cubins")
    parser.add_argument("--cache", type=Path, help="content-hashed cache (default: OUT/.cache)")
    parser.add_argument("--emit-cpp", type=Path, help="also write a C++ source embedding them")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)

    os.environ.setdefault("TRITON_CACHE_DIR", str((args.cache or args.out / ".cache") / "triton"))
    # Compiling for GPUs: kernels must be JIT functions, not the interpreter's stand-ins.
    os.environ.pop("TRITON_INTERPRET", None)
    kernels, base = load_spec(args.spec)
    args.out.mkdir(parents=True, exist_ok=True)
    cache = args.cache or args.out / ".cache"
    cache.mkdir(parents=True, exist_ok=True)
    counter = itertools.count(1)

    def progress(message: str) -> None:
        if not args.quiet:
            print(f"opreg.aot [{next(counter)}] {message}", flush=True)

    manifests = [build_kernel(k, base, args.out, cache, progress) for k in kernels]
    (args.out / "index.txt").write_text("".join(f"{m.name}\n" for m in manifests))
    if args.emit_cpp:
        emit_cpp(manifests, args.emit_cpp, args.spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
