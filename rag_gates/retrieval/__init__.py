"""Retrievers for users without a framework, and for benchmarks: BM25 and dense (Qdrant).

``BM25Retriever`` needs ``rag-gates[eval]`` (bm25s); ``QdrantDenseRetriever`` needs
``rag-gates[qdrant]`` and ``rag-gates[hf]`` (the embedder). Both load lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rag_gates.retrieval.base import BaseRetriever, Retriever

if TYPE_CHECKING:  # pragma: no cover
    from rag_gates.retrieval.bm25 import BM25Retriever
    from rag_gates.retrieval.dense import QdrantDenseRetriever

__all__ = ["BM25Retriever", "BaseRetriever", "QdrantDenseRetriever", "Retriever"]


def __getattr__(name: str) -> Any:
    if name == "BM25Retriever":
        from rag_gates.retrieval.bm25 import BM25Retriever

        return BM25Retriever
    if name == "QdrantDenseRetriever":
        from rag_gates.retrieval.dense import QdrantDenseRetriever

        return QdrantDenseRetriever
    raise AttributeError(f"module 'rag_gates.retrieval' has no attribute {name!r}")
