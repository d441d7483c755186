"""Regression tests for the thirtieth adversarial sweep's findings (reports kept outside the
repository), beside the earlier sweeps' files."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import opreg


def test_opcheck_generates_a_valid_value_for_an_enum_argument():
    # A-F1: a MemoryFormat argument (whose type reads as int) was given 5, which is none, and a
    # correct op failed 60 of its 80 checks.
    @opreg.custom_op(
        "sweep30::formatted", mutates_args=(), schema="(Tensor x, MemoryFormat m) -> Tensor"
    )
    def formatted(x, m):
        return x.clone()

    report = opreg.opcheck(formatted, raise_on_failure=False)
    assert not report.failures, report.failures[0]
    assert any(r.passed and not r.skipped for r in report.rows)


def test_a_fakes_list_output_of_a_declared_length_is_checked():
    # A-F2: a fake returning 3 numbers for an int[2] output was taken, and compiled code that
    # used them made a tensor of the wrong shape.
    @opreg.custom_op("sweep30::shape2", mutates_args=(), schema="(Tensor x) -> int[2]")
    def shape2(x):
        return [x.shape[0], 2]

    shape2.register_fake(lambda x: [x.shape[0], 2, 1])
    assert shape2(torch.ones(4)) == [4, 2]
    with (
        FakeTensorMode() as mode,
        pytest.raises(ValueError, match=r"3 elements for output 0, expected 2"),
    ):
        shape2(mode.from_tensor(torch.ones(4)))
