"""Per-process resources across ``fork`` (gunicorn ``--preload``, Celery prefork,
``multiprocessing``'s fork start method).

A client built in the parent and used in a forked worker would otherwise reuse what cannot
survive a fork: a private event-loop thread (it does not exist in the child, so every call
waits for its backstop timeout), the parent's HTTP sockets, its SQLite connections (SQLite:
a connection must not be carried across fork), and locks another thread may have held at
the moment of the fork. Such an object registers with :func:`rebuild_after_fork`; one
at-fork hook calls each live object's ``_after_fork()`` in the child, which drops (never
closes: they are the parent's) those resources so they are rebuilt on first use.

torch's OpenMP thread pool does not survive a fork either: a child forked after its parent
ran a forward pass on several threads hangs in its first parallel region, silently, until
the worker is killed. rag-gates' models note the threads of each forward pass
(:func:`note_torch_forward`); a child forked after one on several threads is put on one
thread (the one setting that does not hang) with a warning saying how to keep several.
"""

from __future__ import annotations

import os
import sys
import warnings
import weakref
from typing import Protocol

__all__ = ["ForkAware", "note_torch_forward", "rebuild_after_fork"]


class ForkAware(Protocol):
    def _after_fork(self) -> None: ...


_LIVE: weakref.WeakSet[ForkAware] = weakref.WeakSet()


def rebuild_after_fork(obj: ForkAware) -> None:
    """Have ``obj._after_fork()`` called in every child forked while ``obj`` lives."""
    _LIVE.add(obj)


_TORCH_THREADS = 0  # the torch threads of this process's last noted forward pass (0: none)


def note_torch_forward(*_: object) -> None:
    """Remember how many torch threads a forward pass runs on; call it from the forward
    (it also serves as a ``register_forward_pre_hook`` hook)."""
    global _TORCH_THREADS
    _TORCH_THREADS = sys.modules["torch"].get_num_threads()


def _one_torch_thread() -> None:
    if _TORCH_THREADS > 1:
        sys.modules["torch"].set_num_threads(1)
        warnings.warn(
            f"rag-gates: this process was forked after its parent ran a model on "
            f"{_TORCH_THREADS} torch threads; torch's thread pool does not survive fork, so "
            "it runs on one thread here (on more, its first forward pass would hang). For "
            "several threads per worker, load the model in the worker (gunicorn without "
            "--preload, or a post_fork hook) or start workers with spawn.",
            RuntimeWarning, stacklevel=1)


def _in_child() -> None:
    _one_torch_thread()
    for obj in list(_LIVE):
        obj._after_fork()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_in_child)
