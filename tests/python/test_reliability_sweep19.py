"""Regression tests for the nineteenth adversarial sweep's findings (reports kept outside the
repository), beside the earlier sweeps' files."""

from __future__ import annotations

from test_reliability import assert_survived, run_probe


def test_a_ctx_kept_after_its_graph_is_freed_raises_instead_of_reading_freed_memory():
    # A-F19: the Python ctx reached the C++ context of the autograd node by a raw pointer; once
    # the graph was freed, saved_tensors and save_for_backward read and wrote freed memory.
    result = run_probe(
        """
        import gc, torch, opreg
        kept = []
        def setup(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])
            kept.append(ctx)
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * x
        def half_square(x: torch.Tensor) -> torch.Tensor:
            return x * x / 2
        op = opreg.register_vmap_op(
            fake_fn=lambda x: torch.empty_like(x), setup_context=setup, backward=backward,
            name="ctx19::half_square",
        )(half_square)
        x = torch.randn(3, requires_grad=True)
        y = op(x)
        del y
        gc.collect()
        uses = {
            "saved_tensors": lambda: kept[0].saved_tensors,
            "save_for_backward": lambda: kept[0].save_for_backward(x),
            "needs_input_grad": lambda: kept[0].needs_input_grad,
        }
        for use, run in uses.items():
            try:
                run()
                print(use, "answered")
            except RuntimeError as error:
                assert "ctx19::half_square: this ctx belongs to a call whose autograd graph " \\
                    "was freed" in str(error), error
                print(use, "refused")
        op(x).sum().backward()
        torch.testing.assert_close(x.grad, x.detach())
        print("backward ran")
        """
    )
    assert_survived(result)
    for use in ("saved_tensors", "save_for_backward", "needs_input_grad"):
        assert f"{use} refused" in result.stdout, result.stdout
    assert "backward ran" in result.stdout
