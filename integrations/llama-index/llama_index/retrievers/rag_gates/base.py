"""``PassageRetriever``: any rag-gates retriever as a LlamaIndex retriever."""

from __future__ import annotations

from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager
from llama_index.core.schema import NodeWithScore, QueryBundle
from llama_index.retrievers.rag_gates.convert import passages_to_nodes

from rag_gates.retrieval.base import Retriever

__all__ = ["PassageRetriever"]


class PassageRetriever(BaseRetriever):
    """Wrap a rag-gates :class:`~rag_gates.retrieval.base.Retriever` (BM25, dense Qdrant, or
    your own) so LlamaIndex query engines can use it.

    Example:
        >>> from rag_gates.retrieval import BM25Retriever
        >>> from llama_index.core.query_engine import RetrieverQueryEngine
        >>> retriever = PassageRetriever(BM25Retriever.from_passages(passages),
        ...                              similarity_top_k=3)
        >>> engine = RetrieverQueryEngine.from_args(retriever, llm=llm)
    """

    def __init__(self, retriever: Retriever, similarity_top_k: int = 3,
                 callback_manager: CallbackManager | None = None, **kwargs: Any) -> None:
        if not isinstance(retriever, Retriever):
            raise TypeError(f"retriever must follow rag_gates' Retriever protocol "
                            f"(retrieve/aretrieve/retrieve_batch), got {type(retriever).__name__}")
        if similarity_top_k < 1:
            raise ValueError(f"similarity_top_k must be >= 1, got {similarity_top_k}")
        super().__init__(callback_manager=callback_manager, **kwargs)
        self._passages = retriever
        self.similarity_top_k = similarity_top_k

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return passages_to_nodes(self._passages.retrieve(query_bundle.query_str,
                                                         self.similarity_top_k))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        passages = await self._passages.aretrieve(query_bundle.query_str, self.similarity_top_k)
        return passages_to_nodes(passages)
