"""What torch.compile's caches must see of a Python-defined op. AOTAutograd's cache keys a graph by
what Dynamo captured, where an op is only its name, and hands back the code traced from the op's
definition then: after a replace, or in another process whose op of that name differs, a graph of
a decomposed op would run the old Triton launches (seen: an old factor), and any op's graph the
old fake's shapes. Each Python definition (and each op library loaded) therefore puts a
fingerprint of its pieces, taken when a cache key is made, into Inductor's config, which both of
Inductor's cache keys include: the same code gives the same key in every process, and a value that
cannot be fingerprinted gives one no other process shares. Taking it never raises: a failure would
fail every compile of the process (the key is made while pickling Inductor's config)."""

from __future__ import annotations

import builtins
import collections
import dataclasses
import dis
import enum
import functools
import hashlib
import importlib.util
import operator
import os
import secrets
import struct
import sys
import sysconfig
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import torch

from opreg._after_import import run_after_import
from opreg._fork import new_rlock
from opreg._tracing import without_line_events

_PREFIX = "opreg definition "  # no function is named so: torch reads these names as functions
_MAX_DEPTH = 32
_MAX_VALUES = 20000  # beyond, what is left stays unique: a cache key must stay cheap to make
# Functions of these packages are named, not read: their code comes with their version, which
# the caches' keys hold already (opreg's own pieces differ only with opreg's).
_NAMED_PACKAGES = ("torch", "triton", "opreg", "numpy")


_PLAIN = (str, int, float, bool, type(None))  # exactly these: their repr says all they hold
_ABSENT = object()
# A class's dunders that decide what reading or calling its objects gives (PICK(), OBJ.DT), and
# what its dunder methods are (CFG["DT"], str(CFG), len(CFG), a descriptor's __get__).
_BEHAVING_DUNDERS = frozenset({"__call__", "__getattr__", "__getattribute__"})
_METHODS = (types.FunctionType, classmethod, staticmethod, property, functools.partial)
# Code naming one of these may read a module's attribute by a name it computes.
_COMPUTED_NAME_READERS = frozenset({"getattr", "hasattr", "vars", "__dict__", "__getattribute__"})
# ... or one of its own globals.
_COMPUTED_GLOBAL_READERS = _COMPUTED_NAME_READERS | {"globals", "eval", "exec", "modules"}
# What a library keeps in a class for itself (abc's registry of subclasses), not the user's.
_CLASS_BOOKKEEPING = frozenset({"_abc_impl"})
# A function's attributes that code may read of it (dt.__annotations__["return"]).
_FUNCTION_DUNDERS = frozenset({"__doc__", "__name__", "__qualname__", "__annotations__"})
# sys's tables of the import system: what the code reads of them is described elsewhere.
_IMPORT_TABLES = frozenset({"modules", "path", "meta_path", "path_hooks", "path_importer_cache"})
_IMPORT_NAME = dis.opmap["IMPORT_NAME"]
_BUILTIN_CALLABLES = (
    types.BuiltinFunctionType,
    types.WrapperDescriptorType,
    types.MethodDescriptorType,
    types.MethodWrapperType,
    types.ClassMethodDescriptorType,
)
_TUPLE_GETTER = type(collections.namedtuple("_Pair", "first").first)
_GETTERS = (operator.attrgetter, operator.itemgetter, operator.methodcaller)
# Functions that read of an object the names given them as strings (getattr(cfg, "DT")).
_ATTRIBUTE_READERS = (getattr, hasattr)
# What the interpreter itself put in builtins (exit, help, __spec__): the same in every process.
_INTERPRETERS_OWN = {
    name: value
    for name, value in vars(builtins).items()
    if type(value).__module__ in ("_sitebuiltins", "_frozen_importlib")
}
# Code naming one of these reads the environment (os.environ["DT"], os.getenv("DT")).
_ENVIRONMENT_NAMES = frozenset({"environ", "environb", "getenv", "getenvb"})
_STANDARD_LIBRARY_DIRS = (
    os.path.realpath(sysconfig.get_paths()["stdlib"]),
    os.path.realpath(sysconfig.get_paths()["purelib"]),
)
_STANDARD_LIBRARY_MODULES: dict[tuple[str, int], bool] = {}  # (name, id(module)): whether it is
_PROCESS = secrets.token_hex(8)  # with the pid: an id may be the same in another process


def _unique(value: Any) -> str:
    # Only this process can know this value: its key may reuse only this process's entries.
    where = f"at {id(value):#x} in {os.getpid()}.{_PROCESS}"
    try:
        return f"<{type(value).__module__}.{type(value).__qualname__} {where}>"
    except Exception:
        return f"<object {where}>"


def _encoded(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # a name may hold a lone surrogate


class _ReadByName(NamedTuple):
    value: Any  # held, so that its id names it until the digest
    label: str
    held: Callable[[], Mapping[str, Any]]  # what it holds by name now
    read: set[str]


class _Fingerprint:
    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._seen: dict[int, int] = {}
        self._values = 0
        # The names the functions being described read (co_names and constant strings): what
        # their code may read of a user's module reached through any value (a default argument,
        # an object's attribute, a dict).
        self._reading: list[list[str]] = []
        self._module_names: dict[int, set[str]] = {}  # the names each module was read for
        # Every name the code described so far reads, and what was read by name of a user's
        # module, class or function, or of the environment, when it was met: at the end each is
        # read again for the names that code met later reads (sweep 47: a method naming cfg.DT
        # was described before the object that holds cfg, and a class met again was not read
        # for the dunders that later code names).
        self._all_names: set[str] = set()
        self._by_name: dict[int, _ReadByName] = {}
        self._part = False  # a part's (_apart) are read again by the whole's digest

    def add(self, value: Any, depth: int = 0) -> None:
        try:
            described = self._describe(value, depth)
        except Exception:  # a dataclass's unset field, keys that do not sort, a raising property
            described = _unique(value)
        self._hash.update(_encoded(described))
        self._hash.update(b"\0")

    def digest(self) -> str:
        if not self._part:
            self._read_again_by_name()
        return self._hash.hexdigest()

    def _read_by_name(
        self, value: Any, label: str, held: Callable[[], Mapping[str, Any]], read: set[str]
    ) -> None:
        """Remembers that ``read`` was read of ``value`` by name, for _read_again_by_name."""
        entry = self._by_name.setdefault(id(value), _ReadByName(value, label, held, set()))
        entry.read.update(read)

    def _read_again_by_name(self) -> None:
        """What later code names of each value met, until no more code is met; in the order of
        their labels (a set's elements are met in an order of this process)."""
        while True:
            pending = []
            for entry in self._by_name.values():
                held = entry.held()
                names = sorted((self._all_names - entry.read).intersection(held))
                if names:
                    entry.read.update(names)
                    pending.append((entry.label, [[name, held[name]] for name in names]))
            if not pending:
                return
            for label, values in sorted(pending, key=lambda item: item[0]):
                self._nested(f"by name:{label}", values, 0)

    # Containers are copied first, in C, before they are read: another thread may change one (a
    # memo a fallback fills) while a key is made, and iterating it would then raise.
    def _describe(self, value: Any, depth: int) -> str:
        if type(value) is int:
            return f"int:{value:#x}"  # repr refuses an int of over 4300 digits
        if type(value) is bytes:
            return f"bytes:{hashlib.sha256(value).hexdigest()}"
        if value is None or type(value) in (bool, float, complex, str):
            return f"{type(value).__name__}:{value!r}"
        if isinstance(value, int | float | complex | str | bytes) and not isinstance(
            value, enum.Enum
        ):
            return self._subclass_of_plain(value, depth)
        if value is Ellipsis or value is NotImplemented:
            return repr(value)
        if getattr(type(value), "opreg_process_state", False) and _is_named(type(value).__module__):
            return f"state:{type(value).__qualname__}"  # opreg's own, of this process only
        if any(value is reader for reader in (os.environ, os.environb, os.getenv, os.getenvb)):
            # The variables the code names: its other variables differ between processes.
            names = sorted({name for names in self._reading for name in names})
            self._read_by_name(os.environ, "environ", lambda: os.environ.copy(), set(names))
            return f"environ:{[(name, os.environ[name]) for name in names if name in os.environ]}"
        if isinstance(value, torch.dtype | torch.device | torch.layout | torch.memory_format):
            return f"{type(value).__name__}:{value}"
        if isinstance(value, types.ModuleType) and _is_named(value.__name__):
            # Its code comes with its package's version; what it holds for the process (sys.argv)
            # does not.
            state = _process_state(value, {name for names in self._reading for name in names})
            return f"module:{value.__name__}:{state}"
        if isinstance(value, type) and _is_named(value.__module__):
            # What a user set on a library's class (`torch.Tensor.OUT = torch.float64`: sweep 51
            # A v08) among the names the code reads.
            state = _process_state(value, {name for names in self._reading for name in names})
            return f"type:{value.__module__}.{value.__qualname__}:{state}"
        if isinstance(value, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
            return f"op:{value}"  # its own definition has its own fingerprint
        if type(value) in (slice, range):
            self._nested(type(value).__name__, [value.start, value.stop, value.step], depth)
            return type(value).__name__
        if type(value) in _GETTERS:
            # What it is given: the names (attrgetter("cfg.DT")) and keys it reads of what it is
            # called with, and a method's arguments.
            maker, given = value.__reduce__()[:2]
            names = {part for item in given if isinstance(item, str) for part in item.split(".")}
            if isinstance(maker, functools.partial):  # methodcaller with keywords
                names.update(item for item in maker.args if isinstance(item, str))
                given = (*maker.args, sorted(maker.keywords.items()), *given)
            self._all_names.update(names)
            self._nested(f"getter:{type(value).__name__}", given, depth)
            return "getter"
        self._values += 1
        if depth >= _MAX_DEPTH or self._values > _MAX_VALUES:
            return _unique(value)
        if isinstance(value, types.ModuleType):  # a user's: what code reads of it
            # Met again through another function, it is read for that one's names too.
            described = self._module_names.setdefault(id(value), set())
            names = {name for names in self._reading for name in names} | {"__getattr__"}
            held = vars(value)
            if not _COMPUTED_NAME_READERS.isdisjoint(names):
                # getattr(cfg, "D" + "T") reads a name its code does not hold: its plain values
                # are read all.
                names |= {n for n, v in held.copy().items() if _plain_text(_flat(v)) is not None}
            if not names - described:
                return f"module:{value.__name__}#"
            # A module's __getattr__ gives what it lacks (PEP 562).
            read = [[name, held[name]] for name in sorted(names - described) if name in held]
            described |= names
            self._read_by_name(value, f"module:{value.__name__}", held.copy, described)
            self._nested(f"module:{value.__name__}", read, depth)
            return "module"
        # A subclass of a container (a NamedTuple, a dict of the user's): its class too, whose
        # methods and attributes code reads beside the items.
        subclass = [] if type(value) in (tuple, list, dict, set, frozenset) else [type(value)]
        if subclass and getattr(value, "__dict__", None):  # and what its object holds
            subclass.append(sorted(vars(value).copy().items()))
        if isinstance(value, tuple | list):
            items = tuple(value)
            plain = _plain_text(items)
            if plain is not None and not subclass:
                return f"{type(value).__name__}:{plain}"
            self._nested(f"{type(value).__name__}:{len(items)}", [*subclass, *items], depth)
            return "sequence"
        if isinstance(value, frozenset | set):
            # Each element apart, then sorted: a set's order changes with PYTHONHASHSEED.
            text = f"set:{sorted(self._apart(item, depth + 1) for item in frozenset(value))}"
            if not subclass:
                return text
            self._nested(text, subclass, depth)
            return "set"
        if isinstance(value, type):  # a class of the user's: what it holds (Cfg.FACTOR)
            if id(value) in self._seen:
                return f"class#{self._seen[id(value)]}"
            self._seen[id(value)] = len(self._seen)
            held = sorted(
                (k, v)
                for k, v in vars(value).copy().items()
                if (not _is_dunder(k) and k not in _CLASS_BOOKKEEPING)
                or k in _BEHAVING_DUNDERS
                or isinstance(v, _METHODS)
                or k in self._all_names  # C.__doc__, C.__table__["DT"]
            )
            self._read_by_name(
                value,
                f"class:{value.__module__}.{value.__qualname__}",
                lambda: vars(value).copy(),
                {k for k, _ in held} | {k for k in vars(value) if not _is_dunder(k)},
            )
            # What it inherits too (Sub.FACTOR from its base), and what its metaclass gives.
            bases = [base for base in value.__bases__ if base is not object]
            metaclass = [] if type(value) is type else [type(value)]
            self._nested(
                f"class:{value.__module__}.{value.__qualname__}", [held, bases, metaclass], depth
            )
            return "class"
        if isinstance(value, dict):
            items = tuple(x for pair in dict.copy(value).items() for x in pair)
            plain = _plain_text(items)
            if plain is not None and not subclass:
                return f"dict:{plain}"
            if id(value) in self._seen:  # one that holds itself (G = globals())
                return f"dict#{self._seen[id(value)]}"
            self._seen[id(value)] = len(self._seen)
            if isinstance(value, collections.defaultdict):  # what it gives for a key it lacks
                subclass.append(value.default_factory)
            self._nested(f"dict:{len(items) // 2}", [*subclass, *items], depth)
            return "dict"
        if isinstance(value, types.CodeType):
            self._nested(
                f"code:{value.co_name}:{value.co_code.hex()}:{value.co_names}:{value.co_varnames}",
                value.co_consts,
                depth,
            )
            return "code"
        if isinstance(value, functools.partial):
            # Its arguments are what its function reads (partial(lambda c: c.DT, cfg)), and the
            # strings among them names it may read of them (partial(getattr, cfg, "DT")).
            inner = value.func
            given = [*value.args, *value.keywords.values()]
            names = {item for item in given if isinstance(item, str)}
            if isinstance(inner, types.FunctionType) and not _is_named(inner.__module__):
                names.update(_names_read(inner))
            elif not any(inner is reader for reader in _ATTRIBUTE_READERS) and any(
                isinstance(item, types.ModuleType) and not _is_named(item.__name__)
                for item in given
            ):
                return _unique(value)  # what other code reads of a user's module is unknown
            self._reading.append(sorted(names))
            self._all_names.update(names)
            try:
                pieces = [inner, value.args, value.keywords, *_own_class(value)]
                pieces.append(sorted(getattr(value, "__dict__", {}).copy().items()))
                self._nested("partial", pieces, depth)
            finally:
                self._reading.pop()
            return "partial"
        if isinstance(value, classmethod | staticmethod):
            self._nested(type(value).__name__, [value.__func__, *_own_class(value)], depth)
            return "wrapped"
        if isinstance(value, property):
            pieces = [value.fget, value.fset, value.fdel, *_own_class(value)]
            self._nested("property", pieces, depth)
            return "property"
        if isinstance(value, types.MemberDescriptorType | types.GetSetDescriptorType):
            # A __slots__ entry: where its class keeps the value its objects hold.
            return f"member:{value.__objclass__.__qualname__}.{value.__name__}"
        if isinstance(value, _BUILTIN_CALLABLES):  # C code: object.__new__, str.__repr__, len
            # The object a method is bound to (cfg.__getattribute__), else the class of one that
            # is not (str.__repr__).
            owner = getattr(value, "__self__", None) or getattr(value, "__objclass__", None)
            if owner is None or isinstance(owner, type | types.ModuleType):
                module = getattr(owner, "__module__", None) or getattr(owner, "__name__", "")
                if owner is None or _is_named(module):
                    return f"builtin:{module}.{value.__qualname__}"
            self._nested(f"builtin:{value.__qualname__}", [owner], depth)  # what it reads of it
            return "builtin"
        if type(value) is _TUPLE_GETTER:  # a NamedTuple's field
            return f"field:{value.__reduce__()[1]!r}"
        if isinstance(value, types.MethodType):
            self._nested("method", [value.__func__, value.__self__], depth)
            return "method"
        if isinstance(value, types.FunctionType):
            return self._function(value, depth)
        if dataclasses.is_dataclass(value):
            fields = [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
            # Its class too: its methods and ClassVars (CFG.dt()).
            self._nested(f"dataclass:{type(value).__qualname__}", [type(value), fields], depth)
            return "dataclass"
        if isinstance(value, enum.Enum):
            head = f"enum:{type(value).__module__}.{type(value).__qualname__}.{value.name}"
            if _is_named(type(value).__module__):
                return head
            # A user's: its value and its class's methods (MEMBER.value, MEMBER.dt()).
            self._nested(head, [value.value, type(value)], depth)
            return "enum"
        wrapped = _triton_function(value)
        if wrapped is not None:
            self._nested(f"triton:{type(value).__qualname__}", wrapped, depth)
            return "triton"
        held = getattr(value, "__dict__", None)
        if not _shows_all_it_holds(type(value)):
            # Built on C code that keeps more than its attributes show (random.Random's state:
            # sweep 48 A ck04, seeds 1 and 2 gave one key).
            named = _held_by_its_module(value)
            return f"instance:{named}" if named is not None else _unique(value)
        if isinstance(held, dict) and not _is_named(type(value).__module__):
            # An object of the user's (a config): its class and what it holds.
            if id(value) in self._seen:
                return f"object#{self._seen[id(value)]}"
            self._seen[id(value)] = len(self._seen)
            self._nested("object", [type(value), sorted(dict.copy(held).items())], depth)
            return "object"
        slots = _slot_values(value)
        if slots is not None and not _is_named(type(value).__module__):
            # An object of the user's with __slots__: its class and what its slots hold.
            if id(value) in self._seen:
                return f"object#{self._seen[id(value)]}"
            self._seen[id(value)] = len(self._seen)
            self._nested("slotted", [type(value), slots], depth)
            return "slotted"
        if (
            isinstance(held, dict)
            and _plain_text(tuple(x for p in held.copy().items() for x in p)) is not None
        ):
            # A library's object holding plain values (torch.no_grad()'s, in a decorated helper).
            kind = type(value)
            return f"library:{kind.__module__}.{kind.__qualname__}:{sorted(held.copy().items())}"
        named = _held_by_its_module(value)
        return f"instance:{named}" if named is not None else _unique(value)

    def _subclass_of_plain(self, value: Any, depth: int) -> str:
        """A str, bytes, int, float or complex of a subclass: its value, its class (whose methods
        code calls: S("q").lower()) and what its object holds."""
        base = next(kind for kind in (int, float, complex, str, bytes) if isinstance(value, kind))
        if base is int:
            text = format(int.__int__(value), "#x")
        elif base is bytes:
            text = hashlib.sha256(value).hexdigest()
        else:
            text = base.__repr__(value)
        if _is_named(type(value).__module__):
            return f"{type(value).__module__}.{type(value).__qualname__}:{text}"
        held = getattr(value, "__dict__", None) or {}
        self._nested(f"{base.__name__}:{text}", [type(value), sorted(held.items())], depth)
        return "subclass"

    def _nested(self, head: str, values: Iterable[Any], depth: int) -> None:
        self._hash.update(_encoded(head))
        for item in values:
            self.add(item, depth + 1)

    def _apart(self, value: Any, depth: int) -> str:
        part = _Fingerprint()
        part._values = self._values
        part._reading = self._reading
        part._module_names = self._module_names
        part._all_names = self._all_names
        part._by_name = self._by_name
        part._part = True
        part.add(value, depth)
        self._values = part._values
        return part.digest()

    def _function(self, fn: types.FunctionType, depth: int) -> str:
        cells = [
            cell.cell_contents if _filled(cell) else "<empty cell>" for cell in fn.__closure__ or ()
        ]
        head = f"function:{fn.__module__}.{fn.__qualname__}"
        # A function reached again (recursion, or two references) is named by when it was met.
        if id(fn) in self._seen:
            return f"function#{self._seen[id(fn)]}"
        self._seen[id(fn)] = len(self._seen)
        if _is_named(fn.__module__):
            # Its code comes with its package's version, which the caches' keys hold already;
            # what it closes over may be the user's (opreg's wrappers of the user's pieces).
            self._nested(head, [fn.__defaults__, fn.__kwdefaults__, cells], depth)
            return "function"
        attributes = _names_read(fn)
        used_globals = []
        for name in attributes:  # globals()["FACTOR"] names one only as a string
            value = fn.__globals__.get(name, _ABSENT)
            if value is _ABSENT:
                # What it finds there otherwise: its builtins (exec's own __builtins__ too).
                value = fn.__builtins__.get(name, _ABSENT)
                if value is not _ABSENT and value is _INTERPRETERS_OWN.get(name):
                    value = f"<builtins.{name}>"
            if value is not _ABSENT:
                used_globals += [name, value]
        # A name given by a str it reads (ENV = "DT", then os.environ[ENV]; getattr(cfg, ATTR); a
        # closure's or default's name): sweep 48 A-F4.
        held = [
            *used_globals[1::2],
            *cells,
            fn.__defaults__ or (),
            *(fn.__kwdefaults__ or {}).values(),
        ]
        attributes = sorted(set(attributes) | _names_among(held))
        if _ENVIRONMENT_NAMES.intersection(attributes):
            used_globals.append(os.environ)  # reached through os, which is only named
        if not _COMPUTED_GLOBAL_READERS.isdisjoint(attributes):
            # globals()["D" + "T"], eval(name): a name its code does not hold; its plain ones.
            used_globals += sorted(
                (name, value)
                for name, value in fn.__globals__.copy().items()
                if name not in attributes and _plain_text(_flat(value)) is not None
            )
        # What it imports when it runs counts like a global it reads, and so does a user's module
        # its code names as a string (importlib.import_module("cfg"), sys.modules["cfg"]).
        imported = _imported(fn.__code__, fn.__globals__) + [
            (name, sys.modules[name])
            for name in attributes
            if name in sys.modules and not _is_named(name)
        ]
        self._all_names.update(attributes)
        own = sorted(vars(fn).copy().items())  # fn.DT, and what functools.wraps kept
        dunders = _FUNCTION_DUNDERS & self._all_names
        own += [(name, getattr(fn, name, None)) for name in sorted(dunders)]
        self._read_by_name(
            fn,
            f"function:{fn.__module__}.{fn.__qualname__}",
            lambda: {name: getattr(fn, name, None) for name in _FUNCTION_DUNDERS},
            set(dunders),
        )
        pieces = [
            fn.__code__,
            fn.__defaults__,
            fn.__kwdefaults__,
            cells,
            used_globals,
            imported,
            own,
        ]
        self._reading.append(attributes)
        try:
            self._nested(head, pieces, depth)
        finally:
            self._reading.pop()
        return "function"


def _plain_text(values: tuple[Any, ...]) -> str | None:
    """Values that are all plain constants as one text, made in C: a table of them that many ops'
    code reads would otherwise cost each cache key much (seen: 12 s a compile, 3000 ops)."""
    if not all(type(value) in _PLAIN for value in values):
        return None
    try:
        return repr(values)
    except ValueError:  # an int of over 4300 digits
        return None


def _is_named(module: str | None) -> bool:
    package = (module or "").partition(".")[0]
    if package in _NAMED_PACKAGES:
        return True
    return package in sys.stdlib_module_names and _from_the_standard_library(package)


def _from_the_standard_library(package: str) -> bool:
    """Whether the module loaded under a standard library's name is the standard library's, not a
    user's of that name (a profile.py beside the script): its code is not in the version."""
    loaded = sys.modules.get(package)
    if loaded is None:
        return False
    key = (package, id(loaded))
    known = _STANDARD_LIBRARY_MODULES.get(key)
    if known is None:
        file = getattr(loaded, "__file__", None)  # none for the interpreter's own (sys)
        known = file is None or _under(os.path.realpath(file), _STANDARD_LIBRARY_DIRS)
        _STANDARD_LIBRARY_MODULES[key] = known
    return known


def _under(path: str, folders: tuple[str, str]) -> bool:
    stdlib, site = folders
    return path.startswith(stdlib + os.sep) and not path.startswith(site + os.sep)


def _slot_names(kind: type) -> list[str]:
    return [
        name
        for base in kind.__mro__
        for name in (
            [base.__dict__["__slots__"]]
            if isinstance(base.__dict__.get("__slots__"), str)
            else base.__dict__.get("__slots__", ())
        )
    ]


def _shows_all_it_holds(kind: type) -> bool:
    """Whether an object of ``kind`` keeps all it holds in its __dict__ and __slots__: its layout
    is object's and theirs. A class built on C code keeps more, which no attribute shows."""
    pointer = struct.calcsize("P")
    slots = [name for name in _slot_names(kind) if name not in ("__dict__", "__weakref__")]
    expected = (
        object.__basicsize__
        + pointer * len(slots)
        + pointer * (kind.__dictoffset__ > 0)
        + pointer * (kind.__weakrefoffset__ > 0)
    )
    return kind.__itemsize__ == 0 and kind.__basicsize__ == expected


def _slot_values(value: Any) -> list[tuple[str, Any]] | None:
    """What an object's __slots__ hold, None for an object without slots."""
    names = _slot_names(type(value))
    if not names:
        return None
    return sorted(
        (name, getattr(value, name, _ABSENT))
        for name in names
        if name not in ("__dict__", "__weakref__")
    )


def _own_class(value: Any) -> list[Any]:
    """A subclass of the user's (of functools.partial, property): its class, whose methods
    decide what calling or reading it gives, and what its object holds."""
    kind = type(value)
    if _is_named(kind.__module__):
        return []
    return [kind, sorted(getattr(value, "__dict__", {}).copy().items())]


def _held_by_its_module(value: Any) -> str | None:
    """The name a named module holds an object of its own under (dataclasses'
    _HAS_DEFAULT_FACTORY, in the __init__ it makes): the same object in every process."""
    module_name = type(value).__module__
    module = sys.modules.get(module_name)
    if module is None or not _is_named(module_name):
        return None
    return next(
        (f"{module_name}.{name}" for name, held in vars(module).copy().items() if held is value),
        None,
    )


def _process_state(
    holder: types.ModuleType | type, names: set[str], seen: frozenset[int] = frozenset()
) -> list[tuple[str, Any]]:
    """What a named module or class holds as plain data or dtypes (in lists, tuples and dicts too)
    among ``names``: a standard library's for this process (sys.argv), or what a user set on a
    library's (`torch.OUT_DTYPE = ...`: sweep 50 A n16, float32 code ran for float64; a tuple of
    dtypes, or one set on `torch.nn` or `torch.Tensor`: sweep 51 A v04, v05, v08), which another
    process may hold otherwise; and so for the submodules and named classes among ``names``."""
    held = vars(holder)
    state: list[tuple[str, Any]] = []
    for name in sorted(names - _IMPORT_TABLES):
        if name not in held:
            continue
        value = held[name]
        if _data_or_dtypes(value):
            state.append((name, value))
        elif _holds_state(holder, value, seen) and (
            sub := _process_state(value, names, seen | {id(holder)})
        ):
            state.append((name, sub))
    return state


def _holds_state(holder: Any, value: Any, seen: frozenset[int]) -> bool:
    """Whether ``value``, found on ``holder``, is a submodule of it or a library's class."""
    if id(value) in seen or len(seen) >= 4:
        return False
    if isinstance(value, types.ModuleType):
        return value.__name__.startswith(getattr(holder, "__name__", "") + ".")
    return isinstance(value, type) and _is_named(value.__module__)


def _data_or_dtypes(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is plain data or dtypes that its repr shows whole (sweep 52 A r10: a
    frozenset, a SimpleNamespace, a tuple 6 deep)."""
    if _plain_text(_flat(value)) is not None or isinstance(value, torch.dtype):
        return True  # a long table of constants checked in C
    if type(value) is types.SimpleNamespace:
        value = vars(value)
    if depth > 16 or type(value) not in (list, tuple, dict, set, frozenset):
        return False
    items = list(value.items()) if type(value) is dict else [(item,) for item in value]
    return all(_data_or_dtypes(part, depth + 1) for item in items for part in item)


# What this process set on torch that code can read and Inductor's keys hold only in part: every
# key holds it, since code reaches it in more ways than its names tell (`torch.get_autocast_dtype`
# under an alias, `torch.autocast("cpu").fast_dtype`, a torch.backends module under another name:
# sweep 50 A n15, sweep 51 A v01-v06, sweep 52 A r07-r10, each where code traced for one state
# ran for another). Each is read guarded: a build of torch may lack it.
_TORCH_STATE_READERS = (
    lambda: str(torch.get_default_device()),
    torch.get_float32_matmul_precision,
    torch.are_deterministic_algorithms_enabled,
    torch.is_deterministic_algorithms_warn_only_enabled,
    lambda: torch.utils.deterministic.fill_uninitialized_memory,
    torch.is_warn_always_enabled,
    torch.is_autocast_cache_enabled,
    lambda: torch.backends.cuda.matmul.allow_tf32,
    lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
    lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
    lambda: torch.backends.cuda.matmul.fp32_precision,
    lambda: torch.backends.cuda.flash_sdp_enabled(),
    lambda: torch.backends.cuda.mem_efficient_sdp_enabled(),
    lambda: torch.backends.cuda.math_sdp_enabled(),
    lambda: torch.backends.cuda.cudnn_sdp_enabled(),
    lambda: torch.backends.cuda.preferred_linalg_library(),
    lambda: torch.backends.quantized.engine,
    lambda: torch.backends.opt_einsum.enabled,
    lambda: torch.backends.opt_einsum.strategy,
    lambda: torch.backends.fp32_precision,
    # Sweep 53 A-F1: more state a piece could read, each seen to give one key for two behaviours.
    lambda: torch.__future__.get_overwrite_module_params_on_conversion(),
    lambda: torch.__future__.get_swap_module_params_on_conversion(),
    lambda: torch.sparse.check_sparse_tensor_invariants.is_enabled(),
    torch.is_anomaly_enabled,
    torch.is_anomaly_check_nan_enabled,
    lambda: sorted(vars(torch._tensor_str.PRINT_OPTS).items()),
    lambda: _plain_config("torch._dynamo.config"),
    lambda: _plain_config("torch._functorch.config"),
    lambda: numpy.geterr() if (numpy := sys.modules.get("numpy")) else None,
)


def _plain_config(module: str) -> list[tuple[str, Any]] | None:
    """A torch config module's plain settings (not callables or objects, whose text would make
    the key this process's own), if it is imported."""
    config = sys.modules.get(module)
    if config is None:
        return None
    return sorted(
        (name, value)
        for name, value in config.get_config_copy().items()
        if all(type(item) in _PLAIN for item in _flat(value))
    )


def _torch_state() -> str:
    state: list[Any] = []
    for reader in _TORCH_STATE_READERS:
        try:
            state.append(reader())
        except Exception:
            state.append(None)
    for device in ("cpu", "cuda", "xpu"):
        try:
            state += [device, torch.get_autocast_dtype(device), torch.is_autocast_enabled(device)]
        except Exception:  # a device type this build of torch has no autocast for
            state.append(device)
    for name, module, flag in _backend_flags():
        try:
            state.append((name, flag, getattr(module, flag)))
        except Exception:
            state.append((name, flag))
    return f"torch state:{[str(value) for value in state]}"


@functools.cache
def _backend_flags() -> list[tuple[str, types.ModuleType, str]]:
    """The flags torch.backends' modules keep on their classes (cudnn.benchmark, mkldnn.enabled),
    which a module's own state does not show."""
    return [
        (name, module, flag)
        for name, module in sorted(vars(torch.backends).copy().items())
        if isinstance(module, types.ModuleType)
        for flag, held in sorted(vars(type(module)).items())
        if isinstance(held, torch.backends.ContextProp)
    ]


def _flat(value: Any) -> tuple[Any, ...]:
    """A plain value, or a list or tuple of them, as a tuple (anything else as one non-plain)."""
    if type(value) in (list, tuple):
        return tuple(value)
    return (value,) if type(value) in _PLAIN else (_ABSENT,)


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


def _names_read(fn: types.FunctionType) -> list[str]:
    """The names ``fn`` reads: globals and attributes, and constant strings (getattr(cfg,
    "FACTOR") reads an attribute its code names only as a string)."""
    return sorted(set(_names_used(fn.__code__)).union(_strings(fn.__code__)))


def _names_used(code: types.CodeType) -> list[str]:
    return sorted({name for inner in _code_objects(code) for name in inner.co_names})


def _code_objects(code: types.CodeType) -> list[types.CodeType]:
    nested = [const for const in code.co_consts if isinstance(const, types.CodeType)]
    return [code, *(inner for const in nested for inner in _code_objects(const))]


def _strings(code: types.CodeType) -> set[str]:
    """Its constant strings, those of its constant tuples and frozensets too (`for flag in ("WIDE",
    "DOUBLE"): hasattr(cfg, flag)`, a match pattern's keywords: sweep 48 A-F3), and its bytes as
    names (os.environb[b"DT"] is os.environ["DT"])."""
    constants = [const for inner in _code_objects(code) for const in inner.co_consts]
    return _names_among(constants)


def _names_among(values: Iterable[Any]) -> set[str]:
    """The strs among ``values`` and in their tuples and frozensets, and bytes as names."""
    names: set[str] = set()
    pending = list(values)
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            names.add(value)
        elif isinstance(value, bytes):
            names.add(os.fsdecode(value))
        elif type(value) in (tuple, frozenset):
            pending.extend(value)
    return names


def _imported(code: types.CodeType, module_globals: dict[str, Any]) -> list[tuple[str, Any]]:
    """The user's modules (and what they hold) that ``code`` imports when it runs, as they are
    now in ``sys.modules``: nothing is imported here, since an import runs the user's code."""
    found = []
    for inner in _code_objects(code):
        if _IMPORT_NAME not in inner.co_code[::2]:
            continue
        before: list[Any] = [None, None]
        for instruction in dis.get_instructions(inner):
            if instruction.opcode == _IMPORT_NAME:
                level, names = before  # LOAD_CONST level; LOAD_CONST fromlist; IMPORT_NAME
                found += _import_of(instruction.argval, level, names, module_globals)
            before = [before[1], instruction.argval]
    return found


def _import_of(
    name: str, level: Any, names: Any, module_globals: dict[str, Any]
) -> list[tuple[str, Any]]:
    try:
        package = module_globals.get("__package__")
        full = importlib.util.resolve_name("." * level + name, package) if level else name
    except (ImportError, TypeError, ValueError):
        return []
    if _is_named(full):
        return []  # named: its code comes with its package's version
    # One not imported yet (or not importable) is _ABSENT, this process's own: what it will
    # hold once the code runs is unknown.
    parts = full.split(".")
    prefixes = [".".join(parts[: end + 1]) for end in range(len(parts))]
    found = [(prefix, sys.modules.get(prefix, _ABSENT)) for prefix in prefixes]  # a of a.b.c
    module = sys.modules.get(full)
    for held in names if isinstance(names, tuple) and isinstance(module, types.ModuleType) else ():
        # from a.b import c: what a.b holds as c, or its submodule
        value = vars(module).get(held, _ABSENT)
        if value is _ABSENT:
            value = sys.modules.get(f"{full}.{held}", _ABSENT)
        found.append((f"{full}.{held}", value))
    return found


def _triton_function(value: Any) -> list[Any] | None:
    """A Triton kernel's Python function (and an autotuner's configs), without importing Triton
    when no kernel came."""
    module = type(value).__module__ or ""
    if module != "triton" and not module.startswith("triton."):
        return None
    inner = value
    configs = []
    met = set()  # a wrapper whose .fn leads back to itself would loop forever
    while (
        not isinstance(inner, types.FunctionType) and hasattr(inner, "fn") and id(inner) not in met
    ):
        met.add(id(inner))
        configs += [str(config) for config in getattr(inner, "configs", None) or []]
        inner = inner.fn
    return [inner, configs] if isinstance(inner, types.FunctionType) else None


def fingerprint(pieces: Iterable[Any], torch_state: str | None = None) -> str:
    """``torch_state``: _torch_state() of now, where the caller read it once for many."""
    result = _Fingerprint()
    result.add(torch_state or _torch_state())  # see _TORCH_STATE_READERS
    for piece in pieces:
        result.add(piece)
    return result.digest()


_INDUCTOR_CONFIG = "torch._inductor.config"
# Each subject's pieces, fingerprinted only when a cache key is made: code reads globals when it
# runs, and a global assigned after the op's definition (or changed since) counts as well.
_declared: dict[str, list[Any]] = {}
_PENDING = "fingerprinted when a cache key is made"
# Definitions in several threads, and compiles beside them, read and change these dicts: one at
# a time (seen: "dictionary changed size during iteration" from a define).
_lock = new_rlock()


class _SharedEntries(dict):
    """The config's value in every thread: Inductor's config keeps a value per context (thread)
    and copies a mutable default into each, so a plain dict set in one thread would leave the
    others keyed by an older definition. Copies of this one are itself; pickled (as the cache
    keys pickle the config), it is a plain dict holding each subject's fingerprint of now."""

    def __copy__(self) -> _SharedEntries:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> _SharedEntries:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        without_line_events()  # Note [Locks and trace hooks]
        with _lock:
            state = _torch_state()  # once for all: about 0.3 ms
            now = [  # sorted: ops defined in another order key the same (sweep 48 A-F5)
                (
                    key,
                    current_fingerprint(key[len(_PREFIX) :], state) if value == _PENDING else value,
                )
                for key, value in sorted(self.items())
            ]
        return dict, (now,)


_shared = _SharedEntries()


def current_fingerprint(subject: str, torch_state: str | None = None) -> str:
    """The fingerprint a cache key made now would hold for ``subject``."""
    without_line_events()  # Note [Locks and trace hooks]
    with _lock:
        pieces = _declared.get(subject)
        return "not defined" if pieces is None else fingerprint(pieces, torch_state)


def _sync() -> None:
    without_line_events()  # Note [Locks and trace hooks]
    with _lock:
        _sync_locked()


def _sync_locked() -> None:
    config = sys.modules[_INDUCTOR_CONFIG]
    name = "unsafe_marked_cacheable_functions"
    current = getattr(config, name, None)
    if not isinstance(current, dict):
        return  # a PyTorch without it has no AOTAutograd cache either
    # Copies, made in C, are iterated: a definition made meanwhile (a profile hook's, allowed by
    # the reentrant lock) changes these dicts.
    for key in [key for key in list(_shared) if key.startswith(_PREFIX)]:
        if key[len(_PREFIX) :] not in _declared:
            _shared.pop(key, None)
    _shared.update({_PREFIX + subject: _PENDING for subject in list(_declared)})
    entry = getattr(config, "_config", {}).get(name)
    if entry is not None and entry.default is not _shared:
        _shared.update({k: v for k, v in dict.copy(entry.default).items() if k not in _shared})
        entry.default = _shared  # what contexts that never set it read (a new thread's)
    if current is not _shared:
        # This thread's own copy (torch reads the config while compiling; a user may set it):
        # its entries join the shared ones. Set, not filled: the config keeps a snapshot of
        # its values that only a set refreshes.
        _shared.update({k: v for k, v in dict.copy(current).items() if not k.startswith(_PREFIX)})
        setattr(config, name, _shared)


def _changed() -> None:
    # Filled once it is imported: importing it to fill it would cost a process that never
    # compiles over a second.
    run_after_import(_INDUCTOR_CONFIG, _sync, "torch.compile's caches do not see opreg's ops")


def declare(subject: str, pieces: Iterable[Any]) -> None:
    """Keys compiled graphs by these pieces of ``subject`` (an op's name, or a library's path)
    from now on, in place of its earlier ones."""
    without_line_events()  # Note [Locks and trace hooks]
    with _lock:
        _declared[subject] = list(pieces)
        _changed()


def forget(subject: str) -> None:
    """``subject`` is no longer Python's to key (a library replaced the op)."""
    without_line_events()  # Note [Locks and trace hooks]
    with _lock:
        if _declared.pop(subject, None) is not None:
            _changed()
