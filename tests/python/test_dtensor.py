"""opreg ops under DTensor (torch.distributed.tensor): the declaration's sharding (C++ builder,
Python keyword, the batch_polymorphic default), its report, the strategies registered with
DTensor (lazily: importing opreg does not import torch.distributed.tensor), and a 2-process gloo
run (torchrun, CPU) of a model on DTensors sharded on dim 0 that computes shard-wise and equals
the single-process result."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import dtensor_sharding
import pytest
import torch
from test_distributed import TOLERANCE, run_torchrun

import opreg

WORLD_SIZE = 2


def define(name: str, **options):
    return opreg.register_vmap_op(
        lambda x, y: x + y,
        fake_fn=lambda x, y: torch.empty_like(x),
        name=f"opreg_dtensor_unit::{name}",
        schema="(Tensor x, Tensor y) -> Tensor",
        **options,
    )


def sharding_of(name: str) -> opreg.Sharding:
    return opreg.describe_op(f"opreg_dtensor_unit::{name}").sharding


# ---- the declaration ---------------------------------------------------------------------------


def test_no_op_is_pointwise_unless_it_says_so():
    # batch_polymorphic is not elementwise (a row softmax is batch-polymorphic): no default.
    define("default_bp", batch_polymorphic=True)
    define("default_plain")
    define("default_random", batch_polymorphic=True, random=True)
    for name in ("default_bp", "default_plain", "default_random"):
        assert sharding_of(name) is opreg.Sharding.NONE, name
    define("declared_pointwise", batch_polymorphic=True, sharding="pointwise")
    words = opreg.describe_op("opreg_dtensor_unit::declared_pointwise").describe()
    assert "dtensor:  pointwise (each rank computes its shard of the output)" in words


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("pointwise", opreg.Sharding.POINTWISE),
        ("replicate", opreg.Sharding.REPLICATE),
        ("none", opreg.Sharding.NONE),
        (opreg.Sharding.REPLICATE, opreg.Sharding.REPLICATE),
        (lambda x, y: [], opreg.Sharding.PYTHON),
    ],
)
def test_the_keyword_declares_the_sharding(given, expected):
    define("declared", batch_polymorphic=True, sharding=given, replace=True)
    assert sharding_of("declared") is expected


def test_the_shipped_ops_declare_theirs():
    assert opreg.describe_op("opreg::fused_add").sharding is opreg.Sharding.POINTWISE
    for name in ("philox_uniform", "philox_normal", "lowrank_delta_output", "lowrank_gradient"):
        assert opreg.describe_op(f"opreg::{name}").sharding is opreg.Sharding.NONE, name


def test_a_wrong_sharding_names_the_op_the_keyword_and_what_came():
    with pytest.raises(
        ValueError,
        match=r"opreg: op 'opreg_dtensor_unit::bad_kind': sharding must be 'pointwise', "
        r"'replicate', 'none' or a strategy function \(as torch.distributed.tensor.experimental"
        r".register_sharding takes\), got 'elementwise'",
    ):
        define("bad_kind", sharding="elementwise")
    with pytest.raises(
        TypeError, match=r"'opreg_dtensor_unit::bad_type': sharding must be .*got 3"
    ):
        define("bad_type", sharding=3)
    with pytest.raises(ValueError, match=r"sharding must be .*got <Sharding.PYTHON: 'python'>"):
        define("bad_python", sharding=opreg.Sharding.PYTHON)
    for name in ("bad_kind", "bad_type", "bad_python"):
        assert not any(r.name == f"opreg_dtensor_unit::{name}" for r in opreg.describe_ops())


def test_a_strategy_function_must_take_the_ops_arguments():
    with pytest.raises(
        TypeError,
        match=r"'opreg_dtensor_unit::bad_strategy': sharding cannot be called with the schema's "
        r"arguments \(x, y\)",
    ):
        define("bad_strategy", sharding=lambda x: [])


def test_pointwise_is_refused_where_the_schema_does_not_fit():
    with pytest.raises(
        ValueError,
        match=r"opreg_dtensor_unit::listed: sharding pointwise needs Tensor or scalar arguments "
        r"and Tensor outputs, none of them mutated, but argument 'xs' is a Tensor\[\]",
    ):
        opreg.register_vmap_op(
            lambda xs: xs[0],
            fake_fn=None,
            name="opreg_dtensor_unit::listed",
            schema="(Tensor[] xs) -> Tensor",
            sharding="pointwise",
        )
    # Without a declaration, such a batch_polymorphic op simply has no strategy.
    opreg.register_vmap_op(
        lambda xs: xs[0] * 1,
        fake_fn=None,
        name="opreg_dtensor_unit::listed_default",
        schema="(Tensor[] xs) -> Tensor",
        batch_polymorphic=True,
    )
    assert opreg.describe_op("opreg_dtensor_unit::listed_default").sharding is opreg.Sharding.NONE


# ---- registration with DTensor (fresh processes: the import order matters) ---------------------


def run_python(code: str, timeout: float = 120) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_importing_opreg_does_not_import_dtensor():
    out = run_python(
        """
        import sys
        import opreg
        print("torch.distributed.tensor" in sys.modules)
        """
    )
    assert out.strip() == "False"


@pytest.mark.parametrize("dtensor_first", [False, True])
def test_strategies_are_registered_when_dtensor_is_imported_or_at_definition(dtensor_first):
    out = run_python(
        f"""
        if {dtensor_first}:
            import torch.distributed.tensor
        import opreg

        def define(name):
            opreg.register_vmap_op(lambda x: x * 2, fake_fn=None, name=name,
                                   schema="(Tensor x) -> Tensor", sharding="pointwise")

        define("opreg_reg::early")
        from torch.distributed.tensor import DTensor
        define("opreg_reg::late")
        funcs = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
        print(sorted(str(op) for op in funcs if str(op).startswith(("opreg.", "opreg_reg."))))
        """
    )
    assert out.strip() == (
        "['opreg.fused_add.default', 'opreg_reg.early.default', 'opreg_reg.late.default']"
    )


def test_ops_without_a_strategy_are_refused_by_name_on_one_rank():
    """A 1-rank mesh (world size 1) needs no launcher; still a subprocess: it makes a process
    group."""
    out = run_python(
        """
        import os, socket
        import torch, torch.distributed as dist
        import opreg
        from torch.distributed.tensor import (DTensor, Replicate, Shard, distribute_tensor,
                                               init_device_mesh)

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=0, world_size=1)
        mesh = init_device_mesh("cpu", (1,))
        seeds = distribute_tensor(torch.arange(4), mesh, [Shard(0)])
        try:
            torch.ops.opreg.philox_uniform(seeds, 3)
        except NotImplementedError as error:
            print("refused:", error)

        # An op declared pointwise whose output shape is not its inputs' is refused at the
        # call rather than sharded wrongly.
        opreg.register_vmap_op(lambda x: x.sum(-1), fake_fn=None, name="opreg_one::rowsum",
                               schema="(Tensor x) -> Tensor", batch_polymorphic=True,
                               sharding="pointwise")
        try:
            torch.ops.opreg_one.rowsum(distribute_tensor(torch.ones(4, 3), mesh, [Shard(0)]))
        except RuntimeError as error:
            print("refused:", str(error).splitlines()[0])

        # Registered pointwise, then redefined with none: opreg's strategy refuses, naming it.
        opreg.register_vmap_op(lambda x: x * 2, fake_fn=None, name="opreg_one::twice",
                               schema="(Tensor x) -> Tensor", batch_polymorphic=True,
                               sharding="pointwise")
        rows = distribute_tensor(torch.ones(4, 3), mesh, [Shard(0)])
        print("before:", torch.ops.opreg_one.twice(rows).placements)
        opreg.register_vmap_op(lambda x: x * 2, fake_fn=None, name="opreg_one::twice",
                               schema="(Tensor x) -> Tensor", sharding="none", replace=True)
        try:
            torch.ops.opreg_one.twice(rows)
        except NotImplementedError as error:
            print("refused:", error)

        # A strategy function returning something other than its choices (sweep 31 A-F5).
        opreg.register_vmap_op(lambda x: x * 2, fake_fn=None, name="opreg_one::none_chosen",
                               schema="(Tensor x) -> Tensor", sharding=lambda x: None)
        try:
            torch.ops.opreg_one.none_chosen(rows)
        except Exception as error:
            print("refused:", str(error).splitlines()[0])
        for name, choices in (("empty", []), ("strings", [(["R"], ["R"])]),
                              ("bare", [(Shard(0), Shard(0))])):
            opreg.register_vmap_op(lambda x: x * 2, fake_fn=None, name="opreg_one::" + name,
                                   schema="(Tensor x) -> Tensor",
                                   sharding=lambda x, c=choices: c)
            try:
                getattr(torch.ops.opreg_one, name)(rows)
            except Exception as error:
                print("refused:", str(error).splitlines()[0][:80])

        # Placements that do not fit their values (sweep 33 A-F1: a Shard of a dim the output
        # lacks gave a DTensor that could not be gathered; A-F2: DTensor's errors named nothing).
        for name, choices in (("out_dim", [([Shard(2)], [Shard(0), None])]),
                              ("in_dim", [([Shard(0)], [Shard(-1), None])]),
                              ("int_arg", [([Shard(0)], [Shard(0), Shard(0)])]),
                              ("no_placement", [([Shard(0)], [None, None])])):
            opreg.register_vmap_op(lambda x, n: x * n, fake_fn=None, name="opreg_one::" + name,
                                   schema="(Tensor x, int n) -> Tensor",
                                   sharding=lambda x, n, c=choices: c)
            try:
                getattr(torch.ops.opreg_one, name)(rows, 2)
            except Exception as error:
                print("refused:", str(error).splitlines()[0])

        # A placement per argument of the schema, a default left out of the call (sweep 33 A-F3).
        opreg.register_vmap_op(lambda x, k=2.0: x * k, fake_fn=None, name="opreg_one::default",
                               schema="(Tensor x, float k=2.0) -> Tensor",
                               sharding=lambda x, k=2.0: [([Shard(0)], [Shard(0), None])])
        print("default:", torch.ops.opreg_one.default(rows).full_tensor().sum().item())

        # A placement for a Tensor? left out of the call (sweep 34 A-F1: DTensor's raw error).
        opreg.register_vmap_op(lambda x, w=None: x * 2, fake_fn=None,
                               name="opreg_one::optional",
                               schema="(Tensor x, Tensor? w=None) -> Tensor",
                               sharding=lambda x, w=None: [([Shard(0)], [Shard(0), Replicate()])])
        try:
            torch.ops.opreg_one.optional(rows)
        except Exception as error:
            print("refused:", str(error).splitlines()[0])

        # A strategy that redistributes an argument the op writes (sweep 36 A-F2: the write
        # reached only DTensor's new replicated copy).
        def add_one(x):
            x.add_(1)

        opreg.register_triton_op(schema="(Tensor(a!) x) -> ()", fake_fn=lambda x: None,
                                 triton_fn=None, name="opreg_one::written",
                                 sharding=lambda x: [([], [Replicate()])])(add_one)
        try:
            torch.ops.opreg_one.written(rows)
        except Exception as error:
            print("refused:", str(error).splitlines()[0])

        # The same on a mesh of two dims, and for a written Tensor[] (sweep 37 A-F1, A-F2: the
        # check looked at 1-D meshes and single tensors only, and the write was lost).
        mesh2 = init_device_mesh("cpu", (1, 1), mesh_dim_names=("a", "b"))
        rows2 = distribute_tensor(torch.ones(4, 3), mesh2, [Shard(0), Replicate()])
        try:
            torch.ops.opreg_one.written(rows2)
        except Exception as error:
            print("refused 2-D:", str(error).splitlines()[0])
        print("kept 2-D:", rows2.full_tensor().sum().item())

        def add_one_each(xs):
            for x in xs:
                x.add_(1)

        for name, placement in (("each", Replicate()), ("per_element", [Replicate()])):
            opreg.register_triton_op(schema="(Tensor(a!)[] xs) -> ()", fake_fn=lambda xs: None,
                                     triton_fn=None, name="opreg_one::written_" + name,
                                     sharding=lambda xs, p=placement: [([], [p])])(add_one_each)
            try:
                getattr(torch.ops.opreg_one, "written_" + name)([rows])
            except Exception as error:
                print("refused:", str(error).splitlines()[0])
        print("kept:", rows.full_tensor().sum().item())
        dist.destroy_process_group()
        """
    )
    assert (
        "refused 2-D: opreg: op 'opreg_one::written': its sharding strategy function gave "
        "Replicate() for argument 'x', which the op writes or an output views, a DTensor placed "
        "(Shard(dim=0), Replicate()): DTensor would redistribute it" in out
    ), out
    for name in ("each", "per_element"):
        assert (
            f"refused: opreg: op 'opreg_one::written_{name}': its sharding strategy function gave "
            "Replicate() for element 0 of argument 'xs', which the op writes" in out
        ), out
    assert "kept 2-D: 12.0" in out and "kept: 12.0" in out, out
    assert (
        "refused: opreg: op 'opreg_one::written': its sharding strategy function gave Replicate() "
        "for argument 'x', which the op writes or an output views, a DTensor placed "
        "(Shard(dim=0),): DTensor would redistribute it" in out
    ), out
    assert "default: 24.0" in out, out
    assert (
        "refused: opreg: op 'opreg_one::optional': its sharding strategy function gave "
        "Replicate() for argument 'w', which is no DTensor (NoneType); give None there" in out
    ), out
    for name, said in (
        ("out_dim", "gave Shard(dim=2) for output 0, which has 2 dims; expected a dim from 0 to 1"),
        ("in_dim", "gave Shard(dim=-1) for argument 'x', which has 2 dims; expected a dim from 0"),
        ("int_arg", "gave Shard(dim=0) for argument 'n', which is no DTensor (int); give None"),
        ("no_placement", "gave None for argument 'x', a DTensor; give it a placement"),
    ):
        assert f"refused: opreg: op 'opreg_one::{name}': its sharding strategy function {said}" in (
            out
        ), out
    assert (
        "refused: opreg: op 'opreg_one::none_chosen': its sharding strategy function returned "
        "NoneType None, expected a non-empty list of (output placements, input placements) "
        "pairs: 1 placements for the outputs and 1 for the arguments" in out
    ), out
    for name in ("empty", "strings", "bare"):
        assert (
            f"refused: opreg: op 'opreg_one::{name}': its sharding strategy function returned"
            in out
        ), out
    assert "before: (Shard(dim=0),)" in out, out
    assert (
        "refused: opreg: op 'opreg_one::twice' has no DTensor sharding strategy (its current "
        "definition declares none); declare one with sharding= (Python) or .sharding(...) (C++)"
        in out
    ), out
    assert (
        "refused: Operator opreg.philox_uniform.default does not have a sharding strategy "
        "registered." in out
    ), out
    assert (
        "refused: opreg: op 'opreg_one::rowsum': its DTensor sharding is declared pointwise, "
        "but output 0 has shape [4], not its inputs' broadcast shape [4, 3], so the op is not "
        "elementwise; declare sharding='replicate', 'none' or a strategy function" in out
    ), out


# ---- two ranks (torchrun, gloo) ----------------------------------------------------------------


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("dtensor")
    run_torchrun(out, script="dtensor_sharding.py")
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD_SIZE)]


@pytest.fixture(scope="module")
def reference():
    opreg.load_library(opreg.example_library("scale_add"))
    x, shift = dtensor_sharding.inputs()
    x.requires_grad_()
    shift.requires_grad_()
    outputs = dtensor_sharding.forward(x, shift)
    dtensor_sharding.loss_of(outputs).backward()
    return {k: v.detach() for k, v in outputs.items()}, {"x": x.grad, "shift": shift.grad}


def test_elementwise_ops_run_shard_wise(ranks):
    half = (dtensor_sharding.ROWS // WORLD_SIZE, dtensor_sharding.COLUMNS)
    for rank, saved in enumerate(ranks):
        assert saved["world_size"] == WORLD_SIZE
        for name in ("shifted", "squashed", "scaled", "rows"):
            assert saved["placements"][name] == ["Shard(dim=0)"], (rank, name)
            assert saved["local_shapes"][name] == half, (rank, name)
        # The Python fallbacks saw each rank's rows only. softmax over dim 0 needs whole columns:
        # its strategy allows no Shard(0), so DTensor gathered its input (pointwise would have
        # normalized each rank's half of the column).
        assert saved["placements"]["columns"] == ["Replicate()"], rank
        assert saved["seen_shapes"] == [
            ("scaled_tanh", half),
            ("softmax", half),
            ("softmax", (dtensor_sharding.ROWS, dtensor_sharding.COLUMNS)),
        ]
        # Less the fakes: DTensor's shape checks (on meta tensors, or fake ones for a Python fake).
        served = [
            (op, impl) for op, impl, device in saved["trace"] if device != "meta" and impl != "fake"
        ]
        assert served == [
            ("opreg::fused_add", "fallback"),
            ("opreg_dtensor_test::scaled_tanh", "fallback"),
            ("opreg_example::scale_add", "fallback(declined by kernel:cpu_loop)"),  # float64
            ("opreg_dtensor_test::softmax", "fallback"),
            ("opreg_dtensor_test::softmax", "fallback"),
            ("opreg_example::scale_add", "backward"),
            ("opreg_dtensor_test::scaled_tanh", "backward"),
            ("opreg::fused_add", "backward"),
        ], served


def test_the_sharded_run_equals_one_process(ranks, reference):
    outputs, grads = reference
    for rank, saved in enumerate(ranks):
        for name, expected in outputs.items():
            torch.testing.assert_close(saved["full"][name], expected, **TOLERANCE)
        for name, expected in grads.items():
            torch.testing.assert_close(saved["grads"][name], expected, **TOLERANCE, msg=name)
        assert torch.equal(saved["full"]["scaled"], ranks[0]["full"]["scaled"]), rank


def test_ops_without_a_strategy_are_refused_by_name(ranks):
    for saved in ranks:
        errors = saved["errors"]
        assert errors["unsharded"] == (
            "NotImplementedError: Operator opreg_dtensor_test.unsharded.default does not have a "
            "sharding strategy registered."
        )
        assert errors["philox_uniform"] == (
            "NotImplementedError: Operator opreg.philox_uniform.default does not have a sharding "
            "strategy registered."
        )


def test_a_replaced_op_serves_its_new_sharding(ranks):
    for saved in ranks:
        assert saved["replaced"] == {
            "before": ["Shard(dim=0)"],
            "after": ["Replicate()"],
            "after_local_shape": (dtensor_sharding.ROWS, dtensor_sharding.COLUMNS),
            "by_user": ["Shard(dim=0)"],
            "defined_again": ["Replicate()"],
        }
