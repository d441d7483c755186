"""Regression tests for the twenty-eighth adversarial sweep's findings (reports kept outside the
repository), beside the earlier sweeps' files."""

from __future__ import annotations

import pytest
import torch
from test_reliability import assert_survived, run_probe
from torch._subclasses.fake_tensor import FakeTensorMode

import opreg
from conftest import TEST_OPS_LIBRARY
from opreg._registry import _C


def _arange(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32)


def _doubled_arange(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) * 2


def _user_rule(mode, func, types, args, kwargs):
    with mode:
        return torch.empty(args[0] + 1000)


# ---- A-F2: a rule of the user's for a mode, and opreg's own ------------------------------------


def test_a_definition_made_while_the_users_rule_for_a_mode_is_in_place_takes_effect_whole():
    # opreg added its own FakeTensorMode rule (calls without a tensor) after the core took the
    # definition; torch refused it, so a define raised with the op defined, a replace raised with
    # the replace in effect and its Python records gone.
    handle = torch.library.register_torch_dispatch("sweep28::rule_a", FakeTensorMode, _user_rule)
    try:
        op = opreg.register_triton_op(fake_fn=None, triton_fn=None, name="sweep28::rule_a")(_arange)
        assert op(3).tolist() == [0.0, 1.0, 2.0]
        with FakeTensorMode():
            assert op(3).shape == (1003,)  # the user's rule serves
        opreg.register_triton_op(
            fake_fn=None, triton_fn=None, name="sweep28::rule_a", replace=True
        )(_doubled_arange)
        assert op(3).tolist() == [0.0, 2.0, 4.0]
        assert opreg.kernel_status("sweep28::rule_a") == "no triton_fn"
        with FakeTensorMode():
            assert op(3).shape == (1003,)
    finally:
        if hasattr(handle, "destroy"):
            handle.destroy()


def test_the_users_rule_for_a_mode_takes_the_place_of_opregs_own():
    op = opreg.register_triton_op(fake_fn=None, triton_fn=None, name="sweep28::rule_b")(_arange)
    with FakeTensorMode():
        assert op(3).shape == (3,)  # opreg's rule: the fallback on meta tensors
    torch.library.register_torch_dispatch("sweep28::rule_b", FakeTensorMode, _user_rule)
    with FakeTensorMode():
        assert op(3).shape == (1003,)


def test_a_library_load_with_the_users_rule_for_one_of_its_ops_loads_it():
    result = run_probe(
        f"""
        import torch, opreg
        from torch._subclasses.fake_tensor import FakeTensorMode

        def rule(mode, func, types, args, kwargs):
            with mode:
                return torch.empty(args[0] + 1000)

        torch.library.register_torch_dispatch("opreg_test::arange", FakeTensorMode, rule)
        opreg.load_library({str(TEST_OPS_LIBRARY)!r})
        with FakeTensorMode():
            print("fake:", tuple(torch.ops.opreg_test.arange(3).shape))
        opreg.load_library(opreg.example_library())
        print("loaded both")
        """
    )
    assert_survived(result)
    assert "fake: (1003,)" in result.stdout and "loaded both" in result.stdout, result.stdout


# ---- A-F1: torch's block that swaps a custom op's fake -----------------------------------------


@pytest.mark.parametrize("with_fake", [True, False], ids=["with a fake", "without"])
def test_a_custom_ops_fake_is_given_back_after_torchs_fake_profile_block(with_fake):
    # The entry in torch's table of custom ops answered the op itself as its fake, which the block
    # gave back on exit: the op's fake then called the op (RecursionError).
    from torch._library.fake_profile import OpProfile, TensorMetadata, unsafe_generate_fake_kernels
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    name = f"sweep28::profiled_{int(with_fake)}"

    @opreg.custom_op(name, mutates_args=())
    def op(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    if with_fake:
        op.register_fake(lambda x: torch.empty_like(x))
    meta = TensorMetadata(
        rank=1, dtype=torch.float32, device=torch.device("cpu"), layout=torch.strided
    )
    profile = {f"{name.replace('::', '.')}.default": {OpProfile((meta,), meta)}}
    with unsafe_generate_fake_kernels(profile), FakeTensorMode(shape_env=ShapeEnv()):
        assert not isinstance(op(torch.empty(5)).shape[0], int)  # the profile's fake
    with FakeTensorMode(shape_env=ShapeEnv()):
        assert tuple(op(torch.empty(5)).shape) == (5,)
    assert op(torch.ones(2)).tolist() == [2.0, 2.0]


# ---- A-F3: torch.library's functions given what opreg.custom_op returned ------------------------


def test_torch_librarys_functions_take_the_object_custom_op_returns():
    @opreg.custom_op("sweep28::object", mutates_args=())
    def op(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    torch.library.register_fake(op, lambda x: torch.empty_like(x))
    torch.library.register_autograd(op, lambda ctx, grad: grad * 2)
    torch.library.register_vmap(op, lambda info, in_dims, x: (x * 2, in_dims[0]))
    x = torch.ones(3, requires_grad=True)
    op(x).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0, 2.0]
    assert torch.vmap(op)(torch.ones(2, 3)).shape == (2, 3)
    assert set(torch.library.opcheck(op, (torch.ones(3),)).values()) == {"SUCCESS"}
    with pytest.raises(ValueError, match=r"sweep28::object.*register_autocast.*cast them"):
        torch.library.register_autocast(op, "cpu", torch.float16)
    with pytest.raises(ValueError, match=r"sweep28::object.*set_kernel_enabled"):
        op.set_kernel_enabled("cpu", False)


# ---- A-F4: a custom_op's object after register_triton_op took its name --------------------------


def test_pieces_for_an_op_another_front_took_over_name_its_keywords():
    opreg.custom_op("sweep28::taken", mutates_args=())(_triple)
    opreg.register_triton_op(fake_fn=None, triton_fn=None, name="sweep28::taken", replace=True)(
        _triple
    )
    for register in (torch.library.register_fake, opreg.register_fake):
        with pytest.raises(ValueError, match=r"sweep28::taken.*fake_fn="):
            register("sweep28::taken", lambda x: torch.empty_like(x))


def _triple(x: torch.Tensor) -> torch.Tensor:
    return x * 3


# ---- B-F1: dropping compiled code while compiled code runs --------------------------------------


def test_a_fake_that_replaces_an_op_during_compiles_leaves_the_compiled_code_running():
    # The reset of Dynamo's code, handed to a thread of its own after a replace made inside a
    # compile, freed cache entries under the compiled frame running on the main thread (SIGSEGV
    # in 3 runs of 3 at 50 calls).
    result = run_probe(
        """
        import torch, opreg

        def define_a(k):
            @opreg.custom_op("sweep28::a", mutates_args=())
            def a(x: torch.Tensor) -> torch.Tensor:
                return x + k

        define_a(1)

        @opreg.custom_op("sweep28::b", mutates_args=())
        def b(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        fakes = [0]

        @b.register_fake
        def _(x):
            fakes[0] += 1
            define_a(fakes[0] % 2 + 1)  # a replace from inside the compile
            return torch.empty_like(x)

        f = torch.compile(lambda x: torch.ops.sweep28.b(x) + torch.ops.sweep28.a(x),
                          backend="aot_eager")
        for _ in range(300):
            value = f(torch.ones(3))[0].item()
            assert value in (4.0, 5.0), value
        print("calls made; fakes run:", fakes[0])
        """,
        timeout=600,
    )
    assert_survived(result)
    assert "calls made" in result.stdout


def test_a_cpp_thread_replacing_an_op_while_compiled_code_runs_leaves_it_running():
    # A replace from a C++ thread asks Python's main thread to drop compiled code at its next
    # bytecode, which may be inside a compiled frame: Dynamo freed the entry under it.
    result = run_probe(
        f"""
        import ctypes, threading, time, torch, opreg

        library = ctypes.CDLL({str(TEST_OPS_LIBRARY)!r})
        opreg.load_library({str(TEST_OPS_LIBRARY)!r})
        def arange(n: int) -> torch.Tensor:
            return torch.arange(n + 1.0)

        opreg.register_triton_op(fake_fn=lambda n: torch.empty(n + 1), triton_fn=None,
                                 name="sweep28::from_cpp")(arange)
        done = threading.Event()

        def replace():
            while not done.is_set():
                assert library.opreg_test_replace_arange(b"sweep28::from_cpp") == 0
                time.sleep(0.002)

        f = torch.compile(lambda x: torch.ops.sweep28.from_cpp(3).sum() + x, backend="eager")
        thread = threading.Thread(target=replace)
        thread.start()
        end = time.monotonic() + 8
        calls = 0
        try:
            while time.monotonic() < end:
                assert f(torch.zeros(())).item() == 6.0
                calls += 1
        finally:
            done.set()
            thread.join()
        print("calls:", calls)
        """,
        timeout=600,
    )
    assert_survived(result)
    assert "calls:" in result.stdout


# ---- B-F2, B-F3, B-F9: what a call and FakeTensorMode check and say -----------------------------


def test_a_list_of_a_declared_length_is_checked_in_a_call():
    @opreg.custom_op("sweep28::pair", mutates_args=(), schema="(Tensor x, int[2] k=1) -> Tensor")
    def pair(x, k):
        return x + k[0] + k[1]

    assert pair(torch.zeros(1), [2, 3]).tolist() == [5.0]
    assert pair(torch.zeros(1), 4).tolist() == [8.0]  # one int stands for both, as in PyTorch
    for k in ([], [9, 8, 7]):
        with pytest.raises(ValueError, match=rf"sweep28::pair: argument 'k' has {len(k)} elements"):
            pair(torch.zeros(1), k)
    with pytest.raises(ValueError, match=r"argument 'k' has a default of 3 elements, expected 2"):
        opreg.custom_op(
            "sweep28::long_default",
            mutates_args=(),
            schema="(Tensor x, int[2] k=[1,2,3]) -> Tensor",
        )(lambda x, k: x)
    assert not _C.is_defined("sweep28::long_default")


def test_fake_tensor_mode_says_why_a_fallback_serves_as_no_fake():
    # FakeTensorMode replaced opreg's reason with an exception naming only the op; its type stays,
    # since torch.compile runs the op outside the graph on it.
    from torch._subclasses.fake_tensor import UnsupportedOperatorException

    with FakeTensorMode(), pytest.raises(UnsupportedOperatorException) as caught:
        torch.ops.opreg.fused_add(torch.empty(2), torch.empty(3))
    assert caught.value.func is torch.ops.opreg.fused_add.default
    message = str(caught.value)
    assert "opreg::fused_add: has no fake" in message and "broadcast" in message, message
    assert "At:" not in message

    @opreg.custom_op("sweep28::reads_data", mutates_args=())
    def reads_data(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(x.numpy() * 2)

    compiled = torch.compile(lambda x: reads_data(x) + 1, backend="eager")
    assert compiled(torch.ones(2)).tolist() == [3.0, 3.0]
