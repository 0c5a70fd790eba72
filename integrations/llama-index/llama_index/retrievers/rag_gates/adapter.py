"""``LlamaIndexRetrieverAdapter``: any LlamaIndex retriever as a rag-gates ``Retriever``.

The reverse of :class:`~llama_index.retrievers.rag_gates.PassageRetriever`: rag-gates
pipelines (QuCo, and the later method pipelines) then retrieve from whatever a LlamaIndex
application already has: a ``VectorStoreIndex`` over any vector store, BM25, a fusion
retriever, a :class:`~llama_index.retrievers.rag_gates.GatedRetriever`, ...
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever as LlamaIndexBaseRetriever
from llama_index.core.schema import NodeWithScore
from llama_index.retrievers.rag_gates.convert import nodes_to_passages

from rag_gates._frameworks import FrameworkRetrieverAdapter
from rag_gates.types import Passage

__all__ = ["LlamaIndexRetrieverAdapter"]


class LlamaIndexRetrieverAdapter(FrameworkRetrieverAdapter):
    """A LlamaIndex retriever seen as a rag-gates :class:`~rag_gates.retrieval.base.Retriever`.

    ``retrieve(query, k)`` calls the wrapped retriever (``aretrieve`` calls its own async
    path) and converts its nodes with :func:`~llama_index.retrievers.rag_gates.node_to_passage`
    (node id, text without metadata, score, title, metadata). LlamaIndex retrievers fix their
    number of results when built (``index.as_retriever(similarity_top_k=5)``), so ``k``
    *cuts* the result: build the wrapped retriever with at least the ``k`` the pipeline asks
    for (QuCo's default is 3; LlamaIndex's vector retrievers default to 2).

    Args:
        retriever: any LlamaIndex ``BaseRetriever``.
        name: name used in traces (default ``"llama-index:<class name>"``).

    Example:
        >>> from llama_index.core import VectorStoreIndex
        >>> from llama_index.retrievers.rag_gates import LlamaIndexRetrieverAdapter
        >>> index = VectorStoreIndex.from_documents(documents)
        >>> retriever = LlamaIndexRetrieverAdapter(index.as_retriever(similarity_top_k=3))
        >>> passages = retriever.retrieve("Who directed Ed Wood?", k=3)
        >>> passages[0].title, passages[0].score
    """

    native = LlamaIndexBaseRetriever
    kind = "LlamaIndex BaseRetriever (e.g. index.as_retriever())"
    prefix = "llama-index"
    retriever: LlamaIndexBaseRetriever

    def __init__(self, retriever: LlamaIndexBaseRetriever, name: str | None = None) -> None:
        super().__init__(retriever, name)

    def _fetch(self, query: str, k: int) -> list[NodeWithScore]:
        return self.retriever.retrieve(query)

    async def _afetch(self, query: str, k: int) -> list[NodeWithScore]:
        return await self.retriever.aretrieve(query)

    def _passages(self, items: Sequence[Any]) -> list[Passage]:
        return nodes_to_passages(items)
