"""opreg's locks in a forked child: a fork copies a lock another thread holds as held for good (the
child has none of the parent's other threads), and the child's first use of it waited forever
(multiprocessing's fork start, DataLoader workers)."""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

# Weak: a custom op's lock goes with its op, and one hook serves every lock.
_locks: weakref.WeakSet[Any] = weakref.WeakSet()


def _unlock_in_child() -> None:
    for lock in list(_locks):
        owned = getattr(lock, "_is_owned", None)  # an RLock the forking thread holds stays its
        if owned is None or not owned():
            lock._at_fork_reinit()


os.register_at_fork(after_in_child=_unlock_in_child)


def unlocked_in_forked_child(lock: Any) -> Any:
    """Registers `lock` (a threading.Lock or RLock) to be unlocked in a forked child unless the
    forking thread holds it (an RLock it holds stays its, for its own release). Returns it."""
    _locks.add(lock)
    return lock


def new_rlock() -> threading.RLock:
    return unlocked_in_forked_child(threading.RLock())
