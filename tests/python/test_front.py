"""The Python front: EvoX's register_triton_op / register_vmap_op calls run unchanged with the
import switched to opreg, every parameter keeps its meaning, the Triton path matches the fallback
(compiled on a GPU, interpreted on CPU), and each EvoX defect is absent."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap

import evox_style_ops as ops
import pytest
import torch
from torch.func import vmap

import opreg
from conftest import TRITON_DEVICE, requires_cuda

triton_available = pytest.mark.skipif(not opreg.has_triton(), reason="needs a working Triton")


# ---- the seed example -------------------------------------------------------------------------


def test_seed_example_runs_unchanged():
    import seed_example

    x, y = torch.randn(3000), torch.randn(3000)
    with opreg.trace() as t:
        out = seed_example.fused_add(x, y)
    assert t.impls() == ["fallback"]  # a CPU call: the seed's kernel serves CUDA only
    torch.testing.assert_close(out, x + y)
    if torch.cuda.is_available():
        xc, yc = x.cuda(), y.cuda()
        with opreg.trace() as t:
            out = seed_example.fused_add(xc, yc)
        assert t.impls() == ["kernel:triton"]
        torch.testing.assert_close(out, xc + yc, rtol=0, atol=0)


# ---- the Triton path against the fallback ---------------------------------------------------


@triton_available
@pytest.mark.parametrize("shape", [(1, 1), (5, 123), (7, 1023), (0, 4)])
def test_triton_fn_matches_the_fallback(shape):
    x = torch.randn(shape, device=TRITON_DEVICE)
    with opreg.trace() as t:
        out = ops.scale_rows(x, 1.5)
    assert t.impls() == ["kernel:triton"]
    torch.testing.assert_close(out, x * 1.5, rtol=0, atol=0)


# ---- every EvoX parameter -------------------------------------------------------------------


def test_name_schema_and_defaults():
    assert str(ops.scale_rows._schema) == "evox_test::scale_rows(Tensor x, float factor) -> Tensor"
    assert str(ops.softsign._schema) == "evox_test::softsign(Tensor x) -> Tensor"

    @opreg.register_vmap_op(fake_fn=lambda x: torch.empty_like(x))
    def default_named(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    assert default_named._schema.name == "opreg_py::default_named"


def test_mutates_args_is_honoured_in_eager_and_compile():
    x, y = torch.zeros(4), torch.ones(4)
    ops.add_into(x, y)
    assert torch.equal(x, torch.ones(4))
    assert ops.add_into._schema.arguments[0].alias_info.is_write

    def f(a, b):
        ops.add_into(a, b)
        return a * 2

    a = torch.zeros(3)
    torch.testing.assert_close(
        torch.compile(f, fullgraph=True)(a, torch.ones(3)), 2 * torch.ones(3)
    )
    torch.testing.assert_close(a, torch.ones(3))


@triton_available
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_vmap_fn_serves_every_depth_with_one_call(depth):
    """EvoX stops at max_vmap_level with one op per level; opreg has one companion op."""
    x = torch.randn(*([3] * depth), 5, 7, device=TRITON_DEVICE)
    fn = lambda a: ops.scale_rows(a, 2.0)  # noqa: E731
    for _ in range(depth):
        fn = vmap(fn)
    ops.calls.clear()
    with opreg.trace() as t:
        out = fn(x)
    assert ops.calls[-1] == f"vmap_fn{tuple(x.shape)}"  # one call sees every batch dim
    assert len([c for c in ops.calls if c.startswith("wrap")]) == depth
    assert t.impls().count("vmap_fn") == 1
    torch.testing.assert_close(out, x * 2.0, rtol=0, atol=0)


def test_vmap_fn_with_unbatched_arguments_and_out_dims():
    x = torch.randn(4, 6)
    out = vmap(ops.row_norm, in_dims=1, out_dims=0)(x)
    torch.testing.assert_close(out, x.pow(2).sum(0).sqrt())
    nested = vmap(vmap(ops.row_norm))(torch.randn(2, 3, 5))
    assert nested.shape == (2, 3)


def test_without_vmap_fn_the_fallback_runs_under_vmap_not_a_loop():
    x = torch.randn(8, 10)
    with opreg.trace() as t:
        out = vmap(ops.softsign)(x)
    assert t.impls() == ["vmap:fallback", "fallback"]
    torch.testing.assert_close(out, x / (1 + x.abs()))


def test_device_types_and_max_vmap_level_are_accepted():
    report = opreg.describe_op("evox_test::scale_rows")
    assert report.vmap is opreg.VmapSupport.RULE
    assert "kernel:triton" in {k.describe() for k in report.kernels} or not opreg.has_triton()


# ---- EvoX's defects are absent --------------------------------------------------------------


def test_autograd_by_default_and_with_an_explicit_backward():
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    ops.scale_rows(x, 3.0).sum().backward()  # EvoX: "no autograd formula was registered"
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))

    @opreg.register_triton_op(
        fake_fn=lambda x: torch.empty_like(x),
        triton_fn=None,
        name="evox_test::cube",
        setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]),
        backward=lambda ctx, grad: 3 * ctx.saved_tensors[0] ** 2 * grad,
    )
    def cube(x: torch.Tensor) -> torch.Tensor:
        return x**3

    with opreg.trace() as t:
        cube(x).sum().backward()
    assert t.impls() == ["fallback", "backward"]
    assert torch.autograd.gradcheck(cube, (x.detach().requires_grad_(),))


def test_autograd_context_keeps_attributes_and_needs_input_grad():
    seen = {}

    def setup(ctx, inputs, output):
        ctx.factor = inputs[1]
        seen["needs"] = ctx.needs_input_grad

    def backward(ctx, grad):
        return grad * ctx.factor, None

    @opreg.register_vmap_op(
        fake_fn=lambda x, f: torch.empty_like(x),
        name="evox_test::times",
        setup_context=setup,
        backward=backward,
    )
    def times(x: torch.Tensor, f: float) -> torch.Tensor:
        return x * f

    x = torch.randn(3, requires_grad=True)
    times(x, 4.0).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 4.0))
    assert seen["needs"] == (True, False)


def test_error_policy_refuses_with_the_op_name():
    @opreg.register_vmap_op(
        fake_fn=lambda x: torch.empty_like(x), name="evox_test::no_grad", autograd="error"
    )
    def no_grad(x: torch.Tensor) -> torch.Tensor:
        return x.sin()

    with pytest.raises(RuntimeError, match="evox_test::no_grad: an input requires grad"):
        no_grad(torch.randn(2, requires_grad=True))


def test_existing_name_is_an_error_unless_replace():
    def again():
        @opreg.register_vmap_op(fake_fn=lambda x: torch.empty_like(x), name="evox_test::softsign")
        def softsign(x: torch.Tensor) -> torch.Tensor:
            return x

    with pytest.raises(
        ValueError,
        match="evox_test::softsign: an op of this name is already "
        r"defined \(by .*evox_style_ops.py",
    ):
        again()

    @opreg.register_vmap_op(fake_fn=lambda x: torch.empty_like(x), name="evox_test::replaced")
    def first(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    @opreg.register_vmap_op(
        fake_fn=lambda x: torch.empty_like(x), name="evox_test::replaced", replace=True
    )
    def second(x: torch.Tensor) -> torch.Tensor:
        return x + 2

    assert torch.equal(torch.ops.evox_test.replaced(torch.zeros(2)), torch.full((2,), 2.0))
    assert torch.equal(second(torch.zeros(2)), torch.full((2,), 2.0))


def test_device_type_registered_later_reaches_earlier_ops():
    @opreg.register_triton_op(
        fake_fn=lambda x: torch.empty_like(x), triton_fn=lambda x: x * 1, name="evox_test::late"
    )
    def late(x: torch.Tensor) -> torch.Tensor:
        return x * 1

    kernels = lambda: {k.device_type for k in opreg.describe_op("evox_test::late").kernels}  # noqa: E731
    assert "xpu" not in kernels()
    assert opreg.register_triton_device_type(" XPU ") is None  # as EvoX's
    assert "xpu" in opreg.triton_device_types()
    assert "xpu" in kernels()


def test_broken_triton_leaves_import_working_and_the_fallback_serving(tmp_path):
    broken = tmp_path / "triton"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise RuntimeError('this Triton install is broken')\n")
    code = textwrap.dedent("""
        import torch, opreg
        assert not opreg.has_triton()
        @opreg.register_triton_op(fake_fn=lambda x: torch.empty_like(x), triton_fn=lambda x: x,
                                  name="broken::op")
        def op(x: torch.Tensor) -> torch.Tensor:
            return x + 1
        with opreg.trace() as t:
            assert torch.equal(op(torch.zeros(2)), torch.ones(2))
        assert t.impls() == ["fallback"]
        print(opreg.kernel_status("broken::op"))
    """)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert (
        "triton_fn is off: Triton is not usable: RuntimeError: this Triton install is broken"
        in result.stdout
    )


def test_torch_compile_matches_eager_and_sees_triton_kernels_on_gpu():
    x = torch.randn(6, 33, device=TRITON_DEVICE)
    compiled = torch.compile(lambda a: ops.scale_rows(a, 0.5) + 1, fullgraph=True)
    torch.testing.assert_close(compiled(x), x * 0.5 + 1)


@requires_cuda
def test_compile_graph_contains_the_triton_kernel():
    from functorch.compile import aot_function

    graphs = []
    f = aot_function(
        lambda a: ops.scale_rows(a, 0.5), fw_compiler=lambda g, _: graphs.append(g) or g
    )
    x = torch.randn(4, 8, device="cuda")
    torch.testing.assert_close(f(x), x * 0.5)
    assert "triton_kernel_wrapper_functional" in graphs[0].code


def test_opcheck_and_export():
    x = torch.randn(4, 9, device=TRITON_DEVICE)
    torch.library.opcheck(ops.scale_rows, (x, 2.0))
    torch.library.opcheck(ops.softsign, (x,))
    torch.library.opcheck(ops.row_norm, (x,))

    class Module(torch.nn.Module):
        def forward(self, a):
            return ops.softsign(a)

    exported = torch.export.export(Module(), (x,))
    assert "evox_test.softsign.default" in str(exported.graph)


# ---- the public API ---------------------------------------------------------------------------


def test_public_functions_report_opreg_as_their_module():
    for name in opreg.__all__:
        value = getattr(opreg, name)
        if inspect.isfunction(value) or inspect.isclass(value):
            assert value.__module__ == "opreg", name


def test_wrap_triton_returns_a_triton_kernel_like_object():
    wrapped = opreg.wrap_triton(ops.scale_rows_kernel)
    assert isinstance(wrapped, opreg.TritonKernelLike)
    assert callable(wrapped[(1,)])


@triton_available  # triton_fn is only registered when Triton works
def test_keyword_only_arguments_reach_kernel_accepts_and_fallback():
    seen = []

    def scaled_kernel(x, *, scale):
        seen.append(("kernel", scale))
        return x * scale

    def accepts(x, *, scale):
        seen.append(("accepts", scale))
        return scale > 0

    @opreg.register_triton_op(
        fake_fn=lambda x, *, scale: torch.empty_like(x),
        triton_fn=scaled_kernel,
        triton_device_types="cpu",
        triton_accepts=accepts,
        name="opreg_test_front::scaled",
    )
    def scaled(x: torch.Tensor, *, scale: float) -> torch.Tensor:
        seen.append(("fallback", scale))
        return x * scale

    assert "float scale" in str(scaled._schema).split("*")[1]  # keyword-only in the schema
    x = torch.randn(5)
    torch.testing.assert_close(scaled(x, scale=2.0), x * 2.0)
    torch.testing.assert_close(scaled(x, scale=-1.0), -x)
    assert seen == [
        ("accepts", 2.0),
        ("kernel", 2.0),
        ("accepts", -1.0),
        ("fallback", -1.0),
    ]


def test_kernel_status_answers_for_cpp_defined_ops():
    assert opreg.kernel_status("opreg::fused_add") == "cuda: kernel:triton_aot"
    assert opreg.kernel_status("opreg_test::scale_") == (
        "no kernels: the fallback serves every device"
    )
    with pytest.raises(ValueError, match="no op named 'nosuch::op'"):
        opreg.kernel_status("nosuch::op")
