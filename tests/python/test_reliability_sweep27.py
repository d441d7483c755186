"""Regression tests for the twenty-seventh adversarial sweep's findings (reports kept outside the
repository), beside the earlier sweeps' files."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from test_reliability import assert_survived, run_probe
from test_reliability_aot import assert_one_line_error, run_aot, scale_spec

import opreg
from conftest import TEST_OPS_LIBRARY

# ---- A-F1, A-F2: opreg.load_library's lookup of names -----------------------------------------


def test_a_path_with_a_slash_is_used_as_given(tmp_path):
    # Path("./lib.so") reads as "lib.so": the name was looked up on LD_LIBRARY_PATH, where another
    # library of that name was loaded instead, without a word.
    listed, cwd = tmp_path / "listed", tmp_path / "cwd"
    listed.mkdir()
    cwd.mkdir()
    (listed / "libopreg_probe27.so").write_bytes(b"not a library")
    shutil.copy(TEST_OPS_LIBRARY, cwd / "libopreg_probe27.so")
    result = run_probe(
        f"""
        import os
        os.environ["LD_LIBRARY_PATH"] = {str(listed)!r}
        os.chdir({str(cwd)!r})
        import opreg
        opreg.load_library("./libopreg_probe27.so")
        print("loaded:", sorted({{r.origin.split(":")[0] for r in opreg.describe_ops()
                                 if "probe27" in r.origin}}))
        """
    )
    assert_survived(result)
    assert f"loaded: ['{cwd}/libopreg_probe27.so']" in result.stdout, result.stdout


def test_the_bare_name_of_a_loaded_library_is_accepted():
    # The core accepts it (the dynamic loader found it by a runpath); the Python front refused it.
    result = run_probe(
        """
        import opreg
        opreg.load_library("libopreg_ops.so")  # opreg's shipped ops, loaded by the import
        print("loaded again")
        """
    )
    assert_survived(result)
    assert "loaded again" in result.stdout


# ---- A-F4: opcheck on a device type PyTorch names but has no backend for here -----------------


@pytest.mark.parametrize("device", ["hpu", "lazy", "privateuseone"])
def test_opcheck_skips_a_device_type_without_a_backend_with_the_reason(device):
    op = opreg.register_triton_op(
        fake_fn=torch.empty_like,
        triton_fn=None,
        name=f"opreg_sweep27::on_{device}",
        schema="(Tensor x) -> Tensor",
    )(lambda x: x * 2)
    report = opreg.opcheck(op, devices=[device], checks=["fake_vs_real"])
    assert report.rows and all(row.skipped for row in report.rows)
    assert f"no {device} device here" in report.rows[0].message


# ---- A-F3: mutates_args that is no sequence -----------------------------------------------------


@pytest.mark.parametrize("api", ["custom_op", "triton_op"])
def test_mutates_args_that_is_not_a_sequence_names_the_op(api):
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    with pytest.raises(TypeError, match="op 'opreg_sweep27::mutates': mutates_args must be a"):
        getattr(opreg, api)("opreg_sweep27::mutates", mutates_args=5)(fn)


# ---- B-F3: an error of a fallback that FakeTensorMode ran came back empty ---------------------


def test_a_fallback_error_under_fake_tensor_mode_keeps_its_message():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with (
        FakeTensorMode(),
        pytest.raises(RuntimeError, match="upper bound and lower bound") as raised,
    ):
        torch.ops.opreg_test.arange(-3)  # no tensor: FakeTensorMode runs the fallback
    assert "opreg: raised in the fallback of opreg_test::arange" in raised.value.__notes__[0]


# ---- B-F5: a NUL in a bundle's path -------------------------------------------------------------


@pytest.mark.parametrize("function", ["load_triton_bundle", "load_library"])
def test_a_path_with_a_nul_is_refused_as_such(tmp_path, function):
    with pytest.raises(ValueError, match="holds a NUL character"):
        getattr(opreg, function)(f"{tmp_path}\0tail")


# ---- B-F1, B-F7: python -m opreg.aot with --emit-cpp on a device, a source that is a link loop --


def test_emit_cpp_does_not_replace_what_is_no_regular_file(tmp_path):
    # A device (seen: /dev/full) was replaced by a regular file, and the run succeeded.
    target = tmp_path / "device.cpp"
    target.symlink_to("/dev/null")
    result = run_aot(scale_spec(), tmp_path, "--emit-cpp", str(target))
    assert_one_line_error(result, "it is not a regular file")
    assert target.is_symlink() and os.readlink(target) == "/dev/null"


def test_a_kernel_source_that_is_a_link_loop_is_one_line(tmp_path):
    (tmp_path / "loop.py").symlink_to(tmp_path / "loop.py")
    spec = scale_spec(source=f'"{tmp_path / "loop.py"}:scale_kernel"')
    assert_one_line_error(run_aot(spec, tmp_path), "loop.py", "cannot resolve the path")
