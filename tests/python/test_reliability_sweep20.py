"""Regression tests for the twentieth adversarial sweep's findings (reports kept outside the
repository), beside the earlier sweeps' files."""

from __future__ import annotations

import pytest
import torch
from test_reliability import assert_survived, run_probe

import opreg


def test_a_ctx_read_while_another_thread_frees_its_graph():
    # A-F1: a ctx read (saved_tensors) on one thread while the main thread freed the call's graph
    # corrupted the heap (rc -11 or -6 in 3 of 3 runs): the link to the context was cut under the
    # GIL only. Each read now either gets the tensors or raises, naming the op.
    result = run_probe(
        """
        import threading, torch, opreg
        kept = []
        def setup(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])
            kept.append(ctx)
        op = opreg.register_vmap_op(
            lambda x: x * x / 2, fake_fn=lambda x: torch.empty_like(x), name="sweep20::ctx_race",
            schema="(Tensor x) -> Tensor", setup_context=setup,
            backward=lambda ctx, g: g * ctx.saved_tensors[0])
        x = torch.randn(3, requires_grad=True)
        outcomes = set()
        for trial in range(200):
            kept.clear()
            y = op(x)
            ctx = kept[-1]
            stop = threading.Event()
            def reader():
                while not stop.is_set():
                    try:
                        (saved,) = ctx.saved_tensors
                        assert torch.equal(saved, x)
                        outcomes.add("read")
                    except RuntimeError as error:
                        assert "sweep20::ctx_race: this ctx belongs to a call whose" in str(error)
                        outcomes.add("refused")
                        return
            thread = threading.Thread(target=reader)
            thread.start()
            del y
            stop.set()
            thread.join()
        print("outcomes:", sorted(outcomes))
        """
    )
    assert_survived(result)
    assert "refused" in result.stdout, result.stdout


@pytest.mark.parametrize("path", ["vmap_loop", "vmap_fn"])
def test_a_batch_of_no_examples_keeps_the_autograd_policy(path):
    # A-F3: at batch size 0 the 'error' policy let a call that requires grad through (tied into
    # the graph), and vmap_fn's 'none' policy kept the graph.
    if path == "vmap_loop":
        options = {"vmap_loop": True}
    else:
        options = {"vmap_fn": lambda x: x * 2, "fake_vmap_fn": lambda x: torch.empty_like(x)}

    def define(policy):
        return opreg.register_vmap_op(
            lambda x: x * 2,
            fake_fn=lambda x: torch.empty_like(x),
            name=f"sweep20::policy_{policy}_{path}",
            schema="(Tensor x) -> Tensor",
            autograd=policy,
            **options,
        )

    refusing, ignoring = define("error"), define("none")
    for batch in (2, 0):
        x = torch.randn(batch, 3, requires_grad=True)
        with pytest.raises(RuntimeError, match="its autograd policy is 'error'"):
            torch.vmap(refusing)(x)
        assert not torch.vmap(ignoring)(x).requires_grad, batch


def test_an_argument_the_op_writes_must_be_batched_when_another_is():
    # A-F11: the per-example loop let every example write one unbatched tensor in turn; what was
    # left was the last example's write.
    def fallback(x, out):
        out.copy_(x * 2)
        return x * 3

    op = opreg.register_vmap_op(
        fallback,
        fake_fn=lambda x, out: torch.empty_like(x),
        name="sweep20::writes",
        schema="(Tensor x, Tensor(a!) out) -> Tensor",
        vmap_loop=True,
    )
    x = torch.arange(6.0).reshape(3, 2)
    for batch in (x, x[:0]):
        out = torch.zeros(2)
        with pytest.raises(RuntimeError, match="writes argument 'out', which is not batched"):
            torch.vmap(op, in_dims=(0, None))(batch, out)
        assert torch.equal(out, torch.zeros(2))
    out = torch.zeros(3, 2)
    torch.testing.assert_close(torch.vmap(op)(x, out), x * 3)
    torch.testing.assert_close(out, x * 2)


def test_opcheck_takes_a_nan_number_output_as_equal_to_nan():
    # A-F7: a float output that is NaN failed kernel_vs_fallback, fake_vs_real and compile
    # ("output 1 is nan, the fallback's nan").
    op = opreg.register_triton_op(
        triton_fn=None,
        name="sweep20::nan_number",
        schema="(Tensor x) -> (Tensor, float)",
        fake_fn=lambda x: (torch.empty_like(x), float("nan")),
    )(lambda x: (x * 2, float("nan")))
    report = opreg.opcheck(
        op, samples=[(torch.randn(3, 2),)], devices=["cpu"], raise_on_failure=False
    )
    # torch_opcheck is PyTorch's own test, which fails such an op too.
    failed = [row for row in report.failures if row.check != "torch_opcheck"]
    assert not failed, failed
