"""``CorpusStats``: the one interface every corpus-statistics backend implements.

Two questions, each with a single, a batch (order kept) and an async form:

* ``count(phrase)``: how often the phrase occurs (a :class:`CountResult`);
* ``cooccurrence(a, b, scope="document" | Window(tokens=n))``: whether, and how often, the two
  occur together (a :class:`CooccurrenceResult`).

Subclasses implement :meth:`count` and :meth:`cooccurrence`; the batch and async forms have
working defaults (a loop; a worker thread) that backends override when they can do better.

Example:
    >>> from rag_gates.corpus import LocalInfiniGram          # doctest: +SKIP
    >>> stats = LocalInfiniGram("~/indexes/wiki")             # doctest: +SKIP
    >>> stats.count("Barack Obama").value                     # doctest: +SKIP
    1290
    >>> stats.cooccurrence("Barack Obama", "Honolulu").value  # documents with both
    37
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from rag_gates.corpus.types import CooccurrenceResult, CountResult, Scope

__all__ = ["CorpusStats"]


class CorpusStats(ABC):
    """Phrase counts and co-occurrence over one corpus index."""

    #: Short backend name carried by every answer, e.g. ``"local-infini-gram"``.
    backend_name: str = "corpus"

    @property
    @abstractmethod
    def index_name(self) -> str:
        """Human name of the index (directory name, or the hosted index name)."""

    @property
    @abstractmethod
    def index_key(self) -> str:
        """Stable identity of the index content, used as part of cache keys."""

    def options_key(self) -> dict[str, Any]:
        """Every option that changes answers (case, variants, limits); part of cache keys."""
        return {}

    @abstractmethod
    def count(self, phrase: str) -> CountResult:
        """Occurrences of ``phrase`` (matched literally, in all its variants)."""

    @abstractmethod
    def cooccurrence(self, a: str, b: str, scope: Scope = "document") -> CooccurrenceResult:
        """How often ``a`` and ``b`` occur together within ``scope``."""

    def count_batch(self, phrases: Sequence[str]) -> list[CountResult]:
        """``count`` for each phrase, answers in the same order."""
        return [self.count(p) for p in phrases]

    def cooccurrence_batch(self, pairs: Sequence[tuple[str, str]],
                           scope: Scope = "document") -> list[CooccurrenceResult]:
        """``cooccurrence`` for each pair, answers in the same order."""
        return [self.cooccurrence(a, b, scope) for a, b in pairs]

    async def acount(self, phrase: str) -> CountResult:
        return await asyncio.to_thread(self.count, phrase)

    async def acooccurrence(self, a: str, b: str,
                            scope: Scope = "document") -> CooccurrenceResult:
        return await asyncio.to_thread(self.cooccurrence, a, b, scope)

    async def acount_batch(self, phrases: Sequence[str]) -> list[CountResult]:
        return await asyncio.to_thread(self.count_batch, list(phrases))

    async def acooccurrence_batch(self, pairs: Sequence[tuple[str, str]],
                                  scope: Scope = "document") -> list[CooccurrenceResult]:
        return await asyncio.to_thread(self.cooccurrence_batch, list(pairs), scope)

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing to free
        """Release resources (connections, threads); the object is unusable afterwards."""

    def __enter__(self) -> CorpusStats:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
