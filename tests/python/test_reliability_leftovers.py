"""Regression tests for the sweeps' findings left open until 2026-12-02, and the thirteenth
sweep's."""

from __future__ import annotations

import ctypes
import textwrap

import pytest
import torch
from test_reliability import assert_survived, run_probe

import opreg
from conftest import TEST_OPS_LIBRARY


def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_opcheck_names_the_op_when_its_registered_samples_function_raises():
    # The samples function's own error came out alone: which op's samples failed was not said.
    op = opreg.register_vmap_op(fake_fn=torch.empty_like, name="leftovers_samples_raise")(twice)

    def samples(device):
        raise KeyError("no such dataset")

    opreg.register_samples(op, samples)
    with pytest.raises(
        RuntimeError,
        match=r"leftovers_samples_raise: its registered samples function raised on cpu: "
        r"KeyError: 'no such dataset'",
    ) as raised:
        opreg.opcheck(op, devices=["cpu"])
    assert isinstance(raised.value.__cause__, KeyError)

    def lazy_samples(device):  # a generator fails while opcheck reads it
        yield (torch.randn(3),)
        raise ValueError("ran out")

    opreg.register_samples(op, lazy_samples)
    with pytest.raises(RuntimeError, match=r"raised on cpu: ValueError: ran out"):
        opreg.opcheck(op, devices=["cpu"])
    opreg.register_samples(op, lambda device: [(torch.randn(3, device=device),)])
    opreg.opcheck(op, devices=["cpu"], checks=["kernel_vs_fallback"])


# ---- thirteenth sweep ------------------------------------------------------------------------


def test_an_op_called_from_a_finalizer_at_exit_raises_instead_of_aborting():
    # Garbage collected at exit ran a __del__ calling the op; its Python fallback ran while
    # PyTorch's Python objects were torn down, and PyTorch aborted on an internal assert (11 runs
    # in 11). torch.library's ops are gone by then; opreg's stay, and refuse Python pieces.
    result = run_probe(
        """
        import gc, torch, opreg
        opreg.register_vmap_op(
            lambda x: x + 1, fake_fn=torch.empty_like, name="exit13::inner",
            schema="(Tensor x) -> Tensor",
        )
        class Cycle:
            def __del__(self):
                torch.ops.exit13.inner(torch.zeros(1))
        print("in time", torch.ops.exit13.inner(torch.zeros(1)))
        gc.disable()  # the cycle is collected at exit, not before
        a, b = Cycle(), Cycle()
        a.other, b.other = b, a
        del a, b
        """
    )
    assert_survived(result)
    assert "in time tensor([1.])" in result.stdout
    assert result.stderr.count("Exception ignored in") == 2, result.stderr
    assert (
        "exit13::inner: the fallback, written in Python, cannot run: the Python interpreter is "
        "exiting" in result.stderr
    )


def test_an_explicit_backward_refuses_a_list_argument_that_requires_grad():
    # The list's tensors got no gradient and no word: an explicit backward gives one gradient
    # per argument, and a Tensor[] argument's elements have no edge of their own.
    op = opreg.register_vmap_op(
        lambda xs: xs[0] * 2 + xs[1] * 3,
        fake_fn=lambda xs: torch.empty_like(xs[0]),
        name="list13::with_backward",
        schema="(Tensor[] xs) -> Tensor",
        backward=lambda ctx, grad: None,
        setup_context=lambda ctx, inputs, output: None,
    )
    a, b = torch.ones(2, requires_grad=True), torch.ones(2)
    with pytest.raises(
        RuntimeError,
        match=r"list13::with_backward: argument 'xs' \(a Tensor\[\]\) holds a tensor that "
        r"requires grad, but the op's explicit backward gives gradients to Tensor arguments only",
    ):
        op([a, b])
    assert a.grad is None
    torch.testing.assert_close(op([a.detach(), b]), torch.full((2,), 5.0))  # no grad: served
    with torch.no_grad():
        torch.testing.assert_close(op([a, b]), torch.full((2,), 5.0))


def test_gradients_flow_through_an_optional_tensor_list_argument():
    # A Tensor?[] argument was not seen to require grad: the fallback ran below autograd, the
    # output required no grad, and forward mode gave a zero tangent.
    op = opreg.register_vmap_op(
        lambda xs: xs[0] * 2,
        fake_fn=lambda xs: torch.empty_like(xs[0]),
        name="list13::optional",
        schema="(Tensor?[] xs) -> Tensor",
    )
    a = torch.ones(2, requires_grad=True)
    op([a, None]).sum().backward()
    torch.testing.assert_close(a.grad, torch.full((2,), 2.0))
    _, tangent = torch.func.jvp(lambda t: op([t, None]), (torch.ones(2),), (torch.ones(2),))
    torch.testing.assert_close(tangent, torch.full((2,), 2.0))


@pytest.mark.parametrize(
    "name, schema, fallback, shared",
    [
        ("other", "(Tensor(a) x, Tensor y) -> Tensor(a)", lambda x, y: y.view(-1), "argument 'y'"),
        (
            "other_set",
            "(Tensor(a) x, Tensor(b) y) -> Tensor(a)",
            lambda x, y: y[1:],
            "argument 'y'",
        ),
        ("fresh", "(Tensor(a) x, Tensor y) -> Tensor(a)", lambda x, y: y + 0, "no input"),
    ],
)
def test_an_output_declared_an_alias_must_share_the_memory_of_what_it_aliases(
    name, schema, fallback, shared
):
    # An output declared to alias x that shared y's memory (or none) passed: torch.compile, which
    # trusts the schema, would make it a view of x.
    op = opreg.register_vmap_op(
        fallback, fake_fn=lambda x, y: x.view(-1), name=f"alias13::{name}", schema=schema
    )
    with pytest.raises(
        RuntimeError,
        match=rf"alias13::{name}: the fallback returned output 0 sharing memory with {shared}, "
        r"but the schema .* declares it an alias of 'x'; return a view of 'x'",
    ):
        op(torch.zeros(3), torch.ones(3))


def test_an_output_declared_an_alias_may_share_other_inputs_that_share_its_memory():
    op = opreg.register_vmap_op(
        lambda x, y: x[1:],
        fake_fn=lambda x, y: x[1:],
        name="alias13::view",
        schema="(Tensor(a) x, Tensor y) -> Tensor(a)",
    )
    x = torch.arange(4.0)
    out = op(x, x[:2])  # y is a view of x: sharing it too is sharing x
    assert out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    torch.testing.assert_close(out, torch.tensor([1.0, 2.0, 3.0]))


@pytest.mark.parametrize(
    "schema, message",
    [
        (
            "(Tensor x, ScalarType d=99) -> Tensor",
            r"argument 'd' has the default 99, which is no ScalarType \(expected 0 to \d+",
        ),
        (
            "(Tensor x, MemoryFormat? m=77) -> Tensor",
            r"argument 'm' has the default 77, which is no MemoryFormat \(expected 0 to 3",
        ),
        (
            "(Tensor x, Layout l=-1) -> Tensor",
            r"argument 'l' has the default -1, which is no Layout",
        ),
        ("(Tensor x, int(a!) a) -> ()", r"argument 'a' \(int\) has an alias annotation"),
        ("(Tensor(a) x) -> int(a)", r"output 0 \(int\) has an alias annotation"),
    ],
)
def test_declarations_that_could_not_mean_what_they_say_are_refused(schema, message):
    # Accepted before: an out-of-range default reached the fallback (or was refused only at a
    # call using it), and an alias annotation on an int meant nothing.
    with pytest.raises(ValueError, match=message):
        opreg.register_vmap_op(
            lambda *args: None, fake_fn=lambda *args: None, name="decl13::op", schema=schema
        )
    with pytest.raises(ValueError, match="no op named 'decl13::op'"):
        opreg.describe_op("decl13::op")


def test_dtypes_are_checked_on_meta_tensors_and_under_fake_tensor_mode():
    # Only real calls were checked: tracing passed, and the compiled code failed at its call.
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = opreg.register_vmap_op(
        lambda x, ys: x + 1,
        fake_fn=lambda x, ys: torch.empty_like(x),
        name="dtypes13::f",
        schema="(Tensor x, Tensor[] ys) -> Tensor",
        dtypes={"x": [torch.float32], "ys": [torch.float32]},
    )
    message = r"dtypes13::f: argument 'x' has dtype (Int|torch.int32), expected one of"
    for device in ("cpu", "meta"):
        with pytest.raises(TypeError, match=message):
            op(torch.zeros(2, dtype=torch.int32, device=device), [])
    with FakeTensorMode(), pytest.raises(TypeError, match=message):
        op(torch.zeros(2, dtype=torch.int32), [])
    with pytest.raises(
        TypeError, match=r"argument 'ys' element 1 has dtype (Double|torch.float64)"
    ):
        ys = [torch.zeros(1, device="meta"), torch.zeros(1, dtype=torch.float64, device="meta")]
        op(torch.zeros(2, device="meta"), ys)
    assert op(torch.zeros(2, device="meta"), []).shape == (2,)


def test_a_replace_without_vmap_fn_undefines_the_old_companion():
    # The old `<name>_vmap` companion stayed defined and callable, holding its name and serving
    # nothing.
    def f(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    def define(vmap_fn=None):
        companion = {"vmap_fn": vmap_fn, "fake_vmap_fn": torch.empty_like} if vmap_fn else {}
        opreg.register_vmap_op(
            f, fake_fn=torch.empty_like, name="companion13::h", replace=True, **companion
        )

    x = torch.zeros(3, 2)
    define(vmap_fn=lambda x: x + 7)
    torch.testing.assert_close(torch.vmap(torch.ops.companion13.h)(x), x + 7)
    define()
    torch.testing.assert_close(torch.vmap(torch.ops.companion13.h)(x), x + 1)
    with pytest.raises(RuntimeError, match="companion13::h_vmap: the op is not defined now"):
        torch.ops.companion13.h_vmap(x)
    define(vmap_fn=lambda x: x + 9)
    torch.testing.assert_close(torch.vmap(torch.ops.companion13.h)(x), x + 9)
    torch.testing.assert_close(torch.ops.companion13.h_vmap(x), x + 9)


def test_python_calls_survive_schema_changes_made_from_a_thread_without_the_gil():
    # A C++ thread (no GIL) replacing an op with a new schema freed the old one under PyTorch's
    # Python argument parser, which was reading it: segfaults (9 runs in 15), hangs (5 in 15) and
    # a heap-use-after-free under ASan. Such a replace now holds the GIL.
    result = run_probe(
        textwrap.dedent(
            f"""
            import ctypes, threading, torch, opreg
            library = {str(TEST_OPS_LIBRARY)!r}
            opreg.load_library(library)
            flip = ctypes.CDLL(library).opreg_test_flip_schema  # ctypes releases the GIL
            assert flip(1) == 0
            done = threading.Event()
            def replace():
                assert flip(4000) == 0
                done.set()
            threading.Thread(target=replace).start()
            results, errors = set(), set()
            x = torch.zeros(2)
            while not done.is_set():
                for args in ((x,), (x, 5)):
                    try:
                        results.add(torch.ops.opreg_test.flip(*args).tolist()[0])
                    except Exception as error:
                        errors.add(type(error).__name__)
            print("results", sorted(results), "errors", sorted(errors))
            """
        ),
        timeout=300,
    )
    assert_survived(result)
    results = result.stdout.split("results ")[1]
    assert set(eval(results.split(" errors ")[0])) <= {1.0, 5.0}, result.stdout


def test_an_error_raised_in_a_python_piece_names_the_op_in_a_note():
    # Under vmap, a fallback calling .item() raised functorch's message alone, naming no op. The
    # error stays itself (type and message); a note names the op and the piece.
    opreg.register_vmap_op(
        lambda x: x * x.sum().item(),
        fake_fn=torch.empty_like,
        name="note13::item",
        schema="(Tensor x) -> Tensor",
    )
    with pytest.raises(RuntimeError, match=r"\.item\(\)") as raised:
        torch.vmap(torch.ops.note13.item)(torch.ones(3, 2))
    assert raised.value.__notes__ == ["opreg: raised in the fallback of note13::item"]

    def refuse(x):
        raise ValueError("not this one")

    opreg.register_vmap_op(
        refuse, fake_fn=torch.empty_like, name="note13::refuse", schema="(Tensor x) -> Tensor"
    )
    with pytest.raises(ValueError) as raised:
        torch.ops.note13.refuse(torch.ones(1))
    assert str(raised.value) == "not this one"
    assert raised.value.__notes__ == ["opreg: raised in the fallback of note13::refuse"]


def test_a_schema_change_from_a_thread_a_loading_library_waits_for_does_not_deadlock():
    # Review of the fix above: the replacing thread, which a library's initializer starts and
    # joins while the loader's lock is held, waited for the GIL, which a Python thread held while
    # it waited for the loader (ctypes.CDLL): a deadlock, 5 runs in 5. The GIL is now taken by a
    # thread of its own, for at most a second of waiting.
    replacing = TEST_OPS_LIBRARY.parent / "libopreg_failing_thread_replace.so"
    result = run_probe(
        textwrap.dedent(
            f"""
            import ctypes, os, threading, torch, opreg
            os.environ["OPREG_REPLACE_NAME"] = "opreg_test::flip"
            opreg.load_library({str(TEST_OPS_LIBRARY)!r})
            assert ctypes.CDLL({str(TEST_OPS_LIBRARY)!r}).opreg_test_flip_schema(1) == 0
            done = threading.Event()
            def load():
                opreg.load_library({str(replacing)!r})
                done.set()
            threading.Thread(target=load, daemon=True).start()
            while not done.is_set():
                ctypes.CDLL("libm.so.6")  # the loader's lock, with the GIL held
            print("loaded", torch.ops.opreg_test.flip.default._schema)
            """
        ),
        timeout=120,
    )
    assert_survived(result)
    assert "loaded opreg_test::flip(Tensor x) -> Tensor" in result.stdout


@pytest.mark.parametrize("transform", ["grad", "jvp", "vmap"])
def test_a_declared_view_works_under_functorch(transform):
    # Review: functorch's wrappers have no storage, so the view seemed to share no memory.
    op = opreg.register_vmap_op(
        lambda x: x.view(-1),
        fake_fn=lambda x: x.view(-1),
        name=f"alias13::view_{transform}",
        schema="(Tensor(a) x) -> Tensor(a)",
    )
    x = torch.arange(6.0).reshape(2, 3)
    if transform == "grad":
        torch.testing.assert_close(torch.func.grad(lambda t: op(t).sum())(x), torch.ones(2, 3))
    elif transform == "jvp":
        _, tangent = torch.func.jvp(op, (x,), (torch.ones(2, 3),))
        torch.testing.assert_close(tangent, torch.ones(6))
    else:
        torch.testing.assert_close(torch.vmap(op)(x), x)


def test_an_output_declared_an_alias_of_an_argument_not_given_may_not_share_another_input():
    op = opreg.register_vmap_op(
        lambda x, y: y.view(-1),
        fake_fn=lambda x, y: torch.empty_like(y),
        name="alias13::optional",
        schema="(Tensor(a)? x, Tensor y) -> Tensor(a)",
    )
    with pytest.raises(
        RuntimeError,
        match=r"sharing memory with an input, but the schema .* declares it an alias of "
        r"arguments this call does not give",
    ):
        op(None, torch.ones(2))
    opreg.register_vmap_op(
        lambda xs: xs[0],
        fake_fn=lambda xs: xs[0],
        name="alias13::optional_list",
        schema="(Tensor(a)[]? xs) -> Tensor(a)",  # an optional list of aliased tensors
    )
    x = torch.ones(2)
    assert torch.ops.alias13.optional_list([x]).data_ptr() == x.data_ptr()


def test_a_replace_after_cpp_undefined_the_op_and_its_companion_succeeds():
    # Review: C++'s undefine took the companion along; the Python front then undefined it again,
    # which raised after the op was already defined, leaving its old fake in place.
    undefine = ctypes.CDLL(str(TEST_OPS_LIBRARY)).opreg_test_undefine
    undefine.argtypes = [ctypes.c_char_p]

    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    opreg.register_vmap_op(
        twice,
        fake_fn=torch.empty_like,
        vmap_fn=twice,
        fake_vmap_fn=torch.empty_like,
        name="companion13::cpp",
    )
    assert undefine(b"companion13::cpp") == 0
    opreg.register_vmap_op(twice, fake_fn=torch.empty_like, name="companion13::cpp", replace=True)
    torch.testing.assert_close(torch.ops.companion13.cpp(torch.ones(2)), torch.full((2,), 2.0))


def test_an_error_whose_notes_are_not_a_list_stays_itself():
    def fallback(x):
        error = ValueError("the real error")
        error.__notes__ = ("not a list",)
        raise error

    op = opreg.register_vmap_op(
        fallback, fake_fn=torch.empty_like, name="note13::tuple", schema="(Tensor x) -> Tensor"
    )
    with pytest.raises(ValueError, match="the real error"):
        op(torch.ones(1))
