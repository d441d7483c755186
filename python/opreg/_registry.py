"""What opreg knows about its ops and device types, and loading C++ op libraries."""

from __future__ import annotations

import enum
import functools
import inspect
import linecache
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from opreg import _C, _compile_key, _dtensor
from opreg._fork import new_rlock
from opreg._public import public
from opreg._tracing import without_line_events

_PACKAGE_DIR = Path(__file__).resolve().parent


@public
class ServingKind(enum.Enum):
    KERNEL = "kernel"
    SKIPPED = "skipped"


@public
class FakeSource(enum.Enum):
    EXPLICIT = "explicit"
    PYTHON = "python"
    FALLBACK_ON_META = "fallback on meta"


@public
class AutogradSupport(enum.Enum):
    BACKWARD = "backward"
    FALLBACK = "fallback"
    ERROR = "error"
    NONE = "none"


@public
class VmapSupport(enum.Enum):
    RULE = "rule"
    BATCH_POLYMORPHIC = "batch-polymorphic"
    FALLBACK = "fallback"
    PER_EXAMPLE_LOOP = "per-example loop"


@public
class Sharding(enum.Enum):
    """How DTensor runs the op on sharded tensors (docs/distributed.md, "DTensor")."""

    NONE = "none"
    REPLICATE = "replicate"
    POINTWISE = "pointwise"
    PYTHON = "python"  # a strategy function given to the Python front


@public
@dataclass(frozen=True)
class DeviceServing:
    """A device type with a kernel (``kind`` KERNEL) or with a kernel that was not registered
    there (SKIPPED, and the ``reason``)."""

    device_type: str
    kind: ServingKind
    kernel: str
    reason: str = ""

    def describe(self) -> str:
        """``kernel:<name>`` or ``skipped: <reason>``."""
        if self.kind is ServingKind.KERNEL:
            return f"kernel:{self.kernel}"
        return f"skipped: {self.reason}"


@public
@dataclass(frozen=True)
class OpReport:
    """One opreg op: where it came from and what serves it. ``flags`` holds the core's flags
    (``bitwise``, ``random``, ...), each True or False; ``sharding`` how DTensor runs it."""

    name: str
    schema: str
    origin: str
    kernels: tuple[DeviceServing, ...]
    fake: FakeSource
    autograd: AutogradSupport
    vmap: VmapSupport
    flags: Mapping[str, bool]
    sharding: Sharding = Sharding.NONE
    dtypes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    words: str = field(default="", repr=False, compare=False)

    def describe(self) -> str:
        """The report in words, one line per aspect (as ``python3 -m opreg info`` prints it)."""
        return self.words


def _report(raw: _C.OpReport) -> OpReport:
    return OpReport(
        name=raw.name,
        schema=raw.schema,
        origin=raw.origin,
        kernels=tuple(
            DeviceServing(k.device_type, ServingKind[k.kind.name], k.kernel, k.reason)
            for k in raw.kernels
        ),
        fake=FakeSource[raw.fake.name],
        autograd=AutogradSupport[raw.autograd.name],
        vmap=VmapSupport[raw.vmap.name],
        flags=MappingProxyType(raw.flags.as_dict()),
        sharding=Sharding[raw.sharding.name],
        dtypes=tuple((arg, tuple(types)) for arg, types in raw.dtypes),
        words=raw.describe(),
    )


@public
def describe_ops() -> list[OpReport]:
    """Every op defined through opreg, sorted by name."""
    return [_report(raw) for raw in _C.describe_ops()]


@public
def describe_op(name: str) -> OpReport:
    """The report of one op, by its qualified name ``namespace::name``."""
    return _report(_C.describe_op(op_name(name, "describe_op")))


def caller_origin() -> str:
    """'file:line' of the nearest caller outside opreg's private modules (the fronts calling each
    other): where the definition is written, in a user's file or one of opreg's public ones."""
    package = os.path.dirname(os.path.abspath(__file__))
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if os.path.dirname(path) != package or not os.path.basename(path).startswith("_"):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def forget_compiled_code(*, wait: bool = True) -> None:
    """After a replace (or a library load, which may replace ops), torch.compile's code compiled
    before it goes: that code holds what it traced of the old definition (the Triton kernels a
    decomposition inlined, the fake's shapes) and Dynamo does not guard on an op's definition, so
    it would go on running the old kernels with no error. Dynamo recompiles on the next call.
    Only the compiled code goes: torch._dynamo.reset() would also restart the numbering of
    Triton kernels' arguments, so the new graph could take the key of the old one in Inductor's
    graph cache and get its code back (seen). Nothing to do if Dynamo was never imported, or is
    being imported for the first time (nothing is compiled before that import ends).

    Dynamo frees the code it drops, so it goes only while no thread compiles or runs compiled
    code (Note [Dropping compiled code]): the replace waits for other threads' compiles and
    compiled calls to end (at most _WAIT_FOR_OTHERS_S); where this thread itself is inside one (a
    fake that replaces an op, a replace between two graphs of a compiled function) or the wait
    runs out, a thread of its own drops the code at the first such moment, and calls made until
    then still run code compiled before the replace.

    ``wait=False``: no waiting at all, not for Dynamo's compile lock either (see
    forget_compiled_code_later).

    Never raises: the definition it follows has taken effect, so a failed reset warns."""
    without_line_events()  # Note [Locks and trace hooks]
    dynamo = sys.modules.get("torch._dynamo")
    reset_code_caches = getattr(dynamo, "reset_code_caches", None)
    if reset_code_caches is None:
        return
    global _reset_requests
    with _reset_lock:  # never held while waiting for Dynamo's compile lock: a compile may replace
        _reset_requests += 1
        worker_running = _reset_worker is not None
    renew_packets(wait_s=_WAIT_FOR_OTHERS_S if wait else 0)
    if not worker_running and _reset_when_free(
        reset_code_caches, _WAIT_FOR_OTHERS_S if wait else 0
    ):
        return
    with _reset_lock:
        if _reset_worker is None:
            _start_reset_worker(reset_code_caches)


def renew_packets(names: Iterable[str] | None = None, wait_s: float = 0) -> bool:
    """Until the compiled code can go, Dynamo's guards send calls of code compiled against
    torch.ops' packet of an opreg op (`torch.ops.ns.f(x)`, `torch.ops.ns.f.default(x)`) to a new
    compile: each packet (of ``names``, or of every opreg op) is made anew, holding the same
    overload objects (Note [One handle per op]), and Dynamo guards on the packet's identity.
    Sweep 52 A-F2: a thread that never paused between compiled calls ran the old definition's
    graph against the new definition's outputs (wrong values; a heap overflow for a smaller
    dtype). A call already inside compiled code, and code that holds an overload object itself,
    are not covered (ARCHITECTURE.md Guarantees). Python's thread switching is held off
    meanwhile: a packet another thread made in between would make overload objects of its own.
    Done holding Dynamo's compile lock (waited for at most ``wait_s``), never inside a compile
    (this thread's: a fake that replaces an op, a C++ replace's pending call): a compile that met
    the old packet failed its own guard, and Dynamo raised "Guard failed on the same frame it was
    created". Whether they were renewed (if not, the thread of opreg's that drops the code does
    it). Nothing to do if Dynamo was never imported."""
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    guards = sys.modules.get("torch._guards")
    lock = getattr(convert_frame, "compile_lock", None)
    if lock is None or guards is None:
        return True
    if guards.CompileContext.try_get() is not None or lock._is_owned():
        return False
    if names is None:
        try:
            names = [report.name for report in _C.describe_ops()]
        except Exception:  # a definition in flight on another thread
            return False

    def renew() -> bool:
        for qualname in names:
            _renew_packet(qualname)
        return True

    return _alone_with_compile_lock(lock, wait_s, renew)


def _alone_with_compile_lock(lock: Any, wait_s: float, work: Callable[[], Any]) -> Any:
    """``work()`` holding Dynamo's compile lock (waited for at most ``wait_s``; False if it was
    not had), with Python's thread switching held off: no other thread compiles or runs Python
    meanwhile. Not for a thread that holds the lock already."""
    without_line_events()  # Note [Locks and trace hooks]
    with _C.HeldLock(lock, wait_s, alone=True) as had:
        return work() if had else False


def _renew_packet(qualname: str) -> None:
    namespace, name = qualname.split("::")
    held = vars(torch.ops).get(namespace)
    if not isinstance(held, torch._ops._OpNamespace):
        return
    name = name.split(".")[0]
    old = vars(held).get(name)
    if not isinstance(old, torch._ops.OpOverloadPacket):
        return  # not looked up yet: nothing compiled against it
    try:
        # A copy of the packet, with its overload objects: made in Python alone, since looking
        # the op up again lets the GIL go, and with switching held off the thread taking it kept
        # it (seen: the CI run of 99b9739 stalled in such a lookup).
        new = object.__new__(type(old))
        vars(new).update(vars(old))
        new._dir = list(old._dir)
        for key in new._dir:
            vars(new)[key]._overloadpacket = new
        vars(held)[name] = new
    except Exception as error:  # another torch's internals: the old packet stays
        for key in old._dir:
            if key in vars(old):
                vars(old)[key]._overloadpacket = old
        vars(held)[name] = old
        warnings.warn(
            f"opreg: op '{qualname}': torch.ops' handle could not be renewed "
            f"({type(error).__name__}: {error}); code torch.compile compiled before its "
            "replace may run until it can be dropped",
            stacklevel=3,
        )


# Note [Replacing under compiled calls]
# Code torch.compile compiled for an op's earlier definition must not run against its new one:
# its buffers are sized and typed by the earlier fake (sweep 52 A-F2: a thread calling compiled
# code without pause read a float32 result as float64, a heap overflow). So a replace from Python
# first invalidates every cache entry of Dynamo's, as Dynamo does when an object its guards name
# dies: each guard then fails, and a thread calling compiled code goes to compile it again. It
# publishes once no other thread runs compiled code, or has compiled code it is yet to install,
# and holds Dynamo's compile lock until the definition's Python pieces are recorded: a thread
# sent to compile waits at that lock and then traces the new definition. Dynamo's own reset
# (forget_compiled_code) still follows, to free the entries (Note [Dropping compiled code]).
def run_between_compiled_calls(work: Callable[[], None]) -> bool:
    """Runs ``work`` (a replace's publishing and recording, holding the definition lock) as Note
    [Replacing under compiled calls] says. It waits for a compile on another thread, then for
    compiled calls, to end: at most _COMPILE_WAIT_S in all, less where such a thread waits to
    define an op (it waits for this thread). Where it cannot (this thread
    compiles, the time ran out, another torch's Dynamo) it runs ``work`` all the same and says
    False: a call in flight or a compile under way may then meet the new definition, and
    torch.ops' packets are left for the caller to renew."""
    without_line_events()  # Note [Locks and trace hooks]
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    guards = sys.modules.get("torch._guards")
    lock = getattr(convert_frame, "compile_lock", None)
    invalidation = _entry_invalidation()
    if lock is None or guards is None or invalidation is None:
        work()
        return False
    if guards.CompileContext.try_get() is not None or lock._is_owned():
        work()
        return False
    give_up = time.monotonic() + _COMPILE_WAIT_S
    while time.monotonic() < give_up and not _waits_for_this_definition(convert_frame):
        with _C.HeldLock(lock, 0.05) as had:
            if had:
                quiet = _invalidate_until_quiet(convert_frame, invalidation, give_up)
                work()
                return quiet
    _invalidate_entries(convert_frame, *invalidation)  # code compiled already, at least
    work()
    return False


# How long a replace waits for a compile, or a compiled call, on another thread: one traced for
# the earlier definition would install its code after the replace (sweep 53 A-F3: a heap
# overflow), and one in flight would meet the new definition (sweep 54 A c04: a call of 1.5 s).
_COMPILE_WAIT_S = 30.0
_DECLARATION = os.path.join(
    os.path.dirname(__file__), "_declaration.py"
)  # defining(): takes the definition lock


def _waits_for_this_definition(convert_frame: Any) -> bool:
    """Whether another thread that compiles or runs compiled code is in (or waits for) an opreg
    definition, which waits for this thread's. Read with switching held off: frames of a thread
    that runs meanwhile change under the walk (sweep 54 A f02: an AttributeError from it)."""
    without_line_events()  # Note [Locks and trace hooks]
    with _C.HeldLock(None, 0, alone=True):
        return _walk_for_definitions(convert_frame)


def _walk_for_definitions(convert_frame: Any) -> bool:
    try:
        return _walk_frames_for_definitions(convert_frame)
    except Exception:  # a frame read as it changed: not known to wait
        return False


def _walk_frames_for_definitions(convert_frame: Any) -> bool:
    this_thread = threading.get_ident()
    output_codes = {id(code) for ref in convert_frame.output_codes.seen if (code := ref())}
    for thread, frame in sys._current_frames().items():
        compiled = defining = False
        while frame is not None and thread != this_thread:
            code = frame.f_code
            compiled = compiled or id(code) in output_codes
            compiled = compiled or code.co_filename == convert_frame.__file__
            defining = defining or (code.co_name == "defining" and code.co_filename == _DECLARATION)
            frame = frame.f_back
        if compiled and defining:
            return True
    return False


def _entry_invalidation() -> tuple[Any, Any] | None:
    """Dynamo's cache entries of a code object and the guard manager that fails every check, or
    None where this torch has no such API (then only packets are renewed)."""
    eval_frame = sys.modules.get("torch._C._dynamo.eval_frame")
    dynamo_guards = sys.modules.get("torch._dynamo.guards")
    entries = getattr(eval_frame, "_debug_get_cache_entry_list", None)
    deleted = getattr(dynamo_guards, "DeletedGuardManagerWrapper", None)
    if entries is None or deleted is None or not hasattr(eval_frame, "_ExtraState"):
        return None
    return entries, deleted


def _invalidate_until_quiet(
    convert_frame: Any, invalidation: tuple[Any, Any], deadline: float
) -> bool:
    """Invalidates Dynamo's cache entries, again until no other thread runs compiled code or
    holds compiled code not yet installed (a compile that ended before this thread took the lock
    installs its entry after the first pass); False if the deadline passed first."""
    without_line_events()  # Note [Locks and trace hooks]
    delay = 0.0005
    while True:
        with _C.HeldLock(None, 0, alone=True):  # no other thread runs between pass and check
            if not _invalidate_entries(convert_frame, *invalidation):
                return False
            if not _threads_running_compiled_code(convert_frame):
                return True
        if time.monotonic() >= deadline or _waits_for_this_definition(convert_frame):
            return False
        time.sleep(delay)
        delay = min(2 * delay, 0.01)


def _invalidate_entries(convert_frame: Any, entries: Any, deleted: Any) -> bool:
    """Dynamo's CheckFunctionManager.invalidate for every live entry; False if this torch's
    entries are not as expected (nothing more is tried)."""
    try:
        for ref in list(convert_frame.input_codes.seen):
            code = ref()
            if code is None:
                continue
            for entry in entries(code):
                manager = entry.guard_manager
                extra_state = getattr(manager, "extra_state", None)
                if isinstance(manager, deleted) or extra_state is None:
                    continue
                _invalidate_entry(extra_state, entry, manager, deleted)
                # As Dynamo's own invalidate leaves it: a later one for the same entry (a guarded
                # object dying) finds nothing to do rather than an entry Dynamo's reset freed.
                manager.cache_entry = None
                manager.extra_state = None
    except Exception:
        return False
    return True


def _invalidate_entry(extra_state: Any, entry: Any, manager: Any, deleted: Any) -> None:
    """ExtraState.invalidate as this torch takes it: (entry, deleted manager) in torch 2.13;
    builds of torch's main branch have taken the live manager too, or it alone with no entry."""
    replacement = deleted("an op it calls was replaced (opreg)")
    for arguments in ((entry, replacement), (entry, replacement, manager), (replacement, manager)):
        try:
            extra_state.invalidate(*arguments)
            return
        except TypeError:  # another signature: pybind refused the call before it ran
            continue
    raise TypeError("ExtraState.invalidate takes none of the known arguments")


def _threads_running_compiled_code(convert_frame: Any) -> bool:
    """Whether a thread other than this one has a frame of Dynamo's output code, or of its
    frame conversion (compiling, or installing what it compiled) other than waiting for the
    compile lock this thread holds."""
    this_thread = threading.get_ident()
    output_codes = {id(code) for ref in convert_frame.output_codes.seen if (code := ref())}
    waiting_lines = _compile_lock_lines(convert_frame.__file__)
    for thread, frame in sys._current_frames().items():
        if thread == this_thread:
            continue
        if frame.f_code.co_filename == convert_frame.__file__ and frame.f_lineno in waiting_lines:
            continue
        while frame is not None:
            if (
                id(frame.f_code) in output_codes
                or frame.f_code.co_filename == convert_frame.__file__
            ):
                return True
            frame = frame.f_back
    return False


@functools.cache
def _compile_lock_lines(path: str) -> frozenset[int]:
    """The lines of Dynamo's convert_frame.py that take the compile lock."""
    return frozenset(
        number
        for number, line in enumerate(linecache.getlines(path), start=1)
        if line.lstrip().startswith("with compile_lock")
    )


def forget_compiled_code_later() -> None:
    """forget_compiled_code for a replace made from C++ outside a library load, called by Python's
    main thread at its next bytecode (Py_AddPendingCall): that may be inside any Python code,
    holding locks (Dynamo's compile lock, opreg's definition lock) that another thread waits for
    while this one would wait for it: it drops the code only if it can at once, and otherwise
    leaves it to the thread of its own."""
    forget_compiled_code(wait=False)


# Note [Dropping compiled code]
# Dynamo's reset frees each code object's cache entries and the globals its compiled code calls,
# which a frame running that code still reads (its record_function name, its guard manager; seen:
# a use after free) and which a compile fills until its code is installed (seen: SIGSEGV inside
# the compile, a NameError for the compiled function's global just after). So the reset waits
# until no thread's stack holds a frame of Dynamo's output code or of its frame handling
# (convert_frame.py: compiling and installing code; eval_frame.py: a compiled callable's call),
# and the check and the reset run with Python's thread switching held off, so that no thread
# enters such code in between. A reset serves every request made before it.
DEFERRED_RESET = "opreg: forget compiled code when no compiled code runs"
_WAIT_FOR_OTHERS_S = 1.0
_WORKER_GIVES_UP_S = 600.0
_reset_lock = new_rlock()
_reset_requests = 0
_reset_worker: threading.Thread | None = None


def _start_reset_worker(reset_code_caches: Any) -> None:
    """Starts the thread of its own (called holding _reset_lock, or with no other thread)."""
    global _reset_worker
    _reset_worker = threading.Thread(
        target=_reset_for_all_requests, args=(reset_code_caches,), name=DEFERRED_RESET, daemon=True
    )
    _reset_worker.start()


def _reset_worker_in_forked_child() -> None:
    """A fork copies _reset_worker but not its thread: the child took the reset for under way
    and never dropped compiled code again (sweep 37 A-F3). Its own thread serves the requests
    the parent's had not yet served."""
    if _reset_worker is None:
        return
    reset_code_caches = getattr(sys.modules.get("torch._dynamo"), "reset_code_caches", None)
    _start_reset_worker(reset_code_caches)


# After _fork's hook (registered at its import, above): _reset_lock is free in the child by then.
os.register_at_fork(after_in_child=_reset_worker_in_forked_child)


def _reset_when_free(reset_code_caches: Any, wait_s: float) -> bool:
    """Drops the compiled code once no thread compiles or runs compiled code, waiting at most
    ``wait_s`` for other threads (0: not at all); False (nothing done) if the time ran out or
    this thread is inside such code itself."""
    deadline = time.monotonic() + wait_s
    delay = 0.001
    while True:
        blocking = _threads_in_compiled_code(reset_code_caches, deadline)
        if blocking is None:
            return True
        if threading.get_ident() in blocking or time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(2 * delay, 0.05)


def _threads_in_compiled_code(reset_code_caches: Any, deadline: float) -> set[int] | None:
    """The threads that compile or run compiled code (empty: a compile that outlasted
    ``deadline``); None once there were none and the code was dropped."""
    guards = sys.modules.get("torch._guards")
    if guards is not None and guards.CompileContext.try_get() is not None:
        return {threading.get_ident()}
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if convert_frame is None or eval_frame is None:  # nothing can have been compiled
        _reset_code_caches(reset_code_caches)
        return None
    # No compile starts meanwhile. Its lock is waited for no longer than the rest: a compiling
    # thread may wait for a lock the replacing one holds (a user's, around the replace).
    waiting = deadline - time.monotonic()
    lock = convert_frame.compile_lock
    if lock._is_owned():  # Dynamo's own code on this thread, compiling or resetting
        return {threading.get_ident()}
    files = {convert_frame.__file__, eval_frame.__file__}

    def reset_if_none_blocks() -> set[int] | None:
        output_codes = [code for ref in convert_frame.output_codes.seen if (code := ref())]
        ids = {id(code) for code in output_codes}
        blocking = set()
        for thread, frame in sys._current_frames().items():
            while frame is not None:
                if id(frame.f_code) in ids or frame.f_code.co_filename in files:
                    blocking.add(thread)
                    break
                frame = frame.f_back
        if blocking:
            return blocking
        _reset_code_caches(reset_code_caches)
        return None

    result = _alone_with_compile_lock(lock, waiting, reset_if_none_blocks)
    return set() if result is False else result


def _reset_code_caches(reset_code_caches: Any) -> None:
    try:
        reset_code_caches()
    except Exception as error:
        warnings.warn(
            "opreg: code torch.compile compiled before a replace (or a library load) could not "
            f"be dropped, and may run the earlier definition: {type(error).__name__}: {error}",
            stacklevel=5,
        )


def _reset_for_all_requests(reset_code_caches: Any) -> None:
    """The worker's loop, which always lets a later request start another worker: one that
    ended by an exception (from a gc callback's code run on its thread, say) and kept its place
    would have left every later replace's compiled code in place (sweep 45 A-F4)."""
    without_line_events()  # Note [Locks and trace hooks]
    global _reset_worker
    try:
        _serve_reset_requests(reset_code_caches)
    except BaseException as error:
        with _reset_lock:
            _reset_worker = None
        warnings.warn(
            "opreg: code torch.compile compiled before a replace (or a library load) could not "
            f"be dropped, and may run the earlier definition: {type(error).__name__}: {error}",
            stacklevel=1,
        )


def _serve_reset_requests(reset_code_caches: Any) -> None:
    """Resets until a reset served every request made."""
    without_line_events()  # Note [Locks and trace hooks]
    global _reset_worker
    while True:
        with _reset_lock:
            served = _reset_requests
        renew_packets(wait_s=_WORKER_GIVES_UP_S)  # one that its replace could not renew
        if not _reset_when_free(reset_code_caches, _WORKER_GIVES_UP_S):
            with _reset_lock:
                _reset_worker = None
            warnings.warn(
                "opreg: code torch.compile compiled before a replace (or a library load) ran on "
                f"some thread for {_WORKER_GIVES_UP_S:.0f} s without a pause; it is not dropped, "
                "and may run the earlier definition",
                stacklevel=1,
            )
            return
        with _reset_lock:
            if served == _reset_requests:
                _reset_worker = None
                return


# Note [One handle per op]: PyTorch's dispatcher hands a dispatch mode (FakeTensorMode,
# functionalization under torch.compile) the OpOverload it first met for an op, cached for the
# process's life, and torch caches what it reads of a schema by that object (OpOverload says it
# is "immutable and must be unique"). A replace that changes the schema therefore keeps the handles
# and brings them up to the new schema in place: a new handle would leave those modes reading the
# old schema (seen: FakeTensorMode normalized a call against it and failed; functionalization
# refused a mutating op it took for a functional one).
_OWN_STATE = frozenset(
    {
        "_op",
        "_op_dk",
        "_overloadpacket",
        "py_kernels",
        "python_key_table",
        "functorch_table",
        "_dispatch_cache",
    }
)
_SCHEMA_CACHES = (  # torch's caches keyed by an op's handle, of what they read from its schema
    ("torch._subclasses.fake_impls", "_is_tensor_constructor"),
    ("torch._subclasses.fake_tensor", "get_schema_info"),
    ("torch._subclasses.fake_tensor", "torch_decomp_decompositions"),
    ("torch._subclasses.functional_tensor", "_can_decompose_fast"),
)
# torch's dicts keyed by (schema name, overload name): Inductor normalizes a call's arguments with
# the cached signature, and a default the replace changed was filled in from the old one.
_SCHEMA_DICTS = (("torch.fx.operator_schemas", "_SCHEMA_TO_SIGNATURE_CACHE"),)


def refresh_handles(qualname: str) -> None:
    """Brings torch.ops' handles of a defined op up to its schema and tags now (Note [One handle
    per op]); handles of an undefined op stay as they are, and their calls raise opreg's error."""
    namespace, name = qualname.split("::")
    held = vars(torch.ops).get(namespace)  # not a namespace for names torch.ops holds itself
    is_namespace = isinstance(held, torch._ops._OpNamespace)
    packet = vars(held).get(name.split(".")[0]) if is_namespace else None
    if not isinstance(packet, torch._ops.OpOverloadPacket) or not _C.is_defined(qualname):
        return
    try:
        _, overload_names = torch._C._jit_get_operation(packet._qualified_op_name)
        packet._overload_names = overload_names
        stale = False
        for key in list(packet._dir):
            overload = vars(packet)[key]
            use_key = "" if key == "default" else key
            if use_key not in overload_names:  # read again on the next access
                packet._dir.remove(key)
                delattr(packet, key)
                continue
            _, _, tags = torch._C._get_operation_overload(packet._qualified_op_name, use_key)
            schema = torch._C._get_schema(packet._qualified_op_name, use_key)
            if str(schema) == str(overload._schema) and list(tags) == list(overload._tags):
                continue
            stale = True
            fresh = type(overload)(packet, overload._op, overload._op_dk, schema, tags)
            state = vars(overload)
            for cached in [k for k in state if k not in _OWN_STATE and k not in vars(fresh)]:
                del state[cached]  # cached_property values of the old schema
            state.update({k: v for k, v in vars(fresh).items() if k not in _OWN_STATE})
            overload._dispatch_cache.clear()
        packet._has_torchbind_op_overload = any(
            torch._ops._has_script_object_arg(schema) for schema in packet._schemas.values()
        )
    except Exception as error:  # another torch's internals: a new handle is the next best
        warnings.warn(
            f"opreg: op '{qualname}': torch.ops' handle could not take the new schema "
            f"({type(error).__name__}: {error}); a new one replaces it, and handles kept from "
            "before may go on showing the old schema",
            stacklevel=3,
        )
        vars(held).pop(name.split(".")[0], None)
        stale = True
    if stale:
        for module, cache in _SCHEMA_CACHES:
            getattr(getattr(sys.modules.get(module), cache, None), "cache_clear", lambda: None)()
        for module, cache in _SCHEMA_DICTS:
            held_by_name = getattr(sys.modules.get(module), cache, None)
            base_name = f"{namespace}::{name.split('.')[0]}"
            if isinstance(held_by_name, dict):
                for key in [k for k in held_by_name if isinstance(k, tuple) and k[0] == base_name]:
                    held_by_name.pop(key, None)


def op_namespace(namespace: str) -> torch._ops._OpNamespace:
    """torch.ops.<namespace>, also where torch.ops holds an attribute of that name (``_dir``,
    ``__name__``: a C++ library may define ops there)."""
    held = getattr(torch.ops, namespace, None)
    return held if isinstance(held, torch._ops._OpNamespace) else torch._ops._OpNamespace(namespace)


def op_overload(qualname: str) -> torch._ops.OpOverload:
    """torch.ops' handle of a defined op, 'ns::name' or 'ns::name.overload'."""
    namespace, name = qualname.split("::")
    packet = getattr(op_namespace(namespace), name.split(".")[0])
    return getattr(packet, name.split(".")[1] if "." in name else "default")


def op_name(name: Any, function: str) -> str:
    """A qualified op name given to a public function, type-checked with a message naming it."""
    if not isinstance(name, str):
        raise TypeError(
            f"opreg.{function}: expected an op name like 'ns::op', got {type(name).__name__} "
            f"{name!r}"
        )
    if "\0" in name:
        # C++ would read the name up to its NUL, and answer for another op.
        raise ValueError(f"opreg.{function}: op name {name!r} holds a NUL character; no op has one")
    check_text(f"opreg.{function}", "op name", name, "; no op has one")
    return name


def check_text(where: str, what: str, text: str, advice: str = "") -> None:
    """A ValueError unless UTF-8 can hold `text`: a str with a lone surrogate ('\ud800') has no
    form that C++ can take."""
    if text.isascii():
        return
    try:
        text.encode()
    except UnicodeEncodeError:
        raise ValueError(
            f"{where}: {what} {text!r:.200} holds a lone surrogate, which is no character{advice}"
        ) from None


# The words PyTorch's schema lexer takes for keywords (TC_FORALL_TOKEN_KINDS in
# torch/csrc/jit/frontend/lexer.h), which its parser refuses as a name.
SCHEMA_RESERVED_WORDS = frozenset(
    [
        "False",
        "None",
        "NoneType",
        "True",
        "Ellipsis",
        "and",
        "as",
        "assert",
        "break",
        "class",
        "continue",
        "def",
        "del",
        "elif",
        "else",
        "for",
        "global",
        "if",
        "import",
        "in",
        "is",
        "not",
        "or",
        "pass",
        "raise",
        "return",
        "while",
        "with",
    ]
)


def check_op_name(api: str, name: Any) -> None:
    """A name to define an op by: 'namespace::name', both identifiers (so no overload: an op is
    defined by its name alone, as torch.library.custom_op's are)."""
    if not isinstance(name, str) or name.count("::") != 1 or "" in name.split("::"):
        raise ValueError(f"{api}: name must look like 'namespace::name', got {name!r}")
    for part in name.split("::"):
        if not (part.isascii() and part.isidentifier()):
            raise ValueError(
                f"{api}: name {name!r}: {part!r} is not an identifier (letters, digits and "
                "'_', not starting with a digit)"
            )
    for part in name.split("::"):
        if part in SCHEMA_RESERVED_WORDS:
            raise ValueError(
                f"{api}: name {name!r}: '{part}' is a reserved word of PyTorch's schema language "
                "and cannot be an op name or namespace; choose another name"
            )
    namespace, op = name.split("::")
    held = vars(torch.ops).get(namespace)  # torch.ops.higher_order, say, holds no custom ops
    if held is not None and not isinstance(held, torch._ops._OpNamespace):
        raise ValueError(
            f"{api}: name {name!r}: torch.ops.{namespace} is PyTorch's own "
            f"{type(held).__name__}, which could not reach the op; choose another namespace"
        )
    # Attributes found without _OpNamespace.__getattr__ (which finds ops): its own, its class's
    # (dunders such as __init__ and __dict__ among them, which its dir() leaves out).
    fresh = torch._ops._OpNamespace("opreg_reserved_names")
    missing = object()
    for part, owner, taken in (
        (namespace, "torch.ops", [*dir(type(torch.ops)), "loaded_libraries", "_dir"]),
        (
            op,
            f"torch.ops.{namespace}",
            # __origin__ and __self__: _OpNamespace.__getattr__ refuses them
            [*dir(fresh), "__origin__", "__self__"]
            + ([op] if inspect.getattr_static(fresh, op, missing) is not missing else []),
        ),
    ):
        if part in taken:
            raise ValueError(
                f"{api}: name {name!r}: {owner}.{part} is an attribute of PyTorch's own, so "
                f"{owner}.{part} could not reach the op; choose another name"
            )


@public
def accelerated_device_types() -> list[str]:
    """Device types that kernels serve by default (initially ``["cuda"]``)."""
    return list(_C.accelerated_device_types())


@public
def register_accelerated_device_type(name: str) -> str:
    """Add a device type (stripped, lower-cased) to the default set of every kernel.

    Ops defined earlier pick it up at once. A type this PyTorch build does not know is
    recorded as skipped, with the reason, in each op's report.
    """
    if not isinstance(name, str):
        raise TypeError(
            "opreg.register_accelerated_device_type: name must be a device type's name like "
            f"'npu', got {type(name).__name__} {name!r:.80}"
        )
    check_text("opreg.register_accelerated_device_type", "name", name, "; no device type has one")
    return _C.register_accelerated_device_type(name)


def path_argument(function: str, value: object) -> Path:
    """`value` (a str or os.PathLike) as a Path; a TypeError naming the function otherwise."""
    if not isinstance(value, str | os.PathLike):
        raise TypeError(
            f"{function}: 'path' must be a str or os.PathLike, got {type(value).__name__} "
            f"{value!r:.80}"
        )
    if os.fspath(value) in ("", b""):  # Path("") is ".", the current folder
        raise ValueError(f"{function}: 'path' is empty; pass the path of a file or folder")
    raw = os.fspath(value)
    if ("\0" if isinstance(raw, str) else b"\0") in raw:  # C++ would read it up to the NUL
        raise ValueError(f"{function}: 'path' {raw!r:.200} holds a NUL character")
    try:
        os.fsencode(raw)
    except UnicodeEncodeError:  # a lone surrogate that is no escaped byte ('\ud800')
        raise ValueError(
            f"{function}: 'path' {raw!r:.200} holds a lone surrogate; no file has such a name"
        ) from None
    return Path(value)


@public
def load_library(path: str | Path) -> None:
    """Load a C++ library whose opreg ops then become ``torch.ops.<ns>.<name>``.

    If any of its definitions fails, none of its ops stays defined (ops it replaced get their
    earlier definition back) and a ValueError names the library and each failing op; the
    process survives. A missing file raises FileNotFoundError; a path that is not a str or
    os.PathLike, TypeError; an empty one, ValueError.
    """
    given = path
    path = path_argument("opreg.load_library", given)
    # As given: Path("./lib.so") reads as the bare name "lib.so".
    if b"/" not in os.fsencode(os.fspath(given)):  # looked up as the core does, not in the cwd
        file = _C.library_file(os.fsencode(path))
        if not file:
            raise FileNotFoundError(
                f"opreg.load_library: no library named {str(path)!r:.200} in LD_LIBRARY_PATH or "
                "the system's library directories (/etc/ld.so.conf), and none of that name is "
                "loaded; a name without a '/' is not looked up in the working directory: pass "
                f"'./{path!s:.200}' for a file there"
            )
        path = Path(os.fsdecode(file))
    try:
        found = path.is_file()
    except OSError as error:  # a name too long, say
        raise OSError(
            error.errno,
            f"opreg.load_library: cannot read the path {str(path)!r:.200}: {error.strerror}",
        ) from error
    if not found and path.is_dir():  # sweep 52 B-N24: said as "no library at" the folder
        raise IsADirectoryError(
            f"opreg.load_library: {path} is a folder; pass the path of the library file in it "
            "(a folder is taken by the Triton bundle loaders, not by load_library)"
        )
    if not found and path.exists():  # sweep 53 B-N19: /dev/null was said to be missing
        raise OSError(
            f"opreg.load_library: {path} is not a regular file (a device, a pipe or a socket); "
            "pass the path of a shared library"
        )
    if not found:
        raise FileNotFoundError(f"opreg.load_library: no library at {path}")
    from opreg import _declaration  # which imports this module

    python_defined = _declaration.python_defined_forms()
    encoded = os.fsencode(path.resolve())  # bytes: a path need not be UTF-8
    _C.load_library(encoded)
    # As the core writes a definition's origin (and as a hash takes it): bytes that are not
    # UTF-8 as \xNN.
    library = encoded.decode("utf-8", "backslashreplace")
    _declaration.forget_replaced_by(library, python_defined)
    # Every op: those of libraries loaded before (the shipped ops' load at import covers what
    # libraries loaded before opreg defined).
    defined = [report.name for report in _C.describe_ops()]
    for name in defined:
        refresh_handles(name)
    _declaration.follow_cpp_definitions([*defined, *_declaration.cpp_rules()])
    # Its ops' C++ definitions, for torch.compile's caches: the file stands for them (its size
    # and time: hashing its contents would cost each import of opreg a tenth of its time).
    stat = path.stat()
    _compile_key.declare(f"library {library}", [stat.st_size, stat.st_mtime_ns])
    forget_compiled_code()
    torch.ops.loaded_libraries.add(str(path.resolve()))
    _dtensor.sync()  # the library's ops, and those it replaced, when DTensor is imported


@public
def example_library(name: str = "scale_add") -> Path:
    """The path of an example op library shipped with opreg (``examples/<name>``)."""
    path = _PACKAGE_DIR / "lib" / f"libopreg_example_{name}.so"
    if not path.exists():
        raise FileNotFoundError(f"opreg: no example library '{name}' at {path}")
    return path


@public
def example_source(name: str = "scale_add") -> Path:
    """The folder of an example's sources, installed with opreg (``examples/<name>``: the C++
    source, a CMakeLists.txt that finds the installed opreg, a README). Copy it to start an op
    library: ``shutil.copytree(opreg.example_source("scale_add"), "my_ops")``.

    An unknown name raises a ValueError listing the examples there are.
    """
    examples = _PACKAGE_DIR / "examples"
    available = (
        sorted(p.name for p in examples.iterdir() if p.is_dir()) if examples.is_dir() else []
    )
    if name not in available:
        raise ValueError(
            f"opreg.example_source: no example named {name!r}; "
            f"available: {', '.join(available) or f'none (no folder {examples})'}"
        )
    return examples / name


def shipped_ops_library() -> Path:
    return _PACKAGE_DIR / "lib" / "libopreg_ops.so"


@public
def cmake_dir() -> Path:
    """The folder to add to CMAKE_PREFIX_PATH for ``find_package(opreg)``."""
    return _PACKAGE_DIR / "share" / "cmake" / "opreg"
