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
            # The reader runs until it is refused, which every read after the free must be.
            def reader():
                while True:
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


def test_nested_vmap_with_an_inner_batch_of_no_examples_keeps_the_graph():
    # A-F2: the per-example loop's batch of no examples tied its outputs to the inputs that
    # require grad by their own requires_grad, which an outer vmap's BatchedTensor hides: the
    # output of vmap(vmap(op)) over a (3, 0, 4) input did not require grad.
    op = opreg.register_vmap_op(
        lambda x: x * 2,
        fake_fn=lambda x: torch.empty_like(x),
        name="sweep20::nested_empty",
        schema="(Tensor x) -> Tensor",
        setup_context=lambda ctx, inputs, output: None,
        backward=lambda ctx, grad: grad * 2,
        vmap_loop=True,
    )
    x = torch.randn(3, 0, 4, requires_grad=True)
    y = torch.vmap(torch.vmap(op))(x)
    assert y.shape == (3, 0, 4) and y.requires_grad
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


def test_a_batch_of_no_examples_batches_every_kind_of_output():
    # A-F4: vmap_loop at batch 0 refused outputs other than tensors ("supports tensor outputs
    # only"), where a batch of examples stacks lists of tensors and keeps numbers unbatched.
    lists = opreg.register_vmap_op(
        lambda x: [x * 2, x + 1],
        fake_fn=lambda x: [torch.empty_like(x), torch.empty_like(x)],
        name="sweep20::empty_list",
        schema="(Tensor x) -> Tensor[]",
        vmap_loop=True,
    )
    x = torch.randn(0, 3, requires_grad=True)
    outputs = torch.vmap(lists)(x)
    assert [tuple(t.shape) for t in outputs] == [(0, 3), (0, 3)]
    assert all(t.requires_grad for t in outputs)
    mixed = opreg.register_vmap_op(
        lambda x: (x * 2, 3, None),
        fake_fn=lambda x: (torch.empty_like(x), 3, None),
        name="sweep20::empty_mixed",
        schema="(Tensor x) -> (Tensor, int, Tensor?)",
        vmap_loop=True,
    )
    for batch in (2, 0):
        tensor, number, none = torch.vmap(mixed, out_dims=(0, None, None))(torch.randn(batch, 3))
        assert tensor.shape == (batch, 3) and number == 3 and none is None


@pytest.mark.parametrize("path", ["vmap_loop", "vmap_fn_backward"])
def test_the_loops_take_nan_in_a_float_list_output_as_the_same_for_every_example(path):
    # A-F8: a float[] output holding NaN "differs between examples" for the per-example loop and
    # for the backward loop of vmap_fn, which compare number outputs.
    def nan_list(x):
        return x * 2, [float("nan"), 1.0]

    if path == "vmap_loop":
        options = {"vmap_loop": True}
    else:
        options = {
            "vmap_fn": nan_list,
            "fake_vmap_fn": nan_list,
            "setup_context": lambda ctx, inputs, output: None,
            "backward": lambda ctx, grad, _: grad * 2,
        }
    op = opreg.register_vmap_op(
        nan_list,
        fake_fn=lambda x: (torch.empty_like(x), [float("nan"), 1.0]),
        name=f"sweep20::nan_list_{path}",
        schema="(Tensor x) -> (Tensor, float[])",
        **options,
    )
    x = torch.ones(3, 2, requires_grad=True)
    tensor, numbers = torch.vmap(op, out_dims=(0, None))(x)
    torch.testing.assert_close(tensor, torch.full((3, 2), 2.0))
    assert numbers[1] == 1.0 and numbers[0] != numbers[0]
    tensor.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3, 2), 2.0))


@pytest.mark.parametrize("path", ["vmap_fn", "rule"])
def test_an_int_list_output_goes_through_vmap_fn_and_a_rule(path):
    # A-F8: an int[] output of a vmap_fn or a rule was refused ("the vmap rule returned a list
    # output holding a <class 'int'>; expected tensors").
    def batched(x):
        return x * 2, [1, 2]

    if path == "vmap_fn":
        options = {"vmap_fn": batched, "fake_vmap_fn": batched}
    else:
        options = {"vmap": lambda info, in_dims, x: (batched(x), (in_dims[0], None))}
    op = opreg.register_vmap_op(
        batched,
        fake_fn=lambda x: (torch.empty_like(x), [1, 2]),
        name=f"sweep20::int_list_{path}",
        schema="(Tensor x) -> (Tensor, int[])",
        **options,
    )
    tensor, numbers = torch.vmap(op, out_dims=(0, None))(torch.ones(3, 2))
    torch.testing.assert_close(tensor, torch.full((3, 2), 2.0))
    assert numbers == [1, 2]


def test_a_rule_returning_a_wrong_list_element_is_refused_naming_the_op():
    # With A-F8's fix a rule's list outputs convert by the schema's type: a wrong element is
    # still an error naming the op, and None is taken only for Tensor?[].
    op = opreg.register_vmap_op(
        lambda x: [x, None],
        fake_fn=lambda x: [torch.empty_like(x), None],
        name="sweep20::optional_list_rule",
        schema="(Tensor x) -> Tensor?[]",
        vmap=lambda info, in_dims, x: ([x * 2, None], 0),
    )
    tensor, none = torch.vmap(op, out_dims=[0, None])(torch.ones(3, 2))
    assert tensor.shape == (3, 2) and none is None
    wrong = opreg.register_vmap_op(
        lambda x: (x, [1]),
        fake_fn=lambda x: (torch.empty_like(x), [1]),
        name="sweep20::int_list_wrong",
        schema="(Tensor x) -> (Tensor, int[])",
        vmap=lambda info, in_dims, x: ((x, ["a"]), (0, None)),
    )
    with pytest.raises(
        TypeError,
        match=r"sweep20::int_list_wrong: the vmap rule returned <class 'list'> for output 1 \(its "
        r"element 0 is <class 'str'>\), expected int\[\]",
    ):
        torch.vmap(wrong, out_dims=(0, None))(torch.ones(3, 2))


def test_opreg_debug_compares_optional_tensor_list_outputs():
    # A-F9: OPREG_DEBUG=1 compared Tensor and Tensor[] outputs with the fake, not Tensor?[] ones.
    result = run_probe(
        """
        import os
        os.environ["OPREG_DEBUG"] = "1"
        import torch, opreg
        op = opreg.register_vmap_op(
            lambda x: [x[:1] * 2, None],
            fake_fn=lambda x: [torch.empty_like(x), None],
            name="sweep20::debug_optional_list",
            schema="(Tensor x) -> Tensor?[]",
        )
        try:
            op(torch.ones(3))
        except RuntimeError as error:
            print("refused:", error)
        """
    )
    assert_survived(result)
    assert (
        "refused: OPREG_DEBUG: sweep20::debug_optional_list: the fallback returned output 0 "
        "element 0 of shape [1]" in result.stdout
    ), result.stdout
