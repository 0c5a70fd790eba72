"""What the method query engines (QuCo, DeepRAG) share: their LlamaIndex arguments as
rag-gates parts."""

from __future__ import annotations

from typing import Literal, overload

from llama_index.core.base.base_retriever import BaseRetriever as LlamaIndexBaseRetriever
from llama_index.core.llms import LLM
from llama_index.llms.rag_gates.text_lm import as_text_lm
from llama_index.retrievers.rag_gates.adapter import LlamaIndexRetrieverAdapter

from rag_gates._frameworks import retriever_from, text_lm_from
from rag_gates.lm.base import TextLM
from rag_gates.retrieval.base import Retriever

__all__ = ["rag_gates_retriever", "rag_gates_text_lm"]


def rag_gates_text_lm(llm: object) -> TextLM:
    """A LlamaIndex LLM through :func:`as_text_lm`; a rag-gates TextLM as it is."""
    return text_lm_from(llm, LLM, as_text_lm, "LlamaIndex LLM")


@overload
def rag_gates_retriever(retriever: object, *, optional: Literal[False] = False) -> Retriever: ...


@overload
def rag_gates_retriever(retriever: object, *, optional: bool) -> Retriever | None: ...


def rag_gates_retriever(retriever: object, *, optional: bool = False) -> Retriever | None:
    """A LlamaIndex retriever through :class:`LlamaIndexRetrieverAdapter`; a rag-gates
    Retriever as it is; None when ``optional``."""
    return retriever_from(retriever, LlamaIndexBaseRetriever, LlamaIndexRetrieverAdapter,
                          "LlamaIndex BaseRetriever (index.as_retriever())", optional=optional)
