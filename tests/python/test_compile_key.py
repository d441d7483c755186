"""What torch.compile's caches see of a Python definition (opreg._compile_key): a fingerprint that
is the same for the same code in every process and changes with the code, its closure, its
defaults, the globals it reads and the Triton kernels it launches; defining an op does not import
Inductor."""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import enum
import functools
import importlib
import operator
import os
import pickle
import random
import subprocess
import sys
import threading
import types
import typing
import warnings

import pytest
import torch

import opreg
import triton
from opreg import _compile_key
from opreg._declaration import OpDeclaration
from triton import language as tl

LIMIT = 3


def made_with(factor: float):
    def scaled(x):
        return x * factor * LIMIT

    return scaled


@triton.jit
def one_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) + 1, mask=offsets < n)


@triton.jit
def other_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) + 2, mask=offsets < n)


def fingerprint(*pieces):
    return _compile_key.fingerprint(pieces)


def test_the_same_code_gives_the_same_fingerprint_and_other_code_another():
    assert fingerprint(made_with(2.0)) == fingerprint(made_with(2.0))
    assert fingerprint(made_with(2.0)) != fingerprint(made_with(3.0))  # its closure
    assert fingerprint(lambda x: x + 1) != fingerprint(lambda x: x + 2)  # its code
    assert fingerprint(lambda x, y=1: x + y) != fingerprint(lambda x, y=2: x + y)  # defaults
    assert fingerprint(one_kernel) == fingerprint(one_kernel)
    assert fingerprint(one_kernel) != fingerprint(other_kernel)  # a kernel's own code


def test_a_global_the_code_reads_is_part_of_it(monkeypatch):
    before = fingerprint(made_with(2.0))
    monkeypatch.setattr(sys.modules[__name__], "LIMIT", 4)
    assert fingerprint(made_with(2.0)) != before


def test_a_value_it_cannot_read_makes_the_fingerprint_this_process_own():
    a, b = object(), object()
    assert fingerprint(lambda: a) == fingerprint(lambda: a)
    assert fingerprint(lambda: a) != fingerprint(lambda: b)


def test_a_function_that_reaches_itself_is_fingerprinted():
    def countdown(n):
        return n if n == 0 else countdown(n - 1)

    assert fingerprint(countdown) == fingerprint(countdown)


_DEFINE_WITHOUT_COMPILING = """
import sys, torch, opreg
@opreg.custom_op("compile_key::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2
print(twice(torch.ones(2)).tolist(), end=" ")
print("torch._inductor.config" in sys.modules)
"""


def test_defining_an_op_does_not_import_inductor():
    result = subprocess.run(
        [sys.executable, "-c", _DEFINE_WITHOUT_COMPILING], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[2.0, 2.0] False"


# ---- the seventh sweep's findings: what code reads that the fingerprint missed -----------------


def reads(holder):
    def fn(x):
        return x * holder.FACTOR

    return fn


def test_what_code_reads_of_a_class_or_module_of_the_users_is_part_of_it():
    def config_class(factor):
        class Cfg:
            FACTOR = factor

        return Cfg

    assert fingerprint(reads(config_class(7.0))) == fingerprint(reads(config_class(7.0)))
    assert fingerprint(reads(config_class(7.0))) != fingerprint(reads(config_class(9.0)))
    seven, nine = types.ModuleType("cfg"), types.ModuleType("cfg")
    seven.FACTOR, nine.FACTOR = 7.0, 9.0
    assert fingerprint(reads(seven)) != fingerprint(reads(nine))

    class Settings:
        def __init__(self, factor):
            self.FACTOR = factor

    assert fingerprint(reads(Settings(7.0))) == fingerprint(reads(Settings(7.0)))
    assert fingerprint(reads(Settings(7.0))) != fingerprint(reads(Settings(9.0)))


def test_a_vmap_rule_given_later_changes_the_ops_fingerprint():
    # opreg wraps the rule in a function of its own, named only: what it closes over counts.
    @opreg.custom_op("compile_key::rule", mutates_args=())
    def ruled(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    def rule_with(factor):
        def rule(info, in_dims, x):
            return x * factor, in_dims[0]

        return rule

    fingerprints = []
    for factor in (2, 100):
        opreg.register_vmap("compile_key::rule", rule_with(factor))
        fingerprints.append(_compile_key.current_fingerprint("compile_key::rule"))
    assert fingerprints[0] != fingerprints[1]


_FINGERPRINT_OF_A_SET = """
import torch, opreg
from opreg import _compile_key
from opreg._declaration import OpDeclaration
NAMES = {("a", "b"), ("c", "d"), ("e", "f"), ("g", "h")}
@opreg.custom_op("compile_key::set", mutates_args=())
def counted(x: torch.Tensor) -> torch.Tensor:
    return x * len(NAMES)
print(_compile_key.current_fingerprint("compile_key::set"))
"""


def test_a_set_gives_one_fingerprint_whatever_the_hash_seed():
    seen = set()
    for seed in ("1", "2", "3"):
        result = subprocess.run(
            [sys.executable, "-c", _FINGERPRINT_OF_A_SET],
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONHASHSEED=seed),
        )
        assert result.returncode == 0, result.stderr[-2000:]
        seen.add(result.stdout.strip())
    assert len(seen) == 1, seen


def test_a_global_assigned_after_the_definition_counts_when_a_key_is_made():
    # The fingerprint is taken when a cache key is made, not when the op is defined: code reads
    # its globals when it runs (seventh sweep: a global assigned below the op was missed).
    @opreg.custom_op("compile_key::late", mutates_args=())
    def late(x: torch.Tensor) -> torch.Tensor:
        return x * ASSIGNED_LATER  # noqa: F821

    before = _compile_key.current_fingerprint("compile_key::late")
    globals()["ASSIGNED_LATER"] = 7.0
    try:
        seven = _compile_key.current_fingerprint("compile_key::late")
        globals()["ASSIGNED_LATER"] = 9.0
        assert len({before, seven, _compile_key.current_fingerprint("compile_key::late")}) == 3
    finally:
        del globals()["ASSIGNED_LATER"]
    import torch._inductor.config as inductor_config

    keyed = pickle.loads(pickle.dumps(inductor_config.unsafe_marked_cacheable_functions))
    assert type(keyed) is dict
    assert keyed["opreg definition compile_key::late"] == before


def test_ops_defined_in_several_threads_at_once_are_all_fingerprinted():
    # Seventh sweep: defines racing in _compile_key raised "dictionary changed size during
    # iteration" after the op was defined (a retry then found it "already defined").
    import torch._inductor.config as inductor_config

    errors = []

    def define_many(thread: int) -> None:
        for index in range(150):
            name = f"compile_key_threads::t{thread}_{index}"
            try:
                opreg.custom_op(name, mutates_args=())(_twice_annotated)
            except Exception as error:
                errors.append(repr(error))
            pickle.dumps(inductor_config.unsafe_marked_cacheable_functions)  # as a compile does

    threads = [threading.Thread(target=define_many, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    keyed = pickle.loads(pickle.dumps(inductor_config.unsafe_marked_cacheable_functions))
    assert sum(key.startswith("opreg definition compile_key_threads::") for key in keyed) == 600


def _twice_annotated(x: torch.Tensor) -> torch.Tensor:
    return x * 2


# ---- the thirty-ninth sweep's findings: a fingerprint that raised, and imports it missed -------

_MEMO = {index: float(index) for index in range(2000)}
_SEEN = set(range(2000))


def memoized(x, n):
    if n not in _MEMO:
        _MEMO[n] = float(n)
        _SEEN.add(n)
    return x * _MEMO[n]


def test_a_memo_another_thread_fills_does_not_make_the_fingerprint_raise():
    # A fallback's memo filled in one thread while another made a cache key failed that compile
    # ("dictionary changed size during iteration"), and every compile of the process with it.
    stop = threading.Event()

    def fill() -> None:
        while not stop.is_set():
            for n in range(2000, 3000):
                memoized(1.0, n)
            for n in range(2000, 3000):
                del _MEMO[n]
                _SEEN.discard(n)

    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    filler = threading.Thread(target=fill)
    filler.start()
    try:
        for _ in range(200):
            fingerprint(memoized)
    finally:
        stop.set()
        filler.join()
        sys.setswitchinterval(switch_interval)


def test_a_value_that_cannot_be_described_makes_the_key_this_process_own_without_raising():
    # Each raised while Inductor pickled its config: every compile of the process then failed
    # under TORCHINDUCTOR_FX_COMPILE_MODE=subprocess, and bypassed the FX graph cache otherwise.
    import dataclasses

    import torch._inductor.config as inductor_config

    @dataclasses.dataclass
    class Unset:
        late: float = dataclasses.field(init=False)

    class Settings:
        pass

    odd_keys = Settings()
    odd_keys.__dict__.update({1: 5, "scale": 2.0})

    def helper(x):
        return x

    helper.__qualname__ = "helper\udc80"
    unreadable = [2**19937 - 1, Unset(), odd_keys, helper]
    for value in unreadable:
        assert fingerprint(reads(value)) == fingerprint(reads(value))
    assert fingerprint(2**19937 - 1) != fingerprint(2**19937 + 1)
    assert fingerprint(helper) == fingerprint(helper)  # its odd name is encoded, not given up
    _compile_key.declare("compile_key::unreadable", [reads(value) for value in unreadable])
    try:
        keyed = pickle.loads(pickle.dumps(inductor_config.unsafe_marked_cacheable_functions))
        assert keyed["opreg definition compile_key::unreadable"] != "not defined"
    finally:
        _compile_key.forget("compile_key::unreadable")


def test_a_table_of_constants_is_read_whole():
    # Read as one text (a large one, read by many ops' code, made each cache key slow).
    table = {f"k{index}": float(index) for index in range(1000)}
    assert fingerprint(reads(table)) == fingerprint(reads(dict(table)))
    for changed in ({**table, "k999": 0.0}, {**table, "k999": 999}, {**table, "k1000": None}):
        assert fingerprint(reads(changed)) != fingerprint(reads(table))
    assert fingerprint([1, "1", 1.0, True]) != fingerprint([1, 1, 1.0, True])
    assert fingerprint((2**19937 - 1, 1)) != fingerprint((2**19937 + 1, 1))


def reads_by_name(holder):
    def fn(x):
        return x * getattr(holder, "FACTOR")  # noqa: B009

    return fn


def imports_inside():
    def fn(x):
        from compile_key_settings import FACTOR

        def nested(y):
            import compile_key_settings.inner as inner

            return y * inner.LIMIT

        return nested(x) * FACTOR

    return fn


def test_an_attribute_read_by_name_and_a_module_imported_inside_the_code_are_part_of_it(
    monkeypatch,
):
    seven, nine = types.ModuleType("cfg"), types.ModuleType("cfg")
    seven.FACTOR, nine.FACTOR = 7.0, 9.0
    assert fingerprint(reads_by_name(seven)) != fingerprint(reads_by_name(nine))

    settings = types.ModuleType("compile_key_settings")
    settings.__path__ = []
    inner = types.ModuleType("compile_key_settings.inner")
    settings.FACTOR, settings.inner, inner.LIMIT = 7.0, inner, 1
    monkeypatch.setitem(sys.modules, "compile_key_settings", settings)
    monkeypatch.setitem(sys.modules, "compile_key_settings.inner", inner)
    before = fingerprint(imports_inside())
    assert fingerprint(imports_inside()) == before
    monkeypatch.setattr(settings, "FACTOR", 9.0)
    factor_changed = fingerprint(imports_inside())
    monkeypatch.setattr(inner, "LIMIT", 2)
    assert len({before, factor_changed, fingerprint(imports_inside())}) == 3


def reading(read):
    def fn(x):
        return read(x)

    return fn


def test_what_a_value_gives_through_its_class_or_a_name_in_a_string_is_part_of_it(monkeypatch):
    # Sweep 40 A-F1: each of these read a config value that the fingerprint did not see, and a
    # disk-cache hit served code compiled for the earlier value (a float64 output read as float32).
    @dataclasses.dataclass
    class Cfg:
        scale: float = 1.0
        DT: typing.ClassVar[str] = "float32"

        def dt(self):
            return self.DT

    cfg = Cfg()
    prints = {fingerprint(reading(lambda x: cfg.dt()))}
    monkeypatch.setattr(Cfg, "DT", "float64")  # a ClassVar, read by a method
    prints.add(fingerprint(reading(lambda x: cfg.dt())))

    class Base:
        DT = "float32"

    class Sub(Base):
        pass

    sub = Sub()
    prints.add(fingerprint(reading(lambda x: sub.DT)))
    monkeypatch.setattr(Base, "DT", "float64")  # inherited
    prints.add(fingerprint(reading(lambda x: sub.DT)))

    class Picker:
        def __call__(self):
            return "float32"

    pick = Picker()
    prints.add(fingerprint(reading(lambda x: pick())))
    monkeypatch.setattr(Picker, "__call__", lambda self: "float64")  # what calling it does
    prints.add(fingerprint(reading(lambda x: pick())))

    lazy = types.ModuleType("compile_key_lazy")
    lazy.__getattr__ = lambda name: "float32"
    monkeypatch.setitem(sys.modules, "compile_key_lazy", lazy)
    prints.add(fingerprint(reading(lambda x: sys.modules["compile_key_lazy"].DT)))
    lazy.__getattr__ = lambda name: "float64"  # a module's __getattr__, reached by its name
    prints.add(fingerprint(reading(lambda x: sys.modules["compile_key_lazy"].DT)))
    assert len(prints) == 8


def by_global_name(x):
    return globals()["_GLOBAL_DT"]


_GLOBAL_DT = "float32"


def test_a_global_named_only_as_a_string_is_part_of_it(monkeypatch):
    before = fingerprint(by_global_name)
    monkeypatch.setitem(globals(), "_GLOBAL_DT", "float64")
    assert fingerprint(by_global_name) != before


_COMPILE_WITH_A_LOCAL_IMPORT = """
import torch, opreg
from torch._dynamo.utils import counters

def converted(x):
    from cfgpkg import cfgmod
    return (x * 2).to(getattr(torch, cfgmod.DT))

def fake(x):
    from cfgpkg import cfgmod
    return torch.empty_like(x, dtype=getattr(torch, cfgmod.DT))

@opreg.register_triton_op(fake_fn=fake, triton_fn=None, name="compile_key::local_import")
def convert(x: torch.Tensor) -> torch.Tensor:
    return converted(x)

x = torch.arange(4.0)
compiled = torch.compile(lambda a: convert(a) + 1)(x)
hits = counters["inductor"]["fxgraph_cache_hit"]
print(compiled.dtype, torch.equal(compiled, convert(x) + 1), hits)
"""


def test_a_module_the_code_imports_when_it_runs_keys_the_caches_of_other_processes(tmp_path):
    # Its code compiled for float32 was served to a process whose module said float64.
    (tmp_path / "cfgpkg").mkdir()
    (tmp_path / "cfgpkg" / "__init__.py").write_text("")
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        PYTHONDONTWRITEBYTECODE="1",
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
    )

    def write_module(run, dtype):
        (tmp_path / "cfgpkg" / "cfgmod.py").write_text(f"DT = {dtype!r}\n")
        return env

    assert _compiled_in_three_processes(_COMPILE_WITH_A_LOCAL_IMPORT, [], write_module) == (
        _EACH_DTYPE_COMPILED_THEN_SERVED
    )


def _compiled_in_three_processes(script, args, environment):
    """Runs script for float32, float64 and float64 again, each in a process of its own whose
    environment ``environment(run, dtype)`` gives: what each printed last (the compiled dtype,
    whether it equals the eager result, Inductor's disk-cache hits)."""
    seen = []
    for run, dtype in enumerate(("float32", "float64", "float64")):
        result = subprocess.run(
            [sys.executable, "-c", script, *args],
            capture_output=True,
            text=True,
            env=environment(run, dtype),
        )
        assert result.returncode == 0, result.stderr[-2000:]
        seen.append(result.stdout.split()[-3:])
    return seen


# The same code and config the third time: the cache serves it.
_EACH_DTYPE_COMPILED_THEN_SERVED = [
    ["torch.float32", "True", "0"],
    ["torch.float64", "True", "0"],
    ["torch.float64", "True", "1"],
]


_HELD_MODULE = types.ModuleType("compile_key_held")
_HELD_MODULE.DT = "float32"


class _Mode(enum.Enum):
    FAST = "float32"

    def dt(self):
        return _HELD_MODULE.DT


class _Settings(typing.NamedTuple):
    size: int = 1
    DT = "float32"

    def dt(self):
        return self.DT


class _Table(dict):
    DT = "float32"


class _Lazy(type):
    def __getattr__(cls, name):
        return _HELD_MODULE.DT


class _LazyConfig(metaclass=_Lazy):
    pass


def _with_module(c=_HELD_MODULE):
    return c.DT


class _Holder:
    pass


_HOLDER = _Holder()
_HOLDER.cfg = _HELD_MODULE


def test_a_value_reached_through_a_holder_is_part_of_it(monkeypatch):
    # Sweep 41 A-F1: a user's module held by a default argument, an object, a dict, a list or a
    # partial; an enum member's value and methods; a NamedTuple's or a dict subclass's class; a
    # metaclass's __getattr__. The fingerprint saw only their names, and another process's
    # disk-cache hit ran code compiled for float32 on float64 values.
    readers = {
        "default": lambda x: _with_module(),
        "object": lambda x: _HOLDER.cfg.DT,
        "dict": lambda x: {"cfg": _HELD_MODULE}["cfg"].DT,
        "list": lambda x: [_HELD_MODULE][0].DT,
        "partial": lambda x: functools.partial(lambda c: c.DT, _HELD_MODULE)(),
        "enum method": lambda x: _Mode.FAST.dt(),
        "namedtuple": lambda x: _Settings().dt(),
        "dict subclass": lambda x: _Table().DT,
        "metaclass": lambda x: _LazyConfig.DT,
    }
    partial = functools.partial(lambda c: c.DT, _HELD_MODULE)
    readers["partial"] = lambda x: partial()
    before = {name: fingerprint(reading(read)) for name, read in readers.items()}
    assert before == {name: fingerprint(reading(read)) for name, read in readers.items()}
    monkeypatch.setattr(_HELD_MODULE, "DT", "float64")
    monkeypatch.setattr(_Settings, "DT", "float64")
    monkeypatch.setattr(_Table, "DT", "float64")
    after = {name: fingerprint(reading(read)) for name, read in readers.items()}
    assert [name for name in readers if before[name] == after[name]] == []


_FINGERPRINT_OF_AN_ENUM_AND_A_NAMEDTUPLE = """
import enum, sys, typing
sys.path.insert(0, {folder!r})
from opreg import _compile_key
from opreg._declaration import OpDeclaration

class Mode(enum.Enum):
    FAST = "float32"
    def dt(self):
        return self.value

class Settings(typing.NamedTuple):
    size: int = 1
    def dt(self):
        return "float32"

def read(x):
    return Mode.FAST.dt(), Settings().dt(), Mode.FAST.value
print(_compile_key.fingerprint([read]))
"""


def test_an_enum_and_a_namedtuple_give_every_process_the_same_fingerprint(tmp_path):
    # What the fingerprint reads of them (their classes' machinery: object.__new__, a field's
    # getter, classmethods) is described, not made this process's own: other processes share the
    # caches.
    script = _FINGERPRINT_OF_AN_ENUM_AND_A_NAMEDTUPLE.format(folder=str(tmp_path))
    prints = {
        subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True
        ).stdout
        for _ in range(2)
    }
    assert len(prints) == 1 and len(next(iter(prints)).strip()) == 64


def _reads_other():
    return _HELD_MODULE.OTHER


def _reads_dt():
    return _HELD_MODULE.DT


def test_a_module_two_functions_read_is_read_for_the_names_of_both(monkeypatch):
    # Sweep 42 A-F1: a module met again through a second function was named only, so what that
    # function read of it (OTHER, beside DT that _reads_dt, described first, reads) was not part
    # of the fingerprint.
    monkeypatch.setattr(_HELD_MODULE, "OTHER", "float32", raising=False)
    both = reading(lambda x: (_reads_other(), _reads_dt()))
    before = fingerprint(both)
    monkeypatch.setattr(_HELD_MODULE, "OTHER", "float64")
    assert fingerprint(both) != before


# ---- the forty-third sweep's findings: config read through builtins, a partial, the environment

_COMPILE_READING_A_DTYPE = """
import builtins, functools, os, sys, types
import torch, opreg
from torch._dynamo.utils import counters

mode = sys.argv[1]
cfg = types.ModuleType("compile_key_cfg")
sys.modules["compile_key_cfg"] = cfg
if mode == "builtins":
    builtins.COMPILE_KEY_DT = os.environ["COMPILE_KEY_DT"]

    def dt():
        return COMPILE_KEY_DT
elif mode == "partial":
    cfg.DT = os.environ["COMPILE_KEY_DT"]
    read = functools.partial(getattr, cfg, "DT")

    def dt():
        return read()
else:
    def dt():
        return os.environ["COMPILE_KEY_DT"]

def fake(x):
    return torch.empty_like(x, dtype=getattr(torch, dt()))

@opreg.register_triton_op(fake_fn=fake, triton_fn=None, name="compile_key::read_dtype")
def convert(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).to(getattr(torch, dt()))

x = torch.arange(4.0)
compiled = torch.compile(lambda a: convert(a) + 1)(x)
hits = counters["inductor"]["fxgraph_cache_hit"]
print(compiled.dtype, torch.equal(compiled, convert(x) + 1), hits)
"""


@pytest.mark.parametrize("mode", ["builtins", "partial", "environ"])
def test_a_dtype_read_through_builtins_a_partial_or_the_environment_keys_other_processes(
    tmp_path, mode
):
    # Sweep 43 A-F1: a name found in builtins, a module given to partial(getattr, cfg, "DT") and
    # os.environ were not read: a disk-cache hit ran code compiled for float32 on float64 values.
    # A variable the code does not read leaves the key shared.

    def environment(run, dtype):
        return dict(
            os.environ,
            COMPILE_KEY_DT=dtype,
            COMPILE_KEY_UNREAD=str(run),
            TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
        )

    assert _compiled_in_three_processes(_COMPILE_READING_A_DTYPE, [mode], environment) == (
        _EACH_DTYPE_COMPILED_THEN_SERVED
    )


def test_a_partial_of_other_c_code_given_a_users_module_makes_the_key_this_process_own():
    # What vars reads of the module is unknown: two modules alike are not taken for each other.
    one, other = types.ModuleType("cfg"), types.ModuleType("cfg")
    one.DT = other.DT = "float32"
    assert fingerprint(functools.partial(vars, one)) != fingerprint(functools.partial(vars, other))


def test_what_a_defaultdict_gives_for_a_missing_key_is_part_of_it():
    # Sweep 43 A033: its default_factory was not read.
    table = collections.defaultdict(lambda: "float32")
    read = reading(lambda x: table["DT"])
    before = fingerprint(read)
    table.default_factory = lambda: "float64"
    assert fingerprint(read) != before


def test_a_c_method_bound_to_a_users_module_reads_it():
    # Sweep 43 A (left by its fix): cfg.__getattribute__ was described by its name alone.
    cfg = types.ModuleType("compile_key_bound_cfg")
    cfg.DT = "float32"
    read_config = cfg.__getattribute__
    read = reading(lambda x: read_config("DT"))
    before = fingerprint(read)
    cfg.DT = "float64"
    assert fingerprint(read) != before


def test_what_an_object_of_a_users_container_class_holds_is_part_of_it():
    # Sweep 43 A (left by its fix): a dict or list subclass was described by its class and items,
    # not by the attributes its object holds.
    class Table(dict):
        pass

    class Row(list):
        pass

    table, row = Table(), Row()
    table.dtype = row.dtype = "float32"
    read_table = reading(lambda x: table.dtype)
    read_row = reading(lambda x: row.dtype)
    before = fingerprint(read_table), fingerprint(read_row)
    table.dtype = row.dtype = "float64"
    assert fingerprint(read_table) != before[0]
    assert fingerprint(read_row) != before[1]


def test_code_made_by_exec_with_builtins_of_its_own_reads_them():
    # Sweep 43 A033: a name found in exec's own __builtins__ was not read.
    namespace = {"__builtins__": {"DT": "float32"}}
    exec("def read(x):\n    return DT\n", namespace)
    before = fingerprint(namespace["read"])
    namespace["__builtins__"]["DT"] = "float64"
    assert fingerprint(namespace["read"]) != before


def test_an_op_defined_while_another_definition_syncs_its_key_leaves_no_warning():
    # Sweep 43 A-F2: a profile hook defining an op while a definition synced its key changed the
    # dicts that definition iterated, which then warned that the caches did not see it.
    import torch._inductor.config as inductor_config

    opreg.custom_op("compile_key_hook::first", mutates_args=())(_twice_annotated)
    fired = []

    def define_inside(frame, event, arg):
        if (
            not fired
            and event == "c_call"
            and getattr(arg, "__name__", None) == "startswith"
            and frame.f_code.co_filename.endswith("_compile_key.py")
        ):
            fired.append(True)
            sys.setprofile(None)
            opreg.custom_op("compile_key_hook::inner", mutates_args=())(_twice_annotated)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sys.setprofile(define_inside)
        try:
            opreg.custom_op("compile_key_hook::outer", mutates_args=())(_twice_annotated)
        finally:
            sys.setprofile(None)
    assert fired
    assert [str(warning.message) for warning in caught] == []
    keyed = set(inductor_config.unsafe_marked_cacheable_functions)
    assert {f"opreg definition compile_key_hook::{name}" for name in ("outer", "inner")} <= keyed


class _Indexed:
    dtype = "float32"

    def __getitem__(self, key):
        return _Indexed.dtype


class _Defaulting(dict):
    def __missing__(self, key):
        return "float32"


class _Named(str):
    def lower(self):
        return "float32"


class _Bytes(bytes):
    def decode(self, *args):
        return "float32"


class _Picks(frozenset):
    def pick(self):
        return "float32"


class _Partial(functools.partial):
    def __call__(self, *args):
        return "float32"


class _Property(property):
    def __get__(self, obj, owner=None):
        return "float32"


class _HasProperty:
    dtype = _Property(lambda self: "never")


def _dtype_of_its_own():
    return _dtype_of_its_own.dtype


_dtype_of_its_own.dtype = "float32"


class _DunderHeld:
    __dtype__ = "float32"


def _annotated() -> float32:  # noqa: F821
    return "x"


class _Slotted:
    __slots__ = ("dtype",)

    def __init__(self):
        self.dtype = "float32"


COMPILE_KEY_GLOBAL_DT = "float32"


def _computed_name_module():
    module = types.ModuleType("compile_key_computed")
    module.DT = "float32"
    return module


_OTHER_WAYS = ["getitem", "missing", "str_subclass", "computed_name", "argv", "environb"]
_YET_OTHER_WAYS = [
    "function_attribute",
    "bytes_subclass",
    "set_subclass",
    "partial_subclass",
    "property_subclass",
    "computed_global",
    "class_dunder",
    "annotation",
    "slots",
]


@pytest.mark.parametrize("how", _OTHER_WAYS + _YET_OTHER_WAYS)
def test_what_other_ways_of_reading_a_config_give_is_part_of_the_key(how, monkeypatch):
    # Sweep 44 A-F1..A-F3: a class's dunder methods other than __call__ and __getattr__, a str
    # subclass's methods, an attribute read by a name the code computes, sys.argv and
    # os.environb were not read: other processes shared a key for other dtypes. Sweep 45 A-F1:
    # nor were a function's own attributes, a bytes, frozenset, partial or property subclass's
    # class, or a global of its own read by a name it computes. Sweep 46 A: nor a class's dunder
    # attribute the code names, a function's annotations or a slotted object's values.
    monkeypatch.setenv("COMPILE_KEY_DT", "float32")
    monkeypatch.setattr(sys, "argv", [sys.argv[0], "float32"])
    table, defaulting, named = _Indexed(), _Defaulting(), _Named("q")
    module = _computed_name_module()
    encoded, picks, partial = _Bytes(b"q"), _Picks({1}), _Partial(print)
    slotted = _Slotted()
    reads = {
        "getitem": lambda x: table["DT"],
        "missing": lambda x: defaulting["DT"],
        "str_subclass": lambda x: named.lower(),
        "computed_name": lambda x: getattr(module, "".join(["D", "T"])),
        "argv": lambda x: sys.argv[1],
        "environb": lambda x: os.environb[b"COMPILE_KEY_DT"],
        "function_attribute": lambda x: _dtype_of_its_own(),
        "bytes_subclass": lambda x: encoded.decode(),
        "set_subclass": lambda x: picks.pick(),
        "partial_subclass": lambda x: partial(),
        "property_subclass": lambda x: _HasProperty().dtype,
        "computed_global": lambda x: globals()["".join(["COMPILE_KEY_", "GLOBAL_DT"])],
        "class_dunder": lambda x: _DunderHeld.__dtype__,
        "annotation": lambda x: _annotated.__annotations__["return"],
        "slots": lambda x: slotted.dtype,
    }
    read = reading(reads[how])
    before = fingerprint(read)
    assert fingerprint(read) == before
    change = {
        "getitem": (_Indexed, "__getitem__", lambda self, key: "float64"),
        "missing": (_Defaulting, "__missing__", lambda self, key: "float64"),
        "str_subclass": (_Named, "lower", lambda self: "float64"),
        "computed_name": (module, "DT", "float64"),
        "argv": (sys, "argv", [sys.argv[0], "float64"]),
        "environb": (os.environ, "COMPILE_KEY_DT", "float64"),
        "function_attribute": (_dtype_of_its_own, "dtype", "float64"),
        "bytes_subclass": (_Bytes, "decode", lambda self, *args: "float64"),
        "set_subclass": (_Picks, "pick", lambda self: "float64"),
        "partial_subclass": (_Partial, "__call__", lambda self, *args: "float64"),
        "property_subclass": (_Property, "__get__", lambda self, obj, owner=None: "float64"),
        "computed_global": (sys.modules[__name__], "COMPILE_KEY_GLOBAL_DT", "float64"),
        "class_dunder": (_DunderHeld, "__dtype__", "float64"),
        "annotation": (_annotated, "__annotations__", {"return": "float64"}),
        "slots": (slotted, "dtype", "float64"),
    }[how]
    if how == "environb":
        monkeypatch.setenv(*change[1:])
    else:
        monkeypatch.setattr(*change)
    assert fingerprint(read) != before


def test_a_users_module_named_as_a_standard_librarys_is_read_as_the_users(tmp_path, monkeypatch):
    # Sweep 44 A-F4: a user's profile.py was taken for the standard library's, whose code comes
    # with Python's version: its globals were not read.
    (tmp_path / "profile.py").write_text("DT = 'float32'\n\ndef dt():\n    return DT\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "profile", raising=False)
    module = importlib.import_module("profile")
    assert module.__file__ == str(tmp_path / "profile.py")
    before = fingerprint(module.dt)
    module.DT = "float64"
    assert fingerprint(module.dt) != before


_FINGERPRINTS_OF_CONFIGS = """
import abc, collections, dataclasses, enum, sys, typing
from opreg import _compile_key
from opreg._declaration import OpDeclaration

@dataclasses.dataclass
class Config:
    dtype: str = "float32"
    sizes: list = dataclasses.field(default_factory=list)

class Base(abc.ABC):
    @abc.abstractmethod
    def dtype(self): ...

class Chosen(Base):
    def dtype(self):
        return "float32"

class Mode(enum.Enum):
    FAST = "float32"

class Pair(typing.NamedTuple):
    dtype: str = "float32"

class Table(dict):
    def __missing__(self, key):
        return "float32"

class Named(str):
    def lower(self):
        return "float32"

@dataclasses.dataclass(slots=True)
class Slotted:
    dtype: str = "float32"

class Reads(typing.Protocol):
    def dtype(self) -> str: ...

class Reader(Reads):
    def dtype(self):
        return "float32"

config, chosen, pair, table, named = Config(), Chosen(), Pair(), Table(), Named("q")
slotted, reader = Slotted(), Reader()
table_of_itself = {"dtype": "float32"}
table_of_itself["self"] = table_of_itself
import torch
@torch.no_grad()
def helper():
    return "float32"
reads = [lambda x: config.dtype, lambda x: chosen.dtype(), lambda x: Mode.FAST.value,
         lambda x: pair.dtype, lambda x: table["dtype"], lambda x: named.lower(),
         lambda x: sys.argv[0], lambda x: slotted.dtype, lambda x: reader.dtype(),
         lambda x: table_of_itself["dtype"], lambda x: helper()]
print(" ".join(_compile_key.fingerprint((read,)) for read in reads))
"""


def test_configs_of_every_kind_give_one_key_in_every_process():
    # The key must stay shared where nothing differs: a dataclass's __init__ (read since sweep 44,
    # with the other dunder methods) holds dataclasses' own _HAS_DEFAULT_FACTORY, which made the
    # key of every op reading a dataclass this process's own; an ABC's registry did too, and
    # (sweep 45 A-F2) a slotted dataclass's member descriptors and a Protocol's, and (sweep 46 A)
    # a dict that holds itself and a helper under @torch.no_grad().
    keys = [
        subprocess.run(
            [sys.executable, "-c", _FINGERPRINTS_OF_CONFIGS],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        for _ in range(2)
    ]
    assert len(keys[0]) == 11
    assert keys[0] == keys[1]


def test_a_wrapper_whose_fn_leads_back_to_itself_is_fingerprinted_and_ends():
    # Sweep 46 A-F3: an object of a module named like Triton's (triton_utils) whose .fn was itself
    # made the key loop forever; an object of Triton's own modules with such a .fn did too.
    script = """
import sys, types
from opreg import _compile_key
from opreg._declaration import OpDeclaration
for module in ("triton_utils47", "triton.runtime.probe47"):
    Launcher = type("Launcher", (), {"__module__": module, "scale": 2.0})
    launcher = Launcher()
    launcher.fn = launcher
    print(len(_compile_key.fingerprint([lambda x: x * launcher.scale])))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["64", "64"], done.stdout


_FINGERPRINT_OF_AN_OP_WITH_A_VMAP_FN = """
import sys, torch, opreg
from opreg import _compile_key
from opreg._declaration import OpDeclaration
if sys.argv[1] == "after another":  # its definition's serial differs
    opreg.register_vmap_op(lambda x: x * 3, fake_fn=torch.empty_like, vmap_fn=lambda x: x * 3,
                           fake_vmap_fn=torch.empty_like, name="compile_key::before",
                           schema="(Tensor x) -> Tensor")
opreg.register_vmap_op(lambda x: x * 2, fake_fn=torch.empty_like, vmap_fn=lambda x: x * 2,
                       fake_vmap_fn=torch.empty_like, name="compile_key::with_vmap_fn",
                       schema="(Tensor x) -> Tensor")
print(_compile_key.current_fingerprint("compile_key::with_vmap_fn"),
      _compile_key.current_fingerprint("compile_key::with_vmap_fn_vmap"))
"""


def test_an_op_with_a_vmap_fn_gives_every_process_the_same_fingerprint():
    # Sweep 47 A-F1: the rule opreg makes for a vmap_fn calls itself, and the fingerprint went
    # through opreg's own functions without noting those met: it stopped at its depth limit with
    # this process's own key (the op and its companion never shared the caches); it also read
    # the serial of the companion's definition, which depends on what was defined before.
    prints = {
        subprocess.run(
            [sys.executable, "-c", _FINGERPRINT_OF_AN_OP_WITH_A_VMAP_FN, order],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for order in ("first", "first", "after another")
    }
    assert len(prints) == 1 and len(next(iter(prints)).split()) == 2, prints


class _HoldsAModule:
    def __init__(self, config):
        self.config = config

    def fake(self, x):
        return torch.empty_like(x, dtype=getattr(torch, self.config.DT))


def test_what_a_method_reads_of_a_module_its_object_holds_is_part_of_it():
    # Sweep 47 A-F2: the module was described when the object holding it was met, after the
    # method naming DT had been, so for no name: float32 and float64 gave one key.
    config = types.ModuleType("sweep47_config")
    holder = _HoldsAModule(config)
    config.DT = "float32"
    single = fingerprint(holder.fake)
    config.DT = "float64"
    assert fingerprint(holder.fake) != single


class _MetTwice:
    X = 1
    __DT__ = "float32"


def _reads_x():
    return _MetTwice.X


def _reads_the_dunder():
    return _reads_x() + len(_MetTwice.__DT__)


def _annotated() -> float32:  # noqa: F821 (read as a string)
    return None


def _reads_the_annotation():
    return _annotated.__annotations__["return"]


def test_a_dunder_named_by_code_met_after_its_class_or_function_is_part_of_it():
    # Sweep 47 A-F3: a class or function met again was not read for the dunders later code names.
    single = fingerprint(_reads_x, _reads_the_dunder)
    _MetTwice.__DT__ = "float64"
    try:
        assert fingerprint(_reads_x, _reads_the_dunder) != single
    finally:
        _MetTwice.__DT__ = "float32"
    single = fingerprint(_annotated, _reads_the_annotation)
    _annotated.__annotations__["return"] = "float64"
    assert fingerprint(_annotated, _reads_the_annotation) != single


def test_the_configs_entries_pickle_in_one_order_whatever_order_ops_were_defined_in():
    # Sweep 48 A-F5: pickled in the order of definition, the same ops defined in another order
    # (another script importing them otherwise) never shared a cache entry.
    ab = _compile_key._SharedEntries([("opreg::a", "1"), ("opreg::b", "2")])
    ba = _compile_key._SharedEntries([("opreg::b", "2"), ("opreg::a", "1")])
    assert pickle.dumps(ab) == pickle.dumps(ba)


def test_the_serial_a_definition_replaces_is_not_part_of_it():
    # Sweep 48 A-F6: a custom_op's key changed with how many definitions came before it.
    declaration = OpDeclaration(
        schema="compile_key::serial(Tensor x) -> Tensor", fallback=lambda x: x, replace_only=7
    )
    assert "replace_only" not in dict(declaration.compiled_pieces())
    assert fingerprint(*declaration.compiled_pieces()) == fingerprint(
        *dataclasses.replace(declaration, replace_only=8).compiled_pieces()
    )


def _reads_flags_of(config):
    for flag in ("WIDE", "DOUBLE"):
        if hasattr(config, flag):
            return torch.float64
    return torch.float32


_DTYPE_ATTRIBUTE = "DT"


def _reads_the_attribute_a_global_names(config):
    return getattr(config, _DTYPE_ATTRIBUTE)


def test_names_in_constant_tuples_and_strs_the_code_reads_name_what_it_reads(monkeypatch):
    # Sweep 48 A-F3/F4: names held in a tuple constant, a global str (ATTR = "DT"), a closure or a
    # default were not taken for names the code reads: float32 code reused for float64.
    config = types.ModuleType("sweep48_config")
    reads = functools.partial(_reads_flags_of, config)
    single = fingerprint(reads)
    config.WIDE = True
    assert fingerprint(reads) != single
    config.DT = torch.float32
    reads = functools.partial(_reads_the_attribute_a_global_names, config)
    single = fingerprint(reads)
    config.DT = torch.float64
    assert fingerprint(reads) != single

    def made_with(name):
        return lambda: getattr(config, name)

    single = fingerprint(made_with("DT"))
    config.DT = torch.float32
    assert fingerprint(made_with("DT")) != single


def test_an_object_built_on_c_state_it_does_not_show_makes_the_key_this_process_own():
    # Sweep 48 A ck04: random.Random's generator state is C's; its __dict__ holds gauss_next only,
    # and seeds 1 and 2 gave one key.
    seeded = {seed: random.Random(seed) for seed in (1, 2)}
    assert fingerprint(lambda: seeded[1].random()) == fingerprint(lambda: seeded[1].random())
    one, two = seeded[1], seeded[2]
    assert fingerprint(lambda: one.random()) != fingerprint(lambda: two.random())

    class Seeded(random.Random):
        pass

    assert not _compile_key._shows_all_it_holds(Seeded)

    class Plain:
        pass

    class Slotted(Plain):
        __slots__ = ("dtype",)

    assert _compile_key._shows_all_it_holds(Plain)
    assert _compile_key._shows_all_it_holds(Slotted)


_SLICES_AND_GETTERS = """
import operator, sys
from opreg import _compile_key
PART, SPAN = slice(0, int(sys.argv[1])), range(int(sys.argv[1]))
GET, ITEM, CALL = operator.attrgetter("DT"), operator.itemgetter(1), operator.methodcaller("f", k=2)
reads = [lambda x: x[PART], lambda x: SPAN, lambda x: (GET, ITEM, CALL)]
print(" ".join(_compile_key.fingerprint((read,)) for read in reads))
"""


def test_slices_ranges_and_getters_give_every_process_the_same_key():
    # Sweep 48 A ck05: a global slice, range or operator.attrgetter made the key process-own.
    def keys(stop):
        return subprocess.run(
            [sys.executable, "-c", _SLICES_AND_GETTERS, str(stop)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()

    first, again, other = keys(2), keys(2), keys(3)
    assert len(first) == 3
    assert first == again
    assert [a != b for a, b in zip(first, other, strict=True)] == [True, True, False]


def test_what_an_attrgetter_reads_of_a_users_module_is_part_of_it():
    config = types.ModuleType("sweep49_config")
    config.DT = torch.float32
    get = operator.attrgetter("DT")
    single = fingerprint(lambda: get(config))
    config.DT = torch.float64
    assert fingerprint(lambda: get(config)) != single


def test_a_tensor_or_a_c_object_a_piece_reads_makes_the_key_this_process_own():
    # Sweep 49 A c01/c04/c05: a global tensor (its dtype read by the fake) was described as a
    # library object holding no attributes: float32 and float64 gave one key, and the float64
    # process ran float32 code. So did a Parameter, a sparse tensor, a storage, ctypes values and
    # objects of a user's subclass of a C container.
    class Queue(collections.deque):
        pass

    class Buffer(bytearray):
        pass

    pairs = {
        "tensor": (torch.ones(2), torch.ones(2, dtype=torch.float64)),
        "parameter": (torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.zeros(2))),
        "sparse": (torch.eye(2).to_sparse(), torch.eye(3).to_sparse()),
        "storage": (torch.UntypedStorage(2), torch.UntypedStorage(3)),
        "ctypes": (ctypes.c_int(1), ctypes.c_int(2)),
        "deque subclass": (Queue([1]), Queue([2])),
        "bytearray subclass": (Buffer(b"a"), Buffer(b"b")),
    }

    def reading(value):
        return lambda: value.dtype

    def listing(value):
        return lambda: [value]

    for kind, (one, other) in pairs.items():
        assert fingerprint(reading(one)) != fingerprint(reading(other)), kind
        assert fingerprint(listing(one)) != fingerprint(listing(other)), kind


def test_torch_state_a_piece_reads_and_values_set_on_torch_are_part_of_it(monkeypatch):
    # Sweep 50 A n15/n16: a fake choosing its dtype by torch.get_autocast_dtype("cpu"), or by a
    # value the user set on torch, gave one key for float16 and bfloat16 (float32 and float64):
    # the second process ran the first one's code.
    def reads_autocast():
        return torch.get_autocast_dtype("cpu")

    before = fingerprint(reads_autocast)
    previous = torch.get_autocast_dtype("cpu")
    torch.set_autocast_dtype("cpu", torch.float16 if previous != torch.float16 else torch.bfloat16)
    try:
        assert fingerprint(reads_autocast) != before
    finally:
        torch.set_autocast_dtype("cpu", previous)
    assert fingerprint(reads_autocast) == before

    def reads_a_value_set_on_torch():
        return torch.sweep50_out_dtype

    monkeypatch.setattr(torch, "sweep50_out_dtype", torch.float32, raising=False)
    single = fingerprint(reads_a_value_set_on_torch)
    monkeypatch.setattr(torch, "sweep50_out_dtype", torch.float64)
    assert fingerprint(reads_a_value_set_on_torch) != single


def _amp_alias_reader():
    from torch import get_autocast_dtype as amp_dtype

    return lambda: amp_dtype("cpu")


def test_torch_state_read_under_other_names_and_values_on_torchs_modules_and_classes(monkeypatch):
    # Sweep 51 A v01-v08: the sweep 50 rule matched torch's state readers by the names in the code,
    # and kept a library module's plain values and dtypes only: an aliased or partial reader, one
    # held as a default, a tuple or dict of dtypes set on torch, a dtype set on torch.nn or on
    # torch.Tensor, and torch.backends' flags each gave one key for two processes' states.
    def default_reader(reader=torch.get_autocast_dtype):
        return reader("cpu")

    readers = {
        "alias": _amp_alias_reader(),
        "partial": functools.partial(torch.get_autocast_dtype, "cpu"),
        "default": default_reader,
    }
    previous = torch.get_autocast_dtype("cpu")
    before = {kind: fingerprint(reader) for kind, reader in readers.items()}
    torch.set_autocast_dtype("cpu", torch.float16 if previous != torch.float16 else torch.bfloat16)
    try:
        for kind, reader in readers.items():
            assert fingerprint(reader) != before[kind], kind
    finally:
        torch.set_autocast_dtype("cpu", previous)
    for kind, reader in readers.items():
        assert fingerprint(reader) == before[kind], kind

    values = {
        "tuple on torch": (torch, "sweep51_dtypes", lambda: torch.sweep51_dtypes[0], tuple),
        "dict on torch": (torch, "sweep51_dtypes", lambda: torch.sweep51_dtypes["out"], dict),
        "on torch.nn": (torch.nn, "sweep51_dtype", lambda: torch.nn.sweep51_dtype, None),
        "on torch.Tensor": (
            torch.Tensor,
            "sweep51_dtype",
            lambda: torch.Tensor.sweep51_dtype,
            None,
        ),
    }
    for kind, (holder, name, reader, container) in values.items():
        keys = set()
        for dtype in (torch.float32, torch.float64):
            value = (dtype,) if container is tuple else {"out": dtype} if container else dtype
            monkeypatch.setattr(holder, name, value, raising=False)
            keys.add(fingerprint(reader))
        assert len(keys) == 2, kind

    def reads_mkldnn():
        return torch.float64 if torch.backends.mkldnn.enabled else torch.float32

    enabled = fingerprint(reads_mkldnn)
    with torch.backends.mkldnn.flags(enabled=not torch.backends.mkldnn.enabled):
        assert fingerprint(reads_mkldnn) != enabled
    assert fingerprint(reads_mkldnn) == enabled


def test_every_key_holds_torchs_process_state(monkeypatch):
    # Sweep 52 A r07-r10: torch's state read without a getter's name (torch.autocast("cpu")'s
    # fast_dtype, a torch.backends module under another name, a flag no list named) gave one key
    # for two processes' states, and the second ran the first one's code. Every key holds it now.
    from torch.backends import mkldnn as aliased

    readers = {
        "autocast object": lambda: torch.autocast("cpu").fast_dtype,
        "aliased backend": lambda: aliased.enabled,
        "cudnn.benchmark": lambda: torch.backends.cudnn.benchmark,
        "fill_uninitialized_memory": lambda: torch.utils.deterministic.fill_uninitialized_memory,
    }
    changes = {
        "autocast object": lambda: torch.set_autocast_dtype("cpu", torch.float16),
        "aliased backend": lambda: setattr(aliased, "enabled", not aliased.enabled),
        "cudnn.benchmark": lambda: setattr(
            torch.backends.cudnn, "benchmark", not torch.backends.cudnn.benchmark
        ),
        "fill_uninitialized_memory": lambda: setattr(
            torch.utils.deterministic,
            "fill_uninitialized_memory",
            not torch.utils.deterministic.fill_uninitialized_memory,
        ),
    }
    saved = (
        torch.get_autocast_dtype("cpu"),
        aliased.enabled,
        torch.backends.cudnn.benchmark,
        torch.utils.deterministic.fill_uninitialized_memory,
    )
    try:
        for kind, reader in readers.items():
            before = fingerprint(reader)
            changes[kind]()
            assert fingerprint(reader) != before, kind
    finally:
        torch.set_autocast_dtype("cpu", saved[0])
        aliased.enabled = saved[1]
        torch.backends.cudnn.benchmark = saved[2]
        torch.utils.deterministic.fill_uninitialized_memory = saved[3]

    def reads_a_value_set_on_torch():
        return torch.sweep52_dtypes

    for make in (frozenset, lambda d: types.SimpleNamespace(out=d), lambda d: ((((((d,),),),),),)):
        keys = set()
        for dtype in (torch.float32, torch.float64):
            monkeypatch.setattr(torch, "sweep52_dtypes", make([dtype]), raising=False)
            keys.add(fingerprint(reads_a_value_set_on_torch))
        assert len(keys) == 2, make
