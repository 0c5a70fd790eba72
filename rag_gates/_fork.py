"""Per-process resources across ``fork`` (gunicorn ``--preload``, Celery prefork,
``multiprocessing``'s fork start method).

A client built in the parent and used in a forked worker would otherwise reuse what cannot
survive a fork: a private event-loop thread (it does not exist in the child, so every call
waits for its backstop timeout), the parent's HTTP sockets, its SQLite connections (SQLite:
a connection must not be carried across fork), and locks another thread may have held at
the moment of the fork. Such an object registers with :func:`rebuild_after_fork`; one
at-fork hook calls each live object's ``_after_fork()`` in the child, which drops (never
closes: they are the parent's) those resources so they are rebuilt on first use.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol

__all__ = ["ForkAware", "rebuild_after_fork"]


class ForkAware(Protocol):
    def _after_fork(self) -> None: ...


_LIVE: weakref.WeakSet[ForkAware] = weakref.WeakSet()


def rebuild_after_fork(obj: ForkAware) -> None:
    """Have ``obj._after_fork()`` called in every child forked while ``obj`` lives."""
    _LIVE.add(obj)


def _in_child() -> None:
    for obj in list(_LIVE):
        obj._after_fork()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_in_child)
