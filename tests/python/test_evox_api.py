"""EvoX's Triton backend API from opreg (``evox.triton_kernels``: has_triton, triton_device_types,
triton_supports_device, register_triton_device_type, register_triton_op): EvoX's return types
and meanings, and odd arguments answered as documented (docs/evox.md), never a crash. Tests that
register a device type run in a subprocess: a registered type cannot be taken back."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from unittest import mock

import pytest
import torch

import opreg
from opreg import _triton


def _run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_five_names_import_from_opreg():
    from opreg import (  # noqa: F401
        has_triton,
        register_triton_device_type,
        register_triton_op,
        triton_device_types,
        triton_supports_device,
    )

    assert all(callable(f) for f in (has_triton, register_triton_device_type, register_triton_op))


def test_return_types_are_evox_s():
    assert isinstance(opreg.has_triton(), bool)
    types = opreg.triton_device_types()
    assert isinstance(types, frozenset)
    assert "cuda" in types
    assert isinstance(opreg.triton_supports_device("cuda"), bool)


def test_triton_device_types_is_a_snapshot_in_step_with_the_registry():
    assert opreg.triton_device_types() == frozenset(opreg.accelerated_device_types())
    with pytest.raises(AttributeError):
        opreg.triton_device_types().add("npu")  # type: ignore[attr-defined]


CUDA_WORKS = opreg.has_triton() and torch.cuda.is_available()


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        ("cuda", CUDA_WORKS),
        ("cuda:0", CUDA_WORKS),
        (" cuda :3", CUDA_WORKS),  # the type before ':', stripped; the index is not checked
        (torch.device("cuda:1"), CUDA_WORKS),
        (torch.device("cuda"), CUDA_WORKS),
        ("cpu", False),
        (torch.device("cpu"), False),
        ("meta", False),
        ("CUDA", False),  # case is kept, as in EvoX (and torch.device("CUDA") is an error)
        ("", False),
        ("nonsense", False),
        ("npu:0", False),  # not registered in this process
        (":", False),
    ],
    ids=repr,
)
def test_triton_supports_device_answers_any_string(device, expected):
    assert opreg.triton_supports_device(device) is expected


@pytest.mark.parametrize("device", [None, 5, 1.5, ["cuda"], b"cuda"], ids=repr)
def test_triton_supports_device_refuses_a_non_device_with_a_type_error(device):
    with pytest.raises(TypeError, match=r"triton_supports_device: device must be .* got"):
        opreg.triton_supports_device(device)


def test_without_working_triton_no_device_is_supported():
    with mock.patch.object(_triton, "has_triton", return_value=False):
        assert opreg.triton_supports_device("cuda") is False
        assert opreg.triton_supports_device(torch.device("cuda:0")) is False


def test_with_working_triton_cuda_needs_an_available_device():
    with mock.patch.object(_triton, "has_triton", return_value=True):
        assert opreg.triton_supports_device("cuda") is torch.cuda.is_available()
        assert opreg.triton_supports_device("cpu") is False


@pytest.mark.parametrize("name", [None, 5, b"npu", ["npu"]], ids=repr)
def test_register_triton_device_type_refuses_a_non_string(name):
    before = opreg.triton_device_types()
    with pytest.raises(TypeError, match="register_triton_device_type: device_type must be a str"):
        opreg.register_triton_device_type(name)
    assert opreg.triton_device_types() == before


@pytest.mark.parametrize("name", ["", "   ", "\t\n"], ids=repr)
def test_register_triton_device_type_ignores_an_empty_name(name):
    before = opreg.triton_device_types()
    assert opreg.register_triton_device_type(name) is None
    assert opreg.triton_device_types() == before


def test_a_registered_type_is_normalised_supported_and_reaches_earlier_ops():
    out = _run("""
        from unittest import mock
        import torch, opreg
        from opreg import _triton

        @opreg.register_triton_op(fake_fn=lambda x: torch.empty_like(x),
                                  triton_fn=lambda x: x * 2, name="evox_api::early")
        def early(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        assert opreg.register_triton_device_type(" NPU ") is None
        assert opreg.register_triton_device_type("npu") is None  # twice: no change
        assert opreg.triton_device_types() == frozenset({"cuda", "npu"})
        with mock.patch.object(_triton, "has_triton", return_value=True):
            assert opreg.triton_supports_device("npu") is True
            assert opreg.triton_supports_device("npu:1") is True
            assert opreg.triton_supports_device("NPU") is False
            assert opreg.triton_supports_device("cpu") is False
        if not opreg.has_triton():
            assert opreg.triton_supports_device("npu") is False
        # The op defined before the registration serves npu too; this PyTorch has no npu, so
        # its report says the kernel skips it and why.
        assert torch.equal(early(torch.ones(2)), torch.full((2,), 2.0))
        print(opreg.describe_op("evox_api::early").describe())
    """)
    assert "npu" in out


def test_info_reports_why_a_registered_device_type_is_not_served():
    out = _run("""
        import opreg
        from opreg._info import format_info
        opreg.register_triton_device_type("npu")
        print(format_info())
    """)
    assert "npu: no torch.npu module in this PyTorch build" in out


def test_register_triton_op_takes_a_string_or_a_sequence_of_triton_device_types():
    # EvoX's own check, in our words: both forms define the op, and the fallback serves CPU.
    def fake(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    def fallback(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    for name, types in (("evox_api::one_type", "npu"), ("evox_api::two_types", ["cuda", "npu"])):
        op = opreg.register_triton_op(
            name=name,
            fake_fn=fake,
            triton_fn=lambda x: x.clone(),
            device_types=["cpu"],
            triton_device_types=types,
        )(fallback)
        x = torch.randn(4)
        assert torch.equal(op(x), x)
