"""Regression tests for the thirty-fifth adversarial sweep's findings (reports kept outside the
repository), beside the earlier sweeps' files."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

import opreg

_names = itertools.count()


def _view_op(**keywords):
    def view(x):
        return x.view(-1)

    return opreg.register_triton_op(
        schema="(Tensor(a) x) -> Tensor(a)",
        fake_fn=view,
        triton_fn=None,
        name=f"sweep35::view{next(_names)}",
        **keywords,
    )(view)


def _backward_keywords():
    def setup_context(ctx, inputs, output):
        ctx.shape = inputs[0].shape

    def backward(ctx, grad):
        return grad.view(ctx.shape)

    return {"setup_context": setup_context, "backward": backward}


POLICIES = {
    "fallback": {},
    "backward": _backward_keywords(),
    "none": {"autograd": "none"},
    "error": {"autograd": "error"},
}


@pytest.mark.parametrize("policy", POLICIES)
def test_a_declared_view_shares_its_arguments_version_counter(policy):
    # A-F1: an output the schema declares a view (Tensor(a) x -> Tensor(a)) came back a plain
    # tensor with a version counter of its own: an in-place change through it went unseen by a
    # tensor autograd had saved, and w.grad came out 2 where the right answer is an error.
    op = _view_op(**POLICIES[policy])
    w = torch.ones(4, requires_grad=True)
    b = torch.ones(2, 2)
    y = w * b.view(-1)
    v = op(b)
    assert v.data_ptr() == b.data_ptr() and v.tolist() == [1.0] * 4
    v.mul_(2)
    assert b._version == v._version > 0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_a_declared_view_of_an_op_with_a_backward_is_refused_a_change_in_place():
    # A-F1: with an explicit backward, an in-place change through the view bypassed the
    # backward (a gradient of 1 where 2 is right); PyTorch refuses it for a custom Function.
    op = _view_op(**_backward_keywords())
    a = torch.ones(2, 2, requires_grad=True)
    v = op(a * 1)
    assert v._is_view()
    with pytest.raises(RuntimeError, match=r"Output 0 of sweep35::view.* is a view and is being"):
        v.mul_(2)


def test_a_change_of_the_base_reaches_the_gradient_through_the_view_or_is_refused():
    # A-F1: with an explicit backward, after b.mul_(3) the gradient of op(b).sum() came out 1
    # where 3 is right; a custom Function's view refuses it, and the fallback's view serves it.
    a = torch.ones(2, 2, requires_grad=True)
    b = a * 1
    v = _view_op(**_backward_keywords())(b)
    b.mul_(3)
    with pytest.raises(RuntimeError, match="its base or another view of its base has been"):
        v.sum().backward()
    b = a * 1
    v = _view_op()(b)
    b.mul_(3)
    v.sum().backward()
    assert a.grad.tolist() == [[3.0, 3.0], [3.0, 3.0]]
    assert not _view_op(autograd="none")(a * 1).requires_grad


@pytest.mark.parametrize(
    ("schema", "fallback"),
    [
        ("(Tensor(a) x) -> Tensor(a)[]", lambda x: list(x.unbind(0))),
        ("(Tensor(a) x) -> (Tensor(a), Tensor)", lambda x: (x.view(-1), x * 2)),
    ],
)
def test_views_among_several_outputs_share_the_version_counter(schema, fallback):
    # A-F1: a list of views and a view beside a new tensor came back as plain tensors.
    op = opreg.register_triton_op(
        schema=schema, fake_fn=fallback, triton_fn=None, name=f"sweep35::views{next(_names)}"
    )(fallback)
    w = torch.ones(2, 2, requires_grad=True)
    b = torch.ones(2, 2)
    y = w * b
    view = op(b)[0]
    assert view._is_view() and view._base is b
    view.mul_(3)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_an_input_returned_as_its_own_view_is_a_new_tensor_on_its_memory():
    op = opreg.register_triton_op(
        schema="(Tensor(a) x) -> Tensor(a)",
        fake_fn=lambda x: x,
        triton_fn=None,
        name="sweep35::itself",
    )(lambda x: x)
    x = torch.ones(3)
    y = op(x)
    assert y._base is x
    y.add_(1)
    assert x.tolist() == [2.0] * 3 and x._version == y._version


def test_a_view_autograd_cannot_rebuild_is_refused_a_differentiable_change_in_place():
    # A conjugate view: autograd's as_strided cannot make it again, and would have lost the
    # conjugation from the gradient of a value copied into it.
    op = opreg.register_triton_op(
        schema="(Tensor(a) x) -> Tensor(a)",
        fake_fn=lambda x: x.conj(),
        triton_fn=None,
        name="sweep35::conj",
    )(lambda x: x.conj())
    b = torch.ones(3, dtype=torch.complex64)
    v = op(b)
    assert v.is_conj() and v._base is b
    b.mul_(2)
    assert v.tolist() == [2 + 0j] * 3
    w = torch.ones(3, dtype=torch.complex64, requires_grad=True)
    with pytest.raises(RuntimeError, match="sweep35::conj: output 0 is a view of another dtype"):
        v.copy_(w)


def test_a_cpp_error_holding_a_nul_byte_keeps_its_message_and_the_op_name(test_ops_library):
    # B-F2: Python's message stopped at the NUL ('nul'): the rest and the op's name were lost.
    with pytest.raises(RuntimeError, match=r"(?s)nul\\x00after.*opreg_test::throws_bytes"):
        torch.ops.opreg_test.throws_bytes(torch.ones(3))


@pytest.mark.parametrize("layout", ["csr", "csc", "bsr"])
def test_a_new_sparse_compressed_output_is_not_taken_for_an_alias_of_its_input(layout):
    # A-F4: the checks kept the address of a temporary (crow_indices() and the like) and took a
    # later temporary at that address for the input's: x.clone() was refused at random.
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    op = opreg.register_triton_op(fake_fn=None, triton_fn=None, name=f"sweep35::double_{layout}")(
        double
    )
    dense = torch.eye(4)
    x = {
        "csr": dense.to_sparse_csr(),
        "csc": dense.to_sparse_csc(),
        "bsr": dense.to_sparse_bsr((2, 2)),
    }[layout]
    for _ in range(30):
        assert torch.equal(op(x).to_dense(), dense * 2)


def test_opcheck_runs_a_check_again_when_a_replace_interrupts_it():
    # A-F2: opcheck compared a run of one definition with a run of another that a thread
    # put in meanwhile, and blamed the op ("differs from the fallback's by up to 0.968").
    def define(factor: float, replace: bool):
        def scale(x: torch.Tensor) -> torch.Tensor:
            return x * factor

        return opreg.register_triton_op(
            fake_fn=lambda x: torch.empty_like(x),
            triton_fn=lambda x: x * factor,
            triton_device_types="cpu",
            name="sweep35::replaced_meanwhile",
            replace=replace,
        )(scale)

    op = define(2.0, False)
    stop = threading.Event()

    def replace_again_and_again():
        for index in itertools.count():
            if stop.is_set():
                return
            define(3.0 if index % 2 else 2.0, True)

    replacer = threading.Thread(target=replace_again_and_again)
    replacer.start()
    messages = []
    try:
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            report = opreg.opcheck(
                op,
                [(torch.randn(3, dtype=torch.float64),)],
                checks=["kernel_vs_fallback", "gradients"],
                raise_on_failure=False,
            )
            messages += [row.message for row in report.rows if not row.passed]
    finally:
        stop.set()
        replacer.join()
    replaced = "was replaced on another thread during each of 3 runs of this check: not checked"
    assert all(replaced in message for message in messages), messages[:3]


FORK_SIX_CHILDREN = """
for trial in range(6):
    pid = os.fork()
    if pid == 0:
        os._exit(child(trial))
    deadline = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            raise SystemExit(f"child {trial} hung")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(done[1]) == 0, done
print("every child went on")
os._exit(0)
"""


def fork_while_busy(tmp_path, busy_process: str) -> None:
    """Runs busy_process (which starts threads holding opreg's locks at times and defines
    child(trial) -> exit code) and forks it six times; every child must exit 0 within 60 s."""
    # From a file: a definition then reads its function's source, and a lock is held longer
    # (under `python -c` the race was seldom met).
    script = tmp_path / "fork_while_busy.py"
    script.write_text(textwrap.dedent(busy_process) + FORK_SIX_CHILDREN)
    # CUDA cannot be used in a child forked after the parent used it: these are CPU processes.
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert "every child went on" in result.stdout, result.stderr[-3000:]


def test_a_fork_while_another_thread_defines_leaves_the_child_able_to_define(tmp_path):
    # A-F3: the child copied opreg's definition lock held by the defining thread, which it does
    # not have, and its own definition waited forever (multiprocessing's fork, DataLoader workers).
    fork_while_busy(
        tmp_path,
        """
        import os, threading, time, torch, opreg
        def twice(x: torch.Tensor) -> torch.Tensor:
            return x * 2
        opreg.register_triton_op(fake_fn=None, triton_fn=None, name="sweep35::forked")(twice)
        def replace_again_and_again():
            while True:
                opreg.register_triton_op(
                    fake_fn=None, triton_fn=None, name="sweep35::forked", replace=True)(twice)
        threading.Thread(target=replace_again_and_again, daemon=True).start()
        time.sleep(0.2)
        def child(trial):
            op = opreg.register_triton_op(
                fake_fn=None, triton_fn=None, name=f"sweep35::child{trial}")(twice)
            return 0 if op(torch.ones(1)).item() == 2 else 3
        """,
    )


# Sweep 36, run against the fixes above.


def test_a_view_of_an_element_of_a_tensor_list_shares_its_version_counter():
    # Sweep 36 A-F4: a view of xs[0] for (Tensor(a)[] xs) -> Tensor(a) stayed a plain tensor.
    def first(xs):
        return xs[0].view(-1)

    op = opreg.register_triton_op(
        schema="(Tensor(a)[] xs) -> Tensor(a)",
        fake_fn=first,
        triton_fn=None,
        name="sweep36::first",
    )(first)
    w = torch.ones(4, requires_grad=True)
    a = torch.ones(2, 2)
    y = (w * a.view(-1)).sum()
    v = op([torch.zeros(1), a][1:])
    assert v._base is a
    v.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_a_vmap_rule_returning_a_new_tensor_for_a_declared_view_is_refused():
    # Sweep 36 A-F1: the rule's new tensor was accepted, and an in-place change through the
    # output under vmap silently missed the input.
    def flat(x):
        return x.view(-1)

    op = opreg.register_triton_op(
        schema="(Tensor(a) x) -> Tensor(a)",
        fake_fn=flat,
        triton_fn=None,
        name="sweep36::fresh_view",
        vmap=lambda info, dims, x: (x.movedim(dims[0], 0).clone().reshape(x.shape[dims[0]], -1), 0),
    )(flat)
    x = torch.ones(3, 2, 2)
    with pytest.raises(
        RuntimeError,
        match="sweep36::fresh_view: the vmap rule returned output 0 "
        "sharing memory with none of 'x', but the schema",
    ):
        torch.vmap(lambda t: op(t).mul_(2))(x)
    good = opreg.register_triton_op(
        schema="(Tensor(a) x) -> Tensor(a)",
        fake_fn=flat,
        triton_fn=None,
        name="sweep36::kept_view",
        vmap=lambda info, dims, x: (x.movedim(dims[0], 0).reshape(x.shape[dims[0]], -1), 0),
    )(flat)
    torch.vmap(lambda t: good(t).mul_(2))(x)
    assert x.sum().item() == 24.0


def test_replicate_sharding_of_an_op_that_writes_or_views_an_argument_is_refused():
    # Sweep 36 A-F2: DTensor gathered the argument into a new tensor, and the op's write (or
    # the view's later change) reached only that copy.
    for schema in ("(Tensor(a!) x) -> ()", "(Tensor(a) x) -> Tensor(a)"):
        with pytest.raises(ValueError, match="sharding replicate gathers each DTensor argument"):
            opreg.register_triton_op(
                schema=schema,
                fake_fn=lambda x: None,
                triton_fn=None,
                sharding="replicate",
                name=f"sweep36::replicated{len(schema)}",
            )(lambda x: None)


def test_forks_while_other_threads_check_or_add_pieces_leave_the_child_able_to(tmp_path):
    # Sweep 36 A-F6, A-F7: the child copied opcheck's lock, or a custom op's own lock, held by a
    # thread it does not have, and waited forever for it.
    fork_while_busy(
        tmp_path,
        """
        import os, threading, time, torch, opreg

        def twice(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        checked = opreg.register_triton_op(fake_fn=None, triton_fn=None, name="sweep36::checked")(
            twice)
        pieces = opreg.custom_op("sweep36::pieces", twice, mutates_args=())

        def check_again_and_again():
            while True:
                opreg.opcheck(checked, [(torch.ones(2),)], checks=["fake_vs_real"])

        def add_pieces_again_and_again():
            while True:
                pieces.register_fake(lambda x: torch.empty_like(x))

        # Once first: a fork while another thread imports a module (opcheck imports sympy on
        # its first call) leaves the child Python's own held import lock.
        opreg.opcheck(checked, [(torch.ones(2),)], checks=["fake_vs_real"])
        for loop in (check_again_and_again, add_pieces_again_and_again):
            threading.Thread(target=loop, daemon=True).start()
        time.sleep(0.3)

        def child(trial):
            opreg.opcheck(checked, [(torch.ones(2),)], checks=["fake_vs_real"])
            pieces.register_fake(lambda x: torch.empty_like(x))
            return 0 if pieces(torch.ones(1)).item() == 2 else 3
        """,
    )


def test_an_integer_view_carries_no_gradient():
    # Sweep 36 B-F3: a view of another dtype said requires_grad=True, which PyTorch refuses for
    # integer tensors, and a gradient through it silently stopped.
    op = opreg.register_triton_op(
        schema="(Tensor(a) x) -> Tensor(a)",
        fake_fn=lambda x: x.view(torch.int32),
        triton_fn=None,
        name="sweep36::bits",
        **_backward_keywords(),
    )(lambda x: x.view(torch.int32))
    x = torch.ones(2, requires_grad=True)
    base = x * 1
    bits = op(base)
    assert bits.dtype == torch.int32 and not bits.requires_grad
    bits.add_(1)  # a view without autograd's view + in-place handling, on one version counter
    assert base._version == bits._version > 0


def test_a_view_on_the_same_bytes_in_another_storage_shares_the_version_counter():
    # Sweep 36 B-F2: a fallback returning a wrap of its argument's memory (numpy, from_blob) met
    # the alias check but came back with a version counter of its own.
    def wrap(x):
        return torch.from_numpy(x.numpy()).view(-1)

    op = opreg.register_triton_op(
        schema="(Tensor(a) x) -> Tensor(a)",
        fake_fn=lambda x: x.view(-1),
        triton_fn=None,
        name="sweep36::wrap",
    )(wrap)
    w = torch.ones(4, requires_grad=True)
    b = torch.ones(2, 2)
    y = w * b.view(-1)
    v = op(b)
    v.mul_(2)
    assert b._version == v._version > 0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_opcheck_says_why_it_skips_compiling_an_op_whose_output_aliases_an_input():
    # Sweep 36 B-F8: every such op failed the compile rows with PyTorch's "Found a custom
    # (non-ATen) operator whose output has alias annotations".
    op = _view_op()
    report = opreg.opcheck(op, [(torch.ones(2, 2),)], checks=["torch_opcheck", "compile"])
    messages = {row.check: row.message for row in report.rows}
    assert (
        "test_aot_dispatch_dynamic skipped: an output aliasing an input"
        in (messages["torch_opcheck"])
    )
    assert messages["compile"].startswith("an output aliasing an input, which AOTAutograd")


def test_a_str_output_holding_a_nul_is_returned():
    # Sweep 36 B-F7: it was refused as "not UTF-8", which it is.
    op = opreg.custom_op(
        "sweep36::echo", lambda x, s: s, mutates_args=(), schema="(Tensor x, str s) -> str"
    )
    assert op(torch.ones(1), "a\x00b") == "a\x00b"
