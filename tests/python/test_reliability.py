"""Nothing a user does crashes the process, corrupts memory, loses a definition or returns a
silently wrong answer: replaces under load, failed definitions and loads, forward-mode AD,
call-time output checks and bad input. Probes that could crash run in a subprocess, so that a
crash fails the test instead of killing the test runner."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
from torch.func import hessian, jacfwd, jvp, vmap

import opreg
from conftest import REPO, TEST_OPS_LIBRARY

PYTHONPATH_SETUP = f"import sys; sys.path.insert(0, {str(REPO / 'tests' / 'python')!r})\n"


def run_probe(code: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter; a crash shows as a negative return code."""
    return subprocess.run(
        [sys.executable, "-c", PYTHONPATH_SETUP + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_survived(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, f"rc={result.returncode}\n{result.stdout}\n{result.stderr}"


def report_of(name: str) -> tuple:
    report = opreg.describe_op(name)
    return (report.schema, report.kernels, report.fake, report.autograd, report.vmap)


# ---- replace under load, re-entrant replace, old handles ----------------------------------------


def test_replace_of_a_python_op_while_threads_call_it():
    result = run_probe(
        """
        import threading, torch, opreg

        def define(value, replace):
            @opreg.register_vmap_op(fake_fn=lambda x: torch.empty_like(x),
                                    name="rel_load::op", replace=replace,
                                    backward=lambda ctx, g: g)
            def op(x: torch.Tensor) -> torch.Tensor:
                return x + value
            return op

        define(1.0, False)
        stop, errors, seen = False, [], set()

        def caller():
            x = torch.zeros(16, requires_grad=True)
            while not stop:
                try:
                    out = torch.ops.rel_load.op(x)
                    out.sum().backward()
                    seen.add(float(out[0]))
                except Exception as error:
                    errors.append(repr(error))

        threads = [threading.Thread(target=caller) for _ in range(4)]
        for t in threads: t.start()
        for i in range(200):
            define(float(i % 2 + 1), True)
        stop = True
        for t in threads: t.join()
        assert not errors, errors[:3]
        assert seen <= {1.0, 2.0}, seen
        print("ok", sorted(seen))
        """
    )
    assert_survived(result)
    assert "ok" in result.stdout


def test_replacing_the_shipped_fused_add_under_load_then_restoring_it():
    result = run_probe(
        """
        import threading, torch, opreg

        stop, errors = False, []
        def caller():
            x, y = torch.ones(8), torch.ones(8)
            while not stop:
                try:
                    out = torch.ops.opreg.fused_add(x, y)
                    assert float(out[0]) in (2.0, 3.0), out
                except Exception as error:
                    errors.append(repr(error))

        threads = [threading.Thread(target=caller) for _ in range(4)]
        for t in threads: t.start()
        for _ in range(100):
            @opreg.register_vmap_op(fake_fn=lambda x, y: torch.empty_like(x),
                                    name="opreg::fused_add", replace=True)
            def fused_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                return x + y + 1
        stop = True
        for t in threads: t.join()
        assert not errors, errors[:3]
        print("ok")
        """
    )
    assert_survived(result)


def test_a_fallback_that_replaces_its_own_op():
    calls = []

    def define(value, replace):
        @opreg.register_vmap_op(
            fake_fn=lambda x: torch.empty_like(x), name="rel::reentrant", replace=replace
        )
        def reentrant(x: torch.Tensor) -> torch.Tensor:
            calls.append(value)
            if value == 1.0:
                define(2.0, True)  # the running call keeps its own definition
            return x + value

        return reentrant

    first = define(1.0, False)
    assert torch.equal(first(torch.zeros(2)), torch.ones(2))
    # The OpOverload taken before the replace reaches the current definition.
    assert torch.equal(first(torch.zeros(2)), torch.full((2,), 2.0))
    assert torch.equal(torch.ops.rel.reentrant(torch.zeros(2)), torch.full((2,), 2.0))
    assert calls == [1.0, 2.0, 2.0]


def test_an_old_handle_after_a_replace_with_another_schema():
    @opreg.register_vmap_op(fake_fn=lambda x: torch.empty_like(x), name="rel::reschema")
    def one(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    old = one

    @opreg.register_vmap_op(
        fake_fn=lambda x, y: torch.empty_like(x), name="rel::reschema", replace=True
    )
    def two(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y

    assert torch.equal(torch.ops.rel.reschema(torch.ones(2), torch.ones(2)), torch.full((2,), 2.0))
    with pytest.raises(Exception, match="rel::reschema"):
        old(torch.ones(2))


# ---- a failed definition or replace changes nothing ---------------------------------------------


def _define_plain(name, *, replace=False, fake_fn=lambda x: torch.empty_like(x), **options):
    @opreg.register_vmap_op(fake_fn=fake_fn, name=name, replace=replace, **options)
    def plain(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    return plain


@pytest.mark.parametrize(
    "options",
    [
        {"schema": "(Tensr x) -> Tensor"},
        {"schema": ""},
        {"schema": "foo(Tensor x) -> Tensor"},
        {"autograd": "sometimes"},
        {"mutates_args": ("nosuch",)},
        {"backward": 42},
        {"fake_fn": "not a function"},
        {"aot": opreg.AotLaunch("k", ("cdiv(numel(x), 1024",), ("x",), "like:x")},
        {"triton_device_types": "meta", "triton_fn": lambda x: x},
    ],
    ids=lambda options: next(iter(options)) + "=" + repr(next(iter(options.values())))[:20],
)
def test_a_failed_replace_keeps_the_op_its_fake_and_kernel_status(options):
    _define_plain("rel::kept", replace=True)
    before = (report_of("rel::kept"), opreg.kernel_status("rel::kept"))
    fake_fn = options.pop("fake_fn", lambda x: torch.empty_like(x))
    triton_fn = options.pop("triton_fn", None)
    with pytest.raises((ValueError, TypeError, RuntimeError)) as raised:

        @opreg.register_triton_op(
            fake_fn=fake_fn, triton_fn=triton_fn, name="rel::kept", replace=True, **options
        )
        def kept(x: torch.Tensor) -> torch.Tensor:
            return x * 5

    assert "rel::kept" in str(raised.value)
    assert (report_of("rel::kept"), opreg.kernel_status("rel::kept")) == before
    assert torch.equal(torch.ops.rel.kept(torch.ones(2)), torch.full((2,), 3.0))
    fake = torch.ops.rel.kept(torch.empty(4, device="meta"))
    assert fake.shape == (4,)


def test_a_failed_replace_of_the_shipped_fused_add_keeps_it():
    before = report_of("opreg::fused_add")
    with pytest.raises(ValueError, match="lists device type 'meta'"):

        @opreg.register_triton_op(
            fake_fn=lambda x, y: torch.empty_like(x),
            triton_fn=lambda x, y: x + y,
            triton_device_types=["cpu", "meta"],
            name="opreg::fused_add",
            replace=True,
        )
        def fused_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x + y

    assert report_of("opreg::fused_add") == before
    x = torch.randn(5)
    with opreg.trace() as t:
        assert torch.equal(torch.ops.opreg.fused_add(x, x), x + x)
    assert t.impls() == ["fallback"]


def test_a_failed_replace_with_vmap_fn_keeps_the_op_and_its_companion():
    def define(scale, replace, schema=None):
        @opreg.register_vmap_op(
            fake_fn=lambda x: torch.empty_like(x),
            vmap_fn=lambda x: x * scale,
            fake_vmap_fn=lambda x: torch.empty_like(x),
            name="rel::with_companion",
            replace=replace,
            schema=schema,
        )
        def with_companion(x: torch.Tensor) -> torch.Tensor:
            return x * scale

    define(2.0, False)
    before = report_of("rel::with_companion"), report_of("rel::with_companion_vmap")
    with pytest.raises(ValueError, match="rel::with_companion"):
        define(3.0, True, schema="(Tensor x, Tensor x) -> Tensor")
    after = report_of("rel::with_companion"), report_of("rel::with_companion_vmap")
    assert after == before
    assert torch.equal(
        vmap(torch.ops.rel.with_companion)(torch.ones(3, 2)), torch.full((3, 2), 2.0)
    )


def test_a_failed_definition_leaves_nothing_behind():
    with pytest.raises(ValueError, match="schema= is the signature without the name"):
        _define_plain("rel_fresh::bad", schema="foo(Tensor x) -> Tensor")
    assert not [r.name for r in opreg.describe_ops() if r.name.startswith("rel_fresh::")]
    for name in ("bad", "badfoo"):
        with pytest.raises((AttributeError, RuntimeError)):
            _ = getattr(torch.ops.rel_fresh, name).default


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ("(Tensor x, Tensor x) -> Tensor", "names argument 'x' twice"),
        ("(Tensor x, float \u03b1) -> Tensor", "non-ASCII character"),
    ],
)
def test_schema_mistakes_are_refused_with_a_clear_message(schema, message):
    with pytest.raises(ValueError, match=message):
        _define_plain("rel::bad_schema", schema=schema)


def test_ops_in_pytorchs_namespaces_are_refused():
    with pytest.raises(ValueError, match="the namespace 'aten' belongs to PyTorch"):
        _define_plain("aten::my_op")


# ---- load-time errors never abort ---------------------------------------------------------------


def load_failing_library(failure: str, then: str = "", before: str = "") -> str:
    """Loads tests/op_library/failing_ops.cpp built with `failure` in a fresh interpreter, after
    `before`; its output."""
    library = TEST_OPS_LIBRARY.parent / f"libopreg_failing_{failure}.so"
    load = f"""
        import torch, opreg
        {textwrap.dedent(before).strip().replace(chr(10), chr(10) + " " * 8)}
        try:
            opreg.load_library({str(library)!r})
        except ValueError as error:
            print("raised:", error)
        else:
            raise SystemExit("no error")
        assert not [r.name for r in opreg.describe_ops() if r.name.startswith("opreg_failing::")]
        """
    result = run_probe(textwrap.dedent(load) + textwrap.dedent(then))
    assert_survived(result)
    assert str(library) in result.stdout
    return result.stdout


@pytest.mark.parametrize(
    ("failure", "message"),
    [
        ("bad_schema", "cannot parse schema"),
        ("duplicate_name", "opreg_failing::twice: an op of this name is already defined"),
        ("signature_mismatch", "signature does not match the schema"),
        # define_all in an initializer (two ops together) terminated the process (14th sweep)
        ("define_all", "opreg_failing::together_a, opreg_failing::together_b"),
        # a kernel factory that throws 42 terminated it too
        ("factory_throws", "threw something that is not a std::exception"),
        # a builder's own refusals aborted the process from the initializer (21st sweep, B-F2)
        ("empty_fallback", "opreg_failing::empty_fallback: its fallback is an empty function"),
        ("unknown_flag", "opreg: op 'opreg_failing::unknown_flag': no flag named 'nosuchflag'"),
        # a builder's refusal (python_fake(""), then private), and a declaration defined twice,
        # aborted it too (22nd sweep, B-F3)
        ("null_flag", "opreg_failing::null_flag': flag() got a null member pointer"),
        ("defined_twice", "(an OpBuilder defined already): opreg: this OpBuilder was already"),
        # opreg's lookups of a missing op aborted it (23rd sweep, B-F2)
        (
            "find_unknown",
            "opreg: no op named 'opreg_failing::not_defined_anywhere' is defined (a lookup in a"
            " library's static initializer fails the load",
        ),
        (
            "describe_unknown",
            "opreg: no op named 'opreg_failing::not_described' is defined by opreg (a lookup",
        ),
        # so did calling an OpHandle, testing::check and load_bundle_dir there (24th sweep, B-F1)
        ("handle_unknown", "opreg: no op named 'opreg_failing::no_handle' is defined"),
        ("handle_device", "opreg: no op named 'opreg_failing::no_device' is defined"),
        ("handle_device", "opreg: no op named 'opreg_failing::no_pair' is defined"),
        ("handle_mismatch", "the handle's C++ signature does not match"),
        ("check_unknown", "opreg: no op named 'opreg_failing::not_checked' is defined by opreg"),
        ("check_unknown", "opreg: no op named 'opreg_failing::not_called' is defined by opreg"),
        ("bundle_missing", "/nonexistent/opreg_failing_bundle has no index.txt"),
    ],
)
def test_a_library_whose_definition_fails_raises_and_rolls_back(failure, message):
    output = load_failing_library(
        failure,
        then=f"""
        try:
            torch.ops.opreg_failing.good_{failure}(torch.ones(2))
        except Exception as error:
            print("rolled back:", error)
        """,
    )
    assert message in output
    assert f"opreg_failing::good_{failure}: the op is not defined now" in output


def test_a_failure_in_a_load_is_listed_once():
    # An OpHandle call of a missing op failed the lookup and then the call: two lines for one
    # failure (25th sweep, B-F8).
    output = load_failing_library("handle_unknown")
    assert "failed (1)" in output
    assert output.count("opreg: no op named 'opreg_failing::no_handle' is defined") == 1


def test_an_op_looked_up_by_a_failed_load_can_be_defined_later():
    # find_operator in a failed load returns the handle of the bare name, registered in the
    # dispatcher: defining the op afterwards works, and so does that handle (23rd sweep, B-F2).
    output = load_failing_library(
        "find_unknown",
        then="""
        print("before:", hasattr(torch.ops.opreg_failing, "not_defined_anywhere"))
        @opreg.custom_op("opreg_failing::not_defined_anywhere", mutates_args=())
        def plus_one(x: torch.Tensor) -> torch.Tensor:
            return x + 1

        print("after:", torch.ops.opreg_failing.not_defined_anywhere(torch.ones(2)).tolist())
        """,
    )
    assert "before: False" in output
    assert "after: [2.0, 2.0]" in output


def test_a_failed_load_unregisters_the_device_types_it_registered():
    # The sixteenth sweep: the type stayed registered, and ops defined before the load kept the
    # kernels it gave them.
    output = load_failing_library(
        "device_type_then_fail",
        then="""
        print("types:", opreg.accelerated_device_types())
        print("kernels:", [k.device_type for k in opreg.describe_op(FOLLOWS).kernels])
        """,
        before=f"""
        opreg.load_library({str(TEST_OPS_LIBRARY)!r})
        FOLLOWS = "opreg_test::follows_registry"
        print("kernels before:", [k.device_type for k in opreg.describe_op(FOLLOWS).kernels])
        """,
    )
    assert "opreg_failing::bad" in output
    kernels_before = output.split("kernels before:")[1].splitlines()[0]
    assert "'hpu'" not in output.split("types:")[1].splitlines()[0]
    assert output.split("kernels:")[1].splitlines()[0] == kernels_before


def test_a_library_built_against_another_opreg_version_is_refused():
    output = load_failing_library("other_version")
    assert "opreg_failing::good_other_version: its library was built against opreg 0.99." in output
    assert f"the loaded libopreg is opreg {opreg.__version__}" in output


def test_loading_a_second_copy_of_an_op_library(test_ops_library, tmp_path):
    copy = tmp_path / "libcopy_of_test_ops.so"
    shutil.copy(test_ops_library, copy)
    before = report_of("opreg_test::affine")
    with pytest.raises(ValueError, match="opreg_test::affine: an op of this name is already"):
        opreg.load_library(copy)
    assert report_of("opreg_test::affine") == before
    x = torch.randn(3)
    assert torch.allclose(torch.ops.opreg_test.affine(x, 2.0, 1.0), x * 2 + 1)


def test_loading_a_missing_library():
    with pytest.raises(FileNotFoundError, match="no library at"):
        opreg.load_library("/nonexistent/libnothing.so")


# ---- forward-mode AD ----------------------------------------------------------------------------


def test_forward_mode_ad_of_a_cpp_op_with_a_backward():
    x, y = torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    tx, ty = torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    out, tangent = jvp(torch.ops.opreg.fused_add, (x, y), (tx, ty))
    torch.testing.assert_close(out, x + y)
    torch.testing.assert_close(tangent, tx + ty)
    jac = jacfwd(torch.ops.opreg.fused_add)(x, y)
    torch.testing.assert_close(jac, torch.eye(5, dtype=torch.float64))


def test_forward_mode_ad_of_a_python_op_and_forward_ad_api():
    @opreg.register_vmap_op(fake_fn=lambda x: torch.empty_like(x), name="rel::cube")
    def cube(x: torch.Tensor) -> torch.Tensor:
        return x**3

    x = torch.randn(4, dtype=torch.float64)
    _, tangent = jvp(cube, (x,), (torch.ones_like(x),))
    torch.testing.assert_close(tangent, 3 * x**2)
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(x, torch.ones_like(x))
        out = torch.autograd.forward_ad.unpack_dual(cube(dual))
    torch.testing.assert_close(out.tangent, 3 * x**2)
    hess = hessian(lambda v: cube(v).sum())(x)
    torch.testing.assert_close(hess, torch.diag(6 * x))


def test_forward_mode_ad_with_the_error_policy_raises():
    @opreg.register_vmap_op(
        fake_fn=lambda x: torch.empty_like(x), name="rel::no_grads", autograd="error"
    )
    def no_grads(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    with pytest.raises(RuntimeError, match="rel::no_grads: an input has a forward-mode tangent"):
        jvp(no_grads, (torch.randn(3),), (torch.randn(3),))


# ---- call-time output checks -------------------------------------------------------------------


def test_a_fallback_returning_none_for_a_tensor_raises():
    @opreg.register_vmap_op(fake_fn=lambda x: torch.empty_like(x), name="rel::returns_none")
    def returns_none(x: torch.Tensor) -> torch.Tensor:
        return None

    with pytest.raises(
        TypeError, match=r"rel::returns_none: the fallback returned None for output 0"
    ):
        returns_none(torch.ones(2))


def test_a_kernel_returning_its_input_for_a_non_aliasing_schema_raises():
    @opreg.register_triton_op(
        fake_fn=lambda x: torch.empty_like(x),
        triton_fn=lambda x: x,
        triton_device_types="cpu",
        name="rel::aliases",
    )
    def aliases(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    with pytest.raises(RuntimeError, match="kernel 'triton' returned output 0 sharing memory"):
        aliases(torch.ones(2))


def test_a_kernel_returning_the_wrong_count_or_device_raises():
    @opreg.register_triton_op(
        fake_fn=lambda x: (torch.empty_like(x), torch.empty_like(x)),
        triton_fn=lambda x: (x + 1, (x + 2).to("meta")),
        triton_device_types="cpu",
        name="rel::two_outputs",
        schema="(Tensor x) -> (Tensor, Tensor)",
    )
    def two_outputs(x):
        return x + 1, x + 2

    with pytest.raises(RuntimeError, match="returned output 1 on meta, expected cpu"):
        two_outputs(torch.ones(2))


def test_a_vmap_rule_returning_the_wrong_batch_size_raises():
    @opreg.register_vmap_op(
        fake_fn=lambda x: torch.empty_like(x),
        name="rel::bad_rule",
        vmap=lambda info, in_dims, x: (x[:1] * 2, 0),
    )
    def bad_rule(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    with pytest.raises(
        RuntimeError, match="entries along its batch dim 0, expected the batch size 4"
    ):
        vmap(bad_rule)(torch.ones(4, 3))


# ---- bad input ----------------------------------------------------------------------------------


def test_none_for_a_tensor_argument_names_it():
    with pytest.raises(
        TypeError, match="opreg::fused_add: argument 'y' must be a Tensor, got None"
    ):
        torch.ops.opreg.fused_add(torch.ones(2), None)


def test_backward_twice_without_retain_graph_is_a_clear_error():
    @opreg.register_vmap_op(
        fake_fn=lambda x: torch.empty_like(x),
        name="rel::twice_backward",
        backward=lambda ctx, g: g * 2,
    )
    def twice_backward(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    x = torch.ones(3, requires_grad=True)
    out = twice_backward(x).sum()
    out.backward()
    with pytest.raises(RuntimeError, match="backward ran a second time"):
        out.backward()


def test_threads_replacing_and_defining_in_parallel_leave_a_consistent_registry():
    errors = []

    def worker(index):
        try:
            for round_ in range(20):
                _define_plain(f"rel_par::op{index}", replace=round_ > 0)
        except Exception as error:
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    names = sorted(r.name for r in opreg.describe_ops() if r.name.startswith("rel_par::"))
    assert names == [f"rel_par::op{i}" for i in range(4)]


def test_opreg_debug_compares_each_call_with_the_fake():
    code = """
        import torch, opreg

        @opreg.register_triton_op(
            fake_fn=None, triton_fn=lambda x: x[:1] * 2, triton_device_types="cpu",
            name="rel_debug::short_kernel")
        def short_kernel(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        try:
            short_kernel(torch.ones(4))
        except RuntimeError as error:
            print("raised:", error)
        else:
            print("no error")
        """
    plain = run_probe(code)
    assert_survived(plain)
    assert "no error" in plain.stdout
    debug = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "OPREG_DEBUG": "1"},
    )
    assert_survived(debug)
    assert (
        "OPREG_DEBUG: rel_debug::short_kernel: kernel 'triton' returned output 0 of shape [1]"
        in debug.stdout
    )
    assert "the op's fake gives shape [4]" in debug.stdout


def test_a_library_closed_behind_opregs_back_stays_loaded():
    # Libraries that define ops are pinned: dlclose (here through ctypes, twice: its own handle and
    # opreg's) cannot unmap the code their definitions call.
    result = run_probe(
        """
        import ctypes, _ctypes, torch, opreg
        path = str(opreg.example_library("scale_add"))
        opreg.load_library(path)
        handle = ctypes.CDLL(path)._handle
        _ctypes.dlclose(handle)
        _ctypes.dlclose(handle)
        x = torch.ones(3)
        print(torch.ops.opreg_example.scale_add(x, x, 0.5))
        """
    )
    assert_survived(result)
    assert "tensor([1.5000, 1.5000, 1.5000])" in result.stdout


def test_a_replace_with_an_unannotated_fallback_keeps_the_op():
    _define_plain("rel::annotated", replace=True)
    before = report_of("rel::annotated")
    with pytest.raises(ValueError, match=r"rel::annotated.*must have a type annotation"):
        opreg.register_vmap_op(
            lambda x: x, fake_fn=lambda x: torch.empty_like(x), name="rel::annotated", replace=True
        )
    assert report_of("rel::annotated") == before
    assert torch.equal(torch.ops.rel.annotated(torch.ones(2)), torch.full((2,), 3.0))


def test_a_kernel_returning_too_few_outputs_raises():
    @opreg.register_triton_op(
        fake_fn=lambda x: (torch.empty_like(x), torch.empty_like(x)),
        triton_fn=lambda x: (x + 1,),
        triton_device_types="cpu",
        name="rel::too_few",
        schema="(Tensor x) -> (Tensor, Tensor)",
    )
    def too_few(x):
        return x + 1, x + 2

    with pytest.raises(
        RuntimeError, match=r"rel::too_few: kernel 'triton' returned 1 values, expected 2$"
    ):
        too_few(torch.ones(2))


def test_a_vmap_fn_returning_the_wrong_batch_size_raises():
    @opreg.register_vmap_op(
        fake_fn=lambda x: torch.empty_like(x),
        vmap_fn=lambda x: x[:1].clone(),
        fake_vmap_fn=lambda x: torch.empty_like(x),
        name="rel::short_vmap_fn",
    )
    def short_vmap_fn(x: torch.Tensor) -> torch.Tensor:
        return x * 1

    with pytest.raises(RuntimeError, match="rel::short_vmap_fn: its vmap_fn returned output 0"):
        vmap(short_vmap_fn)(torch.ones(5, 2))


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"vmap_fn": lambda x: x}, TypeError, "vmap_fn needs fake_vmap_fn"),
        (
            {"vmap": lambda i, d, x: (x, 0), "vmap_fn": lambda x: x, "fake_vmap_fn": lambda x: x},
            TypeError,
            "give vmap",
        ),
        ({"vmap_out_dims": "a"}, TypeError, "vmap_out_dims must be an int"),
        ({"mutates_args": 42}, TypeError, "mutates_args must be a sequence"),
        ({"aot": "opreg_fused_add_f32"}, TypeError, "aot must be an opreg.AotLaunch"),
        ({"autograd": "error", "backward": lambda ctx, g: g}, ValueError, "autograd='error'"),
    ],
    ids=[
        "vmap_fn_without_fake",
        "vmap_and_vmap_fn",
        "out_dims",
        "mutates",
        "aot",
        "error_backward",
    ],
)
def test_keyword_mistakes_name_the_op(options, error, message):
    with pytest.raises(error, match=rf"rel::keywords.*{message}"):
        _define_plain("rel::keywords", replace=True, **options)


def test_a_python_fake_returning_none_raises():
    _define_plain("rel::none_fake", replace=True, fake_fn=lambda x: None)
    with pytest.raises(TypeError, match="rel::none_fake': its fake returned NoneType"):
        torch.ops.rel.none_fake(torch.ones(2, device="meta"))


def test_a_vmap_rule_returning_something_else_names_the_op():
    _define_plain("rel::bad_rule_shape", replace=True, vmap=lambda info, in_dims, x: None)
    with pytest.raises(TypeError, match="rel::bad_rule_shape': its vmap rule must return"):
        vmap(torch.ops.rel.bad_rule_shape)(torch.ones(3, 2))


def test_opcheck_of_something_that_is_not_an_op():
    with pytest.raises(TypeError, match=r"opreg\.opcheck: op must be an op"):
        opreg.opcheck(lambda x: x)


def test_a_library_that_failed_fails_again_when_loaded_again():
    library = TEST_OPS_LIBRARY.parent / "libopreg_failing_bad_schema.so"
    result = run_probe(
        f"""
        import opreg
        for attempt in range(2):
            try:
                opreg.load_library({str(library)!r})
            except ValueError as error:
                print(attempt, "raised:", str(error).splitlines()[0])
        """
    )
    assert_survived(result)
    assert "0 raised: opreg::load_library:" in result.stdout
    assert "1 raised: opreg::load_library:" in result.stdout


# ---- found by the adversarial sweep of 2026-11-30 ----------------------------------------------


def test_a_replace_to_another_schema_from_inside_the_op_with_a_backward():
    """The autograd kernel reads the schema of the definition it runs, not the op's current one
    (which the fallback changed under it to one with two outputs)."""
    result = run_probe(
        """
        import torch, opreg

        def replace_with_two_outputs():
            @opreg.register_vmap_op(fake_fn=None, name="rel_schema::op", replace=True,
                                    schema="(Tensor x) -> (Tensor, Tensor)")
            def op2(x):
                return x * 3, x * 4

        @opreg.register_vmap_op(fake_fn=lambda x: torch.empty_like(x), name="rel_schema::op",
                                backward=lambda ctx, g: g * 2)
        def op(x: torch.Tensor) -> torch.Tensor:
            replace_with_two_outputs()
            return x * 2

        x = torch.ones(3, requires_grad=True)
        y = torch.ops.rel_schema.op(x)
        assert torch.equal(y.detach(), torch.full((3,), 2.0)), y
        y.sum().backward()
        assert torch.equal(x.grad, torch.full((3,), 2.0)), x.grad
        a, b = torch.ops.rel_schema.op(torch.ones(2))
        assert torch.equal(b, torch.full((2,), 4.0))
        print("ok")
        """
    )
    assert_survived(result)
    assert "ok" in result.stdout


def test_a_fallback_returning_a_tensor_on_another_device_raises():
    @opreg.register_vmap_op(fake_fn=None, name="rel_device::to_meta")
    def to_meta(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x, device="meta")

    with pytest.raises(
        RuntimeError,
        match="rel_device::to_meta: the fallback returned output 0 on meta, expected cpu",
    ):
        to_meta(torch.ones(2))


def test_a_fake_returning_a_tensor_on_another_device_raises():
    @opreg.register_vmap_op(fake_fn=lambda x: torch.empty(x.shape), name="rel_device::bad_fake")
    def bad_fake(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    with pytest.raises(
        RuntimeError,
        match="rel_device::bad_fake': its fake returned output 0 on cpu, expected meta",
    ):
        bad_fake(torch.ones(2, device="meta"))


def test_a_fallback_returning_a_number_for_a_tensor_names_the_op_and_output():
    @opreg.register_vmap_op(fake_fn=None, name="rel_return::number")
    def number(x: torch.Tensor) -> torch.Tensor:
        return 3

    with pytest.raises(
        TypeError,
        match="rel_return::number: the fallback returned <class 'int'> for "
        "output 0, expected Tensor",
    ):
        number(torch.ones(2))


def test_a_fallback_returning_one_value_for_two_outputs_names_the_op():
    @opreg.register_vmap_op(
        fake_fn=None, name="rel_return::pair", schema="(Tensor x) -> (Tensor, Tensor)"
    )
    def pair(x):
        return x

    with pytest.raises(
        TypeError,
        match=r"rel_return::pair: the fallback returned <class "
        "'torch.Tensor'>, expected a tuple of 2 outputs",
    ):
        pair(torch.ones(2))


@pytest.mark.parametrize(
    ("keyword", "piece"),
    [
        ("fake_fn", lambda x: torch.empty_like(x)),
        ("triton_accepts", lambda: True),
    ],
)
def test_a_piece_that_cannot_take_the_arguments_is_refused_at_definition(keyword, piece):
    # triton_accepts decides triton_fn's calls: without one it is refused for that instead.
    kernel = (lambda x, y: x + y) if keyword == "triton_accepts" else None
    options = {"fake_fn": None, "triton_fn": kernel, keyword: piece}
    with pytest.raises(
        TypeError,
        match=f"rel_arity::op': {keyword} cannot be called with the "
        r"schema's arguments \(x, y\)",
    ):

        @opreg.register_triton_op(name="rel_arity::op", **options)
        def op(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x + y

    with pytest.raises(ValueError):
        opreg.describe_op("rel_arity::op")


def test_a_vmap_rule_returning_its_input_raises():
    def rule(info, in_dims, x):
        return x, in_dims[0]

    @opreg.register_vmap_op(fake_fn=None, name="rel_vmap::aliasing", vmap=rule)
    def aliasing(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    with pytest.raises(
        RuntimeError,
        match="rel_vmap::aliasing: the vmap rule returned output 0 sharing memory with an input",
    ):
        vmap(aliasing)(torch.ones(3, 2))


def test_an_aten_error_inside_an_op_names_the_op():
    with pytest.raises(
        RuntimeError,
        match=r"(?s)The size of tensor a \(3\) must match.*"
        r"in the fallback of opreg::fused_add",
    ):
        torch.ops.opreg.fused_add(torch.ones(3), torch.ones(4))


# ---- found by the independent sweep of 2026-12-01 (798 probes against 79bc8df) ----------------


def test_a_python_fake_reached_with_mixed_devices_checks_no_device():
    @opreg.register_vmap_op(fake_fn=lambda x, y: torch.empty_like(x), name="rel_sweep::mixed")
    def mixed(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y

    # The Meta key wins dispatch, as with torch.library; the fake's CPU tensor would be
    # uninitialised memory, so it is refused (tests/python/test_reliability_sweep5.py).
    with pytest.raises(RuntimeError, match="for a call with a meta tensor among its arguments"):
        mixed(torch.ones(2), torch.ones(2, device="meta"))


@pytest.mark.parametrize(
    "misuse",
    [
        "b.fallback(None)",
        "b.kernel(None, 'k', ['cpu'], None, None)",
        "b.kernel(lambda x: x * 3, 'k', ['cpu'], lambda x: False, None)",
        "b.backward(lambda ctx, g: g, None, None)",
        "_C.define_all([None], {})",
    ],
)
def test_misuse_of_the_builder_binding_raises_instead_of_crashing(misuse):
    result = run_probe(
        f"""
        import torch, opreg
        from opreg import _C
        b = _C.OpBuilder("rel_sweep::b(Tensor x) -> Tensor")
        try:
            {misuse}
        except TypeError as error:
            assert "must be callable" in str(error) or "takes OpBuilders" in str(error), error
            print("refused")
        """
    )
    assert_survived(result)
    assert "refused" in result.stdout


def test_deeply_nested_aot_expressions_and_manifests_are_refused(tmp_path):
    result = run_probe(
        f"""
        import opreg, torch
        try:
            opreg.register_triton_op(
                fake_fn=None, triton_fn=None, name="rel_sweep::deep",
                schema="(Tensor x, Tensor y) -> Tensor",
                aot=opreg.AotLaunch("opreg_fused_add_f32",
                                    ("cdiv(" * 30000 + "1" + ", 2)" * 30000,),
                                    ("x", "y", "out0", "numel(x)"), "like:x"),
            )(lambda x, y: x + y)
        except ValueError as error:
            assert "nest at most 64 calls deep" in str(error), error
            print("expression refused")
        folder = {str(tmp_path)!r}
        open(folder + "/deep.json", "w").write("[" * 100000 + "]" * 100000)
        open(folder + "/index.txt", "w").write("deep.json\\n")
        try:
            opreg.load_triton_bundle(folder)
        except ValueError as error:
            assert "deep.json" in str(error) and "nest deeper" in str(error), error
            print("manifest refused")
        """
    )
    assert_survived(result)
    assert "expression refused" in result.stdout and "manifest refused" in result.stdout


def test_loading_a_truncated_library_raises(tmp_path):
    truncated = tmp_path / "truncated.so"
    truncated.write_bytes(opreg.example_library().read_bytes()[:2000])
    result = run_probe(
        f"""
        import opreg
        try:
            opreg.load_library({str(truncated)!r})
        except ValueError as error:
            assert "truncated shared library" in str(error), error
            print("refused")
        """
    )
    assert_survived(result)
    assert "refused" in result.stdout
