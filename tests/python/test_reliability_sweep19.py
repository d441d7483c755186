"""Regression tests for the nineteenth adversarial sweep's findings (reports kept outside the
repository), beside the earlier sweeps' files."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from test_reliability import assert_survived, run_probe

import opreg


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


def test_debug_checks_skip_fakes_that_cannot_run_on_meta_and_compare_calls_under_autograd():
    # A-F1 and B-F1: a correct fake with a data-dependent size made by ATen (nonzero, boolean
    # masks, unique, masked_select) or combining its inputs with CPU constants was refused under
    # OPREG_DEBUG=1 (torch's texts for these on meta were not known as "cannot run there").
    # A-F18: a call whose fallback ran under autograd (an input requiring grad, jvp) was not
    # compared at all.
    result = run_probe(
        """
        import os
        os.environ["OPREG_DEBUG"] = "1"
        import torch, opreg
        fakes = {
            "mask": lambda x: x[x > 0],
            "nonzero": torch.nonzero,
            "unique": torch.unique,
            "masked_select": lambda x: torch.masked_select(x, x > 0),
            "cpu_constant": lambda x: x + torch.zeros(x.shape[-1]),
            # the twentieth sweep's A-F6: torch's text for this one was not known either
            "where_cpu_mask": lambda x: torch.where(torch.ones(x.shape, dtype=torch.bool), x, x),
        }
        x = torch.tensor([1.0, -1.0, 2.0])
        for name, fake in fakes.items():
            op = opreg.register_vmap_op(fake_fn=fake, name=f"debug19::{name}",
                                        schema="(Tensor x) -> Tensor")(fake)
            torch.testing.assert_close(op(x), fake(x))
        wrong = opreg.register_vmap_op(fake_fn=lambda x: x.new_empty(x.shape[0] + 1),
                                       name="debug19::wrong",
                                       schema="(Tensor x) -> Tensor")(lambda x: x * 2)
        calls = {
            "plain": lambda: wrong(torch.ones(3)),
            "requires_grad": lambda: wrong(torch.ones(3, requires_grad=True)),
            "jvp": lambda: torch.func.jvp(wrong, (torch.ones(3),), (torch.ones(3),)),
        }
        for name, call in calls.items():
            try:
                call()
                print(name, "not compared")
            except RuntimeError as error:
                assert "fake gives shape [4]" in str(error), error
                print(name, "compared")
        """
    )
    assert_survived(result)
    for name in ("plain", "requires_grad", "jvp"):
        assert f"{name} compared" in result.stdout, result.stdout


@pytest.mark.parametrize("schema", ["(Tensor x) -> Tensor(b)", "(Tensor(a) x) -> Tensor(b)"])
def test_an_output_aliasing_a_set_no_argument_is_in_is_refused(schema):
    # A-F10: such an output read as a wildcard, so the op could return its input itself.
    with pytest.raises(ValueError, match="output 0 is declared an alias of the alias set 'b', "):
        opreg.register_vmap_op(fake_fn=lambda x: x, name="alias19::b", schema=schema)(lambda x: x)
    view = opreg.register_vmap_op(
        fake_fn=lambda x: x, name=f"alias19::a{len(schema)}", schema="(Tensor(a) x) -> Tensor(a)"
    )(lambda x: x)
    x = torch.ones(2)
    y = view(x)  # its input itself, made a view of it (sweep 35 A-F1)
    assert y._base is x and y.data_ptr() == x.data_ptr()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_the_cli_says_in_one_line_that_it_cannot_write_its_output():
    # B-F10: `python -m opreg info > /dev/full` ended in an OSError traceback.
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "opreg", "info"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "python -m opreg: cannot write the output: [Errno 28] No space left on device"
    ], result.stderr


@pytest.mark.parametrize("type_name", ["fp16", "bf16"])
def test_half_precision_scalar_parameters_compile(tmp_path, type_name):
    # The eighteenth sweep's B-F10: PTX declares such a parameter as a byte array
    # (`.param .align 2 .b8 name[2]`), which the size reader skipped, so every such kernel was
    # refused ("the binary expects parameters of sizes [8, 8, 8, 8, 8]").
    from test_reliability_aot import run_aot, scale_spec

    name = f"opreg_rel_scale_{type_name}"
    signature = f'{{ x_ptr = "*fp32", out_ptr = "*fp32", n = "i64", factor = "{type_name}" }}'
    spec = scale_spec(name, signature=signature)
    result = run_aot(spec, tmp_path, "--cache", str(tmp_path / "cache"))
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "out" / f"{name}.json").read_text())
    assert {tuple(v["param_sizes"]) for v in manifest["variants"]} == {(8, 8, 8, 2, 8, 8)}
    assert opreg.load_triton_bundle(tmp_path / "out") == [name]
