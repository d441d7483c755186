"""Regression tests for what the adversarial sweep 45 found (see issue 13's notes): a call an op's
own fallback makes anew after replacing or undefining the op, and an op returning many tensors."""

from __future__ import annotations

import time

import pytest
import torch

import opreg
from conftest import run_with_test_ops
from opreg import _C


@pytest.mark.parametrize("change", ["new schema", "same schema", "undefine"])
def test_a_call_a_fallback_makes_anew_after_changing_its_op_reaches_the_op_as_it_is(change):
    # Sweep 45 B-N10/N20: the outer call's autograd pin served every call of the op on its thread
    # while the fallback ran: the new call ran the old definition, on arguments read for the new
    # schema (it returned the tuple (x, y + 1)), or ran after an undefine.
    name = f"sweep45::changes_itself_{change.replace(' ', '_')}"
    namespace, short = name.split("::")
    seen = []

    def new_definition():
        if change == "new schema":
            opreg.custom_op(name, mutates_args=())(_with_y)
        elif change == "same schema":
            opreg.custom_op(name, mutates_args=())(_times_hundred)
        else:
            _C.undefine(name)

    def call_anew():
        op = getattr(getattr(torch.ops, namespace), short)
        if change == "new schema":
            return op(torch.ones(2), torch.full((2,), 7.0))
        return op(torch.ones(2))

    def outer(x: torch.Tensor) -> torch.Tensor:
        new_definition()
        try:
            seen.append(call_anew().tolist())
        except RuntimeError as error:
            seen.append(str(error))
        return x + 1

    opreg.custom_op(name, mutates_args=())(outer)
    assert getattr(getattr(torch.ops, namespace), short)(torch.zeros(2)).tolist() == [1.0, 1.0]
    if change == "new schema":
        assert seen == [[107.0, 107.0]]
    elif change == "same schema":
        assert seen == [[100.0, 100.0]]
    else:
        assert seen[0].startswith(f"{name}: the op is not defined now")


def _with_y(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x * 100 + y


def _times_hundred(x: torch.Tensor) -> torch.Tensor:
    return x * 100


def test_many_tensors_returned_are_checked_in_time_and_sharing_ones_found():
    # Sweep 45 B-N28: the check that outputs do not share memory compared every pair: 256k
    # tensors took 96 s (torch.library's custom_op: 1 s). Now 200k take under a second here;
    # the bound leaves room for a slow machine and catches quadratic time (about a minute).
    @opreg.custom_op("sweep45::many", mutates_args=())
    def many(n: int, share: bool) -> list[torch.Tensor]:
        outputs = [torch.zeros(1) for _ in range(n)]
        if share:
            outputs[-1] = outputs[n // 2][:]
        return outputs

    start = time.perf_counter()
    assert len(torch.ops.sweep45.many(200_000, False)) == 200_000
    assert time.perf_counter() - start < 10
    with pytest.raises(RuntimeError, match="returned two tensors in output 0 sharing memory"):
        torch.ops.sweep45.many(100, True)


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (
            "meta",
            "the vmap rule returned output 0 on meta, expected cpu (the device of its inputs)",
        ),
        ("one tensor twice", "the vmap rule returned outputs 0 and 1 sharing memory"),
    ],
)
def test_a_vmap_rules_outputs_are_checked_as_a_fallbacks(returned, message):
    # Sweep 45 B-N1/B-N2: a rule's output on another device, or one tensor for two outputs, came
    # out of torch.vmap with no error (a fallback's are refused).
    def rule(info, in_dims, x):
        doubled = x * 2
        if returned == "meta":
            return (doubled.to("meta"), x * 3), (0, 0)
        return (doubled, doubled), (0, 0)

    name = "meta" if returned == "meta" else "twice"
    op = opreg.register_vmap_op(
        lambda x: (x * 2, x * 3),
        fake_fn=lambda x: (torch.empty_like(x), torch.empty_like(x)),
        vmap=rule,
        name=f"sweep45::rule_{name}",
        schema="(Tensor x) -> (Tensor, Tensor)",
        replace=True,
    )
    with pytest.raises(RuntimeError) as raised:
        torch.vmap(op)(torch.ones(3, 2))
    assert str(raised.value).startswith(f"sweep45::rule_{name}: {message}")


def test_a_vmap_fns_error_notes_name_the_vmap_fn():
    # Sweep 45 A-F3: the note said "raised in the vmap rule of" an op that has none.
    op = opreg.register_vmap_op(
        lambda x: x * 2,
        fake_fn=torch.empty_like,
        vmap_fn=lambda x: [x],
        fake_vmap_fn=torch.empty_like,
        name="sweep45::noted",
        schema="(Tensor x) -> Tensor",
        replace=True,
    )
    with pytest.raises(TypeError) as raised:
        torch.vmap(op)(torch.ones(3, 2))
    assert raised.value.__notes__ == ["opreg: raised in the vmap_fn of sweep45::noted"]


def test_a_str_argument_that_is_not_utf8_is_named(test_ops_library):
    # Sweep 45 B-N29: a C++ caller's str of bytes that are not UTF-8 reached a Python op as a
    # bare UnicodeDecodeError naming nothing.
    result = run_with_test_ops(
        """
        import ctypes, os, torch, opreg
        opreg.load_library(os.environ["OPREG_TEST_OPS"])
        @opreg.custom_op("sweep45::takes_text", mutates_args=())
        def takes_text(x: torch.Tensor, text: str) -> torch.Tensor:
            return x * len(text)
        calling = ctypes.PyDLL(os.environ["OPREG_TEST_OPS"])
        print("text", calling.opreg_test_call_with_text(b"sweep45::takes_text", b"abc"))
        print("bytes", calling.opreg_test_call_with_text(b"sweep45::takes_text", b"\\xff\\xfe"))
        """,
        test_ops_library,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "text 0" in result.stdout and "bytes 1" in result.stdout
    assert (
        "sweep45::takes_text: argument 'text' holds bytes that are not UTF-8 text ('\\xff\\xfe')"
        in result.stderr
    )


def test_the_worker_dropping_compiled_code_makes_way_for_another_after_an_exception(monkeypatch):
    # Sweep 45 A-F4: an exception on the worker's thread (a gc callback's code) left it in place,
    # and no later replace's compiled code was dropped again.
    from opreg import _registry

    def fails(reset_code_caches):
        raise AttributeError("from a gc callback")

    monkeypatch.setattr(_registry, "_serve_reset_requests", fails)
    with pytest.warns(UserWarning, match="could not be dropped.*from a gc callback"):
        with _registry._reset_lock:
            _registry._start_reset_worker(lambda: None)
        _registry._reset_worker.join(10)
    assert _registry._reset_worker is None
