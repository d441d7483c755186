"""Regression tests for the twenty-second adversarial sweep's findings (reports kept outside the
repository), beside the earlier sweeps' files."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import opreg
from conftest import TEST_OPS_LIBRARY

# ---- B-F1, B-F2: a library named without a '/' ----------------------------------------------

_LOAD_BY_NAME = """
import sys
from opreg._registry import _C
try:
    _C.load_library(sys.argv[1].encode())
    names = [r.name for r in _C.describe_ops()]
    print("loaded:", sorted(n for n in names if n.startswith("opreg_example")))
except Exception as error:
    print(type(error).__name__, error)
"""


def _load_by_name(name, cwd, library_path=None):
    """C++ opreg::load_library(name) in a fresh process, whose dynamic loader reads
    LD_LIBRARY_PATH at its start."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    if library_path is not None:
        env["LD_LIBRARY_PATH"] = str(library_path)
    result = subprocess.run(
        [sys.executable, "-c", _LOAD_BY_NAME, name],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,  # the FIFOs blocked without end
    )
    assert result.returncode == 0, result.stderr[-2000:]  # a truncated file: SIGBUS
    return result.stdout


@pytest.fixture
def folders(tmp_path):
    library = opreg.example_library().read_bytes()
    made = {name: tmp_path / name for name in ("good", "cut", "fifo")}
    for folder in made.values():
        folder.mkdir()
    (made["good"] / "libsweep22_ops.so").write_bytes(library)
    (made["cut"] / "libsweep22_ops.so").write_bytes(library[:12288])  # cut inside a segment
    os.mkfifo(made["fifo"] / "libsweep22_ops.so")
    return made


def test_a_name_on_the_library_path_is_checked_where_it_is_found(folders):
    output = _load_by_name("libsweep22_ops.so", folders["good"], library_path=folders["fifo"])
    assert "ValueError" in output and "it is not a regular file" in output, output
    output = _load_by_name("libsweep22_ops.so", folders["good"], library_path=folders["cut"])
    assert "the file is a truncated shared library" in output, output
    # The working directory's file is not the one loaded: the truncated one there is no reason to
    # refuse the good one the path leads to.
    output = _load_by_name("libsweep22_ops.so", folders["cut"], library_path=folders["good"])
    assert "loaded: ['opreg_example::scale_add']" in output, output


def test_a_name_found_only_in_the_working_directory_is_refused(folders):
    # The dynamic loader does not look there; opreg's check read the FIFO there without end.
    for where in ("fifo", "good"):
        output = _load_by_name("libsweep22_ops.so", folders[where])
        assert "no file of that name in LD_LIBRARY_PATH" in output, output
    assert "loaded: []" in _load_by_name("libc.so.6", folders["fifo"])  # loaded already


# ---- A-F1: Inductor's signature of an op whose schema a replace changed ----------------------


def test_inductor_compiles_a_replaced_op_with_its_new_schema():
    def define(default, replace=False):
        @opreg.register_triton_op(
            fake_fn=lambda x, a, b=default: torch.empty_like(x),
            triton_fn=None,
            name="sweep22::default_changes",
            replace=replace,
        )
        def op(x: torch.Tensor, a: float, b: float = default) -> torch.Tensor:
            return x * a + b

        return op

    define(1.0)
    x = torch.full((3,), 10.0)
    call = torch.ops.sweep22.default_changes
    assert torch.equal(torch.compile(lambda t: call(t, 2.0), fullgraph=True)(x), x * 2 + 1)
    define(5.0, replace=True)
    # Inductor filled in the old default from torch.fx's signature cache: 21, not 25.
    assert torch.equal(torch.compile(lambda t: call(t, 2.0), fullgraph=True)(x), x * 2 + 5)

    @opreg.register_triton_op(
        fake_fn=lambda x, a, b, k: torch.empty_like(x),
        triton_fn=None,
        name="sweep22::default_changes",
        replace=True,
    )
    def more(x: torch.Tensor, a: float, b: float, k: float) -> torch.Tensor:
        return (x * a + b) * k

    # An argument more: every later Inductor compile failed with a LoweringException.
    compiled = torch.compile(lambda t: call(t, 2.0, 1.0, 3.0), fullgraph=True)
    assert torch.equal(compiled(x), (x * 2 + 1) * 3)


# ---- A-F2, B-F4, B-F8: opcheck's vmap check ---------------------------------------------------


def _vmap_failures(op):
    report = opreg.opcheck(op, devices=["cpu"], raise_on_failure=False)
    return [row.message for row in report.failures if row.check == "vmap"]


def test_opcheck_fails_a_rule_that_changes_the_dtype_or_the_number_of_outputs():
    def wider(info, in_dims, x):
        return (x.movedim(in_dims[0], 0) * 2).double(), 0

    @opreg.register_triton_op(
        fake_fn=torch.empty_like, triton_fn=None, name="sweep22::wider", vmap=wider
    )
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    messages = _vmap_failures(twice)
    assert messages and all("dtype torch.float64, the loop's [" in m for m in messages), messages

    def one_short(info, in_dims, x):
        return [x * 2], [in_dims[0]]

    @opreg.register_triton_op(
        fake_fn=lambda x: [torch.empty_like(x), torch.empty_like(x)],
        triton_fn=None,
        name="sweep22::pair",
        vmap=one_short,
    )
    def pair(x: torch.Tensor) -> list[torch.Tensor]:
        return [x.clone(), x * 2]

    messages = _vmap_failures(pair)
    assert messages and all("gave 1 tensors, a loop of single calls 2" in m for m in messages)


# ---- A-F3: kernel_status after an undefine from C++ ------------------------------------------


def test_kernel_status_names_no_op_that_cpp_undefined():
    @opreg.register_triton_op(
        fake_fn=torch.empty_like,
        triton_fn=lambda x: x * 2,
        triton_device_types="cpu",
        name="sweep22::undefined_from_cpp",
    )
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    assert "cpu" in opreg.kernel_status("sweep22::undefined_from_cpp")
    undefine = ctypes.CDLL(str(TEST_OPS_LIBRARY)).opreg_test_undefine
    assert undefine(b"sweep22::undefined_from_cpp") == 0
    with pytest.raises(ValueError, match="no op named 'sweep22::undefined_from_cpp'"):
        opreg.kernel_status("sweep22::undefined_from_cpp")


# ---- A-F4: vmap_wrap_inputs that returns the wrong thing -------------------------------------


@pytest.mark.parametrize(
    "returned, said", [(None, "it returned NoneType"), ("one", "it returned 1 values")]
)
def test_a_wrong_vmap_wrap_inputs_is_named(returned, said):
    def wrap(info, in_dims, x, y):
        return None if returned is None else (x,)

    op = opreg.register_vmap_op(
        lambda x, y: x + y,
        fake_fn=lambda x, y: torch.empty_like(x),
        vmap_fn=lambda x, y: x + y,
        fake_vmap_fn=lambda x, y: torch.empty_like(x),
        vmap_wrap_inputs=wrap,
        name=f"sweep22::wraps_{returned}",
        schema="(Tensor x, Tensor y) -> Tensor",
    )
    x = torch.randn(4, 3)
    with pytest.raises(TypeError, match=f"sweep22::wraps_{returned}'.*vmap_wrap_inputs must"):
        torch.vmap(op)(x, x)
    with pytest.raises(TypeError, match=said):
        torch.vmap(op)(x, x)


# ---- A-F5: a written argument that is not batched, on every path -----------------------------


@pytest.mark.parametrize("path", ["batch_polymorphic", "vmap_fn", "rule"])
def test_every_path_refuses_writing_an_unbatched_argument(path):
    def fallback(x, out):
        out.add_(x)

    options = {
        "batch_polymorphic": {"batch_polymorphic": True},
        "vmap_fn": {
            "vmap_fn": lambda x, out: out.add_(x.sum(0)),  # a reduction: it wrote silently
            "fake_vmap_fn": lambda x, out: None,
        },
        "rule": {"vmap": lambda info, in_dims, x, out: (out.add_(x.sum(0)), None)[1:] * 2},
    }[path]
    op = opreg.register_vmap_op(
        fallback,
        fake_fn=lambda x, out: None,
        name=f"sweep22::writes_{path}",
        schema="(Tensor x, Tensor(a!) out) -> ()",
        **options,
    )
    out = torch.zeros(3)
    with pytest.raises(
        RuntimeError, match=f"sweep22::writes_{path}: vmap over this op writes argument 'out', "
    ):
        torch.vmap(op, in_dims=(0, None))(torch.ones(4, 3), out)
    assert not out.any()


# ---- B-F5: --emit-cpp through a hard link ----------------------------------------------------


def test_emit_cpp_through_a_hard_link_leaves_the_spec(tmp_path):
    (tmp_path / "k.py").write_text(
        textwrap.dedent(
            """
            import triton
            import triton.language as tl

            @triton.jit
            def neg(x_ptr, out_ptr, BLOCK: tl.constexpr):
                i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
                tl.store(out_ptr + i, -tl.load(x_ptr + i))
            """
        )
    )
    spec = tmp_path / "spec.toml"
    spec.write_text(
        'targets = ["sm_80"]\n[[kernel]]\nname = "neg"\nsource = "k.py:neg"\n'
        'signature = { x_ptr = "*fp32", out_ptr = "*fp32" }\nconstexprs = { BLOCK = 128 }\n'
    )
    before = spec.read_text()
    os.link(spec, tmp_path / "kernels.cpp")
    command = [sys.executable, "-m", "opreg.aot", "spec.toml", "--out", "out", "--quiet"]
    result = subprocess.run(
        [*command, "--emit-cpp", "kernels.cpp"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1 and "--emit-cpp 'kernels.cpp': that is the spec" in result.stderr
    assert spec.read_text() == before


def test_the_compiler_replaces_what_it_writes_instead_of_writing_through(tmp_path):
    from opreg.aot.compile import write_file

    source = tmp_path / "k.py"
    source.write_text("kept")
    (tmp_path / "out").mkdir()
    os.link(source, tmp_path / "out" / "neg.json")
    write_file("--out", tmp_path / "out" / "neg.json", lambda p: p.write_text("{}"))
    assert source.read_text() == "kept"
    assert (tmp_path / "out" / "neg.json").read_text() == "{}"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["neg.json"]
