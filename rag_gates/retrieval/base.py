"""The retriever protocol every pipeline and benchmark takes."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from rag_gates._text import check_text
from rag_gates.types import Passage

__all__ = ["BaseRetriever", "BatchRetriever", "Retriever", "check_query"]


def check_query(query: object, k: object) -> tuple[str, int]:
    """Validate a query and k; raise TypeError/ValueError saying what is wrong."""
    query = check_text(query, "query")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    return query, k


@runtime_checkable
class Retriever(Protocol):
    """Anything that returns passages for a query, best first."""

    @property
    def name(self) -> str: ...

    def retrieve(self, query: str, k: int = 3) -> list[Passage]: ...

    async def aretrieve(self, query: str, k: int = 3) -> list[Passage]: ...

    def retrieve_batch(self, queries: Sequence[str], k: int = 3) -> list[list[Passage]]: ...


class BaseRetriever(ABC):
    """Implement ``retrieve``; async and batch forms come free (batch keeps order)."""

    @property
    @abstractmethod
    def name(self) -> str: ...

    @abstractmethod
    def retrieve(self, query: str, k: int = 3) -> list[Passage]: ...

    async def aretrieve(self, query: str, k: int = 3) -> list[Passage]:
        return await asyncio.to_thread(self.retrieve, query, k)

    def retrieve_batch(self, queries: Sequence[str], k: int = 3) -> list[list[Passage]]:
        return [self.retrieve(q, k) for q in queries]


class BatchRetriever(BaseRetriever):
    """For a backend that answers many queries at once (BM25's matrix, one embedding call):
    implement :meth:`_retrieve_batch`; ``retrieve`` is a batch of one, and every query is
    checked before the backend sees any."""

    def retrieve(self, query: str, k: int = 3) -> list[Passage]:
        return self.retrieve_batch([query], k)[0]

    def retrieve_batch(self, queries: Sequence[str], k: int = 3) -> list[list[Passage]]:
        for q in queries:
            check_query(q, k)
        if not queries:
            return []
        return self._retrieve_batch(queries, k)

    @abstractmethod
    def _retrieve_batch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """Passages for each of ``queries`` (checked, at least one), best first."""
