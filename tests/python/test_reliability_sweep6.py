"""Regression tests for the sixth adversarial sweep's findings (against 0bd77a7): opcheck's vmap
check passing a rule that ignores in_dims, the per-example loop failing on a batch of size 0,
torch.library's own CustomOpDef refused by opreg.register_vmap, keywords accepted silently
(triton_device_types=[], vmap_out_dims of the wrong length, max_vmap_level='x', a samples
function that takes no device), unclear messages (a PyTorch internal assert for a schema default,
a raw pybind error for ctx.save_for_backward(3), a samples function returning an int), the
function form of register_vmap_op recording opreg's own file as the op's origin, trace blocks
exited on another thread or out of order, and torch.compile's code compiled before a replace
running the old definition's Triton kernels (silently: the replaced op gave the old values), from
Dynamo's code caches and from Inductor's, in one process and across processes."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import threading

import pytest
import torch

import opreg
import triton
from conftest import TEST_OPS_LIBRARY
from opreg import _C
from triton import language as tl

_names = itertools.count()


def fresh(stem: str) -> str:
    return f"sweep6::{stem}{next(_names)}"


def empty(x):
    return torch.empty_like(x)


def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


# ---- silent wrong: a vmap rule that reads in_dims wrongly passed opcheck ----------------------


def test_opcheck_vmap_fails_a_rule_that_assumes_the_batch_in_front():
    def rule(info, in_dims, x):
        return x * 2, 0  # wrong unless in_dims[0] == 0: the batch stays where it came

    op = opreg.register_vmap_op(fake_fn=empty, vmap=rule, name=fresh("front_only"))(twice)
    report = opreg.opcheck(op, [(torch.randn(3, 4),)], checks=["vmap"], raise_on_failure=False)
    assert report.failures, str(report)

    def right(info, in_dims, x):
        return x * 2, in_dims[0]

    good = opreg.register_vmap_op(fake_fn=empty, vmap=right, name=fresh("honours"))(twice)
    opreg.opcheck(good, [(torch.randn(3, 4),)], checks=["vmap"])


# ---- valid use refused ---------------------------------------------------------------------


def test_the_per_example_loop_serves_a_batch_of_no_examples():
    op = opreg.register_vmap_op(fake_fn=empty, name=fresh("loop"), vmap_per_example_loop=True)(
        twice
    )
    out = torch.vmap(op)(torch.randn(0, 3))
    assert out.shape == (0, 3) and out.dtype == torch.float32
    out = torch.vmap(op, in_dims=1)(torch.randn(3, 0))
    assert out.shape == (0, 3)
    torch.testing.assert_close(torch.vmap(op)(torch.ones(2, 3)), torch.full((2, 3), 2.0))


def test_register_vmap_passes_torch_s_own_custom_ops_to_torch():
    name = fresh("torch_op")

    @torch.library.custom_op(name, mutates_args=())
    def plus1(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    def rule(info, in_dims, x):
        return x + 1, in_dims[0]

    opreg.register_vmap(plus1, rule)
    torch.testing.assert_close(torch.vmap(plus1)(torch.zeros(2, 3)), torch.ones(2, 3))


# ---- mistakes accepted silently --------------------------------------------------------------


@pytest.mark.parametrize(
    ("keywords", "error", "message"),
    [
        (
            {"triton_fn": twice, "triton_device_types": []},
            ValueError,
            "triton_device_types names no device type, so triton_fn would serve nothing",
        ),
        (
            {"vmap_fn": twice, "fake_vmap_fn": empty, "vmap_out_dims": (0, 0, 0)},
            ValueError,
            r"vmap_out_dims \(0, 0, 0\) gives 3 dims, but the op has 1 outputs",
        ),
        ({"max_vmap_level": "x"}, TypeError, "max_vmap_level must be None or an int"),
        ({"max_vmap_level": -1}, TypeError, "max_vmap_level must be None or an int"),
    ],
)
def test_evox_keywords_that_could_not_work_are_refused(keywords, error, message):
    name = fresh("kw")
    keywords = {"triton_fn": None, **keywords}
    with pytest.raises(error, match=message):
        opreg.register_triton_op(fake_fn=empty, name=name, **keywords)(twice)
    with pytest.raises(ValueError, match=f"no op named '{name}'"):
        opreg.describe_op(name)


def test_register_samples_checks_the_function_and_what_it_returns():
    op = opreg.register_vmap_op(fake_fn=empty, name=fresh("samples"))(twice)
    with pytest.raises(TypeError, match=r"samples is called as samples\(device\)"):
        opreg.register_samples(op, lambda: [])
    opreg.register_samples(op, lambda device: 5)
    with pytest.raises(
        TypeError, match=r"its registered samples function must return a list .* got int"
    ):
        opreg.opcheck(op)
    opreg.register_samples(op, lambda device: [(torch.randn(3, device=device),)])
    opreg.opcheck(op, devices=["cpu"], checks=["kernel_vs_fallback"])


# ---- unclear messages ------------------------------------------------------------------------


def test_a_default_before_an_argument_without_one_is_said_plainly():
    name = fresh("defaults")
    with pytest.raises(ValueError) as error:
        opreg.register_vmap_op(fake_fn=None, name=name, schema="(int a=1, int b) -> Tensor")(
            lambda a, b: torch.zeros(a)
        )
    message = str(error.value)
    assert f"op '{name}'" in message and "INTERNAL ASSERT" not in message, message
    assert "Non-default positional argument follows default argument" in message, message


def test_save_for_backward_of_a_non_tensor_names_the_op():
    name = fresh("saves_int")

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(3)

    op = opreg.register_vmap_op(
        fake_fn=empty, name=name, backward=lambda ctx, g: 2 * g, setup_context=setup_context
    )(twice)
    with pytest.raises(
        TypeError, match=rf"op '{name}': ctx.save_for_backward takes tensors or None, got int 3"
    ):
        op(torch.ones(2, requires_grad=True))


def test_the_function_form_of_register_vmap_op_records_the_caller_as_origin():
    name = fresh("origin")
    opreg.register_vmap_op(twice, fake_fn=empty, name=name)
    assert opreg.describe_op(name).origin.startswith(__file__ + ":")


# ---- trace blocks ----------------------------------------------------------------------------


def test_a_trace_block_is_exited_on_its_own_thread():
    block = opreg.trace()
    block.__enter__()
    errors = []

    def exit_elsewhere():
        try:
            block.__exit__(None, None, None)
        except RuntimeError as error:
            errors.append(str(error))

    thread = threading.Thread(target=exit_elsewhere)
    thread.start()
    thread.join()
    assert errors and "exited on the thread that entered it" in errors[0]
    block.__exit__(None, None, None)  # still open here, and exits


def test_trace_blocks_exited_out_of_order_say_so():
    outer, inner = opreg.trace(), opreg.trace()
    outer.__enter__()
    inner_trace = inner.__enter__()
    with pytest.raises(RuntimeError, match="exited before a block entered inside it"):
        outer.__exit__(None, None, None)
    torch.ops.opreg.fused_add(torch.ones(2), torch.ones(2))
    inner.__exit__(None, None, None)
    assert inner_trace.impls("opreg::fused_add") == ["fallback"]


# ---- silent wrong: compiled code ran a replaced op's old Triton kernels ----------------------


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * factor, mask=mask)


def scale_op(name: str, factor: float):
    @opreg.triton_op(name, mutates_args=(), fallback=lambda x: x * factor)
    def scale(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        grid = (triton.cdiv(x.numel(), 64),)
        opreg.wrap_triton(scale_kernel)[grid](x, out, x.numel(), factor, BLOCK=64)
        return out

    return scale


# The Triton kernels run on a GPU, or in Triton's interpreter on CPU tensors (conftest.py sets it
# where there is no GPU).
TRITON_DEVICE = (
    "cpu"
    if os.environ.get("TRITON_INTERPRET") == "1"
    else "cuda"
    if torch.cuda.is_available()
    else None
)
_runs_triton = pytest.mark.skipif(
    TRITON_DEVICE is None, reason="needs a GPU or Triton's interpreter"
)


def filled(size: int, value: float) -> torch.Tensor:
    return torch.full((size,), value, device=TRITON_DEVICE)


@_runs_triton
def test_code_compiled_before_a_replace_runs_the_new_definition():
    # aot_eager: Dynamo's code caches alone (Inductor's are the tests below).
    name = fresh("compiled")
    op = scale_op(name, 3.0)
    compiled = torch.compile(lambda a: op(a) + 1, backend="aot_eager")
    x = filled(8, 1.0)
    torch.testing.assert_close(compiled(x), filled(8, 4.0))
    scale_op(name, 5.0)
    torch.testing.assert_close(op(x), filled(8, 5.0))
    torch.testing.assert_close(compiled(x), filled(8, 6.0))


@_runs_triton
def test_inductor_code_compiled_before_a_replace_runs_the_new_definition(tmp_path, monkeypatch):
    # Inductor's caches: AOTAutograd's keys a graph by what Dynamo captured, which names the op
    # but held nothing of its definition, and handed back the graph traced from the old one.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    name = fresh("inductor")
    op = scale_op(name, 3.0)
    x = filled(8, 1.0)
    torch.testing.assert_close(torch.compile(lambda a: op(a) + 1)(x), filled(8, 4.0))
    scale_op(name, 5.0)
    torch._dynamo.reset()  # the in-memory caches too: what is left is Inductor's on disk
    torch.testing.assert_close(torch.compile(lambda a: op(a) + 1)(x), filled(8, 6.0))
    # Inductor's config holds a value per thread: a replace in one thread reaches compiles in
    # others, those that compiled before it and new ones.
    replace = threading.Thread(target=scale_op, args=(name, 7.0))
    replace.start()
    replace.join()
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(lambda a: op(a) + 1)(x), filled(8, 8.0))
    results = []
    compile_elsewhere = threading.Thread(
        target=lambda: results.append(torch.compile(lambda a: op(a) + 2)(x))
    )
    compile_elsewhere.start()
    compile_elsewhere.join()
    torch.testing.assert_close(results[0], filled(8, 9.0))


_SCALE_IN_A_PROCESS = """
import sys, torch, triton, opreg
from triton import language as tl
from torch._dynamo.utils import counters
factor, device = float(sys.argv[1]), sys.argv[2]
@triton.jit
def scale_kernel(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * factor, mask=mask)
@opreg.triton_op("sweep6_processes::scale", mutates_args=(), fallback=lambda x: x * factor)
def scale(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    grid = (triton.cdiv(x.numel(), 64),)
    opreg.wrap_triton(scale_kernel)[grid](x, out, x.numel(), factor, BLOCK=64)
    return out
print(torch.compile(lambda a: scale(a) + 1)(torch.ones(4, device=device)).tolist())
print("cache hit" if counters["aot_autograd"]["autograd_cache_hit"] else "cache miss")
"""


@_runs_triton
def test_inductor_caches_tell_apart_processes_whose_op_of_one_name_differs(tmp_path):
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"))
    script = tmp_path / "scale.py"  # a file: Triton's compiler reads the kernel's source
    script.write_text(_SCALE_IN_A_PROCESS)

    def run(factor: str) -> list[str]:
        result = subprocess.run(
            [sys.executable, str(script), factor, TRITON_DEVICE],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout.split("\n")[:2]

    assert run("7") == ["[8.0, 8.0, 8.0, 8.0]", "cache miss"]
    assert run("9") == ["[10.0, 10.0, 10.0, 10.0]", "cache miss"]  # was [8.0, ...], a hit
    # The same definition again is still served from the cache.
    assert run("9") == ["[10.0, 10.0, 10.0, 10.0]", "cache hit"]


# ---- seventh sweep: register_triton_op(name="ns::op.overload") defined an overload -------------


@pytest.mark.parametrize("name", ["sweep7::op.overload", "sweep7::a::b", "sweep7::1op"])
def test_the_front_refuses_a_name_that_is_not_namespace_and_identifier(name):
    with pytest.raises(ValueError, match=r"is not an identifier|must look like 'namespace::name'"):
        opreg.register_triton_op(fake_fn=None, triton_fn=None, name=name)(twice)
    with pytest.raises(ValueError, match=r"is not an identifier|must look like 'namespace::name'"):
        opreg.register_vmap_op(twice, fake_fn=None, name=name)
    assert not [op for op in opreg.describe_ops() if op.name.startswith("sweep7::")]


def test_opcheck_with_no_checks_and_samples_for_an_op_opreg_does_not_define_are_refused():
    # Seventh sweep: opcheck(checks=[]) passed with no row, and register_samples took aten::add
    # (opcheck then refused the op); both are refused at once now.
    with pytest.raises(ValueError, match="checks= is empty, so nothing would be checked"):
        opreg.opcheck(torch.ops.opreg.fused_add.default, checks=[])
    with pytest.raises(ValueError, match=r"no op named 'aten::add\.Tensor' is defined by opreg"):
        opreg.register_samples(torch.ops.aten.add.Tensor, lambda device: [])
    with pytest.raises(ValueError, match="seconds must be >= 0, got -1"):
        _C.wait_for_backward_errors(-1.0)
    with pytest.raises(ValueError, match="seconds must be >= 0, got nan"):
        _C.wait_for_backward_errors(float("nan"))
    assert _C.wait_for_backward_errors(1e30)  # a day at most: nothing overflows


# ---- seventh sweep: a C++ library replacing a Python op left the Python side's pieces ---------


def _load_replacing_library(folder) -> None:
    # A copy of its own for each test: loading a path again would not run its definitions again.
    copy = folder / "libopreg_replacing_ops.so"
    shutil.copy(TEST_OPS_LIBRARY.parent / "libopreg_replacing_ops.so", copy)
    opreg.load_library(copy)


def test_a_library_replacing_a_python_op_takes_its_fake_along(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))

    def first_only(x: torch.Tensor) -> torch.Tensor:
        return x[:1] * 2

    opreg.register_triton_op(
        fake_fn=lambda x: x.new_empty(1),
        triton_fn=None,
        name="opreg_replacing::op",
        replace=True,  # the library's definition, when the other test ran first
    )(first_only)
    x = torch.ones(4)
    assert torch.compile(lambda a: torch.ops.opreg_replacing.op(a) + 1)(x).shape == (1,)
    _load_replacing_library(tmp_path)
    # The Python fake (shape (1,)) went: compiled code failed on it ("expected size 4==1").
    assert torch.ops.opreg_replacing.op(torch.ones(4, device="meta")).shape == (4,)
    torch._dynamo.reset()
    compiled = torch.compile(lambda a: torch.ops.opreg_replacing.op(a) + 1)
    torch.testing.assert_close(compiled(x), torch.full((4,), 101.0))


def test_a_library_replacing_a_python_op_through_define_all_takes_its_fake_along(tmp_path):
    # Fifteenth sweep: define_all with a raw OpBuilder named no caller, so the definition's
    # origin was "unknown", not the library, and the Python op's fake (shape (7,)) stayed.
    opreg.register_triton_op(
        fake_fn=lambda x: x.new_empty(7),
        triton_fn=None,
        name="opreg_replacing::together",
        replace=True,
    )(twice)
    _load_replacing_library(tmp_path)
    assert opreg.describe_op("opreg_replacing::together").origin.endswith(
        "libopreg_replacing_ops.so"
    )
    assert torch.ops.opreg_replacing.together(torch.ones(4, device="meta")).shape == (4,)
    torch.testing.assert_close(
        torch.ops.opreg_replacing.together(torch.ones(2)), torch.full((2,), 100.0)
    )


@_runs_triton
def test_a_library_replacing_a_decomposed_python_op_takes_its_decomposition_along(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))

    def launch(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        opreg.wrap_triton(scale_kernel)[(triton.cdiv(x.numel(), 64),)](
            x, out, x.numel(), 2.0, BLOCK=64
        )
        return out

    opreg.register_triton_op(
        fake_fn=lambda x: torch.empty_like(x),
        triton_fn=launch,
        triton_device_types=TRITON_DEVICE,  # the interpreter's decomposition serves the CPU
        name="opreg_replacing::op",
        replace=True,  # the library's definition, when the other test ran first
    )(twice)
    x = filled(4, 1.0)
    torch.testing.assert_close(
        torch.compile(lambda a: torch.ops.opreg_replacing.op(a) + 1)(x), filled(4, 3.0)
    )
    _load_replacing_library(tmp_path)
    torch.testing.assert_close(torch.ops.opreg_replacing.op(x), filled(4, 100.0))
    for backend in ("aot_eager", "inductor"):  # they ran the old Triton kernel: 3.0
        torch._dynamo.reset()
        compiled = torch.compile(lambda a: torch.ops.opreg_replacing.op(a) + 1, backend=backend)
        torch.testing.assert_close(compiled(x), filled(4, 101.0))


def test_register_accelerated_device_type_names_a_name_that_is_not_a_string():
    # Seventh sweep: an int gave pybind's "incompatible function arguments".
    with pytest.raises(TypeError, match="name must be a device type's name like 'npu', got int 5"):
        opreg.register_accelerated_device_type(5)


def _add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


def test_the_status_of_an_aot_kernel_not_registered_yet_says_the_fallback_serves():
    # Seventh sweep: an AotLaunch of an unknown kernel read as a serving CUDA kernel.
    unknown = fresh("unregistered_aot")
    op = opreg.register_triton_op(
        fake_fn=empty,
        triton_fn=None,
        aot=opreg.AotLaunch("sweep7_no_such_kernel", ("1",), ("x", "out0"), outputs="like:x"),
        name=unknown,
    )(twice)
    assert "not registered yet, so the fallback serves its calls until it is" in (
        opreg.kernel_status(unknown)
    )
    torch.testing.assert_close(op(torch.ones(3)), torch.full((3,), 2.0))


@pytest.mark.skipif(
    "opreg_fused_add_f32" not in {kernel["name"] for kernel in opreg.triton_kernels()},
    reason="this build has no AOT Triton kernels (the sanitizer build's)",
)
def test_the_status_of_an_aot_kernel_registered_says_nothing_of_the_fallback():
    known = fresh("registered_aot")
    opreg.register_triton_op(
        fake_fn=lambda x, y: torch.empty_like(x),
        triton_fn=None,
        aot=opreg.AotLaunch(
            "opreg_fused_add_f32", ("1",), ("x", "y", "out0", "numel(x)"), outputs="like:x"
        ),
        name=known,
    )(_add)
    assert "not registered yet" not in opreg.kernel_status(known)
