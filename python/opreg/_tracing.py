"""Keeps a trace hook's line events out of the frames that hold opreg's locks."""

from __future__ import annotations

import sys

# Note [Locks and trace hooks]
# CPython 3.11 gives a trace hook (sys.settrace: a debugger, a test's interrupter) a line event
# at a with statement's line once its block is done and before __exit__ runs, outside the
# block's cleanup: a KeyboardInterrupt the hook raised there skipped __exit__ and left the lock
# held for good, and every definition on another thread waited for it (sweep 53 A-F2); one
# raised at a `try:` line directly inside the block did the same (sweep 51 A-F3). So a function
# that takes a lock in a with statement turns its own frame's line events off first. Calls and
# returns are still traced, and what it calls keeps its line events: an exception raised there
# unwinds through the block's cleanup. (tests/python/test_reliability_sweep53.py checks every
# such function.)


def without_line_events() -> None:
    """Turns off line events of its caller's frame (Note [Locks and trace hooks])."""
    sys._getframe(1).f_trace_lines = False
