"""Regression tests for the twenty-eighth adversarial sweep's findings in the core (reports kept
outside the repository): a library rebuilt under a path loaded before, and a Triton bundle's
config values. The C++ side of each (and opreg::testing::check on random ops) is in tests/cpp/."""

from __future__ import annotations

import json

import pytest
from test_reliability import assert_survived, run_probe

import opreg

# ---- B-F7: opreg.load_library of a library rebuilt under a path loaded before ------------------


@pytest.fixture
def scripted(test_ops_library):
    """The path of the scripted test library `name` (tests/op_library/scripted_ops.cpp)."""
    return lambda name: str(test_ops_library.parent / f"libopreg_scripted_{name}.so")


def test_a_library_rebuilt_under_a_loaded_path_is_refused(scripted, tmp_path):
    # The dynamic loader hands back the library it mapped for a path: the second load reported
    # success, and none of the new file's ops was defined.
    path, copy = tmp_path / "libopreg_rebuilt.so", tmp_path / "libopreg_rebuilt_copy.so"
    result = run_probe(
        f"""
        import os, shutil, torch
        os.environ["OPREG_SCRIPT_a"] = "def:rebuilt_old:1"
        os.environ["OPREG_SCRIPT_b"] = "def:rebuilt_new:2"
        import opreg
        def defined(name):
            return name in {{report.name for report in opreg.describe_ops()}}
        shutil.copy({scripted("a")!r}, {str(path)!r})
        opreg.load_library({str(path)!r})
        opreg.load_library({str(path)!r})  # the same file again: as before
        os.remove({str(path)!r})
        shutil.copy({scripted("b")!r}, {str(path)!r})  # rebuilt: another file at the path
        for attempt in range(2):
            try:
                opreg.load_library({str(path)!r})
                print("loaded")
            except ValueError as error:
                print("refused:", error)
        print("new op:", defined("opreg_script::rebuilt_new"))
        print("old op:", torch.ops.opreg_script.rebuilt_old(torch.zeros(1)).tolist())
        shutil.copy({str(path)!r}, {str(copy)!r})
        opreg.load_library({str(copy)!r})
        print("from a copy:", torch.ops.opreg_script.rebuilt_new(torch.zeros(1)).tolist())
        """
    )
    assert_survived(result)
    out = result.stdout
    assert "loaded\n" not in out, out
    assert (
        out.count(
            f"refused: opreg::load_library: cannot load '{path}': a library was loaded from that "
            "path earlier in this process, from another file than the one there now (loaded: device"
        )
        == 2
    ), out
    assert (
        "a process cannot load a rebuilt library under the same path again: restart the "
        "process to load it"
    ) in out, out
    assert "new op: False" in out, out
    assert "old op: [1.0]" in out, out
    assert "from a copy: [2.0]" in out, out


def test_a_library_written_again_in_place_is_refused_until_it_is_as_it_was(scripted, tmp_path):
    # The same inode with another modification time (or size): the file was written again after
    # it was mapped. Put back as it was, it loads again.
    path = tmp_path / "libopreg_touched.so"
    result = run_probe(
        f"""
        import os, shutil
        os.environ["OPREG_SCRIPT_c"] = "def:touched:3"
        import opreg
        shutil.copy({scripted("c")!r}, {str(path)!r})
        opreg.load_library({str(path)!r})
        before = os.stat({str(path)!r})
        os.utime({str(path)!r}, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
        try:
            opreg.load_library({str(path)!r})
            print("loaded while changed")
        except ValueError as error:
            print("refused:", error)
        os.utime({str(path)!r}, ns=(before.st_atime_ns, before.st_mtime_ns))
        opreg.load_library({str(path)!r})
        print("loaded as it was")
        """
    )
    assert_survived(result)
    assert f"refused: opreg::load_library: cannot load '{path}'" in result.stdout, result.stdout
    assert "loaded while changed" not in result.stdout
    assert "loaded as it was" in result.stdout


# ---- B-F8: the values of a Triton bundle's config ------------------------------------------------

CUBIN = b"\x7fELF\x02\x01" + bytes(12) + (190).to_bytes(2, "little") + bytes(44)


def write_bundle(folder, kernel: str, config: dict) -> None:
    folder.mkdir()
    (folder / "k.cubin").write_bytes(CUBIN)
    (folder / "index.txt").write_text("k.json\n")
    variant = {
        "arch": 80,
        "entry": "k",
        "num_warps": 4,
        "num_ctas": 1,
        "shared": 0,
        "global_scratch_size": 0,
        "global_scratch_align": 1,
        "profile_scratch_size": 0,
        "profile_scratch_align": 1,
        "launch_pdl": False,
        "launch_cooperative_grid": False,
        "assumptions": [],
        "config": config,
        "param_sizes": [8, 8],
        "file": "k.cubin",
    }
    manifest = {
        "format": "opreg-triton-aot/1",
        "kernel": kernel,
        "params": [],
        "variants": [variant],
    }
    (folder / "k.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    "config, expected",
    [
        (
            {"num_stages": "three"},
            "'num_stages' must be a pipeline depth from 1 to 16 (an integer), got \"three\"",
        ),
        (
            {"num_stages": -5},
            "'num_stages' must be a pipeline depth from 1 to 16 (an integer), got -5",
        ),
        (
            {"maxnreg": [1, 2]},
            "'maxnreg' must be a register count from 1 to 255 (an integer), got [1,2]",
        ),
        ({"maxnreg": 0}, "'maxnreg' must be a register count from 1 to 255 (an integer), got 0"),
        ({"num_ctas": 17}, "'num_ctas' must be a CTA count from 1 to 16 (an integer), got 17"),
        (
            {"num_warps": 4.0},
            "'num_warps' must be a power of two from 1 to 32 (an integer), got 4.0",
        ),
    ],
)
def test_a_bundle_configs_values_are_checked(tmp_path, config, expected):
    # The keys were checked, not the values: they loaded and showed in triton_kernels().
    write_bundle(tmp_path / "b", "opreg_sweep28_config", config)
    with pytest.raises(ValueError) as raised:
        opreg.load_triton_bundle(tmp_path / "b")
    assert (
        f"opreg: Triton manifest {tmp_path}/b/k.json: kernel 'opreg_sweep28_config', variant 0: "
        f"field 'config' entry {expected}"
    ) in str(raised.value)
    assert "opreg_sweep28_config" not in {k["name"] for k in opreg.triton_kernels()}


def test_a_bundle_config_within_the_compilers_limits_loads(tmp_path):
    config = {"num_warps": 32, "num_stages": 16, "num_ctas": 1, "maxnreg": 255}
    config_text = "maxnreg=255 num_ctas=1 num_stages=16 num_warps=32"
    write_bundle(tmp_path / "b", "opreg_sweep28_config_ok", config)
    manifest = json.loads((tmp_path / "b" / "k.json").read_text())
    manifest["variants"][0]["num_warps"] = 32
    (tmp_path / "b" / "k.json").write_text(json.dumps(manifest))
    assert opreg.load_triton_bundle(tmp_path / "b") == ["opreg_sweep28_config_ok"]
    (kernel,) = [k for k in opreg.triton_kernels() if k["name"] == "opreg_sweep28_config_ok"]
    assert [variant["config"] for variant in kernel["variants"]] == [config_text]
