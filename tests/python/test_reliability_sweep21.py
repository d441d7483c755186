"""Regression tests for the twenty-first adversarial sweep's findings (reports kept outside the
repository), beside the earlier sweeps' files."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import forward_ad

import opreg


def _writes(name, schema, **options):
    def fallback(x, out=None):
        for tensor in out if isinstance(out, list) else [out]:
            if tensor is not None:
                tensor.copy_(x * 2)
        return x * 3

    return opreg.register_vmap_op(
        fallback,
        fake_fn=lambda x, out=None: torch.empty_like(x),
        name=f"sweep21::{name}",
        schema=schema,
        **options,
    )


def test_the_loop_refuses_writing_memory_its_examples_share():
    # A-F1: under vmap_loop every example wrote the same memory in turn, and the last write was
    # kept: an unbatched tensor in a written list batched as a whole, or an expanded out.
    x = torch.arange(6.0).reshape(3, 2)
    in_list = _writes("writes_list", "(Tensor x, Tensor(a!)[] out) -> Tensor", vmap_loop=True)
    out = [torch.zeros(3, 2), torch.zeros(2)]
    with pytest.raises(RuntimeError, match="writes argument 'out', whose examples share memory"):
        torch.vmap(in_list, in_dims=(0, [0, None]))(x, out)
    assert not out[0].any() and not out[1].any()
    expanded = _writes("writes_expanded", "(Tensor x, Tensor(a!) out) -> Tensor", vmap_loop=True)
    base = torch.zeros(2)
    with pytest.raises(RuntimeError, match="writes argument 'out', whose examples share memory"):
        torch.vmap(expanded)(x, base.expand(3, 2))
    assert not base.any()
    out = torch.zeros(3, 2)  # each example its own memory: written
    torch.testing.assert_close(torch.vmap(expanded)(x, out), x * 3)
    torch.testing.assert_close(out, x * 2)


@pytest.mark.parametrize("given", ["none", "empty_list"])
def test_the_loop_takes_a_written_argument_that_holds_nothing(given):
    # A-F3: a written Tensor(a!)? given None, or a Tensor(a!)[] given [], was refused as "not
    # batched" by the loop (sweep 20's A-F11 check), though nothing is written.
    if given == "none":
        op = _writes("opt_out", "(Tensor x, Tensor(a!)? out=None) -> Tensor", vmap_loop=True)
        value = None
    else:
        op = _writes("empty_out", "(Tensor x, Tensor(a!)[] out) -> Tensor", vmap_loop=True)
        value = []
    x = torch.arange(6.0).reshape(3, 2)
    torch.testing.assert_close(torch.vmap(op, in_dims=(0, None))(x, value), x * 3)


def test_a_vmap_rule_keeps_the_none_and_error_policies():
    # A-F2: calls served by a vmap rule skipped the autograd policy: 'none' let the rule's
    # gradients through, 'error' accepted an input that requires grad.
    def rule(info, in_dims, x):
        return x.movedim(in_dims[0], 0) * 2, 0

    def define(policy):
        return opreg.register_vmap_op(
            lambda x: x * 2,
            fake_fn=torch.empty_like,
            name=f"sweep21::rule_{policy}",
            schema="(Tensor x) -> Tensor",
            autograd=policy,
            vmap=rule,
        )

    ignoring, refusing = define("none"), define("error")
    x = torch.ones(3, 4, requires_grad=True)
    assert not ignoring(x).requires_grad
    assert not torch.vmap(ignoring)(x).requires_grad
    (torch.vmap(ignoring)(x) + x).sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(3, 4))
    with pytest.raises(RuntimeError, match="its autograd policy is 'error'"):
        torch.vmap(refusing)(x)
    torch.testing.assert_close(torch.vmap(refusing)(x.detach()), x.detach() * 2)


def test_opcheck_vmap_keeps_index_tensors_valid():
    # A-F4a: the vmap check made the other examples of an integer tensor value + i, out of
    # bounds for a correct op taking indices.
    op = opreg.register_vmap_op(
        lambda x, idx: x.index_select(0, idx),
        fake_fn=lambda x, idx: x.new_empty(idx.shape[0], *x.shape[1:]),
        name="sweep21::pick",
        schema="(Tensor x, Tensor idx) -> Tensor",
    )
    sample = (torch.randn(4, 2), torch.tensor([0, 1, 3]))
    report = opreg.opcheck(op, [sample], devices=["cpu"], checks=["vmap"], raise_on_failure=False)
    assert [(row.check, row.passed) for row in report.rows] == [("vmap", True)], report.rows


def test_opcheck_vmap_checks_a_rule_when_a_written_optional_is_none():
    # A-F4b: a sample giving a written Tensor(a!)? as None skipped every combination, and the
    # check passed a wrong rule without comparing anything.
    def fallback(x, out=None):
        if out is not None:
            out.copy_(x * 2)
        return x * 3

    op = opreg.register_vmap_op(
        fallback,
        fake_fn=lambda x, out=None: torch.empty_like(x),
        name="sweep21::wrong_rule",
        schema="(Tensor x, Tensor(a!)? out=None) -> Tensor",
        vmap=lambda info, in_dims, x, out=None: (x.movedim(in_dims[0], 0) * 5, 0),
    )
    report = opreg.opcheck(
        op, [(torch.ones(3), None)], devices=["cpu"], checks=["vmap"], raise_on_failure=False
    )
    assert [(row.check, row.passed) for row in report.rows] == [("vmap", False)], report.rows


def test_the_forward_mode_warning_of_an_op_with_a_backward_says_it_serves_reverse_mode(capfd):
    # A-F8: the warning told an op that has a backward to "give the op a backward". A call
    # through torch.ops warns through C++'s handler, to stderr (as sweep 8's test reads it).
    op = opreg.register_vmap_op(
        lambda x: torch.from_numpy(x.detach().numpy() * 2),
        fake_fn=torch.empty_like,
        name="sweep21::numpy_with_backward",
        schema="(Tensor x) -> Tensor",
        setup_context=lambda ctx, inputs, output: None,
        backward=lambda ctx, grad: grad * 2,
    )
    capfd.readouterr()
    with forward_ad.dual_level():
        out = op(forward_ad.make_dual(torch.ones(3), torch.ones(3)))
        tangent = forward_ad.unpack_dual(out).tangent
    assert tangent is None or not tangent.any()
    err = capfd.readouterr().err
    assert "sweep21::numpy_with_backward: an input has a forward-mode tangent" in err, err
    assert "the op's backward serves reverse mode only" in err, err


def test_a_gradient_for_a_number_argument_is_refused_in_python_terms():
    # A-F7: the refusal spoke C++ only ("return an undefined tensor there").
    op = opreg.register_vmap_op(
        lambda x, a: x * a,
        fake_fn=lambda x, a: torch.empty_like(x),
        name="sweep21::grad_for_float",
        schema="(Tensor x, float a) -> Tensor",
        setup_context=lambda ctx, inputs, output: None,
        backward=lambda ctx, grad: (grad, grad),
    )
    x = torch.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"return an undefined tensor \(None in Python\) there"):
        op(x, 2.0).sum().backward()


def test_a_vmapped_call_racing_a_replace_that_drops_vmap_fn_names_the_replace():
    # A-F6: about 1 in 30 such refusals blamed the internal companion (<name>_vmap), "not
    # defined now ... define it again", instead of the replace of the op the user called.
    import threading
    import time

    def define(with_vmap_fn):
        options = {"vmap_fn": lambda x: x * 2, "fake_vmap_fn": torch.empty_like}
        opreg.register_vmap_op(
            lambda x: x * 2,
            fake_fn=torch.empty_like,
            name="sweep21::race",
            schema="(Tensor x) -> Tensor",
            replace=True,
            **(options if with_vmap_fn else {}),
        )

    define(True)
    stop = threading.Event()
    messages = []

    def caller():
        while not stop.is_set():
            try:
                torch.vmap(torch.ops.sweep21.race)(torch.ones(3, 2))
            except RuntimeError as error:
                messages.append(str(error).splitlines()[0])

    def replacer():
        flip = False
        while not stop.is_set():
            flip = not flip
            define(flip)

    threads = [threading.Thread(target=caller), threading.Thread(target=replacer)]
    for thread in threads:
        thread.start()
    time.sleep(3)
    stop.set()
    for thread in threads:
        thread.join()
    expected = "opreg: op 'sweep21::race' was replaced (or undefined) while this vmapped call ran"
    assert messages and all(m.startswith(expected) for m in messages), "\n".join(set(messages))


def test_code_compiled_before_a_replace_made_from_cpp_is_compiled_again():
    # B-F1: a replace made from C++ outside a library load (here through ctypes, as a C++
    # extension may) reached no Python front, so code compiled before it kept the old fake's
    # shape: 3 numbers where the new definition gives 4.
    import ctypes

    from conftest import TEST_OPS_LIBRARY

    op = opreg.register_triton_op(
        triton_fn=None, name="sweep21::replaced", schema="(int n) -> Tensor", fake_fn=None
    )(lambda n: torch.arange(n, dtype=torch.float32))
    compiled = torch.compile(lambda x: op(3).sum() + op(3).shape[0] + x, backend="aot_eager")
    assert compiled(torch.zeros(1)).item() == 3.0 + 3
    library = ctypes.CDLL(str(TEST_OPS_LIBRARY))
    assert library.opreg_test_replace_arange(b"sweep21::replaced") == 0
    assert compiled(torch.zeros(1)).item() == 6.0 + 4  # the C++ fallback: n + 1 numbers


def test_opcheck_takes_negative_zero_for_other_bits_of_a_bitwise_op():
    # B-F10: a kernel giving -0.0 where the fallback gives +0.0 passed kernel_vs_fallback for an
    # op that declares its kernels bitwise (isclose takes them as equal).
    def define(name, kernel):
        return opreg.register_triton_op(
            fake_fn=torch.empty_like,
            triton_fn=kernel,
            triton_device_types="cpu",
            name=f"sweep21::{name}",
            schema="(Tensor x) -> Tensor",
            bitwise=True,
        )(lambda x: x.abs() * 0)

    sample = [(torch.randn(4),)]
    flipped = define("negative_zero", lambda x: -(x.abs() * 0))
    report = opreg.opcheck(flipped, sample, devices=["cpu"], raise_on_failure=False)
    failed = {row.check: row.message for row in report.rows if not row.passed}
    assert "has -0.0 where the fallback's has +0.0" in failed.get("kernel_vs_fallback", ""), failed
    same = define("positive_zero", lambda x: x.abs() * 0)
    report = opreg.opcheck(same, sample, devices=["cpu"], raise_on_failure=False)
    assert all(row.passed for row in report.rows if row.check == "kernel_vs_fallback")


def test_an_error_of_the_fallback_after_a_kernel_declined_names_the_fallback():
    # B-F7: the fallback's error, after the C++ kernel cpu_loop declined the call, said "in
    # kernel 'cpu_loop'" while the trace said the fallback ran.
    opreg.load_library(opreg.example_library())
    with opreg.trace() as trace, pytest.raises(RuntimeError) as error:
        torch.ops.opreg_example.scale_add(torch.ones(2), torch.ones(3), 1.0)
    assert trace.impls() == ["fallback(declined by kernel:cpu_loop)"]
    message = str(error.value)
    assert "(in the fallback of opreg_example::scale_add, which served the call" in message
    assert "in kernel 'cpu_loop'" not in message
