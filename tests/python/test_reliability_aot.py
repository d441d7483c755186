"""Reliability of the AOT Triton path against malformed input: the compiler (`python -m
opreg.aot`) refuses what the runtime cannot load, with one line naming the kernel and the field;
the bundle loader checks every manifest field; declared launch expressions are checked when the
op is defined; philox_uniform refuses sizes it cannot allocate. Probes that could crash the
process run in a subprocess, so a crash is a test failure."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import opreg
from conftest import DEVICES, REPO, requires_cuda
from opreg import _C
from opreg.aot.compile import cubin_problem, emit_cpp

KERNELS = REPO / "tests" / "kernel_sources"
CACHE = REPO / "build" / "aot-test-cache"


def run_aot(spec_text: str, tmp_path, *extra: str) -> subprocess.CompletedProcess:
    spec = tmp_path / "spec.toml"
    spec.write_text(textwrap.dedent(spec_text))
    command = [sys.executable, "-m", "opreg.aot", str(spec), "--out", str(tmp_path / "out")]
    return subprocess.run([*command, *extra], capture_output=True, text=True)


def assert_one_line_error(result: subprocess.CompletedProcess, *parts: str) -> None:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m opreg.aot: error: "), lines
    for part in parts:
        assert part in lines[0], (part, lines[0])


def scale_spec(name: str = "opreg_rel_scale", **fields: str) -> str:
    entries = {
        "name": f'"{name}"',
        "source": f'"{KERNELS / "triton_kernels.py"}:scale_kernel"',
        "signature": '{ x_ptr = "*fp32", out_ptr = "*fp32", n = "i64", factor = "fp32" }',
        "constexprs": "{ BLOCK = 512 }",
        "do_not_specialize": '["n"]',
    } | fields
    body = "\n".join(f"{key} = {value}" for key, value in entries.items())
    return f'targets = ["sm_80"]\n[[kernel]]\n{body}\n'


# ---- 1. the compiler refuses scalar types the runtime does not launch; u8/u16 are launched ----


def test_unsigned_8_and_16_bit_scalars_compile_and_load(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "opreg.aot",
            str(KERNELS / "unsigned_kernels.toml"),
            "--out",
            str(tmp_path),
            "--cache",
            str(CACHE),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert opreg.load_triton_bundle(tmp_path) == ["opreg_test_fill_sum_u8_u16"]
    (kernel,) = [k for k in opreg.triton_kernels() if k["name"] == "opreg_test_fill_sum_u8_u16"]
    assert kernel["params"] == ["out_ptr: *fp32", "a: u8", "b: u16", "n: i32"]
    manifest = json.loads((tmp_path / "opreg_test_fill_sum_u8_u16.json").read_text())
    assert {tuple(v["param_sizes"]) for v in manifest["variants"]} == {(8, 1, 2, 4, 8, 8)}


@requires_cuda
def test_unsigned_8_and_16_bit_scalars_are_packed_at_their_width(tmp_path):
    command = [sys.executable, "-m", "opreg.aot", str(KERNELS / "unsigned_kernels.toml")]
    subprocess.run([*command, "--out", str(tmp_path), "--cache", str(CACHE)], check=True)
    opreg.load_triton_bundle(tmp_path)
    kernel = opreg.AotKernel("opreg_test_fill_sum_u8_u16")
    out = torch.full((300,), float("nan"), device="cuda")
    kernel[(2,)](out, 255, 65535, 300)
    torch.testing.assert_close(out, torch.full_like(out, 255.0 + 65535.0), rtol=0, atol=0)
    with pytest.raises(ValueError, match="argument 'a' = 256 does not fit u8"):
        kernel[(2,)](out, 256, 0, 300)
    with pytest.raises(ValueError, match="argument 'b' = -1 does not fit u16"):
        kernel[(2,)](out, 0, -1, 300)


@pytest.mark.parametrize("type_name", ["fp8e5", "u1", "i128", "*nope", "float", "*fp128", "**fp32"])
def test_scalar_types_the_runtime_rejects_are_spec_errors(tmp_path, type_name):
    signature = f'{{ x_ptr = "*fp32", out_ptr = "*fp32", n = "{type_name}", factor = "fp32" }}'
    result = run_aot(scale_spec(signature=signature), tmp_path)
    assert_one_line_error(
        result,
        "kernel opreg_rel_scale: 'signature.n' must be a type the runtime launches",
        type_name,
    )
    assert not (tmp_path / "out").exists()


# ---- 2. names, duplicates, targets, variants, cubins, one-line errors ----


@pytest.mark.parametrize("name", ["../escape", 'quo"te', "has space", "9lives", ""])
def test_kernel_names_must_be_c_identifiers(tmp_path, name):
    result = run_aot(scale_spec(name=json.dumps(name)[1:-1]), tmp_path)
    assert_one_line_error(result, "'name' must be a C identifier", repr(name))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.toml"]  # nothing written


def test_duplicate_kernel_names_are_refused(tmp_path):
    spec = scale_spec() + scale_spec().split("\n", 1)[1]
    result = run_aot(spec, tmp_path)
    assert_one_line_error(result, "kernel names must be unique, ['opreg_rel_scale']")


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        ("[]", "'targets' must be a non-empty list"),
        ('["sm_9x"]', "GPU target 'sm_9x' is not of the form sm_90"),
        ('["sm_5"]', "GPU target 'sm_5' is not of the form sm_90"),
        ('["sm_90", "sm_90"]', "'targets' must be a list without repeats"),
        ('"sm_90"', "'targets' must be a non-empty list"),
    ],
)
def test_targets_are_checked(tmp_path, targets, message):
    assert_one_line_error(run_aot(scale_spec(targets=targets), tmp_path), message)


def test_a_target_ptxas_cannot_build_for_is_one_line(tmp_path):
    result = run_aot(scale_spec(targets='["sm_999"]'), tmp_path)
    assert_one_line_error(result, "GPU target 'sm_999' is not supported", "not sm_999")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("cuda:999", "--target 'cuda:999' is not supported"),
        ("sm_12", "--target 'sm_12' is not supported"),
        ("bogus", "--target 'bogus': GPU target 'bogus' is not of the form sm_90"),
        ("sm_80,sm_80", "--target 'sm_80,sm_80': a target is repeated"),
    ],
)
def test_unknown_target_option_is_one_line(tmp_path, target, message):
    assert_one_line_error(run_aot(scale_spec(), tmp_path, "--target", target), message)
    assert not (tmp_path / "out").exists()


def test_emit_cpp_may_go_into_the_out_folder_before_it_exists(tmp_path):
    # opreg_add_triton_kernels passes OUT/<spec>_embedded.cpp; Make, unlike Ninja, does not
    # create OUT first.
    generated = tmp_path / "out" / "spec_embedded.cpp"
    result = run_aot(scale_spec(), tmp_path, "--cache", str(CACHE), "--emit-cpp", str(generated))
    assert result.returncode == 0, result.stderr
    assert "opreg::triton::register_embedded_bundle" in generated.read_text()


@pytest.mark.parametrize("target", ["spec", "source", "index", "manifest", "cache"])
def test_emit_cpp_never_takes_the_place_of_an_input_or_an_output(tmp_path, target):
    # Sweep 21 B-F5: --emit-cpp naming the spec, the kernel's source or the bundle's index.txt
    # overwrote it with generated C++ and exited 0; the user's file was lost.
    source = tmp_path / "kernels.py"
    shutil.copy(KERNELS / "triton_kernels.py", source)
    spec = scale_spec(source=f'"{source}:scale_kernel"')
    out = tmp_path / "out"
    out.mkdir()
    (out / "index.txt").write_text("kept\n")
    (out / "opreg_rel_scale.json").write_text("kept\n")
    path = {
        "spec": tmp_path / "spec.toml",
        "source": source,
        "index": out / "index.txt",
        "manifest": out / "opreg_rel_scale.json",
        "cache": tmp_path / "cache" / "kernels.cpp",
    }[target]
    before = path.read_text() if path.exists() else None
    result = run_aot(spec, tmp_path, "--cache", str(tmp_path / "cache"), "--emit-cpp", str(path))
    assert_one_line_error(result, f"--emit-cpp {str(path)!r}: that is the spec, a kernel's source")
    if target != "spec":  # run_aot writes the spec itself
        assert (path.read_text() if path.exists() else None) == before


def test_target_option_replaces_the_spec_targets(tmp_path):
    spec = scale_spec(do_not_specialize='["n"]')
    result = run_aot(spec, tmp_path, "--cache", str(CACHE), "--target", "sm_90")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "out" / "opreg_rel_scale.json").read_text())
    assert {v["arch"] for v in manifest["variants"]} == {90}


@pytest.mark.parametrize(
    ("option", "where", "message"),
    [
        ("--emit-cpp", "no_such_folder/k.cpp", "cannot write it: No such file or directory"),
        ("--emit-cpp", ".", "cannot write it: Is a directory"),
        ("--out", "spec.toml/out", "cannot write there"),
        ("--cache", "spec.toml/cache", "cannot write there"),
    ],
)
def test_unwritable_paths_are_one_line(tmp_path, option, where, message):
    spec = tmp_path / "spec.toml"
    spec.write_text(scale_spec())
    path = str(tmp_path / where)
    command = [sys.executable, "-m", "opreg.aot", str(spec), "--out", str(tmp_path / "out")]
    result = subprocess.run([*command, option, path], capture_output=True, text=True)
    assert_one_line_error(result, f"{option} {path!r}: {message}")
    assert not (tmp_path / "no_such_folder").exists()


@pytest.mark.parametrize("which", ["spec", "--emit-cpp"])
def test_a_fifo_for_the_spec_or_the_generated_source_is_refused(tmp_path, which):
    # Sweep 24 B-F3: reading the spec, or probing --emit-cpp, waited for ever on a FIFO.
    spec, fifo = tmp_path / "spec.toml", tmp_path / "fifo"
    spec.write_text(scale_spec())
    os.mkfifo(fifo)
    command = [sys.executable, "-m", "opreg.aot", str(fifo if which == "spec" else spec)]
    command += ["--out", str(tmp_path / "out")]
    if which == "--emit-cpp":
        command += ["--emit-cpp", str(fifo)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert_one_line_error(result, "it is not a regular file")


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        ("[]", "'configs' must be a non-empty list"),
        ("[{ num_warps = 64 }]", "'configs.num_warps' must be a power of two from 1 to 32, got 64"),
        ("[{ num_warps = 3 }]", "'configs.num_warps' must be a power of two from 1 to 32, got 3"),
        ('[{ num_warps = "4" }]', "'configs' must be tables of integers"),
    ],
)
def test_configs_are_checked_and_zero_variants_is_an_error(tmp_path, configs, message):
    assert_one_line_error(run_aot(scale_spec(configs=configs), tmp_path), message)


# The fifth sweep: these compiled (Triton took or ignored them) or wrote duplicate variants.
@pytest.mark.parametrize(
    ("configs", "message"),
    [
        ("[{ num_stages = -1 }]", "'configs.num_stages' must be a pipeline depth from 1 to 16"),
        ("[{ num_stages = 0 }]", "'configs.num_stages' must be a pipeline depth from 1 to 16"),
        # The fourteenth sweep: 2**63-1 passed the spec and failed in Triton's own binding.
        (
            "[{ num_stages = 9223372036854775807 }]",
            "'configs.num_stages' must be a pipeline depth from 1 to 16",
        ),
        ("[{ maxnreg = 0 }]", "'configs.maxnreg' must be a register count from 1 to 255, got 0"),
        ("[{ maxnreg = 300 }]", "'configs.maxnreg' must be a register count from 1 to 255"),
        (
            "[{ num_warps = 4 }, { num_warps = 8 }, { num_warps = 4 }]",
            "'configs' entries 0 {'num_warps': 4} and 2 {'num_warps': 4} are the same config",
        ),
        # The sixteenth sweep: these compiled twice, Triton's defaults made them one config.
        (
            "[{}, { num_warps = 4 }]",
            "'configs' entries 0 {} and 1 {'num_warps': 4} are the same config once Triton's "
            "defaults {'num_warps': 4,",
        ),
        (
            "[{ num_stages = 3 }, { num_warps = 8 }, { num_ctas = 1, num_warps = 4 }]",
            "'configs' entries 0 {'num_stages': 3} and 2 {'num_ctas': 1, 'num_warps': 4} are",
        ),
    ],
)
def test_config_values_triton_would_misuse_are_refused(tmp_path, configs, message):
    assert_one_line_error(run_aot(scale_spec(configs=configs), tmp_path), message)
    assert not (tmp_path / "out").exists()


def test_an_argument_in_both_signature_and_constexprs_is_refused(tmp_path):
    # The sixth sweep: it failed later, on a parameter-size mismatch that did not say why.
    signature = '{ x_ptr = "*fp32", out_ptr = "*fp32", n = "i64", factor = "fp32", BLOCK = "i32" }'
    result = run_aot(scale_spec(signature=signature), tmp_path)
    assert_one_line_error(
        result, "'constexprs' must be arguments not also in the signature", "['BLOCK']"
    )


def test_a_constexpr_that_is_a_table_is_refused(tmp_path):
    # The fourteenth sweep: Triton failed on it with "'dict' object has no attribute 'type'".
    spec = scale_spec(constexprs="{ BLOCK = { size = 256 } }")
    assert_one_line_error(
        run_aot(spec, tmp_path), "'constexprs.BLOCK' must be a number, a boolean or a string"
    )


def test_unknown_top_level_keys_are_refused(tmp_path):
    # A misspelled 'targets' would have compiled for the default targets.
    result = run_aot("target = ['sm_90']\n" + scale_spec(), tmp_path)
    assert_one_line_error(result, "unknown top-level keys ['target']; a spec has 'targets'")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("[[kernel]]\nname = 'k'\n", "kernel k: missing keys ['source', 'signature']"),
        ("[[kernel]\n", "not valid TOML"),
        (
            scale_spec(source='"nowhere.py:scale_kernel"'),
            "kernel opreg_rel_scale: source 'nowhere.py:scale_kernel': no file",
        ),
        (scale_spec(source='"no_such_module_x:f"'), "no module named 'no_such_module_x'"),
        (scale_spec(equal_to_1='["m"]'), "'equal_to_1' must be names of arguments"),
    ],
)
def test_spec_errors_are_one_line(tmp_path, spec, message):
    assert_one_line_error(run_aot(spec, tmp_path), message)


def test_missing_spec_file_is_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "opreg.aot", str(tmp_path / "none.toml"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert_one_line_error(result, "none.toml: cannot read the spec")


def test_a_spec_that_starts_with_a_byte_order_mark_compiles(tmp_path):
    # The sixteenth sweep: "not valid TOML: Invalid statement (at line 1, column 1)".
    result = run_aot("\ufeff" + scale_spec(), tmp_path, "--cache", str(CACHE))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "index.txt").read_text() == "opreg_rel_scale.json\n"


def test_a_spec_that_is_not_utf8_is_one_line(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_bytes(b"\xff\xfe\x00garbage")
    command = [sys.executable, "-m", "opreg.aot", str(spec), "--out", str(tmp_path / "out")]
    result = subprocess.run(command, capture_output=True, text=True)
    assert_one_line_error(
        result, f"{spec}: cannot read the spec: it is not UTF-8 text (byte 0xff at offset 0)"
    )


@pytest.mark.parametrize(
    ("configs", "unknown"),
    [
        ("[{ bogus_option = 4 }]", "['bogus_option']"),
        ("[{ num_warps = 4, numstages = 2 }]", "['numstages']"),
    ],
)
def test_unknown_config_keys_are_refused(tmp_path, configs, unknown):
    # Triton ignores options it does not know: a misspelled key would compile with the default.
    result = run_aot(scale_spec(configs=configs), tmp_path)
    assert_one_line_error(
        result,
        f"{tmp_path / 'spec.toml'}: kernel opreg_rel_scale: 'configs' entry",
        f"has unknown keys {unknown}; a config takes num_warps, num_stages, num_ctas, maxnreg",
    )
    assert not (tmp_path / "out").exists()


SOURCE_FILES = {
    "syntax_error.py": "def k(:\n",
    "plain.py": "def k(x_ptr, out_ptr, n, factor, BLOCK):\n    pass\n",
    "raises.py": "import os\n\nraise RuntimeError('import-time boom')\n",
    "imports_missing.py": "import opreg_no_such_dependency\n",
}


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (":scale_kernel", "source ':scale_kernel' must be 'file.py:function' or 'module:function'"),
        ("plain.py:", "source 'plain.py:' must be 'file.py:function' or 'module:function'"),
        # The sixteenth sweep: this said "no module named '{dir}/plain'".
        ("plain.py:k:x", "source 'plain.py:k:x' must be 'file.py:function' or "
         "'module:function', with one ':'"),
        ("syntax_error.py:k", "importing {dir}/syntax_error.py failed: {dir}/syntax_error.py:1: "
         "SyntaxError: invalid syntax"),
        ("raises.py:k", "importing {dir}/raises.py failed: {dir}/raises.py:3: RuntimeError: "
         "import-time boom"),
        ("imports_missing.py:k", "{dir}/imports_missing.py:1: ModuleNotFoundError: No module "
         "named 'opreg_no_such_dependency'"),
        ("plain.py:k", "source 'plain.py:k': 'k' is a function, not a @triton.jit kernel"),
        ("os:getcwd", "'getcwd' is a builtin_function_or_method, not a @triton.jit kernel"),
    ],
)  # fmt: skip
def test_kernel_sources_that_do_not_import_are_one_line(tmp_path, source, message):
    for name, text in SOURCE_FILES.items():
        (tmp_path / name).write_text(text)
    result = run_aot(scale_spec(source=f'"{source}"'), tmp_path)
    where = f"{tmp_path / 'spec.toml'}: kernel opreg_rel_scale: "
    assert_one_line_error(result, where, message.format(dir=tmp_path))


SCALE_LINE = "offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"constexprs": '{ BLOCK = "big" }'},
         f"triton_kernels.py:20:15: AttributeError(\"'str' object has no attribute 'type'\") "
         f"(in `{SCALE_LINE}`)"),
        ({"constexprs": "{ BLOCK = 500 }"},
         f"triton_kernels.py:20:42: arange's range must be a power of 2 (in `{SCALE_LINE}`)"),
        ({"signature": '{ x_ptr = "*fp8e4nv", out_ptr = "*fp32", n = "i64", factor = "fp32" }'},
         "triton_kernels.py:19:1: ValueError(\"type fp8e4nv not supported in this architecture."),
    ],
)  # fmt: skip
def test_what_triton_cannot_compile_is_one_line_naming_the_variant(tmp_path, fields, message):
    result = run_aot(scale_spec(**fields), tmp_path)
    assert_one_line_error(
        result,
        f"{tmp_path / 'spec.toml'}: kernel opreg_rel_scale (sm_80, [x_ptr:aligned16, "
        f"out_ptr:aligned16] {{'num_warps': 4}}): Triton cannot compile it: {KERNELS}/",
        message,
    )


def test_cubin_check():
    assert cubin_problem(b"") == "it is empty"
    assert cubin_problem(b"not a cubin" * 10) == "it is not an ELF file (110 bytes)"
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    header[18:20] = (3).to_bytes(2, "little")
    assert cubin_problem(bytes(header)) == "its ELF machine is 3, not CUDA (190)"


def test_truncated_cached_cubins_are_recompiled_not_copied(tmp_path):
    cache = tmp_path / "cache"
    spec = scale_spec(do_not_specialize='["n"]')
    first = run_aot(spec, tmp_path, "--cache", str(cache))
    assert first.returncode == 0, first.stderr
    outputs = sorted((tmp_path / "out").glob("*.cubin"))
    assert len(outputs) == 2  # out_ptr and x_ptr aligned or not
    whole = {p.name: p.read_bytes() for p in outputs}
    for name, data in whole.items():
        assert cubin_problem(data) == ""
        (cache / name).write_bytes(data[: len(data) // 2])  # a build killed while writing
    shutil.rmtree(tmp_path / "out")
    second = run_aot(spec, tmp_path, "--cache", str(cache))
    assert second.returncode == 0, second.stderr
    assert not any(line.endswith("(cached)") for line in second.stdout.splitlines())
    for name, data in whole.items():
        assert (tmp_path / "out" / name).read_bytes() == data
    third = run_aot(spec, tmp_path, "--cache", str(cache))
    assert all(line.endswith("(cached)") for line in third.stdout.splitlines())


def test_edited_cache_metadata_is_compiled_again(tmp_path):
    # The 22nd sweep (B-F6): only the cubin was hashed; metadata edited in the cache (another
    # num_warps, another entry) went into the manifest as "(cached)".
    cache = tmp_path / "cache"
    spec = scale_spec()
    assert run_aot(spec, tmp_path, "--cache", str(cache)).returncode == 0
    built = {p.name: p.read_text() for p in (tmp_path / "out").glob("*.json")}
    for entry in cache.glob("*.json"):
        record = json.loads(entry.read_text())
        entry.write_text(json.dumps({**record, "num_warps": 8, "entry": "another_kernel"}))
    shutil.rmtree(tmp_path / "out")
    again = run_aot(spec, tmp_path, "--cache", str(cache))
    assert again.returncode == 0, again.stderr
    assert not any(line.endswith("(cached)") for line in again.stdout.splitlines())
    assert {p.name: p.read_text() for p in (tmp_path / "out").glob("*.json")} == built


def test_a_folder_where_a_cached_cubin_goes_is_one_line(tmp_path):
    # The sixteenth sweep: a traceback ending in IsADirectoryError. The entry cannot be read, so
    # the variant is recompiled; its cubin cannot be written there either.
    cache = tmp_path / "cache"
    first = run_aot(scale_spec(), tmp_path, "--cache", str(cache))
    assert first.returncode == 0, first.stderr
    cached = sorted(cache.glob("*.cubin"))
    for path in cached:
        path.unlink()
        path.mkdir()
    second = run_aot(scale_spec(), tmp_path, "--cache", str(cache))
    assert_one_line_error(
        second, f"--cache '{cache}/opreg_rel_scale.", ".cubin': cannot write it: Is a directory"
    )


STUB_TRITON_H = """
#include <cstddef>
namespace opreg::triton {
struct EmbeddedFile { const char* name; const unsigned char* data; size_t size; };
bool register_embedded_bundle(const char*, size_t, const EmbeddedFile*, size_t);
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile the generated source")
def test_generated_cpp_is_valid_whatever_the_file_names(tmp_path):
    # A manifest from elsewhere (not validated by this compiler) naming a file with a quote, a
    # backslash and a newline; the spec's own file name with a newline (in a // comment).
    weird = 'a"b\\c\nd*.cubin'
    (tmp_path / weird).write_bytes(b"\x7fELF")
    variant = {"file": weird}
    (tmp_path / "k.json").write_text(json.dumps({"kernel": "k", "variants": [variant]}))
    (tmp_path / "opreg").mkdir()
    (tmp_path / "opreg" / "triton.h").write_text(STUB_TRITON_H)
    source = tmp_path / "embedded.cpp"
    emit_cpp([tmp_path / "k.json"], source, tmp_path / "spec\nint oops;.toml")
    result = subprocess.run(
        ["g++", "-std=c++17", "-fsyntax-only", "-Werror", "-I", str(tmp_path), str(source)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr + source.read_text()[:400]
    assert r'{"a\042b\134c\012d\052.cubin", kBlob0_0, sizeof(kBlob0_0)}' in source.read_text()


# ---- 3. the bundle loader checks every manifest field and names the file ----


def corrupted_bundle(aot_bundle, tmp_path, name, change):
    m = json.loads((aot_bundle / "opreg_test_scale.json").read_text())
    m["kernel"] = name
    for variant in m["variants"]:
        shutil.copy(aot_bundle / variant["file"], tmp_path / variant["file"])
    change(m, tmp_path)
    (tmp_path / "bad.json").write_text(json.dumps(m))
    (tmp_path / "index.txt").write_text("bad.json\n")
    return tmp_path


def set_field(key, value):
    def change(m, _):
        m["variants"][0][key] = value

    return change


def empty_cubin(m, folder):
    (folder / m["variants"][0]["file"]).write_bytes(b"")


def truncated_cubin(m, folder):
    path = folder / m["variants"][0]["file"]
    path.write_bytes(path.read_bytes()[:200])


def equals1_on_pointer(m, _):
    m["variants"][0]["assumptions"] = [{"param": 0, "kind": "equals1"}]


def escaping_file(m, _):
    m["variants"][0]["file"] = "../elsewhere.cubin"


def missing_field(m, _):
    del m["variants"][0]["shared"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (set_field("num_warps", -1), "field 'num_warps' must be an integer from 1 to 32, got -1"),
        (set_field("num_warps", 2**40), "field 'num_warps' must be an integer from 1 to 32"),
        (set_field("num_warps", 4.5), "field 'num_warps' must be an integer from 1 to 32, got 4.5"),
        (set_field("num_warps", 3), "field 'num_warps' must be a power of two, got 3"),
        (set_field("num_ctas", 0), "field 'num_ctas' must be an integer from 1 to 16, got 0"),
        (set_field("shared", -4), "field 'shared' must be an integer from 0 to 2147483647"),
        (set_field("global_scratch_align", 0), "field 'global_scratch_align' must be an integer"),
        (
            set_field("global_scratch_align", 3),
            "field 'global_scratch_align' must be a power of two",
        ),
        (set_field("launch_pdl", "yes"), "field 'launch_pdl' must be true or false"),
        (set_field("arch", -90), "field 'arch' must be an integer from 10 to 9999, got -90"),
        (set_field("entry", ""), "field 'entry' must be a non-empty string"),
        (missing_field, "field 'shared' is missing"),
        (equals1_on_pointer, "assumption 'equals1' on parameter 'x_ptr' (*fp32) needs an integer"),
        (empty_cubin, "is not a cubin: it is empty"),
        (truncated_cubin, "is not a cubin: it is truncated"),
        (escaping_file, "field 'file' must be a file name beside the manifest"),
        # 22nd sweep, B-F6: the launch used 8 warps for a cubin compiled for 4
        (
            set_field("config", {"num_warps": 8}),
            "field 'config' says num_warps = 8, field 'num_warps' says 4",
        ),
    ],
)
def test_manifest_fields_are_checked(aot_bundle, tmp_path, change, message):
    name = f"opreg_rel_bad_{abs(hash(message)) % 10**8}"
    folder = corrupted_bundle(aot_bundle, tmp_path, name, change)
    with pytest.raises(ValueError) as error:
        opreg.load_triton_bundle(folder)
    text = str(error.value)
    assert f"opreg: Triton manifest {folder}/bad.json: kernel '{name}', variant 0" in text, text
    assert message in text
    assert name not in {k["name"] for k in opreg.triton_kernels()}


def unknown_field(m, _):
    m["kernel_name"] = "x" * 100


def unknown_variant_field(m, _):
    m["variants"][0]["num_warp"] = 4


def repeated_param(m, _):
    m["params"].append(dict(m["params"][1]))


def repeated_variant(m, folder):
    m["variants"].insert(1, dict(m["variants"][0]))


def unknown_config_field(m, _):
    m["variants"][0]["config"]["bogus"] = 1


def unknown_param_field(m, _):
    m["params"][1]["align"] = 16


def unknown_assumption_field(m, _):
    m["variants"][0]["assumptions"][0]["x"] = 1


def no_params(m, _):
    m["params"] = []


def no_generic_variant_for_sm90(m, _):
    generic_sm90 = [v for v in m["variants"] if v["arch"] == 90 and not v["assumptions"]]
    assert generic_sm90, "the bundle has a generic sm_90 variant to drop"
    m["variants"] = [v for v in m["variants"] if v not in generic_sm90]


@pytest.mark.parametrize(
    ("change", "where", "message"),
    [
        (repeated_param, "", "field 'params' names parameter 'out_ptr' twice"),
        (repeated_variant, ", variant 1", "repeats variant 0 (arch "),
        (unknown_field, "", 'unknown field "kernel_name"; a manifest has format, kernel'),
        # The fourteenth sweep: a variant's misspelt field loaded, and the field was not read.
        (unknown_variant_field, ", variant 0", 'unknown field "num_warp"; a variant has the'),
        # The sixteenth sweep: unknown fields inside these loaded, and so did a kernel whose
        # unaligned launches had no variant to take.
        (
            unknown_config_field,
            ", variant 0",
            "unknown field \"bogus\" in field 'config'; a config has num_warps, num_stages",
        ),
        (
            unknown_param_field,
            "",
            "unknown field \"align\" of parameter 'out_ptr'; a parameter has name and type",
        ),
        (
            unknown_assumption_field,
            ", variant 0",
            "unknown field \"x\" of an assumption on parameter 'x_ptr'; an assumption has",
        ),
        # Sweep 24 B-F6: "field 'param' must be an integer from 0 to -1, got 0".
        (no_params, ", variant 0", "a variant's assumption names a parameter, but 'params' is"),
        (
            no_generic_variant_for_sm90,
            "",
            "no generic variant (one without assumptions) for sm_90: a launch whose arguments",
        ),
    ],
)
def test_manifest_repeats_and_unknown_fields_are_refused(
    aot_bundle, tmp_path, change, where, message
):
    # The fifth and sixth sweeps: a repeated parameter or variant loaded (one variant never
    # launched), and so did a field of no meaning (an 80 MB one).
    name = f"opreg_rel_repeat_{change.__name__}"
    folder = corrupted_bundle(aot_bundle, tmp_path, name, change)
    with pytest.raises(ValueError) as error:
        opreg.load_triton_bundle(folder)
    text = str(error.value)
    assert f"opreg: Triton manifest {folder}/bad.json: kernel '{name}'{where}: {message}" in text
    assert name not in {k["name"] for k in opreg.triton_kernels()}


@pytest.mark.parametrize(
    ("param", "type_name"), [(0, "*fp128"), (2, "u1"), (3, "f32"), (0, "*u1"), (0, "*f32")]
)
def test_types_the_compiler_refuses_are_refused_by_the_loader(
    aot_bundle, tmp_path, param, type_name
):
    def retype(m, _):
        m["params"][param]["type"] = type_name

    folder = corrupted_bundle(aot_bundle, tmp_path, "opreg_rel_type", retype)
    with pytest.raises(ValueError) as error:
        opreg.load_triton_bundle(folder)
    name = ["x_ptr", "out_ptr", "n", "factor"][param]
    assert (
        f"Triton manifest {folder}/bad.json: kernel 'opreg_rel_type', parameter '{name}': "
        f"unsupported parameter type '{type_name}'" in str(error.value)
    )
    assert "opreg_rel_type" not in {k["name"] for k in opreg.triton_kernels()}


def renamed_manifest(aot_bundle, folder, name, change=lambda m: None):
    """opreg_test_scale's manifest under another kernel name, its cubins beside it."""
    m = json.loads((aot_bundle / "opreg_test_scale.json").read_text())
    m["kernel"] = name
    for variant in m["variants"]:
        shutil.copy(aot_bundle / variant["file"], folder / variant["file"])
    change(m)
    (folder / f"{name}.json").write_text(json.dumps(m))
    return f"{name}.json"


def more_warps(manifest: dict) -> None:
    """Makes the first variant a consistent launch for twice the warps (its binary unchanged)."""
    variant = manifest["variants"][0]
    variant["num_warps"] *= 2
    if "num_warps" in variant["config"]:
        variant["config"]["num_warps"] = variant["num_warps"]


def registered_kernels() -> set[str]:
    return {k["name"] for k in opreg.triton_kernels()}


def test_a_bundle_folder_with_one_bad_manifest_registers_nothing(aot_bundle, tmp_path):
    def bad_warps(m):
        m["variants"][-1]["num_warps"] = 0

    good = renamed_manifest(aot_bundle, tmp_path, "opreg_rel_atomic_good")
    bad = renamed_manifest(aot_bundle, tmp_path, "opreg_rel_atomic_bad", bad_warps)
    (tmp_path / "index.txt").write_text(f"{good}\n{bad}\n")
    with pytest.raises(ValueError, match=f"Triton manifest {tmp_path}/{bad}: kernel "):
        opreg.load_triton_bundle(tmp_path)
    assert not {"opreg_rel_atomic_good", "opreg_rel_atomic_bad"} & registered_kernels()


def test_a_bundle_folder_that_clashes_with_a_registered_kernel_registers_nothing(
    aot_bundle, tmp_path
):
    def other_source(m):
        m["source"] = "elsewhere.py:scale_kernel"

    good = renamed_manifest(aot_bundle, tmp_path, "opreg_rel_clash_good")
    clash = renamed_manifest(aot_bundle, tmp_path, "opreg_test_scale", other_source)
    (tmp_path / "index.txt").write_text(f"{good}\n{clash}\n")
    with pytest.raises(ValueError) as error:
        opreg.load_triton_bundle(tmp_path)
    assert (
        f"opreg: Triton manifest {tmp_path}/{clash}: a Triton kernel named 'opreg_test_scale' is "
        "already registered, and this one differs: its source is elsewhere.py:scale_kernel, the "
        "registered one's " in str(error.value)
    )
    assert "opreg_rel_clash_good" not in registered_kernels()


def test_a_rebuilt_kernel_under_a_registered_name_is_refused(aot_bundle, tmp_path):
    # The fourteenth sweep: same name, source and parameters with other binaries or launch
    # fields loaded without a word, and the old binaries stayed in use.
    opreg.load_triton_bundle(aot_bundle)

    manifest = renamed_manifest(aot_bundle, tmp_path, "opreg_test_scale", more_warps)
    (tmp_path / "index.txt").write_text(f"{manifest}\n")
    with pytest.raises(ValueError) as error:
        opreg.load_triton_bundle(tmp_path)
    assert (
        "a Triton kernel named 'opreg_test_scale' is already registered, and this one differs: "
        "its variant 0 (launch fields and binary) is none of the registered one's; a registered "
        "kernel cannot be replaced" in str(error.value)
    )
    # The sweep after: the same variants in another order were refused as "another source",
    # naming the bundle's own source. The order decides the variant a launch takes.
    reordered_folder = tmp_path / "reordered"
    reordered_folder.mkdir()
    reordered = renamed_manifest(
        aot_bundle, reordered_folder, "opreg_test_scale", lambda m: m["variants"].reverse()
    )
    (reordered_folder / "index.txt").write_text(f"{reordered}\n")
    variants = json.loads((reordered_folder / reordered).read_text())["variants"]
    assert len({v["arch"] for v in variants}) == 2  # sm_80 and sm_90: the order shows
    with pytest.raises(ValueError, match=r"registered one's variants in another order"):
        opreg.load_triton_bundle(reordered_folder)
    same = tmp_path / "same"
    same.mkdir()
    (same / "index.txt").write_text(renamed_manifest(aot_bundle, same, "opreg_test_scale") + "\n")
    assert "opreg_test_scale" in opreg.load_triton_bundle(same)  # the very same bundle: harmless


def test_two_manifests_of_one_name_in_a_folder_register_nothing(aot_bundle, tmp_path):
    def fewer_params(m):
        m["params"][-1]["name"] = "scale"

    first = renamed_manifest(aot_bundle, tmp_path, "opreg_rel_twice")
    (tmp_path / "sub").mkdir()
    renamed_manifest(aot_bundle, tmp_path / "sub", "opreg_rel_twice", fewer_params)
    shutil.copy(tmp_path / "sub" / first, tmp_path / "second.json")
    (tmp_path / "index.txt").write_text(f"{first}\nsecond.json\n")
    with pytest.raises(
        ValueError, match=r"second\.json and Triton manifest .*define two different"
    ):
        opreg.load_triton_bundle(tmp_path)
    assert "opreg_rel_twice" not in registered_kernels()
    # Listed twice: refused (the sixth sweep: it loaded, naming the kernel twice).
    (tmp_path / "index.txt").write_text(f"{first}\n{first}\n")
    with pytest.raises(ValueError, match=rf"line 2 lists '{first}' again \(line 1\)"):
        opreg.load_triton_bundle(tmp_path)
    assert "opreg_rel_twice" not in registered_kernels()


def test_manifest_that_is_not_json_names_the_file(tmp_path):
    (tmp_path / "broken.json").write_text('{"format": "opreg-triton-aot/1", "kernel": ')
    (tmp_path / "index.txt").write_text("broken.json\n")
    with pytest.raises(
        ValueError, match=f"Triton manifest {tmp_path}/broken.json is not valid JSON"
    ):
        opreg.load_triton_bundle(tmp_path)


@pytest.mark.parametrize("where", ["top", "variant"])
def test_manifest_giving_a_key_twice_is_refused(aot_bundle, tmp_path, where):
    # The last of the two values won, silently (the ninth sweep): which one the author meant is
    # not knowable, so the manifest loads neither.
    name = f"opreg_rel_dup_{where}"
    path = tmp_path / renamed_manifest(aot_bundle, tmp_path, name)
    text = path.read_text()
    if where == "top":
        text = text.replace('"kernel": ', '"kernel": "other", "kernel": ', 1)
    else:
        text = text.replace('"num_warps": ', '"num_warps": 4, "num_warps": ', 1)
    path.write_text(text)
    (tmp_path / "index.txt").write_text(f"{path.name}\n")
    key = "kernel" if where == "top" else "num_warps"
    with pytest.raises(ValueError, match=rf"{path.name}: an object gives the key '{key}' twice"):
        opreg.load_triton_bundle(tmp_path)
    assert name not in registered_kernels() and "other" not in registered_kernels()


def test_manifest_with_wrongly_typed_params_names_the_field(tmp_path):
    manifest = {"format": "opreg-triton-aot/1", "kernel": "k", "params": {"x": 1}, "variants": []}
    (tmp_path / "k.json").write_text(json.dumps(manifest))
    (tmp_path / "index.txt").write_text("k.json\n")
    with pytest.raises(ValueError, match=r"k.json: kernel 'k': field 'params' must be a list"):
        opreg.load_triton_bundle(tmp_path)


def test_index_with_crlf_blank_lines_spaces_and_a_bom_loads(aot_bundle, tmp_path):
    manifest = renamed_manifest(aot_bundle, tmp_path, "opreg_rel_crlf")
    (tmp_path / "index.txt").write_bytes(f"\ufeff\r\n  \n\t{manifest} \r\n\n".encode())
    assert opreg.load_triton_bundle(tmp_path) == ["opreg_rel_crlf"]


def load_error(folder) -> str:
    """The message of the ValueError that loading `folder` raises (not a UnicodeDecodeError of a
    message holding bytes from a file)."""
    with pytest.raises(ValueError) as error:
        opreg.load_triton_bundle(folder)
    return str(error.value)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x89PNG\r\n\x1a\x00\xa2", "opreg: {dir}/index.txt line 2 has the control byte \\x1a"),
        (b"ok.json\n\x00\x01\xff", "opreg: {dir}/index.txt line 2 has the control byte \\x00"),
        (b"\xa2\xffname.json\n", "opreg: cannot read {dir}/\\xa2\\xffname.json (listed in "
         "index.txt line 1): no such file"),
        ("é.json\n".encode(), "opreg: cannot read {dir}/é.json (listed in index.txt line 1)"),
        (b"../k.json\n", "opreg: {dir}/index.txt line 1: expected the file name of a manifest "
         "beside it, got '../k.json'"),
        (b"k.json\n\n k.json\n", "opreg: {dir}/index.txt line 3 lists 'k.json' again (line 1): "
         "each manifest is listed once"),  # the sixth sweep: loaded, the kernel listed twice
    ],
)  # fmt: skip
def test_an_index_that_is_not_text_names_the_index_and_line(tmp_path, content, message):
    (tmp_path / "index.txt").write_bytes(content)
    assert message.format(dir=tmp_path) in load_error(tmp_path)


def test_directories_and_fifos_where_files_belong_name_the_file(aot_bundle, tmp_path):
    # A directory made reading throw from inside the stream; a FIFO would block the reader.
    manifest = renamed_manifest(aot_bundle, tmp_path, "opreg_rel_dirs")
    (tmp_path / "index.txt").write_text(f"{manifest}\n")
    cubin = json.loads((tmp_path / manifest).read_text())["variants"][0]["file"]
    (tmp_path / cubin).unlink()
    (tmp_path / cubin).mkdir()
    assert (
        f"opreg: cannot read {tmp_path}/{cubin} (named by {tmp_path}/{manifest}): it is a "
        "directory, not a file" in load_error(tmp_path)
    )
    (tmp_path / manifest).unlink()
    (tmp_path / manifest).mkdir()
    assert (
        f"opreg: cannot read {tmp_path}/{manifest} (listed in index.txt line 1): it is a "
        "directory, not a file" in load_error(tmp_path)
    )
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "index.txt").write_text("fifo.json\n")
    probe = f"import opreg; opreg.load_triton_bundle({str(tmp_path)!r})"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert (
        f"opreg: cannot read {tmp_path}/fifo.json (listed in index.txt line 1): it is not a "
        "regular file" in result.stderr
    )
    (tmp_path / "index.txt").unlink()
    (tmp_path / "index.txt").mkdir()
    assert f"cannot read {tmp_path}/index.txt: it is a directory" in load_error(tmp_path)
    assert "opreg_rel_dirs" not in registered_kernels()


@pytest.mark.parametrize("path", [None, 5, b"/tmp"])
def test_load_functions_refuse_paths_that_are_not_paths(path):
    with pytest.raises(TypeError, match=r"opreg.load_library: 'path' must be a str or os.PathLike"):
        opreg.load_library(path)
    with pytest.raises(TypeError, match=r"opreg.load_triton_bundle: 'path' must be a str or os"):
        opreg.load_triton_bundle(path)


# ---- 4. AotKernel: launches from Python with wrong arguments ----


@pytest.mark.parametrize("device", [2**40, -(2**40)])
def test_available_on_a_device_index_beyond_an_int_is_out_of_range(device):
    # The sixteenth sweep: pybind's "incompatible function arguments".
    kernel = opreg.AotKernel("opreg_test_scale")
    assert kernel.available_on(device) == (False, f"CUDA device index {device} out of range")


def test_aot_kernel_name_must_be_a_str():
    with pytest.raises(TypeError, match=r"opreg.AotKernel: 'name' must be a str .*, got int 5"):
        opreg.AotKernel(5)


@pytest.mark.parametrize(
    ("grid", "error", "message"),
    [
        ((1.5,), TypeError, "the grid must be an int or a tuple of 1 to 3 ints, got (1.5,)"),
        ("abc", TypeError, "the grid must be an int or a tuple of 1 to 3 ints, got 'abc'"),
        ((True,), TypeError, "the grid must be an int or a tuple of 1 to 3 ints, got (True,)"),
        ((), ValueError, "the grid has 1 to 3 dimensions, got 0"),
        ((1, 1, 1, 1), ValueError, "the grid has 1 to 3 dimensions, got 4"),
        ((2**70,), ValueError, "grid (1180591620717411303424,) is outside CUDA's limits"),
    ],
)
def test_aot_kernel_grids_are_checked(aot_bundle, grid, error, message):
    # x is a CPU tensor: the grid is checked first (the sixth sweep: a negative grid got only
    # the device error), so these run without a GPU.
    kernel = opreg.AotKernel("opreg_test_scale")
    x = torch.ones(4)
    with pytest.raises(error) as raised:
        kernel[grid](x, x, 4, 1.0)
    assert str(raised.value).startswith(f"opreg.AotKernel 'opreg_test_scale': {message}")
    with pytest.raises(error):
        kernel.launch(grid, x, x, 4, 1.0)


def test_a_negative_grid_is_named_before_the_arguments(aot_bundle):
    x = torch.ones(4)  # on the CPU, which the kernel refuses too
    with pytest.raises(ValueError, match=r"grid \(-1, 1, 1\) is outside CUDA's limits"):
        opreg.AotKernel("opreg_test_scale")[(-1,)](x, x, 4, 1.0)


def test_aot_kernel_arguments_beyond_64_bits_name_the_parameter(aot_bundle):
    kernel = opreg.AotKernel("opreg_test_scale")
    x = torch.ones(4)
    with pytest.raises(ValueError) as error:
        kernel.variant_for(x, x, 2**70, 1.0)
    assert str(error.value).startswith(
        "opreg.AotKernel 'opreg_test_scale': argument 'n' (i64) = 1180591620717411303424 does "
        "not fit i64 (an integer parameter is at most 64 bits: -2^63 to 2^63 - 1)"
    )
    with pytest.raises(
        TypeError,
        match=r"argument 'factor' \(fp32\) is a str; expected a tensor, an int or a float",
    ):
        kernel.variant_for(x, x, 4, "1.0")
    # A large int for a float parameter converts, as Triton's launcher converts it; these CPU
    # tensors are why no variant fits.
    assert kernel.variant_for(x, x, 4, 2**70) == "none: argument 'x_ptr' is on cpu, not CUDA"
    with pytest.raises(
        ValueError, match=r"'opreg_rel_absent': argument 0 = \d+ does not fit 64 bits"
    ):
        opreg.AotKernel("opreg_rel_absent").variant_for(2**70)


# ---- 5. declared launch expressions ----


def define_declared(name, grid, arguments, outputs="like:x", kernel="opreg_test_scale"):
    def fn(x: torch.Tensor, f: float, k: int) -> torch.Tensor:
        return x * f

    sequence = (list, tuple)
    grid = tuple(grid) if isinstance(grid, sequence) else grid
    arguments = tuple(arguments) if isinstance(arguments, sequence) else arguments
    launch = opreg.AotLaunch(kernel, grid, arguments, outputs)
    return opreg.register_triton_op(
        fake_fn=lambda x, f, k: torch.empty_like(x),
        triton_fn=None,
        aot=launch,
        triton_device_types="cpu",
        name=f"aot_rel::{name}",
    )(fn)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("--5", "'--5' is not an integer"),
        ("1e999", "'1e999' is out of the range of a float (double)"),
        ("99999999999999999999", "is out of the range of a 64-bit integer"),
        ("", "the expression is empty"),
        ("   ", "the expression is empty"),
        ("numel(x", "expected ')' after 'numel(x', found the end"),
        ("numel(x))", "expected the end after 'numel(x)', found ')'"),
        ("(numel(x))", "expected a name after '', found '(numel(x))'"),
        ("cdiv(numel(x), 0)", "the divisor of cdiv must be a positive integer"),
        ("cdiv(numel(x), 99999999999999999999)", "out of the range of a 64-bit integer"),
        ("size(x, 1.5)", "'1.5' is not an integer"),
        ("size(x)", "expected ',' after 'size(x', found ')'"),
        ("numel(x) + 1", "expected the end after 'numel(x)', found '+ 1'"),
        ("sqrt(x)", "unknown function 'sqrt' (known: numel, size, stride, cdiv)"),
        ("numel(f)", "argument 'f' is float, not a tensor"),
        ("size(k, 0)", "argument 'k' is int, not a tensor"),
        ("stride(f, 0)", "argument 'f' is float, not a tensor"),
        ("out1", "'out1' names no output: the op has 1 outputs"),
        ("out99999999999999999999", "names no output"),
        ("nan", "no argument named 'nan' (the op has: x, f, k)"),
    ],
)
def test_malformed_expressions_are_value_errors(expression, message):
    name = f"bad_{abs(hash(expression)) % 10**8}"
    with pytest.raises(ValueError) as error:
        define_declared(name, ["cdiv(numel(x), 512)"], ["x", "out0", expression, "f"])
    assert f"aot_rel::{name}: aot_kernel arguments: cannot read '{expression}': " in str(
        error.value
    )
    assert message in str(error.value)


def test_an_argument_named_like_an_output_is_refused_where_a_launch_names_it():
    # Sweep 21 B-F4: with an argument named out0, the launch's 'out0' bound output 0 while
    # like:out0 and numel(out0) read the argument: silently mixed.
    def fn(x: torch.Tensor, out0: torch.Tensor) -> torch.Tensor:
        return x + out0

    launch = opreg.AotLaunch("opreg_test_scale", ("1",), ("out0", "x"), "like:x")
    with pytest.raises(ValueError, match=r"aot_rel::shadowed: aot_kernel arguments: cannot read "
                       r"'out0': 'out0' names an output here, and the op has an argument of that "
                       r"name too"):  # fmt: skip
        opreg.register_triton_op(
            fake_fn=lambda x, out0: torch.empty_like(x),
            triton_fn=None,
            aot=launch,
            triton_device_types="cuda",
            name="aot_rel::shadowed",
            schema="(Tensor x, Tensor out0) -> Tensor",
        )(fn)
    assert not _C.is_defined("aot_rel::shadowed")


def test_grid_expressions_must_be_integers():
    with pytest.raises(ValueError, match="grid: cannot read 'f': expected an integer expression"):
        define_declared("float_grid", ["f"], ["x", "out0", "numel(x)", "f"])
    with pytest.raises(ValueError, match="cdiv needs an integer to divide, 'x' is a tensor"):
        define_declared("tensor_cdiv", ["cdiv(x, 4)"], ["x", "out0", "numel(x)", "f"])
    with pytest.raises(ValueError, match="outputs: cannot read 'k': argument 'k' is int, not a"):
        define_declared("int_like", ["1"], ["x", "out0", "numel(x)", "f"], outputs="like:k")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("kernel", 5, "'kernel' must be a str, the name of an AOT Triton kernel, got int 5"),
        ("grid", (1,), "'grid' must be a tuple of str expressions over the op's arguments, got"),
        ("arguments", ("x", 2), "'arguments' must be a tuple of str expressions over the op's"),
        ("outputs", None, "'outputs' must be 'fake' or 'like:<argument>', got NoneType None"),
    ],
)
def test_aot_launch_fields_of_the_wrong_type_are_type_errors(field, value, message):
    fields = {
        "kernel": "opreg_test_scale",
        "grid": ("1",),
        "arguments": ("x", "out0", "numel(x)", "f"),
    }
    fields |= {"outputs": "like:x", field: value}
    with pytest.raises(TypeError, match=re.escape(f"opreg.AotLaunch: {message}")):
        _C.AotLaunch(**fields)
    name = f"wrong_{field}_{type(value).__name__}"
    with pytest.raises(TypeError, match=re.escape(f"opreg.AotLaunch: {message}")):
        define_declared(name, **fields)
    assert not hasattr(torch.ops.aot_rel, name)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["x", "out0", "numel(x)"],
            "aot_kernel 'opreg_test_scale' takes 4 arguments (x_ptr: *fp32, out_ptr: *fp32, "
            "n: i64, factor: fp32), the launch gives 3",
        ),
        (
            ["x", "out0", "f", "f"],
            "aot_kernel 'opreg_test_scale': argument 2 ('f') is a float, the kernel's parameter "
            "'n' is an integer (i64)",
        ),
        (
            ["x", "k", "numel(x)", "f"],
            "aot_kernel 'opreg_test_scale': argument 1 ('k') is an integer, the kernel's "
            "parameter 'out_ptr' is a pointer (*fp32)",
        ),
        (
            ["x", "out0", "numel(x)", "x"],
            "aot_kernel 'opreg_test_scale': argument 3 ('x') is a tensor, the kernel's "
            "parameter 'factor' is a float (fp32)",
        ),
    ],
)
def test_declared_arguments_must_fit_a_loaded_kernel_at_definition(aot_bundle, arguments, message):
    name = f"mismatch_{abs(hash(message)) % 10**8}"
    with pytest.raises(ValueError) as error:
        define_declared(name, ["1"], arguments)
    assert f"aot_rel::{name}: {message}" in str(error.value)
    assert f"aot_rel::{name}" not in {r.name for r in opreg.describe_ops()}


def test_an_integer_for_a_float_parameter_is_converted(aot_bundle):
    op = define_declared("int_for_float", ["cdiv(numel(x), 512)"], ["x", "out0", "numel(x)", "k"])
    x = torch.randn(700, device=DEVICES[-1])
    torch.testing.assert_close(op(x, 2.0, 2), x * 2)  # on CUDA the kernel computes x * k


def test_declared_arguments_are_checked_on_the_first_call_once_the_kernel_loads(
    aot_bundle, tmp_path
):
    kernel = "opreg_rel_late_scale"
    op = define_declared("late", ["1"], ["x", "out0", "f", "f"], kernel=kernel)  # f for n: i64
    x = torch.randn(5)
    with opreg.trace() as t:
        torch.testing.assert_close(op(x, 2.0, 1), x * 2)  # not loaded: the fallback serves
    assert t.impls()[0] == "fallback(declined by kernel:triton_aot)"
    (tmp_path / "index.txt").write_text(renamed_manifest(aot_bundle, tmp_path, kernel) + "\n")
    opreg.load_triton_bundle(tmp_path)
    message = (
        f"aot_rel::late: aot_kernel '{kernel}': argument 2 ('f') is a float, the kernel's "
        "parameter 'n' is an integer (i64)"
    )
    for _ in range(2):  # every call, never a launch
        with pytest.raises(ValueError) as error:
            op(x, 2.0, 1)
        assert message in str(error.value)


def test_off_cuda_the_declared_kernel_declines_before_evaluating():
    op = define_declared(
        "decline_first", ["cdiv(size(x, 3), 512)"], ["x", "out0", "stride(x, 3)", "f"]
    )
    x = torch.randn(10)
    with opreg.trace() as t:
        torch.testing.assert_close(op(x, 2.0, 1), x * 2)
    assert t.impls()[0] == "fallback(declined by kernel:triton_aot)"


@requires_cuda
def test_dims_out_of_range_at_call_time_are_value_errors(aot_bundle):
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    op = opreg.register_triton_op(
        fake_fn=lambda x: torch.empty_like(x),
        triton_fn=None,
        aot=opreg.AotLaunch(
            "opreg_test_scale", ("1",), ("x", "out0", "size(x, 2)", "2.0"), "like:x"
        ),
        name="aot_rel::dim_range",
    )(fn)
    with pytest.raises(
        ValueError, match=r"size\(x, 2\): dim 2 is out of range for argument 'x' of 1"
    ):
        op(torch.randn(8, device="cuda"))


# ---- 6. philox sizes that cannot be allocated ----

PHILOX_PROBE = """
import json, torch, opreg
seeds = torch.arange(3, dtype=torch.int64)
out = []
for op, n in [("philox_uniform", 2**63 - 1), ("philox_normal", 2**63 - 1),
              ("philox_uniform", 2**61), ("philox_uniform", -1)]:
    try:
        getattr(torch.ops.opreg, op)(seeds, n)
        out.append(["ok", ""])
    except Exception as error:
        out.append([type(error).__name__, str(error).splitlines()[0]])
small = torch.ops.opreg.philox_uniform(seeds, 5)
out.append(["shape", list(small.shape)])
print(json.dumps(out))
"""


def test_philox_sizes_that_cannot_be_allocated_are_value_errors():
    result = subprocess.run([sys.executable, "-c", PHILOX_PROBE], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    outcomes = json.loads(result.stdout.strip().splitlines()[-1])
    limit = (2**63 - 1) // 8 // 3 - 3
    assert outcomes[0] == [
        "ValueError",
        "opreg::philox_uniform: argument 'n' = 9223372036854775807 is too large: 3 seed(s) "
        f"times n values cannot be allocated (n must be at most {limit})",
    ]
    assert outcomes[1][0] == "ValueError" and "opreg::philox_normal: argument 'n'" in outcomes[1][1]
    assert outcomes[2][0] == "ValueError" and "is too large" in outcomes[2][1]
    assert outcomes[3] == ["ValueError", "opreg::philox_uniform: argument 'n' must be >= 0, got -1"]
    assert outcomes[4] == ["shape", [3, 5]]


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"kernel": 5}, "'kernel' must be a str, the name of an AOT Triton kernel, got int 5"),
        ({"grid": "cdiv(numel(x), 4)"}, "'grid' must be a tuple of str expressions"),
        ({"arguments": None}, "'arguments' must be a tuple of str expressions .* got NoneType"),
        ({"arguments": ("x", 5)}, "'arguments' must be a tuple of str expressions"),
        ({"outputs": None}, "'outputs' must be 'fake' or 'like:<argument>', got NoneType None"),
    ],
)
def test_the_python_aot_launch_checks_its_fields_when_made(fields, words):
    given = {"kernel": "k", "grid": ("1",), "arguments": ("x",), **fields}
    with pytest.raises(TypeError, match="opreg.AotLaunch: " + words):
        opreg.AotLaunch(**given)
