"""Regression tests for the thirty-third adversarial sweep's findings (reports kept outside the
repository), beside the earlier sweeps' files."""

from __future__ import annotations

import pytest
import torch

import opreg


@pytest.mark.parametrize(
    ("output", "value", "error", "message"),
    [
        ("float", 10**400, ValueError, "returned 1000.* for output 0, which a double cannot hold"),
        ("Scalar", 2**70, ValueError, "returned 1180.* for output 0, which a 64-bit int cannot"),
        (
            "int[]",
            [1, 2**63],
            ValueError,
            "returned 9223372036854775808 as element 1 of output 0, which a 64-bit int cannot",
        ),
        ("ScalarType", "float32", TypeError, "expected ScalarType \\(the schema's return type"),
        ("Layout", "strided", TypeError, "expected Layout \\(the schema's return type"),
    ],
)
def test_a_non_tensor_output_that_does_not_fit_says_why(output, value, error, message):
    # A-F3: an int too large for the C++ value was said to be of the wrong type ("returned int,
    # expected float"); A-F4: a ScalarType or Layout output was said to expect an int.
    name = f"sweep33::misfit_{output.strip('[]').lower()}"
    op = opreg.custom_op(name, lambda x: value, mutates_args=(), schema=f"(Tensor x) -> {output}")
    with pytest.raises(error, match=f"{name}: .*{message}"):
        op(torch.ones(1))


def test_a_fakes_output_that_does_not_fit_says_why():
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = opreg.custom_op(
        "sweep33::fake_misfit", lambda x: 1.0, mutates_args=(), schema="(Tensor x) -> float"
    )
    op.register_fake(lambda x: 10**400)
    with (
        FakeTensorMode(),
        pytest.raises(ValueError, match=r"its fake returned 1000.*, which a double cannot hold"),
    ):
        op(torch.empty(1))
