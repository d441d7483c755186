"""Regression tests for the twenty-ninth adversarial sweep's findings (reports kept outside the
repository), beside the earlier sweeps' files."""

from __future__ import annotations

import pytest
import torch
from test_reliability import assert_survived, run_probe
from torch._subclasses.fake_tensor import FakeTensorMode, UnsupportedOperatorException

import opreg

# ---- A-F1: a replace while another thread compiles, holding a lock that compile waits for ----


def test_a_replace_made_under_a_lock_a_compile_waits_for_returns():
    # The replace waited for Dynamo's compile lock without end, held by a thread whose fake
    # waited for the user's lock the replacing thread held: a deadlock.
    result = run_probe(
        """
        import threading, time, torch, opreg
        from opreg import _registry

        registry_lock, in_fake = threading.Lock(), threading.Event()

        def fake_a(x):
            in_fake.set()
            time.sleep(0.5)  # the main thread takes the lock first
            with registry_lock:
                return torch.empty_like(x)

        def times(k):
            def f(x: torch.Tensor) -> torch.Tensor:
                return x * k
            return f

        a = opreg.register_triton_op(fake_fn=fake_a, triton_fn=None, name="sweep29::a")(times(1))
        opreg.register_triton_op(fake_fn=torch.empty_like, triton_fn=None,
                                 name="sweep29::b")(times(2))
        torch.compile(lambda x: x.sin(), backend="eager")(torch.ones(2))  # Dynamo in use
        results = []
        compiling = threading.Thread(
            target=lambda: results.append(torch.compile(lambda x: a(x) + 1,
                                                        backend="eager")(torch.ones(2))))
        compiling.start()
        in_fake.wait()
        with registry_lock:
            opreg.register_triton_op(fake_fn=torch.empty_like, triton_fn=None,
                                     name="sweep29::b", replace=True)(times(3))
        compiling.join()
        for thread in threading.enumerate():
            if thread.name == _registry.DEFERRED_RESET:
                thread.join()
        assert results[0].tolist() == [2.0, 2.0]
        assert torch.ops.sweep29.b(torch.ones(1)).tolist() == [3.0]
        print("returned")
        """,
        timeout=120,
    )
    assert_survived(result)
    assert "returned" in result.stdout


# ---- A-F2: a custom_op defined again after its object gave a rule for a mode -------------------


def test_a_custom_op_defined_again_after_its_rule_for_a_mode_has_opregs_rule():
    # The new definition found the old object's rule in place and added none of its own; the old
    # object's rule then went with it, leaving the op without a rule for FakeTensorMode.
    def define():
        @opreg.custom_op("sweep29::factory", mutates_args=())
        def factory(n: int) -> torch.Tensor:
            return torch.zeros(n)

        return factory

    factory = define()
    factory.register_torch_dispatch(
        FakeTensorMode, lambda mode, func, types, args, kwargs: torch.zeros(args[0] + 1)
    )
    with FakeTensorMode():
        assert factory(4).shape == (5,)  # the user's rule
    factory = define()
    with FakeTensorMode():
        assert factory(4).shape == (4,)  # opreg's rule: the fallback under the mode
    assert torch.compile(lambda: factory(4) + 1, fullgraph=True, backend="eager")().shape == (4,)


# ---- A-F3: Device outputs of an op whose fake is its fallback on meta tensors ---------------


@pytest.mark.parametrize(
    ("returns", "value"),
    [
        ("Device", lambda x: x.device),
        ("Device?", lambda x: x.device),
        ("Device[]", lambda x: [x.device, x.device]),
        ("Device", lambda x: torch.device("meta")),
    ],
    ids=["Device", "Device?", "Device[]", "meta given"],
)
def test_a_device_output_without_a_fake_is_refused_by_fake_tensor_mode(returns, value):
    # The fallback run on meta tensors gives 'meta' where the real call gives another device;
    # sweep 28's fix gave the inputs' device for a plain Device only, also where the real call
    # gives 'meta'. Such a fallback serves as no fake.
    name = f"sweep29::device_{abs(hash((returns, value))) % 10**6}"
    op = opreg.custom_op(name, mutates_args=(), schema=f"(Tensor x) -> {returns}")(value)
    real = op(torch.ones(2))
    with FakeTensorMode() as mode, pytest.raises(UnsupportedOperatorException) as caught:
        op(mode.from_tensor(torch.ones(2)))
    message = str(caught.value)
    assert f"{name}: has no fake" in message and "'meta' for the Device of output 0" in message
    # torch.compile runs the op outside the graph: the real value
    compiled = torch.compile(lambda x: op(x), backend="eager")
    assert compiled(torch.ones(2)) == real


def test_a_device_output_with_a_fake_is_the_fakes():
    @opreg.custom_op("sweep29::device_faked", mutates_args=(), schema="(Tensor x) -> Device")
    def where(x):
        return x.device

    where.register_fake(lambda x: x.device)
    with FakeTensorMode() as mode:
        assert where(mode.from_tensor(torch.ones(2))) == torch.device("cpu")


# ---- A-F4: a str output holding a lone surrogate -----------------------------------------------


def test_a_str_output_with_a_lone_surrogate_says_so():
    @opreg.custom_op("sweep29::surrogate", mutates_args=(), schema="(Tensor x) -> str")
    def text(x):
        return "a\ud800b" if x.numel() == 1 else "caf\u00e9"

    assert text(torch.ones(2)) == "caf\u00e9"
    with pytest.raises(
        ValueError, match=r"sweep29::surrogate: .* str for output 0 that is not UTF-8"
    ):
        text(torch.ones(1))
