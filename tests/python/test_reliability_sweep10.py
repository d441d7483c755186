"""Regression tests for the tenth adversarial sweep's findings in the Python fronts."""

from __future__ import annotations

from test_reliability import assert_survived, run_probe

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
