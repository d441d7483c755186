"""Regression tests for the nineteenth sweep's findings in opcheck and the Python front
(tester A: A-F5, A-F13, A-F11, A-F8, A-F4, A-F16)."""

from __future__ import annotations

import pytest
import torch

import opreg


def test_fake_vs_real_names_the_output_a_fake_leaves_none():
    # A-F5: a Tensor? output the fake gives as None was a bare "zip() argument 2 is longer".
    op = opreg.register_vmap_op(
        fake_fn=lambda x: (torch.empty_like(x), None),
        name="sw19::fake_none",
        schema="(Tensor x) -> (Tensor, Tensor?)",
    )(lambda x: (x * 2, x * 3))
    with pytest.raises(opreg.OpcheckError) as failure:
        opreg.opcheck(op, [(torch.randn(3),)], devices=["cpu"], checks=["fake_vs_real"])
    assert (
        "fake_vs_real failed for sw19::fake_none on cpu, sample '#0': output 1 "
        "(Optional[Tensor]): the fake gives None, the real op a tensor"
    ) in str(failure.value)


def test_fake_vs_real_names_a_tensor_list_of_another_length():
    op = opreg.register_vmap_op(
        fake_fn=lambda x: [torch.empty_like(x)],
        name="sw19::fake_short_list",
        schema="(Tensor x) -> Tensor[]",
    )(lambda x: [x * 2, x * 3])
    with pytest.raises(
        opreg.OpcheckError,
        match=r"output 0 \(List\[Tensor\]\): the fake gives a "
        r"list of 1, the real op a list of 2",
    ):
        opreg.opcheck(op, [(torch.randn(3),)], devices=["cpu"], checks=["fake_vs_real"])


def test_opcheck_takes_a_torch_library_custom_op():
    # A-F13: torch.library.custom_op's CustomOpDef was refused as "op must be an op".
    def g(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    op = torch.library.custom_op("sw19t::g", mutates_args=())(g)
    op.register_fake(lambda x: torch.empty_like(x))
    checks = ["torch_opcheck", "fake_vs_real"]
    report = opreg.opcheck(op, [(torch.ones(2),)], devices=["cpu"], checks=checks)
    assert [(r.op, r.passed) for r in report.rows] == [("sw19t::g", True)] * 2
    # The checks of what opreg declares say it is not an opreg op, as for its OpOverload.
    with pytest.raises(
        opreg.OpcheckError, match=r"kernel_vs_fallback failed for sw19t::g.*sw19t::g"
    ):
        opreg.opcheck(op, [(torch.ones(2),)], devices=["cpu"], checks=["kernel_vs_fallback"])


def test_register_vmap_op_refuses_triton_fn_naming_itself_and_the_op():
    # A-F11: refused as "register_triton_op() got multiple values for keyword argument".
    def fb(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    for decorate in (True, False):
        with pytest.raises(
            TypeError,
            match=r"op 'sw19::tf': register_vmap_op takes no triton_fn .*register_triton_op",
        ):
            options = dict(fake_fn=torch.empty_like, name="sw19::tf", triton_fn=lambda x: x)
            if decorate:
                opreg.register_vmap_op(**options)(fb)
            else:
                opreg.register_vmap_op(fb, **options)
    assert not hasattr(torch.ops.sw19, "tf")


def test_fake_vs_real_converts_keyword_tensors_of_a_vmap_fn_op():
    # A-F8: the vmapped fake run closed over the sample's real keyword tensors.
    def fb(x: torch.Tensor, s: float, *, y: torch.Tensor) -> torch.Tensor:
        return x * s + y

    op = opreg.register_vmap_op(
        fake_fn=lambda x, s, *, y: torch.empty_like(x),
        vmap_fn=lambda x, s, *, y: x * s + y,
        fake_vmap_fn=lambda x, s, *, y: torch.empty(torch.broadcast_shapes(x.shape, y.shape)),
        name="sw19::kw_tensor",
    )(fb)
    sample = opreg.Sample((torch.randn(3), 2.0), {"y": torch.randn(3)})
    report = opreg.opcheck(op, [sample], devices=["cpu"], checks=["fake_vs_real"])
    assert not report.failures


def _wrong_list_rule(info, in_dims, x):
    x = x.movedim(in_dims[0], 0)
    return [x * 5, x * 3], 0  # the first output should be x * 2


def test_vmap_check_runs_for_tensor_list_outputs():
    # A-F4: skipped as "returns List[Tensor]: torch.vmap maps only functions of tensors".
    @opreg.custom_op("sw19::tl", mutates_args=())
    def op(x: torch.Tensor) -> list[torch.Tensor]:
        return [x * 2, x * 3]

    op.register_fake(lambda x: [torch.empty_like(x), torch.empty_like(x)])
    op.register_vmap(_wrong_list_rule)
    report = opreg.opcheck(op, [(torch.randn(3),)], devices=["cpu"], raise_on_failure=False)
    rows = {r.check: r for r in report.rows}
    assert not rows["vmap"].skipped and not rows["vmap"].passed
    assert "differ from a loop of single calls" in rows["vmap"].message
    assert not rows["compile"].skipped and rows["compile"].passed


def test_vmap_and_compile_checks_run_for_optional_tensor_outputs():
    schema = "(Tensor x) -> (Tensor, Tensor?)"
    wrong = opreg.register_vmap_op(
        fake_fn=lambda x: (torch.empty_like(x), torch.empty_like(x)),
        name="sw19::opt_wrong",
        schema=schema,
        vmap=lambda info, d, x: ((x.movedim(d[0], 0) * 2, x.movedim(d[0], 0) * 9), (0, 0)),
    )(lambda x: (x * 2, x * 3))
    report = opreg.opcheck(wrong, [(torch.randn(3),)], devices=["cpu"], raise_on_failure=False)
    rows = {r.check: r for r in report.rows}
    assert not rows["vmap"].skipped and not rows["vmap"].passed
    assert not rows["compile"].skipped and rows["compile"].passed
    # A Tensor? output that is None: vmap maps it unbatched.
    none = opreg.register_vmap_op(
        fake_fn=lambda x: (torch.empty_like(x), None), name="sw19::opt_none", schema=schema
    )(lambda x: (x * 2, None))
    report = opreg.opcheck(none, [(torch.randn(3),)], devices=["cpu"])
    skipped = {r.check for r in report.rows if r.skipped}
    assert not skipped & {"vmap", "compile", "fake_vs_real"}


@pytest.mark.parametrize(("kind", "value"), [("int", 4), ("SymInt", 4), ("float", 0.5)])
def test_compile_check_runs_for_a_number_beside_a_tensor(kind, value):
    # A-F4: skipped as "Dynamo cannot put a custom op's non-tensor outputs in a full graph".
    op = opreg.register_vmap_op(
        fake_fn=lambda x: (torch.empty_like(x), value),
        name=f"sw19::number_{kind.lower()}",
        schema=f"(Tensor x) -> (Tensor, {kind})",
    )(lambda x: (x * 2, value))
    report = opreg.opcheck(op, [(torch.randn(3),)], devices=["cpu"], checks=["compile"])
    assert [(r.skipped, r.passed) for r in report.rows] == [(False, True)]


def test_fake_vs_real_checks_fake_vmap_fn_under_nested_vmap():
    # A-F16: a fake_vmap_fn right for one batch dim and wrong for two passed.
    op = opreg.register_vmap_op(
        fake_fn=torch.empty_like,
        vmap_fn=lambda x: x * 2,
        fake_vmap_fn=lambda x: x.new_empty(x.shape[0], x.shape[-1]),
        name="sw19::nested_fake",
        schema="(Tensor x) -> Tensor",
    )(lambda x: x * 2)
    with pytest.raises(
        opreg.OpcheckError,
        match=r"under nested vmap \(fake_vmap_fn\), .*expected the batch size 2",
    ):
        opreg.opcheck(op, [(torch.randn(4),)], devices=["cpu"], checks=["fake_vs_real"])
