"""Plumbing shared by the HTTP clients (model servers, hosted corpus indexes): a private event
loop on a daemon thread, so sync, batch and async calls from any thread share one connection
pool and one concurrency bound; and the retry schedule (exponential backoff with jitter,
``Retry-After`` honoured, never past the call's deadline).

Example:
    >>> runner = LoopThread("example")
    >>> async def two() -> int:
    ...     return 2
    >>> runner.submit(two()).result()
    2
    >>> runner.stop()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import random
import threading
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

__all__ = ["RETRY_STATUS", "LoopThread", "backoff_delay", "retry_after_seconds"]

T = TypeVar("T")

# Statuses worth another try: timeouts, rate limits, and the server's own failures.
RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


class LoopThread:
    """A private asyncio loop on a daemon thread, shared by every call of one client."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        if not self.loop.is_running():
            self.loop.close()


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """The ``Retry-After`` header in seconds, when it is a number."""
    value = headers.get("Retry-After")
    if value is None:
        return None
    with contextlib.suppress(ValueError):
        return float(value)
    return None


def backoff_delay(attempt: int, retry_after: float | None, base: float, cap: float) -> float:
    """Seconds to wait before retry ``attempt + 1``: the server's ``Retry-After`` when given
    (capped), else ``base * 2**attempt`` (capped) with jitter so clients do not retry in step."""
    if retry_after is not None:
        return min(cap, max(0.0, retry_after))
    return float(min(cap, base * (2 ** attempt)) * random.uniform(0.5, 1.0))
