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
import subprocess
import sys
import threading
import tomllib
import traceback
from dataclasses import dataclass, field
from pathlib import Path

FORMAT = "opreg-triton-aot/1"
CACHE_VERSION = 3  # bump when what the cache stores per variant changes
POINTER_ALIGNMENT = 16

# What the C++ runtime (src/triton/kernel.cpp) accepts; anything else is refused here, at build
# time, rather than when the library that embeds it loads.
SCALAR_SIZES = {
    "i1": 1, "i8": 1, "u8": 1, "i16": 2, "u16": 2, "fp16": 2, "bf16": 2,
    "i32": 4, "u32": 4, "fp32": 4, "i64": 8, "u64": 8, "fp64": 8,
}  # fmt: skip
POINTEE_TYPES = {*SCALAR_SIZES, "fp8e4nv", "fp8e5", "fp8e4b15", "fp8e4b8", "fp8e5b16"}
MAX_PARAMS = 64
MAX_WARPS = 32  # 1024 threads per block
# The integer options of Triton's CUDA backend a config may set; Triton ignores a key it does not
# know, so a misspelled one would silently compile with the default.
MAX_STAGES = 16  # a software pipeline deeper than this does not fit any GPU's shared memory
CONFIG_KEYS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
MAX_CTAS = 16
MAX_REGISTERS = 255  # per thread, on every NVIDIA GPU Triton compiles for
MAX_INT32 = 2**31 - 1
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_NAME = 128
TARGET = re.compile(r"(?:sm_|cuda:)(\d{2,4})")
ELF_MACHINE_CUDA = 190


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
    # Reading a FIFO would wait for a writer for ever.
    if path.is_fifo():
        raise SpecError(f"{path}: cannot read the spec: it is not a regular file")
    try:
        # An editor may start the file with a byte order mark; index.txt tolerates one too.
        data = tomllib.loads(path.read_text(encoding="utf-8").removeprefix("\ufeff"))
    except OSError as error:
        raise SpecError(f"{path}: cannot read the spec: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise SpecError(
            f"{path}: cannot read the spec: it is not UTF-8 text (byte "
            f"0x{error.object[error.start]:02x} at offset {error.start})"
        ) from None
    except tomllib.TOMLDecodeError as error:
        raise SpecError(f"{path}: not valid TOML: {error}") from None
    unknown = sorted(set(data) - {"targets", "kernel"})
    if unknown:
        raise SpecError(
            f"{path}: unknown top-level keys {unknown}; a spec has 'targets' and [[kernel]] tables"
        )
    targets = data.get("targets", ["sm_80", "sm_90"])
    raws = data.get("kernel", [])
    if not isinstance(raws, list) or not all(isinstance(raw, dict) for raw in raws):
        raise SpecError(f"{path}: 'kernel' must be a list of [[kernel]] tables")
    kernels = []
    for raw in raws:
        name = raw.get("name", "?")
        unknown = set(raw) - set(KernelSpec.__dataclass_fields__)
        if unknown:
            raise SpecError(f"{path}: kernel {name}: unknown keys {sorted(unknown)}")
        missing = [key for key in ("name", "source", "signature") if key not in raw]
        if missing:
            raise SpecError(f"{path}: kernel {name}: missing keys {missing}")
        raw.setdefault("targets", targets)
        kernel = KernelSpec(**raw)
        check_kernel_spec(kernel, path)
        kernels.append(kernel)
    if not kernels:
        raise SpecError(f"{path}: no [[kernel]] entries")
    names = [k.name for k in kernels]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SpecError(f"{path}: kernel names must be unique, {duplicates} appear more than once")
    return kernels, path.parent


def check_kernel_spec(spec: KernelSpec, path: Path) -> None:
    """The fields' types and values, before anything is compiled or written."""

    def fail(field_name: str, expected: str, got: object) -> None:
        raise SpecError(
            f"{path}: kernel {spec.name}: '{field_name}' must be {expected}, got {got!r}"
        )

    if not isinstance(spec.name, str) or not IDENTIFIER.fullmatch(spec.name):
        fail("name", "a C identifier (letters, digits, _; it names files and C++ symbols)",
             spec.name)  # fmt: skip
    if len(spec.name) > MAX_NAME:  # file names of the cache are the name and 60 more characters
        fail(
            "name",
            f"at most {MAX_NAME} characters (it names files)",
            f"{len(spec.name)} characters",
        )
    if not isinstance(spec.source, str):
        fail("source", "a string 'file.py:function' or 'module:function'", spec.source)
    if not isinstance(spec.signature, dict) or not spec.signature:
        fail("signature", "a table of argument name = type", spec.signature)
    for arg, type_name in spec.signature.items():
        pointer = isinstance(type_name, str) and type_name.startswith("*")
        known = POINTEE_TYPES if pointer else SCALAR_SIZES
        if not isinstance(type_name, str) or type_name.removeprefix("*") not in known:
            fail(
                f"signature.{arg}",
                f"a type the runtime launches ({', '.join(SCALAR_SIZES)}, or a pointer '*fp32')",
                type_name,
            )
    if not isinstance(spec.constexprs, dict):
        fail("constexprs", "a table of argument name = value", spec.constexprs)
    for name, value in spec.constexprs.items():
        if not isinstance(value, (bool, int, float, str)):
            fail(f"constexprs.{name}", "a number, a boolean or a string", value)
    both = [name for name in spec.constexprs if name in spec.signature]
    if both:
        fail("constexprs", "arguments not also in the signature (each is one or the other)", both)
    for key in ("equal_to_1", "do_not_specialize"):
        value = getattr(spec, key)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            fail(key, "a list of argument names", value)
        unknown = [v for v in value if v not in spec.signature]
        if unknown:
            fail(key, f"names of arguments in the signature ({list(spec.signature)})", unknown)
    if not isinstance(spec.configs, list) or not spec.configs:
        fail("configs", "a non-empty list of tables like { num_warps = 4 }", spec.configs)
    for config in spec.configs:
        if not isinstance(config, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in config.values()
        ):
            fail("configs", "tables of integers like { num_warps = 4, num_stages = 3 }", config)
        unknown = [key for key in config if key not in CONFIG_KEYS]
        if unknown:
            raise SpecError(
                f"{path}: kernel {spec.name}: 'configs' entry {config!r} has unknown keys "
                f"{unknown}; a config takes {', '.join(CONFIG_KEYS)}"
            )
        warps = config.get("num_warps", 4)
        if not 1 <= warps <= MAX_WARPS or warps & (warps - 1):
            fail("configs.num_warps", f"a power of two from 1 to {MAX_WARPS}", warps)
        if not 1 <= config.get("num_ctas", 1) <= MAX_CTAS:
            fail("configs.num_ctas", f"from 1 to {MAX_CTAS}", config["num_ctas"])
        if not 1 <= config.get("num_stages", 1) <= MAX_STAGES:
            fail(
                "configs.num_stages",
                f"a pipeline depth from 1 to {MAX_STAGES}",
                config["num_stages"],
            )
        if not 1 <= config.get("maxnreg", 1) <= MAX_REGISTERS:
            fail(
                "configs.maxnreg", f"a register count from 1 to {MAX_REGISTERS}", config["maxnreg"]
            )
    # Triton fills in what a config leaves out: {} and { num_warps = 4 } compile the same binary.
    complete = [triton_config_defaults() | config for config in spec.configs]
    for later, config in enumerate(complete):
        if config in complete[:later]:
            earlier = complete.index(config)
            raise SpecError(
                f"{path}: kernel {spec.name}: 'configs' entries {earlier} "
                f"{spec.configs[earlier]!r} and {later} {spec.configs[later]!r} are the same "
                f"config once Triton's defaults {triton_config_defaults()!r} apply; list it once"
            )
    targets = spec.targets
    if not isinstance(targets, list) or not targets:
        fail("targets", "a non-empty list of GPU targets like ['sm_80', 'sm_90']", targets)
    for target in targets:
        parse_arch(target, f"{path}: kernel {spec.name}")
    if len({parse_arch(t) for t in targets}) != len(targets):
        fail("targets", "a list without repeats", targets)


def triton_config_defaults() -> dict[str, object]:
    """What Triton's CUDA backend compiles with for a key a config does not give."""
    import dataclasses

    from triton.backends.nvidia.compiler import CUDAOptions

    return {f.name: f.default for f in dataclasses.fields(CUDAOptions) if f.name in CONFIG_KEYS}


def resolved(path: Path) -> Path:
    """``path`` made absolute with its links followed; SpecError (one line) for a link loop."""
    try:
        return path.resolve()
    except (OSError, RuntimeError) as error:  # Python 3.11 raises RuntimeError for a loop
        raise SpecError(f"{str(path)!r}: cannot resolve the path: {error}") from None


def load_function(source: str, base: Path):
    """The @triton.jit function `source` names; SpecError (one line, naming the source) when it
    cannot be imported or is something else."""
    location, _, function = source.partition(":")
    if source.count(":") != 1 or not location or not function:
        raise SpecError(
            f"source '{source}' must be 'file.py:function' or 'module:function', with one ':'"
        )
    if location.endswith(".py"):
        path = resolved(base / location)
        if not path.exists():
            raise SpecError(f"source '{source}': no file {path}")
        if not path.is_file():  # a directory, or a FIFO that would block the import
            raise SpecError(f"source '{source}': {path} is not a regular file")
        module_name = "opreg_aot_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise SpecError(f"cannot load kernel source {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as error:  # SystemExit too: a script's argparse exits on import
            del sys.modules[module_name]
            raise SpecError(
                f"source '{source}': importing {path} failed: {raised(error)}"
            ) from None
    else:
        try:
            module = importlib.import_module(location)
        except BaseException as error:
            missing = error.name if isinstance(error, ModuleNotFoundError) else None
            if missing and location.startswith(missing):  # not a module it imports
                raise SpecError(f"source '{source}': no module named {missing!r}") from None
            raise SpecError(
                f"source '{source}': importing {location} failed: {raised(error)}"
            ) from None
    try:
        fn = getattr(module, function)
    except AttributeError:
        raise SpecError(f"{location} has no function '{function}'") from None
    from triton.runtime.jit import JITFunction

    if not isinstance(fn, JITFunction):
        raise SpecError(
            f"source '{source}': '{function}' is a {type(fn).__name__}, not a @triton.jit kernel"
        )
    return fn


def raised(error: BaseException) -> str:
    """An exception raised by the user's code, in one line: where (the innermost frame, or a
    SyntaxError's file and line), its type and its message."""
    if isinstance(error, SyntaxError) and error.filename:
        where = f"{error.filename}:{error.lineno}: "
        message = error.msg
    else:
        frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename[0] != "<"]
        where = f"{frames[-1].filename}:{frames[-1].lineno}: " if frames else ""
        message = str(error)
    return where + one_line(f"{type(error).__name__}: {message}")


def one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def parse_arch(target: object, where: str = "") -> int:
    """sm_90 -> 90; the runtime takes architectures 10 to 9999."""
    match = TARGET.fullmatch(target) if isinstance(target, str) else None
    if match is None or int(match.group(1)) < 10:
        prefix = f"{where}: " if where else ""
        raise SpecError(f"{prefix}GPU target {target!r} is not of the form sm_90")
    return int(match.group(1))


def unsupported_target(arch: int) -> str:
    """Why the ptxas Triton uses for `arch` cannot build for it, or "" (also when it cannot be
    asked: compiling then reports any problem)."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        ptxas = get_ptxas(arch).path
        help_text = subprocess.run(
            [ptxas, "--help"], capture_output=True, text=True, timeout=60
        ).stdout
    except Exception:
        return ""
    known = sorted({int(n) for n in re.findall(r"'sm_(\d+)a?'", help_text)})
    if not known or arch in known:
        return ""
    listed = ", ".join(f"sm_{n}" for n in known)
    return f"the ptxas Triton uses for it ({ptxas}) builds for {listed}, not sm_{arch}"


def check_targets_supported(kernels: list[KernelSpec], override: str | None) -> None:
    for arch in sorted({parse_arch(t) for k in kernels for t in k.targets}):
        why = unsupported_target(arch)
        if why:
            where = f"--target {override!r}" if override else f"GPU target 'sm_{arch}'"
            raise SpecError(f"{where} is not supported: {why}")


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
    params = [{"name": a, "type": spec.signature[a]} for a in arg_names if a in spec.signature]
    if len(params) > MAX_PARAMS:
        raise SpecError(
            f"kernel {spec.name}: {len(params)} parameters, the runtime launches at most "
            f"{MAX_PARAMS}"
        )
    return params


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
    try:
        compiled = triton_compile(source, GPUTarget("cuda", variant.arch, 32), options=options)
    except Exception as error:
        raise SpecError(
            f"kernel {spec.name} (sm_{variant.arch}, {describe(variant)}): Triton cannot compile "
            f"it: {compile_error(fn, error)}"
        ) from None
    return source, compiled


def compile_error(fn, error: Exception) -> str:
    """Triton's error in one line; for an error in the kernel's code, where in the file it is
    (Triton counts lines from the function's def, after its decorators) and the line itself."""
    from triton.compiler.errors import CompilationError

    if not isinstance(error, CompilationError) or not hasattr(error.node, "lineno"):
        return one_line(f"{type(error).__name__}: {error}")
    lines = (error.src or "").splitlines()
    code = lines[error.node.lineno - 1].strip() if error.node.lineno <= len(lines) else ""
    decorators = next(
        (i for i, text in enumerate(fn.raw_src) if text.lstrip().startswith("def ")), 0
    )
    line = fn.starting_line_number + decorators + error.node.lineno - 1
    where = f"{fn.fn.__code__.co_filename}:{line}:{error.node.col_offset + 1}"
    return one_line(f"{where}: {error.error_message or type(error).__name__} (in `{code}`)")


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
    try:
        fn = load_function(spec.source, base)
    except SpecError as error:
        raise SpecError(f"kernel {spec.name}: {error}") from None
    params = runtime_params(spec, list(fn.arg_names))
    index = {p["name"]: i for i, p in enumerate(params)}
    manifest = {
        "format": FORMAT,
        "kernel": spec.name,
        "source": spec.source,
        "params": params,
        "variants": [],
    }
    all_variants = variants(spec, params)
    if not all_variants:
        raise SpecError(f"kernel {spec.name}: no variants to compile (check targets and configs)")
    for variant in all_variants:
        digest = content_hash(fn, spec, variant)
        cubin_name = f"{spec.name}.{digest}.sm{variant.arch}.cubin"
        meta, cubin = cached_variant(cache, cubin_name, digest)
        if meta is not None:
            progress(f"{spec.name} sm_{variant.arch} {describe(variant)} (cached)")
        else:
            progress(f"{spec.name} sm_{variant.arch} {describe(variant)}")
            meta, cubin = compile_to_cache(fn, spec, params, variant, cache, cubin_name, digest)
        entry = {
            "arch": variant.arch,
            "file": cubin_name,
            "config": dict(variant.config),
            "assumptions": [{"param": index[n], "kind": k} for n, k in variant.assumptions],
            **meta,
        }
        check_variant(spec, params, variant, entry)
        write_file("--out", out / cubin_name, lambda p, data=cubin: p.write_bytes(data))
        manifest["variants"].append(entry)
    path = out / f"{spec.name}.json"
    write_file("--out", path, lambda p: p.write_text(json.dumps(manifest, indent=1)))
    return path


def cached_variant(cache: Path, cubin_name: str, digest: str) -> tuple[dict | None, bytes]:
    """The cached metadata and cubin, or (None, b"") when absent or damaged (then recompiled):
    a cubin whose hash differs from the one recorded (truncated by a killed build) is never
    copied."""
    meta_path = cache / f"{digest}.json"
    try:
        meta = json.loads(meta_path.read_text())
        cubin = (cache / cubin_name).read_bytes()
    except (OSError, ValueError):
        return None, b""
    recorded = meta.pop("entry_sha256", None) if isinstance(meta, dict) else None
    if recorded != record_hash(meta, cubin) or cubin_problem(cubin):
        return None, b""
    return meta, cubin


def record_hash(meta: dict, cubin: bytes) -> str:
    """The hash a cache entry records of its cubin and its metadata: an entry whose metadata
    was edited (a num_warps that is not the cubin's, another entry's name) is compiled again."""
    described = json.dumps(meta, sort_keys=True).encode()
    return hashlib.sha256(cubin + b"\0" + described).hexdigest()


def compile_to_cache(fn, spec, params, variant, cache: Path, cubin_name: str, digest: str):
    _, compiled = compile_variant(fn, spec, params, variant)
    md = compiled.metadata
    if md.tensordesc_meta:
        raise SpecError(f"kernel {spec.name}: tensor-descriptor arguments are not supported")
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
    cubin = compiled.asm["cubin"]
    problem = cubin_problem(cubin)
    if problem:
        raise SpecError(f"kernel {spec.name}: Triton gave a binary that is not a cubin: {problem}")
    # The cubin first, its metadata (with its hash) last: a build killed in between leaves an
    # entry that cached_variant refuses.
    # A cache entry that cannot be read was recompiled; one that cannot be written either (a
    # folder in its place) is the option's error, like a --cache folder that cannot be written.
    write_file("--cache", cache / cubin_name, lambda p: p.write_bytes(cubin))
    record = {**meta, "entry_sha256": record_hash(meta, cubin)}
    write_file("--cache", cache / f"{digest}.json", lambda p: p.write_text(json.dumps(record)))
    return meta, cubin


def check_variant(spec: KernelSpec, params, variant: Variant, entry: dict) -> None:
    """The checks the runtime makes when it loads the manifest (src/triton/kernel.cpp
    parse_manifest), so that a bundle this writes always loads."""
    where = f"kernel {spec.name} (sm_{variant.arch}, {describe(variant)})"
    limits = {
        "num_warps": (1, MAX_WARPS),
        "num_ctas": (1, MAX_CTAS),
        "shared": (0, MAX_INT32),
        "global_scratch_size": (0, MAX_INT32),
        "profile_scratch_size": (0, MAX_INT32),
        "global_scratch_align": (1, 1 << 16),
        "profile_scratch_align": (1, 1 << 16),
    }
    for key, (low, high) in limits.items():
        value = entry[key]
        if not isinstance(value, int) or not low <= value <= high:
            raise SpecError(f"{where}: {key} = {value!r}, the runtime takes {low} to {high}")
        if (key == "num_warps" or key.endswith("_align")) and value & (value - 1):
            raise SpecError(f"{where}: {key} = {value} is not a power of two")
    dropped = {params[a["param"]]["name"] for a in entry["assumptions"] if a["kind"] == "equals1"}
    packed = [SCALAR_SIZES.get(p["type"], 8) for p in params if p["name"] not in dropped]
    packed += [8, 8]  # global and profile scratch pointers
    if entry["param_sizes"] != packed:
        raise SpecError(
            f"{where}: the binary expects parameters of sizes {entry['param_sizes']}, the "
            f"launcher would pack {packed}"
        )


def cubin_problem(data: bytes) -> str:
    """Why `data` is not a whole cubin (an ELF64 little-endian image for CUDA whose header
    tables lie inside it), or "". The runtime makes the same check."""
    if not data:
        return "it is empty"
    if len(data) < 64 or data[:4] != b"\x7fELF":
        return f"it is not an ELF file ({len(data)} bytes)"
    if data[4] != 2 or data[5] != 1:
        return "it is not a 64-bit little-endian ELF file"
    machine = int.from_bytes(data[18:20], "little")
    if machine != ELF_MACHINE_CUDA:
        return f"its ELF machine is {machine}, not CUDA ({ELF_MACHINE_CUDA})"

    def field(offset: int, size: int) -> int:
        return int.from_bytes(data[offset : offset + size], "little")

    for offset, count, entry_size in ((field(32, 8), field(56, 2), field(54, 2)),
                                      (field(40, 8), field(60, 2), field(58, 2))):  # fmt: skip
        if offset + count * entry_size > len(data):
            return f"it is truncated: its ELF header points past its {len(data)} bytes"
    return ""


# One parameter's declaration: `.param .u32 name`, `.param .u64 .ptr .global .align 16 name`,
# or a byte array for types PTX has no parameter type of (fp16, bf16): `.param .align 2 .b8
# name[2]`.
PTX_PARAM_TYPE = re.compile(r"\.[bsuf](\d+)\b")
PTX_PARAM_COUNT = re.compile(r"\[(\d+)\]\s*$")


def ptx_param_sizes(ptx: str, entry: str) -> list[int]:
    """Byte size of each parameter of the entry, read from the PTX: the layout the launcher must
    pack (checked by the C++ runtime when it loads the manifest)."""
    start = ptx.index(f".entry {entry}(")
    header = ptx[start + len(f".entry {entry}(") : ptx.index(")", start)]
    sizes = []
    for declaration in header.split(","):
        if ".param" not in declaration:
            continue
        bits = PTX_PARAM_TYPE.search(declaration)
        count = PTX_PARAM_COUNT.search(declaration)
        sizes.append(int(bits.group(1)) // 8 * (int(count.group(1)) if count else 1))
    return sizes


def describe(variant: Variant) -> str:
    parts = [f"{n}:{k}" for n, k in variant.assumptions] or ["generic"]
    return f"[{', '.join(parts)}] {dict(variant.config)}"


def emit_cpp(manifests: list[Path], out: Path, spec_path: Path) -> None:
    """One C++ source embedding every manifest and cubin, registered at load time."""
    spec_name = spec_path.name.encode("unicode_escape").decode("ascii")  # one line
    lines = [
        f"// Generated by opreg/aot/compile.py from {spec_name}; do not edit.",
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
        entries = [f"{{{c_string(f)}, {s}, sizeof({s})}}" for mm, f, s in blobs if mm == m]
        lines.append(f"const opreg::triton::EmbeddedFile kFiles{m}[] = {{{', '.join(entries)}}};")
        lines.append(
            f"const bool kRegistered{m} = opreg::triton::register_embedded_bundle("
            f"reinterpret_cast<const char*>(kManifest{m}), sizeof(kManifest{m}), kFiles{m}, "
            f"sizeof(kFiles{m}) / sizeof(kFiles{m}[0]));"
        )
    lines += ["}  // namespace", ""]
    out.write_text("\n".join(lines))


def c_string(text: str) -> str:
    """A C++ string literal of `text`, every byte but letters, digits and ._- escaped."""
    safe = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
    return '"' + "".join(chr(b) if b in safe else f"\\{b:03o}" for b in text.encode()) + '"'


def bytes_literal(path: Path) -> str:
    return ",".join(str(b) for b in path.read_bytes())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opreg.aot", description=__doc__.split("\n")[0])
    parser.add_argument("spec", type=Path, help="the TOML spec of the kernels")
    parser.add_argument("--out", type=Path, required=True, help="folder for manifests and cubins")
    parser.add_argument("--cache", type=Path, help="content-hashed cache (default: OUT/.cache)")
    parser.add_argument("--emit-cpp", type=Path, help="also write a C++ source embedding them")
    parser.add_argument(
        "--target",
        help="GPU targets to build for, comma-separated (sm_80,sm_90), instead of the spec's",
    )
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    try:
        return run(args)
    except SpecError as error:
        print(f"python -m opreg.aot: error: {error}", file=sys.stderr)
        return 1


def writable_folder(option: str, path: Path) -> Path:
    """`path`, created if needed; SpecError naming the option when it cannot be written."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".opreg-write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise SpecError(f"{option} {str(path)!r}: cannot write there: {error.strerror}") from None
    return path


def write_file(option: str, path: Path, write) -> None:
    """`write` writes a new file, which then takes the place of `path`: a file there that is a
    hard link to another (an input) is unlinked, not written through."""
    temporary = path.with_name(f".{path.name}.opreg-{os.getpid()}-{threading.get_ident()}")
    try:
        write(temporary)
        os.replace(temporary, path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise SpecError(f"{option} {str(path)!r}: cannot write it: {error.strerror}") from None


def probe_writable(path: Path) -> None:
    existed = path.exists()
    # A FIFO would wait for a reader for ever; a device or folder would be replaced by the rename
    # that writes the file.
    if existed and not path.is_file() and not path.is_dir():  # opening a folder says so
        raise OSError(0, "it is not a regular file")
    path.open("ab").close()
    if not existed:
        path.unlink()


def input_files(spec: Path, kernels: list[KernelSpec], base: Path) -> list[Path]:
    """The spec and the kernels' sources."""
    inputs = [resolved(spec)]
    for kernel in kernels:
        file = kernel.source.rpartition(":")[0]
        if file.endswith(".py"):
            inputs.append(resolved(base / file))
    return inputs


def bundle_files(out: Path, kernels: list[KernelSpec]) -> list[Path]:
    """The files of the bundle in --out that may share a name with an input (the cubins'
    names end in .cubin, which no input's may)."""
    folder = resolved(out)
    return [folder / "index.txt", *(folder / f"{k.name}.json" for k in kernels)]


def check_out_target(spec: Path, kernels: list[KernelSpec], base: Path, out: Path) -> None:
    """The bundle must not take the place of an input: the spec would be lost, silently."""
    inputs = input_files(spec, kernels, base)
    for file in bundle_files(out, kernels):
        if file in inputs or any(_same_file(file, path) for path in inputs):
            raise SpecError(
                f"--out {str(out)!r}: the bundle's {file.name} would take the place of "
                f"{'the spec' if _same_file(file, spec) else 'a kernel source'} there; give "
                "--out a folder of its own (e.g. build/kernels)"
            )


def check_emit_target(
    target: Path, spec: Path, kernels: list[KernelSpec], base: Path, out: Path, cache: Path
) -> None:
    """The generated source must not take the place of an input (the spec, a kernel's source) or
    of what the compiler writes (the bundle in --out, the cache): it would be lost, silently."""
    resolved_target = resolved(target)
    inputs = input_files(spec, kernels, base)
    outputs = bundle_files(out, kernels)
    taken = (
        resolved_target in inputs
        or resolved_target in outputs
        or resolved_target.suffix == ".cubin"
        or any(_same_file(target, path) for path in [*inputs, *outputs])  # a hard link
    )
    if taken or resolved_target.is_relative_to(resolved(cache)):
        raise SpecError(
            f"--emit-cpp {str(target)!r}: that is the spec, a kernel's source, or a file the "
            "compiler writes (the bundle in --out, the cache); name a file of its own (e.g. "
            "kernels.cpp)"
        )


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # either is missing
        return False


def targets_of(option: str | None) -> list[str] | None:
    if option is None:
        return None
    targets = [t.strip() for t in option.split(",")]
    for target in targets:
        parse_arch(target, f"--target {option!r}")
    if len({parse_arch(t) for t in targets}) != len(targets):
        raise SpecError(f"--target {option!r}: a target is repeated")
    return targets


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TRITON_CACHE_DIR", str((args.cache or args.out / ".cache") / "triton"))
    # Compiling for GPUs: kernels must be JIT functions, not the interpreter's stand-ins.
    os.environ.pop("TRITON_INTERPRET", None)
    override = targets_of(args.target)
    kernels, base = load_spec(args.spec)
    for kernel in kernels:
        kernel.targets = override or kernel.targets
    check_targets_supported(kernels, args.target)
    writable_folder("--out", args.out)
    check_out_target(args.spec, kernels, base, args.out)
    cache = writable_folder("--cache", args.cache or args.out / ".cache")
    if args.emit_cpp:  # after --out: CMake writes it there, and only Ninja makes the folder
        check_emit_target(args.emit_cpp, args.spec, kernels, base, args.out, cache)
        try:
            probe_writable(args.emit_cpp)
        except OSError as error:
            raise SpecError(
                f"--emit-cpp {str(args.emit_cpp)!r}: cannot write it: {error.strerror}"
            ) from None
    counter = itertools.count(1)

    def progress(message: str) -> None:
        if not args.quiet:
            print(f"opreg.aot [{next(counter)}] {message}", flush=True)

    manifests = []
    for kernel in kernels:
        try:
            manifests.append(build_kernel(kernel, base, args.out, cache, progress))
        except SpecError as error:
            raise SpecError(f"{args.spec}: {error}") from None
    index = "".join(f"{m.name}\n" for m in manifests)
    write_file("--out", args.out / "index.txt", lambda p: p.write_text(index))
    if args.emit_cpp:
        write_file("--emit-cpp", args.emit_cpp, lambda p: emit_cpp(manifests, p, args.spec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
