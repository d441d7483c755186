"""Failed loads that race other threads, nest, or bring in other libraries leave nothing behind
(the nineteenth round of fixes, from the eighteenth sweep's B-F1 to B-F6). Each case runs in a
fresh interpreter: loads are once per process, and a crash must fail the test, not the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from test_reliability import assert_survived, run_probe


@pytest.fixture
def scripted(test_ops_library):
    """The path of the scripted test library `name` (tests/op_library/scripted_ops.cpp)."""
    return lambda name: str(test_ops_library.parent / f"libopreg_scripted_{name}.so")


PRELUDE = """
import os, threading, time, torch, opreg
def load(path, errors):
    try:
        opreg.load_library(path)
    except ValueError as error:
        errors.append(str(error))
def in_background(path, errors):
    thread = threading.Thread(target=load, args=(path, errors))
    thread.start()
    return thread
def kernels(name):
    served = opreg.describe_op(name).kernels
    return sorted(f"{s.device_type}={s.kind.value}:{s.kernel}" for s in served)
def defined(name):
    return name in {report.name for report in opreg.describe_ops()}
def wait_for(path):
    for _ in range(2000):
        if os.path.exists(path):
            return
        time.sleep(0.01)
    raise AssertionError("the script never got to " + path)
"""


def probe(code: str, timeout: float = 120, **scripts: str) -> str:
    setup = "".join(
        f"os.environ['OPREG_SCRIPT_{name}'] = {script!r}\n" for name, script in scripts.items()
    )
    result = run_probe(PRELUDE + setup + textwrap.dedent(code), timeout=timeout)
    assert_survived(result)
    return result.stdout


def test_a_device_type_registered_during_a_failing_load_serves_the_ops_it_rolls_back(
    scripted, tmp_path
):
    # B-F1: the rollback put back the op's definition as built before the type was registered.
    go, replaced = tmp_path / "go", tmp_path / "replaced"
    out = probe(
        f"""
        opreg.load_library({scripted("a")!r})
        errors = []
        thread = in_background({scripted("b")!r}, errors)
        wait_for({str(replaced)!r})
        opreg.register_accelerated_device_type("xpu")
        open({str(go)!r}, "w").close()
        thread.join()
        assert errors and "opreg_script::bad" in errors[0], errors
        print("kernels:", kernels("opreg_script::x"))
        print("value:", torch.ops.opreg_script.x(torch.zeros(1)).tolist())
        """,
        a="def:x:1",
        b=f"rep:x:10;touch:{replaced};wait:{go};bad",
    )
    assert "xpu=kernel:accelerated" in out, out
    assert "value: [1.0]" in out, out


def test_a_device_type_another_thread_asked_for_stays_after_a_failing_load_took_its_own_back(
    scripted, tmp_path
):
    # B-F2: the failing load had registered the type first; its rollback unregistered the type
    # that the main thread's registration (a no-op then) had been told was registered.
    go, registered = tmp_path / "go", tmp_path / "registered"
    out = probe(
        f"""
        opreg.load_library({scripted("a")!r})
        errors = []
        thread = in_background({scripted("b")!r}, errors)
        wait_for({str(registered)!r})
        assert opreg.register_accelerated_device_type("xpu") == "xpu"
        open({str(go)!r}, "w").close()
        thread.join()
        assert errors and "opreg_script::bad" in errors[0], errors
        print("types:", opreg.accelerated_device_types())
        print("kernels:", kernels("opreg_script::x"))
        """,
        a="def:x:1",
        b=f"devtype:xpu;touch:{registered};wait:{go};bad",
    )
    assert "'xpu'" in out.split("types:")[1].splitlines()[0], out
    assert "xpu=kernel:accelerated" in out, out


def test_a_device_type_only_a_failed_load_asked_for_leaves_every_op(scripted, tmp_path):
    # B-F2's second form: an op defined while the type was registered kept a kernel for it.
    go, registered = tmp_path / "go", tmp_path / "registered"
    out = probe(
        f"""
        import ctypes
        # Loaded (and its symbols resolved) before the load, which holds the dynamic loader.
        run = ctypes.CDLL({scripted("c")!r}).opreg_scripted_run
        run.argtypes = [ctypes.c_char_p]
        errors = []
        thread = in_background({scripted("b")!r}, errors)
        wait_for({str(registered)!r})
        assert run(b"def:y:1") == 0
        open({str(go)!r}, "w").close()
        thread.join()
        assert errors and "opreg_script::bad" in errors[0], errors
        print("types:", opreg.accelerated_device_types())
        print("kernels:", kernels("opreg_script::y"))
        """,
        b=f"devtype:xpu;touch:{registered};wait:{go};bad",
    )
    assert "xpu" not in out, out
    assert "cuda=kernel:accelerated" in out, out


@pytest.mark.parametrize("how", ["needs", "opens with dlopen"])
def test_a_library_that_a_failing_library_brings_in_fails_with_it(scripted, how):
    # B-F3: its initializers ran inside the failed load and its ops were rolled back; loading it
    # again succeeded, with no ops.
    outer, inner = ("needy", "dep") if how == "needs" else ("a", "c")
    scripts = {inner: "def:inner:5", outer: "def:outer:1;bad"}
    if how != "needs":
        scripts[outer] = f"def:outer:1;dlopen:{scripted(inner)};bad"
    out = probe(
        f"""
        errors = []
        load({scripted(outer)!r}, errors)
        assert errors and "opreg_script::bad" in errors[0], errors
        load({scripted(inner)!r}, errors)
        print("again:", errors[1:])
        print("defined:", defined("opreg_script::inner"))
        """,
        **scripts,
    )
    assert f"libopreg_scripted_{inner}.so' was loaded with" in out, out
    assert "defined: False" in out, out


@pytest.mark.parametrize("how", ["needs", "opens with dlopen"])
@pytest.mark.parametrize("inner_script", ["devtype:hpu", "undef:x"])
def test_a_library_brought_in_that_defines_nothing_fails_with_the_load(scripted, how, inner_script):
    # The twentieth sweep's B-F2: a library brought in that only asked for a device type or only
    # undefined an op was not marked failed (only the origins of definitions were), and loading it
    # again succeeded with its effect gone.
    outer, inner = ("needy", "dep") if how == "needs" else ("a", "c")
    scripts = {inner: inner_script, outer: "def:outer:1;bad"}
    if how != "needs":
        scripts[outer] = f"def:outer:1;dlopen:{scripted(inner)};bad"
    out = probe(
        f"""
        opreg.custom_op("opreg_script::x", lambda t: t + 1, mutates_args=(),
                        schema="(Tensor x) -> Tensor")
        errors = []
        load({scripted(outer)!r}, errors)
        assert errors and "opreg_script::bad" in errors[0], errors
        load({scripted(inner)!r}, errors)
        print("again:", errors[1:])
        print("types:", opreg.accelerated_device_types(), "x:", defined("opreg_script::x"))
        """,
        **scripts,
    )
    assert f"libopreg_scripted_{inner}.so' was loaded with" in out, out
    assert "types: ['cuda'] x: True" in out, out


def test_a_library_loaded_before_stays_loaded_when_a_failing_library_loads_it_again(scripted):
    # B-F4: it was marked failed, though nothing of it was rolled back.
    out = probe(
        f"""
        opreg.load_library({scripted("b")!r})
        errors = []
        load({scripted("a")!r}, errors)
        assert errors and "opreg_script::bad" in errors[0], errors
        opreg.load_library({scripted("b")!r})
        print("inner:", torch.ops.opreg_script.inner(torch.zeros(1)).tolist())
        """,
        a=f"def:outer:1;loadlib:{scripted('b')};bad",
        b="def:inner:5",
    )
    assert "inner: [5.0]" in out, out


def test_a_load_of_a_library_a_failing_load_is_loading_does_not_succeed_with_no_ops(
    scripted, tmp_path
):
    # B-F5: the second thread's load returned, then the failing load rolled the library's ops
    # back. Either it raises the library's error, or the library keeps its ops.
    started = tmp_path / "started"
    out = probe(
        f"""
        first, second = [], []
        thread = in_background({scripted("a")!r}, first)
        wait_for({str(started)!r})
        load({scripted("b")!r}, second)
        thread.join()
        assert first and "opreg_script::bad" in first[0], first
        defined = defined("opreg_script::inner")
        assert defined or (second and "was loaded by" in second[0]), (defined, second)
        print("ok")
        """,
        a=f"def:outer:1;loadlib:{scripted('b')};bad",
        b=f"def:inner:5;touch:{started};sleep:600",
    )
    assert "ok" in out


@pytest.mark.parametrize(
    ("b", "c"),
    [
        ("rep:x:10;sleep:400;bad", "rep:x:20;sleep:900;bad"),
        ("undef:x;sleep:400;bad", "def:x:20;sleep:900;bad"),
    ],
    ids=["two replaces", "an undefine, then a define"],
)
def test_two_failing_loads_on_two_threads_leave_the_op_as_it_was(scripted, b, c):
    # B-F6: the second load's replace recorded the first's definition as the one to put back; the
    # first's rollback skipped the op (no longer its), and the second's put the first's back.
    out = probe(
        f"""
        opreg.load_library({scripted("a")!r})
        first, second = [], []
        one = in_background({scripted("b")!r}, first)
        time.sleep(0.15)
        two = in_background({scripted("c")!r}, second)
        one.join()
        two.join()
        assert first and second, (first, second)
        print("value:", torch.ops.opreg_script.x(torch.zeros(1)).tolist())
        """,
        a="def:x:1",
        b=b,
        c=c,
    )
    assert "value: [1.0]" in out, out


def test_a_failed_load_registers_none_of_its_embedded_triton_kernels(
    scripted, aot_bundle, tmp_path
):
    # B-F7: the kernels embedded before the one that clashed stayed registered, and refused the
    # same names in every later library or bundle.
    from test_reliability_aot import more_warps, renamed_manifest

    folders = {name: tmp_path / name for name in ("registered", "library", "later")}
    for folder in folders.values():
        folder.mkdir()
    renamed_manifest(aot_bundle, folders["registered"], "opreg_loads_clash")
    (folders["registered"] / "index.txt").write_text("opreg_loads_clash.json\n")
    renamed_manifest(aot_bundle, folders["later"], "opreg_loads_other", more_warps)
    (folders["later"] / "index.txt").write_text("opreg_loads_other.json\n")
    library = folders["library"]
    clash = renamed_manifest(aot_bundle, library, "opreg_loads_clash", more_warps)
    binaries = ",".join(v["file"] for v in json.loads((library / clash).read_text())["variants"])

    def bundle(name, change=lambda m: None):
        return f"bundle:{library},{renamed_manifest(aot_bundle, library, name, change)},{binaries}"

    out = probe(
        f"""
        kernels = lambda: {{kernel["name"] for kernel in opreg.triton_kernels()}}
        opreg.load_triton_bundle({str(folders["registered"])!r})
        errors = []
        load({scripted("a")!r}, errors)
        assert errors and "Triton kernel 'opreg_loads_clash'" in errors[0], errors
        print("after the failed load:", sorted(k for k in kernels() if "loads_o" in k))
        print("later:", opreg.load_triton_bundle({str(folders["later"])!r}))
        opreg.load_library({scripted("b")!r})
        print("after a load:", "opreg_loads_fine" in kernels())
        """,
        a=f"def:x:1;{bundle('opreg_loads_other')};{bundle('opreg_loads_clash', more_warps)}",
        b=f"def:y:1;{bundle('opreg_loads_fine')}",
    )
    assert "after the failed load: []" in out, out
    assert "later: ['opreg_loads_other']" in out, out
    assert "after a load: True" in out, out


def test_a_load_whose_nested_library_embeds_a_clashing_kernel_registers_no_kernel(
    scripted, aot_bundle, tmp_path
):
    # The twentieth sweep's B-F1: the outer library's kernels were committed, then the nested
    # library's clashed with them and failed the load, and the outer's stayed registered.
    from test_reliability_aot import more_warps, renamed_manifest

    outer, inner, later = tmp_path / "outer", tmp_path / "inner", tmp_path / "later"
    for folder in (outer, inner, later):
        folder.mkdir()

    def bundle(folder, name, change=lambda m: None):
        manifest = renamed_manifest(aot_bundle, folder, name, change)
        files = ",".join(v["file"] for v in json.loads((folder / manifest).read_text())["variants"])
        return f"bundle:{folder},{manifest},{files}"

    renamed_manifest(aot_bundle, later, "opreg_loads_nested_clash")
    (later / "index.txt").write_text("opreg_loads_nested_clash.json\n")
    outer_bundles = (
        f"{bundle(outer, 'opreg_loads_outer_only')};{bundle(outer, 'opreg_loads_nested_clash')}"
    )
    out = probe(
        f"""
        errors = []
        load({scripted("a")!r}, errors)
        assert errors and "opreg_loads_nested_clash" in errors[0], errors
        names = [kernel["name"] for kernel in opreg.triton_kernels()]
        print("kernels:", sorted(name for name in names if "loads_" in name))
        print("later:", opreg.load_triton_bundle({str(later)!r}))
        """,
        a=f"def:x:1;{outer_bundles};loadlib:{scripted('b')}",
        b=f"def:y:2;{bundle(inner, 'opreg_loads_nested_clash', more_warps)}",
    )
    assert "kernels: []" in out, out
    assert "later: ['opreg_loads_nested_clash']" in out, out


def test_a_failed_load_does_not_put_back_an_op_another_thread_undefined_after_it(
    scripted, tmp_path
):
    # The twentieth sweep's B-F3: the load undefined the op, another thread defined it and undefined
    # it again; the rollback saw "undefined" both times and put the op back.
    started, go = tmp_path / "started", tmp_path / "go"
    out = probe(
        f"""
        import ctypes
        opreg.load_library({scripted("a")!r})
        # C++ definitions, which do not wait for the loading thread's dlopen as Python's do
        run = ctypes.CDLL({scripted("c")!r}).opreg_scripted_run
        run.argtypes = [ctypes.c_char_p]
        errors = []
        thread = in_background({scripted("b")!r}, errors)
        wait_for({str(started)!r})
        assert run(b"def:x:9") == 0 and run(b"undef:x") == 0
        open({str(go)!r}, "w").close()
        thread.join()
        assert errors and "opreg_script::bad" in errors[0], errors
        print("defined:", defined("opreg_script::x"))
        """,
        a="def:x:1",
        b=f"undef:x;touch:{started};wait:{go};bad",
    )
    assert "defined: False" in out, out


@pytest.mark.parametrize("name", ["a b", "cpu"])
def test_a_device_type_refused_inside_a_load_fails_the_load(scripted, name):
    # The twentieth sweep's B-F4: register_accelerated_device_type's refusal escaped the library's
    # static initializer, and the process aborted.
    out = probe(
        f"""
        errors = []
        load({scripted("a")!r}, errors)
        assert errors, "the load succeeded"
        print("error:", errors[0])
        print("defined:", defined("opreg_script::x"))
        print("types:", opreg.accelerated_device_types())
        """,
        a=f"def:x:1;devtype:{name}",
    )
    assert f"accelerated device type '{name}'" in out, out
    assert "libopreg_scripted_a.so" in out, out
    assert "defined: False" in out, out
    assert "types: ['cuda']" in out, out


def test_a_clashing_embedded_kernel_opened_outside_load_library_is_launched_by_no_op(
    scripted, aot_bundle, tmp_path
):
    # The eighteenth sweep's B-F8: a library opened by torch.ops.load_library (or dlopen) whose
    # embedded kernel clashed with a registered one was only warned about, and its ops launched
    # the registered kernel, built for other launches (kernels are found by name).
    from test_reliability_aot import more_warps, renamed_manifest

    registered, library = tmp_path / "registered", tmp_path / "library"
    registered.mkdir()
    library.mkdir()
    renamed_manifest(aot_bundle, registered, "opreg_loads_named_twice")
    (registered / "index.txt").write_text("opreg_loads_named_twice.json\n")
    clash = renamed_manifest(aot_bundle, library, "opreg_loads_named_twice", more_warps)
    binaries = ",".join(v["file"] for v in json.loads((library / clash).read_text())["variants"])
    out = probe(
        f"""
        from opreg import _C
        opreg.load_triton_bundle({str(registered)!r})
        kept = _C.TritonKernel("opreg_loads_named_twice")  # found the registered kernel
        print("before:", kept.available_on(0))
        torch.ops.load_library({scripted("a")!r})
        print("defined:", defined("opreg_script::x"))
        for kernel in (kept, _C.TritonKernel("opreg_loads_named_twice")):
            print("after:", kernel.available_on(0))
        """,
        a=f"def:x:1;bundle:{library},{clash},{binaries}",
    )
    before = next(line for line in out.splitlines() if line.startswith("before:"))
    assert "neither kernel" not in before, out
    assert "defined: True" in out, out
    after = [line for line in out.splitlines() if line.startswith("after:")]
    assert len(after) == 2, out
    for line in after:
        assert "(False," in line and "neither kernel of the name is launched" in line, out


def test_a_definition_while_another_thread_opens_a_library_with_a_plain_dlopen(scripted, tmp_path):
    # The nineteenth sweep's B-F7: the definition asked dladdr for its origin under opreg's
    # registry lock, while the other thread held the dynamic loader's lock and its library's
    # initializer waited for the registry's: both threads waited forever.
    started = tmp_path / "started"
    out = probe(
        f"""
        import ctypes
        run = ctypes.CDLL({scripted("c")!r}).opreg_scripted_run
        run.argtypes = [ctypes.c_char_p]
        libc = ctypes.CDLL(None)
        libc.dlopen.restype = ctypes.c_void_p
        libc.dlopen.argtypes = [ctypes.c_char_p, ctypes.c_int]
        opening = threading.Thread(target=libc.dlopen, args=({scripted("b")!r}.encode(), 2))
        opening.start()
        wait_for({str(started)!r})
        assert run(b"def:defined_meanwhile:3") == 0
        opening.join()
        print("meanwhile:", torch.ops.opreg_script.defined_meanwhile(torch.zeros(1)).tolist())
        print("opened:", torch.ops.opreg_script.opened(torch.zeros(1)).tolist())
        """,
        timeout=60,
        b=f"touch:{started};sleep:1500;def:opened:7",
    )
    assert "meanwhile: [3.0]" in out and "opened: [7.0]" in out, out


def test_the_cli_checks_an_op_in_a_namespace_torch_ops_holds_an_attribute_of(scripted):
    # The nineteenth sweep's B-F9: `python -m opreg check` reached torch.ops._dir, which is
    # dir(), and ended in a bare AttributeError.
    result = subprocess.run(
        [sys.executable, "-m", "opreg", "check", "--load", scripted("a"), "_dir::f"],
        capture_output=True,
        text=True,
        env={**os.environ, "OPREG_SCRIPT_a": "defin:_dir:f:1"},
        timeout=300,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        "python -m opreg check: '_dir::f' is in a namespace that torch.ops holds an attribute of "
        "its own for (torch.ops._dir), so PyTorch's tools (opcheck, FakeTensorMode, "
        "torch.compile) cannot reach the op: define it in another namespace"
    ], result.stderr


def test_a_custom_op_racing_a_load_of_the_same_name_replaces_nothing(scripted, tmp_path):
    # The 24th sweep's B-F2: custom_op found the name free, waited for the load, then replaced
    # the op the library defined (custom_op replaces only its own definitions): neither side
    # raised, and the library's op was gone. Now one of the two definitions is refused.
    started, go = tmp_path / "started", tmp_path / "go"
    out = probe(
        f"""
        errors, refused = [], []
        loading = in_background({scripted("a")!r}, errors)
        wait_for({str(started)!r})
        def define():
            try:
                @opreg.custom_op("opreg_script::raced", mutates_args=())
                def raced(x: torch.Tensor) -> torch.Tensor:
                    return x * 10
            except ValueError as error:
                refused.append(str(error))
        defining = threading.Thread(target=define)
        defining.start()
        time.sleep(0.3)  # the definition now waits for the load
        open({str(go)!r}, "w").close()
        loading.join()
        defining.join()
        print("load refused:", bool(errors), "custom_op refused:", bool(refused))
        print("messages:", errors + refused)
        print("value:", torch.ops.opreg_script.raced(torch.ones(1)).tolist())
        """,
        a=f"touch:{started};wait:{go};def:raced:1",
    )
    assert out.count("refused: True") == 1, out
    if "load refused: True" in out:
        assert "value: [10.0]" in out, out
    else:
        assert "while this definition was made" in out and "value: [2.0]" in out, out


def test_a_library_loaded_by_another_reports_its_ops_undefined_since(scripted):
    # Sweep 25, B-F4: only the outermost library had its ops recorded, so loading the inner one
    # again, after its op was undefined, succeeded without a word and left the op undefined.
    out = probe(
        f"""
        import ctypes
        run = ctypes.CDLL({scripted("c")!r}).opreg_scripted_run
        run.argtypes = [ctypes.c_char_p]
        errors = []
        load({scripted("a")!r}, errors)
        assert not errors, errors
        assert run(b"undef:inner") == 0
        load({scripted("b")!r}, errors)
        print("errors:", errors)
        """,
        a=f"def:outer:1;loadlib:{scripted('b')}",
        b="def:inner:5",
    )
    assert "ops it defined were undefined since: opreg_script::inner" in out, out


def test_a_library_that_undefines_its_own_op_loads_again(scripted):
    # Sweep 25, B-F5: the op it defined and then undefined in its initializer was recorded as one
    # of its ops, so a second load said it was "undefined since".
    out = probe(
        f"""
        errors = []
        load({scripted("a")!r}, errors)
        load({scripted("a")!r}, errors)
        print("errors:", errors)
        print("kept:", defined("opreg_script::kept"), defined("opreg_script::temporary"))
        """,
        a="def:temporary:1;def:kept:2;undef:temporary",
    )
    assert "errors: []" in out, out
    assert "kept: True False" in out, out


def test_an_op_torch_ops_cannot_reach_leaves_later_loads_working(scripted):
    # Sweep 54 B-N53: a C++ library's op named after an attribute of torch.ops' Python objects
    # ('__init__') made every later opreg.load_library raise an internal AttributeError.
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            PRELUDE
            + f"""
opreg.load_library({scripted("a")!r})
opreg.load_library({scripted("b")!r})
print("second load", defined("sweep54_names::__init__"), defined("sweep54_names::after"))
""",
        ],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "OPREG_SCRIPT_a": "defin:sweep54_names:__init__:1",
            "OPREG_SCRIPT_b": "defin:sweep54_names:after:2",
        },
        timeout=300,
    )
    assert "second load True True" in result.stdout, result.stdout + result.stderr
