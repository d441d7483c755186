"""One definition path: the Python front builds the same OpBuilder as C++ ops, its declaration
carries every flag of the core, and reports are typed."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import opreg
from opreg import _C
from opreg._declaration import OpDeclaration


def test_the_python_declaration_has_every_flag_of_the_core():
    fields = {f.name: f for f in dataclasses.fields(OpDeclaration)}
    flags = [name for name, _promise in _C.op_flags()]
    assert flags == [
        "bitwise",
        "allow_mixed_devices",
        "batch_polymorphic",
        "vmap_per_example_loop",
        "random",
        "cuda_graph_unsafe",
    ]
    for flag in flags:
        assert fields[flag].default is False, flag


@pytest.mark.parametrize("flag", [name for name, _ in _C.op_flags()])
def test_each_flag_is_a_keyword_and_reaches_the_report(flag):
    @opreg.register_vmap_op(
        fake_fn=lambda x: torch.empty_like(x), name=f"opreg_path::flag_{flag}", **{flag: True}
    )
    def op(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    report = opreg.describe_op(f"opreg_path::flag_{flag}")
    assert report.flags == {name: name == flag for name, _ in _C.op_flags()}
    assert flag in report.describe()


def test_an_unknown_keyword_names_the_op_and_the_flags():
    with pytest.raises(
        TypeError,
        match=r"opreg_path::unknown': unknown keyword 'bitwize'; "
        r"the flags are bitwise, allow_mixed_devices",
    ):
        opreg.register_vmap_op(lambda x: x, fake_fn=None, name="opreg_path::unknown", bitwize=True)
    with pytest.raises(ValueError):
        opreg.describe_op("opreg_path::unknown")


def test_a_flag_must_be_a_bool():
    with pytest.raises(TypeError, match="random must be True or False, got 'yes'"):
        opreg.register_vmap_op(
            lambda x: x, fake_fn=None, name="opreg_path::flag_type", random="yes"
        )


def test_the_cpp_builder_refuses_an_unknown_flag_by_name():
    # At the definition (sweep 21 B-F2: a builder call's throw escaped a C++ library's static
    # initializer), which defines nothing.
    builder = _C.OpBuilder("opreg_path::by_name(Tensor x) -> Tensor")
    builder.fallback(lambda x: x * 2, "")
    builder.flag("fast", True)
    with pytest.raises(ValueError, match="no flag named 'fast'; the flags are: bitwise"):
        _C.define_all([builder], {})
    assert not _C.is_defined("opreg_path::by_name")


def test_a_builder_defined_twice_is_refused():
    builder = _C.OpBuilder("opreg_path::twice(Tensor x) -> Tensor")
    builder.fallback(lambda x: x * 2, "")
    _C.define_all([builder], {})
    with pytest.raises(ValueError, match=r"already defined \(or moved from\); make a new one"):
        _C.define_all([builder], {})


def test_dtypes_from_python_are_checked_on_every_call():
    @opreg.register_vmap_op(
        fake_fn=lambda x, y: torch.empty_like(x),
        name="opreg_path::typed",
        dtypes={"x": [torch.float32]},
    )
    def typed(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y

    assert torch.equal(typed(torch.ones(2), torch.ones(2)), torch.full((2,), 2.0))
    with pytest.raises(
        TypeError, match="opreg_path::typed: argument 'x' has dtype Double, expected one of: Float"
    ):
        typed(torch.ones(2, dtype=torch.float64), torch.ones(2))
    assert opreg.describe_op("opreg_path::typed").dtypes == (("x", ("Float",)),)


def test_dtypes_check_optional_and_list_arguments():
    # Found by the sixth sweep: dtypes on a Tensor? or Tensor[] argument was refused as "not a
    # Tensor"; the check now reads each tensor they hold, and None passes.
    @opreg.register_vmap_op(
        fake_fn=None,
        name="opreg_path::typed_lists",
        schema="(Tensor[] xs, Tensor? bias, Tensor?[] extra) -> Tensor",
        dtypes={"xs": [torch.float32], "bias": [torch.float32], "extra": [torch.float32]},
    )
    def typed_lists(xs, bias, extra):
        return torch.stack(xs).sum(0) + (0 if bias is None else bias)

    ones = torch.ones(2)
    assert torch.equal(typed_lists([ones, ones], None, [None, ones]), torch.full((2,), 2.0))
    doubles = ones.double()
    with pytest.raises(TypeError, match="argument 'xs' element 1 has dtype Double, expected one"):
        typed_lists([ones, doubles], None, [])
    with pytest.raises(TypeError, match="argument 'bias' has dtype Double, expected one of: Float"):
        typed_lists([ones], doubles, [])
    with pytest.raises(TypeError, match="argument 'extra' element 1 has dtype Double"):
        typed_lists([ones], None, [None, doubles])
    with pytest.raises(ValueError, match="which is not a Tensor, Tensor\\?, Tensor\\[\\] or"):
        opreg.register_vmap_op(
            lambda x, n: x * n,
            fake_fn=None,
            name="opreg_path::typed_int",
            schema="(Tensor x, int n) -> Tensor",
            dtypes={"n": [torch.float32]},
        )


def test_dtypes_naming_a_missing_argument_are_refused():
    with pytest.raises(ValueError, match="dtypes\\(\\) names argument 'z', which the schema"):
        opreg.register_vmap_op(
            lambda x: x * 1,
            fake_fn=None,
            name="opreg_path::typed_bad",
            schema="(Tensor x) -> Tensor",
            dtypes={"z": [torch.float32]},
        )
    with pytest.raises(TypeError, match="dtypes must map argument names to lists of torch"):
        opreg.register_vmap_op(
            lambda x: x * 1,
            fake_fn=None,
            name="opreg_path::typed_bad",
            schema="(Tensor x) -> Tensor",
            dtypes={"x": "float32"},
        )


def test_allow_mixed_devices_from_python():
    def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y.to(x.device)

    mixed = opreg.register_vmap_op(
        add, fake_fn=None, name="opreg_path::mixed", allow_mixed_devices=True
    )
    assert opreg.describe_op("opreg_path::mixed").flags["allow_mixed_devices"]
    assert mixed(torch.ones(2, device="meta"), torch.ones(2)).device.type == "meta"


def test_reports_are_typed_and_described():
    report = opreg.describe_op("opreg::fused_add")
    assert report.fake in set(opreg.FakeSource)
    assert report.autograd is opreg.AutogradSupport.BACKWARD
    assert report.vmap is opreg.VmapSupport.BATCH_POLYMORPHIC
    assert all(isinstance(k.kind, opreg.ServingKind) for k in report.kernels)
    text = report.describe()
    assert text.startswith("opreg::fused_add\n  schema:")
    assert "autograd: backward" in text
    assert "vmap:     batch-polymorphic" in text
    assert report.sharding is opreg.Sharding.POINTWISE  # declared in C++: .sharding(kPointwise)
    assert "dtensor:  pointwise" in text


def test_the_sharding_option_goes_through_the_builder():
    """Not a flag: OpDeclaration's field, one line in builder(), the binding's method."""
    fields = {f.name: f for f in dataclasses.fields(OpDeclaration)}
    assert fields["sharding"].default is None  # the core's default
    declaration = OpDeclaration(
        schema="opreg_path::sharded(Tensor x) -> Tensor",
        fallback=lambda x: x * 2,
        sharding="replicate",
    )
    _C.define_all([declaration.builder()], {})
    assert opreg.describe_op("opreg_path::sharded").sharding is opreg.Sharding.REPLICATE


def test_kernel_status_answers_for_cpp_ops():
    status = opreg.kernel_status("opreg::fused_add")
    assert status.startswith("cuda: ")
    with pytest.raises(ValueError, match="no op named 'opreg_path::nothing'"):
        opreg.kernel_status("opreg_path::nothing")
