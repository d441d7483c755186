"""Regression tests for the fourteenth sweep's findings in the Python front (those of loading
and the AOT tools are in test_reliability.py and test_reliability_aot.py)."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

import opreg


def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def thrice(x: torch.Tensor) -> torch.Tensor:
    return x * 3


def raising(error: Exception):
    def piece(*args, **kwargs):
        raise error

    return piece


def notes_of(raised: pytest.ExceptionInfo) -> list[str]:
    return getattr(raised.value, "__notes__", [])


def test_errors_of_every_python_piece_keep_their_type_and_get_a_note_naming_the_op():
    # The fallback's and kernels' errors had the note; those of the backward, setup_context,
    # vmap rule, triton_accepts and fake did not, and named no op.
    x = torch.ones(3, requires_grad=True)

    op = opreg.register_triton_op(
        fake_fn=torch.empty_like,
        triton_fn=None,
        name="note14::backward",
        backward=raising(ValueError("backward broke")),
        setup_context=lambda ctx, inputs, output: None,
    )(twice)
    with pytest.raises(ValueError, match="backward broke") as raised:
        op(x).sum().backward()
    assert notes_of(raised) == ["opreg: raised in the backward of note14::backward"]

    op = opreg.register_triton_op(
        fake_fn=torch.empty_like,
        triton_fn=None,
        name="note14::setup_context",
        backward=lambda ctx, grad: grad * 2,
        setup_context=raising(KeyError("setup broke")),
    )(twice)
    with pytest.raises(KeyError, match="setup broke") as raised:
        op(x)
    assert notes_of(raised) == ["opreg: raised in the setup_context of note14::setup_context"]

    op = opreg.register_triton_op(
        fake_fn=torch.empty_like,
        triton_fn=None,
        name="note14::vmap_rule",
        vmap=raising(IndexError("rule broke")),
    )(twice)
    with pytest.raises(IndexError, match="rule broke") as raised:
        torch.vmap(op)(torch.ones(2, 3))
    assert notes_of(raised) == ["opreg: raised in the vmap rule of note14::vmap_rule"]

    op = opreg.register_triton_op(
        fake_fn=torch.empty_like,
        triton_fn=twice,
        triton_device_types="cpu",
        triton_accepts=raising(ValueError("accepts broke")),
        name="note14::accepts",
    )(twice)
    with pytest.raises(ValueError, match="accepts broke") as raised:
        op(torch.ones(3))
    assert notes_of(raised) == [
        "opreg: raised in the accepts of kernel 'triton' of note14::accepts"
    ]

    op = opreg.register_triton_op(
        fake_fn=raising(RuntimeError("fake broke")), triton_fn=None, name="note14::fake"
    )(twice)
    with pytest.raises(RuntimeError, match="fake broke") as raised:
        op(torch.ones(3, device="meta"))
    assert "opreg: raised in the fake of note14::fake" in notes_of(raised)


def test_an_int_output_out_of_the_64_bit_range_is_said_so():
    # "returned <class 'int'> for output 0, expected int" contradicted itself.
    op = opreg.register_triton_op(
        fake_fn=None, triton_fn=None, name="sweep14::huge_int", schema="(Tensor x) -> int"
    )(lambda x: 2**70)
    with pytest.raises(
        ValueError,
        match=r"returned 1180591620717411303424 for output 0, which a "
        r"64-bit int cannot hold",
    ):
        op(torch.ones(1))


def test_batch_polymorphic_and_the_per_example_loop_together_are_refused():
    # Both were accepted, and which of the two vmap used was not what the declaration said.
    opreg.register_triton_op(fake_fn=torch.empty_like, triton_fn=None, name="sweep14::both")(twice)
    with pytest.raises(ValueError, match="batch_polymorphic and vmap_per_example_loop are both"):
        opreg.register_triton_op(
            fake_fn=torch.empty_like,
            triton_fn=None,
            name="sweep14::both",
            batch_polymorphic=True,
            vmap_per_example_loop=True,
            replace=True,
        )(thrice)
    torch.testing.assert_close(torch.ops.sweep14.both(torch.ones(2)), torch.full((2,), 2.0))


def test_an_op_without_tensor_arguments_traces_without_a_fake():
    # FakeTensorMode took it for a factory and called it with device='meta', which its schema
    # lacks: "expected at most 1 argument(s) but received 2", under torch.compile too.
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = opreg.register_triton_op(
        fake_fn=None, triton_fn=None, name="sweep14::count_up", schema="(int n) -> Tensor"
    )(lambda n: torch.arange(n, dtype=torch.float32))
    with FakeTensorMode():
        fake = op(3)
    assert fake.shape == (3,) and fake.dtype == torch.float32
    compiled = torch.compile(lambda: op(5) + 1, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(), torch.arange(5, dtype=torch.float32) + 1)


@pytest.mark.parametrize("load", [opreg.load_library, opreg.load_triton_bundle])
def test_an_empty_path_is_said_to_be_empty(load):
    # load_library("") said "no library at ." (Path("") is the current folder).
    with pytest.raises(ValueError, match="'path' is empty"):
        load("")


def test_bytes_that_are_not_utf8_are_escaped_in_messages(test_ops_library, tmp_path):
    # A C++ piece's error, a library's path and a manifest with a 0xff byte raised
    # UnicodeDecodeError (or pybind's "incompatible function arguments" for the path) instead of
    # the error naming what failed.
    with pytest.raises(RuntimeError, match=r"opreg_test::throws_bytes: .*bad \\xff byte"):
        torch.ops.opreg_test.throws_bytes(torch.ones(1))
    missing = os.fsdecode(bytes(tmp_path) + b"/lib\xff.so")
    with pytest.raises(FileNotFoundError):
        opreg.load_library(missing)
    failing = test_ops_library.parent / "libopreg_failing_bad_schema.so"
    odd = os.fsdecode(bytes(tmp_path) + b"/odd\xff.so")
    shutil.copy(failing, odd)
    with pytest.raises(ValueError, match=r"odd\\xff\.so' defines ops that failed"):
        opreg.load_library(odd)
    replacing = os.fsdecode(bytes(tmp_path) + b"/replacing\xff.so")
    shutil.copy(test_ops_library.parent / "libopreg_replacing_ops.so", replacing)
    opreg.load_library(replacing)  # it loads, and its ops' origin is a str
    assert opreg.describe_op("opreg_replacing::op").origin.endswith("/replacing\\xff.so")
    folder = tmp_path / "bundle"
    folder.mkdir()
    (folder / "index.txt").write_text("k.json\n")
    (folder / "k.json").write_bytes(b'{"format": "opreg-triton-aot/1", "kernel": "k\xff"}')
    with pytest.raises(ValueError, match=r"k\.json is not valid JSON: .*\\xff"):
        opreg.load_triton_bundle(folder)
