"""Regression tests for the thirty-first adversarial sweep's findings (reports kept outside the
repository), beside the earlier sweeps' files."""

from __future__ import annotations

import pytest
import torch

import opreg


def _rows(report: opreg.OpcheckReport, check: str) -> list[opreg.CheckRow]:
    rows = [r for r in report.rows if r.check == check]
    assert rows, check
    return rows


def test_opcheck_checks_the_kernel_on_a_sample_that_requires_grad():
    # B-F1: with autograd="fallback" (the default) a call whose input requires grad goes to the
    # fallback, so kernel_vs_fallback compared the fallback with itself and a wrong kernel passed.
    if not opreg.has_triton():
        pytest.skip("the Python front registers triton_fn only when Triton works")

    @opreg.register_triton_op(
        fake_fn=torch.empty_like,
        triton_fn=lambda x: x + 5,
        triton_device_types="cpu",
        name="sweep31::plus_five",
    )
    def plus_five(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    sample = opreg.Sample((torch.zeros(2, requires_grad=True),))
    (row,) = _rows(opcheck_rows(plus_five, sample), "kernel_vs_fallback")
    assert not row.passed
    assert "output 0 differs from the fallback's by up to 4" in row.message


def opcheck_rows(op, sample: opreg.Sample) -> opreg.OpcheckReport:
    return opreg.opcheck(op, [sample], devices=["cpu"], raise_on_failure=False)


def test_opcheck_leaves_out_the_stride_of_a_dim_of_size_one():
    # B-F4: a fake differing from the real output only there failed fake_vs_real.
    @opreg.custom_op("sweep31::column", mutates_args=())
    def column(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(1, -1).clone().t()  # strides (1, n)

    column.register_fake(lambda x: x.new_empty(x.numel(), 1))
    assert column(torch.zeros(3)).stride() == (1, 3)
    report = opcheck_rows(column, opreg.Sample((torch.zeros(3),)))
    assert all(r.passed for r in _rows(report, "fake_vs_real"))


def test_opcheck_compares_sparse_outputs_by_value():
    # B-F5: the kernel_vs_fallback row met aten::max's "Could not run ... SparseCPU".
    if not opreg.has_triton():
        pytest.skip("the Python front registers triton_fn only when Triton works")

    @opreg.register_triton_op(
        fake_fn=lambda x: torch.empty(x.shape, layout=torch.sparse_coo, device="meta"),
        triton_fn=lambda x: (x + 1).to_sparse(),
        triton_device_types="cpu",
        name="sweep31::sparse",
    )
    def sparse(x: torch.Tensor) -> torch.Tensor:
        return x.to_sparse()

    report = opcheck_rows(sparse, opreg.Sample((torch.tensor([0.0, 1.0, 0.0]),)))
    (row,) = _rows(report, "kernel_vs_fallback")
    assert not row.passed
    assert "output 0 differs from the fallback's by up to 1" in row.message


@pytest.mark.parametrize("front", ["custom_op", "triton_op"])
def test_a_bad_schema_is_shown_with_the_parsers_position_marker(front):
    # A-F3: custom_op and triton_op kept the first line only, ending in a dangling "here:".
    define = getattr(opreg, front)
    with pytest.raises(ValueError) as error:
        define(f"sweep31::{front}_marker", mutates_args=(), schema="(Tensor x, int y=) -> Tensor")(
            lambda x, y: x.clone()
        )
    lines = str(error.value).splitlines()
    assert lines[0].endswith("expected number but found ')' here:")
    assert lines[1] == f"sweep31::{front}_marker(Tensor x, int y=) -> Tensor"
    assert lines[2].endswith("~ <--- HERE")


def test_compiled_autograd_over_an_explicit_backward_names_the_op():
    # A-F2: torch's "compiled_args not implemented: ...Backward" and C++ frames reached the user.
    import torch._dynamo.compiled_autograd as compiled_autograd

    @opreg.custom_op("sweep31::sin", mutates_args=())
    def sin(x: torch.Tensor) -> torch.Tensor:
        return x.sin()

    sin.register_autograd(
        lambda ctx, grad: grad * ctx.x.cos(),
        setup_context=lambda ctx, inputs, output: setattr(ctx, "x", inputs[0]),
    )
    x = torch.randn(4, requires_grad=True)
    with (
        pytest.raises(NotImplementedError) as error,
        compiled_autograd._enable(torch.compile(backend="eager")),
    ):
        sin(x).sum().backward()
    assert str(error.value).startswith(
        "sweep31::sin: torch's compiled autograd cannot trace this opreg op's backward; run the "
        "backward without it"
    )
    assert "frame #0" not in str(error.value)
    sin(x).sum().backward()  # and without it, the backward runs
    torch.testing.assert_close(x.grad, x.detach().cos())
