"""Retrieval that leaves a record: every call's query, passage ids and latency go into a
:class:`~rag_gates.types.TraceRecorder`, so a pipeline's trace counts its retrievals.

Example:
    >>> from rag_gates.types import TraceRecorder
    >>> rec = TraceRecorder()
    >>> passages = retrieve_recorded(rec, bm25, "Who wrote Hamlet?", k=3)  # doctest: +SKIP
    >>> rec.trace().retrievals                                              # doctest: +SKIP
    1
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rag_gates.retrieval.base import Retriever
from rag_gates.types import Passage, TraceRecorder

__all__ = ["RecordedRetriever", "retrieve_recorded"]


def retrieve_recorded(rec: TraceRecorder, retriever: Retriever, query: str, k: int
                      ) -> list[Passage]:
    """Retrieve and record the retrieval (query, ids, latency) in the trace."""
    with rec.timed("retrieval", retriever.name) as data:
        passages = retriever.retrieve(query, k)
        _note(data, query, passages)
    return passages


def _note(data: dict[str, Any], query: str, passages: Sequence[Passage]) -> None:
    data["query"] = query
    data["ids"] = [p.id for p in passages]


class RecordedRetriever:
    """A retriever proxy that records every retrieval in a trace (for handing a retriever to
    a framework, which would otherwise call it unseen)."""

    def __init__(self, retriever: Retriever, rec: TraceRecorder) -> None:
        self._retriever = retriever
        self._rec = rec

    @property
    def name(self) -> str:
        return self._retriever.name

    def retrieve(self, query: str, k: int = 3) -> list[Passage]:
        return retrieve_recorded(self._rec, self._retriever, query, k)

    async def aretrieve(self, query: str, k: int = 3) -> list[Passage]:
        """The wrapped retriever's own ``aretrieve`` (never a blocking search on the loop),
        recorded as :meth:`retrieve` records."""
        with self._rec.timed("retrieval", self._retriever.name) as data:
            passages = await self._retriever.aretrieve(query, k)
            _note(data, query, passages)
        return passages

    def retrieve_batch(self, queries: Sequence[str], k: int = 3) -> list[list[Passage]]:
        return [self.retrieve(q, k) for q in queries]
