"""Regression tests for the tenth adversarial sweep's findings in the Python fronts."""

from __future__ import annotations

import re
import textwrap
import threading
from pathlib import Path

import pytest
import torch
from test_reliability import assert_survived, run_probe

import opreg
from opreg._registry import SCHEMA_RESERVED_WORDS

# ---- F2: a replace while torch.compile is tracing --------------------------------------------

# A backend that counts the graphs compiled (into `graphs`), and an op body adding `value`.
COMPILE_HELPERS = """
def counting(gm, example_inputs):
    graphs.append(gm)
    return gm.forward

def plus(value):
    def f(x: torch.Tensor) -> torch.Tensor:
        return x + value
    return f
"""


def test_a_replace_from_a_fake_during_a_compile_survives_and_drops_compiled_code():
    # The reset of Dynamo's code caches ran inside the compile, which crashed (SIGSEGV); it now
    # runs once the compile ends, and code compiled before the replace is compiled again.
    result = run_probe(
        COMPILE_HELPERS
        + textwrap.dedent(
            """
        import threading, torch, opreg
        from opreg import _registry

        graphs = []

        def replace_once(x):
            if not replaced:
                replaced.append(True)
                opreg.register_triton_op(name="sweep10::r8", fake_fn=torch.empty_like,
                                         triton_fn=None, replace=True)(plus(2))
            return torch.empty_like(x)

        replaced = []
        op = opreg.register_triton_op(name="sweep10::r8", fake_fn=torch.empty_like,
                                      triton_fn=None)(plus(1))
        earlier = torch.compile(lambda x: op(x) * 3, fullgraph=True, backend=counting)
        assert earlier(torch.zeros(2)).tolist() == [3.0, 3.0]
        op = opreg.register_triton_op(name="sweep10::r8", fake_fn=replace_once, triton_fn=None,
                                      replace=True)(plus(1))
        compiled = torch.compile(lambda x: op(x) * 1, fullgraph=True, backend=counting)
        assert compiled(torch.zeros(2)).tolist() == [2.0, 2.0]
        assert len(graphs) == 2
        for thread in threading.enumerate():
            if thread.name == _registry.DEFERRED_RESET:
                thread.join()
        assert compiled(torch.zeros(2)).tolist() == [2.0, 2.0]
        assert earlier(torch.zeros(2)).tolist() == [6.0, 6.0]
        assert len(graphs) == 4, len(graphs)  # both compiled again
        """
        )
    )
    assert_survived(result)


# ---- F6: a replace while torch._dynamo is first being imported ---------------------------------


def test_a_replace_while_torch_dynamo_is_partly_imported_does_not_raise():
    # A first import of torch._dynamo under way on another thread leaves a module without
    # reset_code_caches in sys.modules: the replace had taken effect, then raised AttributeError.
    result = run_probe(
        """
        import sys, types, torch, opreg

        assert "torch._dynamo" not in sys.modules
        def define(value, replace):
            def f(x: torch.Tensor) -> torch.Tensor:
                return x + value
            return opreg.register_triton_op(name="sweep10::partly", fake_fn=torch.empty_like,
                                            triton_fn=None, replace=replace)(f)

        define(1, False)
        sys.modules["torch._dynamo"] = types.ModuleType("torch._dynamo")  # partly imported
        op = define(2, True)
        del sys.modules["torch._dynamo"]
        assert op(torch.zeros(2)).tolist() == [2.0, 2.0]
        """
    )
    assert_survived(result)


def test_a_replace_whose_reset_of_compiled_code_fails_warns_instead_of_raising():
    result = run_probe(
        """
        import sys, types, warnings, torch, opreg

        def define(value, replace):
            def f(x: torch.Tensor) -> torch.Tensor:
                return x + value
            return opreg.register_triton_op(name="sweep10::failing", fake_fn=torch.empty_like,
                                            triton_fn=None, replace=replace)(f)

        def reset_code_caches():
            raise RuntimeError("no reset here")

        define(1, False)
        sys.modules["torch._dynamo"] = types.ModuleType("torch._dynamo")
        sys.modules["torch._dynamo"].reset_code_caches = reset_code_caches
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            op = define(2, True)
        del sys.modules["torch._dynamo"]
        assert op(torch.zeros(2)).tolist() == [2.0, 2.0]
        [warning] = [w for w in caught if "could not be dropped" in str(w.message)]
        assert "may run the earlier definition: RuntimeError: no reset here" in str(
            warning.message
        ), warning.message
        """
    )
    assert_survived(result)


def test_a_replace_during_a_compile_on_another_thread_waits_for_it_and_drops_its_code():
    # torch.compiler.is_compiling() is True on every thread while one compiles; the reset waits
    # for Dynamo's compile lock instead (for a second; then opreg's thread waits), and the code
    # that compile made is compiled again.
    result = run_probe(
        COMPILE_HELPERS
        + textwrap.dedent(
            """
        import threading, time, torch, opreg
        from opreg import _registry

        graphs, tracing = [], threading.Event()

        def slow_fake(x):
            tracing.set()
            time.sleep(0.5)
            return torch.empty_like(x)

        op = opreg.register_triton_op(name="sweep10::other", fake_fn=slow_fake,
                                      triton_fn=None)(plus(1))
        compiled = torch.compile(lambda x: op(x) * 1, fullgraph=True, backend=counting)

        def replace():
            tracing.wait()
            opreg.register_triton_op(name="sweep10::other", fake_fn=torch.empty_like,
                                     triton_fn=None, replace=True)(plus(2))

        replacer = threading.Thread(target=replace)
        replacer.start()
        compiled(torch.zeros(2))
        replacer.join()
        for thread in threading.enumerate():  # a compile slower than a second
            if thread.name == _registry.DEFERRED_RESET:
                thread.join()
        assert compiled(torch.zeros(2)).tolist() == [2.0, 2.0]
        assert len(graphs) == 2, len(graphs)
        """
        )
    )
    assert_survived(result)


# ---- F7: op names that are reserved words of PyTorch's schema language -----------------------


def define_named(name: str) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    opreg.register_triton_op(name=name, fake_fn=torch.empty_like, triton_fn=None)(f)


def test_the_reserved_words_are_those_of_pytorchs_schema_lexer():
    lexer = Path(torch.__file__).parent / "include/torch/csrc/jit/frontend/lexer.h"
    if not lexer.is_file():
        pytest.skip("PyTorch's headers are not installed")
    tokens = re.findall(r'_\(TK_\w+, "[^"]*", "([^"]*)"\)', lexer.read_text())
    assert {token for token in tokens if token.isidentifier()} == SCHEMA_RESERVED_WORDS


@pytest.mark.parametrize("word", sorted(SCHEMA_RESERVED_WORDS))
def test_a_reserved_word_of_the_schema_language_is_refused_as_op_name_or_namespace(word):
    # The refusal was the schema parser's ("expected ident but found 'in'"), naming no name.
    for name in (f"sweep10_reserved::{word}", f"{word}::sweep10_reserved"):
        with pytest.raises(RuntimeError):
            torch._C.parse_schema(f"{name}(Tensor x) -> Tensor")
        message = (
            f"name '{name}': '{word}' is a reserved word of PyTorch's schema language and cannot "
            "be an op name or namespace"
        )
        with pytest.raises(ValueError, match=re.escape(f"opreg: {message}")):
            define_named(name)
        with pytest.raises(ValueError, match=re.escape(f"opreg.custom_op: {message}")):
            opreg.custom_op(name, mutates_args=())(lambda x: x)
        with pytest.raises(ValueError, match="no op"):
            opreg.describe_op(name)


@pytest.mark.parametrize("word", ["ins", "define", "If", "not_", "lambda", "yield", "Tensor"])
def test_a_near_miss_of_a_reserved_word_is_an_op_name(word):
    torch._C.parse_schema(f"sweep10_near::{word}(Tensor x) -> Tensor")
    define_named(f"sweep10_near::{word}")
    assert getattr(torch.ops.sweep10_near, word)(torch.zeros(2)).tolist() == [1.0, 1.0]


# ---- F8: one CustomOpDef used from several threads at once -----------------------------------


def test_one_custom_op_def_takes_pieces_from_several_threads_at_once():
    # Each method re-defines the op; a thread that read the registry between another's define
    # and its bookkeeping was told the op "was defined again since this object defined it".
    @opreg.custom_op("sweep10::shared", mutates_args=())
    def shared(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    def backward(ctx, grad):
        return grad * 3

    errors, ready = [], threading.Barrier(4)

    def repeat(register):
        ready.wait()
        try:
            for _ in range(30):
                register()
        except Exception as error:
            errors.append(error)

    registers = [
        lambda: shared.register_fake(torch.empty_like),
        lambda: shared.register_autograd(backward),
        lambda: shared.register_kernel("cuda", lambda x: x * 2),
        lambda: shared.register_vmap(lambda info, in_dims, x: (x * 2, in_dims[0])),
    ]
    threads = [threading.Thread(target=repeat, args=(register,)) for register in registers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    x = torch.ones(2, requires_grad=True)
    shared(x).sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]  # every thread's piece is in the last definition
    report = opreg.describe_op("sweep10::shared")
    assert (report.fake, report.vmap) == (opreg.FakeSource.PYTHON, opreg.VmapSupport.RULE)
    assert [k.device_type for k in report.kernels if k.kind is opreg.ServingKind.KERNEL] == ["cuda"]


# ---- F9: a device type named twice -----------------------------------------------------------


def test_a_device_type_named_twice_counts_once_as_in_torch_library():
    # Was refused as "kernels 'triton' and 'triton' both serve device type 'cpu'".
    def plus_one(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    def plus_ten(x):
        return x + 10

    op = opreg.register_triton_op(
        name="sweep10::twice",
        fake_fn=torch.empty_like,
        triton_fn=plus_ten,
        triton_device_types=["cpu", "CPU "],
        device_types=["cuda", "cuda"],
    )(plus_one)
    report = opreg.describe_op("sweep10::twice")
    assert [(k.device_type, k.kernel) for k in report.kernels] == [("cpu", "triton")]
    assert op(torch.zeros(2)).tolist() == [10.0, 10.0]

    @torch.library.custom_op("sweep10_torch::twice", mutates_args=(), device_types=["cpu", "cpu"])
    def torchs(x: torch.Tensor) -> torch.Tensor:  # what torch.library does with the same list
        return x + 10

    assert torchs(torch.zeros(2)).tolist() == [10.0, 10.0]
