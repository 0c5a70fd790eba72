"""What the method query engines (QuCo, DeepRAG) share: their LlamaIndex arguments as
rag-gates parts (the core rule, :class:`rag_gates._frameworks.FrameworkInputs`, bound to
LlamaIndex's types)."""

from __future__ import annotations

from llama_index.core.base.base_retriever import BaseRetriever as LlamaIndexBaseRetriever
from llama_index.core.llms import LLM
from llama_index.llms.rag_gates.text_lm import as_text_lm
from llama_index.retrievers.rag_gates.adapter import LlamaIndexRetrieverAdapter

from rag_gates._frameworks import FrameworkInputs

__all__ = ["rag_gates_retriever", "rag_gates_text_lm"]

_LLAMA_INDEX = FrameworkInputs(
    lm_type=LLM, as_text_lm=as_text_lm, lm_kind="LlamaIndex LLM",
    retriever_type=LlamaIndexBaseRetriever, as_retriever=LlamaIndexRetrieverAdapter,
    retriever_kind="LlamaIndex BaseRetriever (index.as_retriever())")

rag_gates_text_lm = _LLAMA_INDEX.text_lm
"""A LlamaIndex LLM through :func:`as_text_lm`; a rag-gates TextLM as it is."""
rag_gates_retriever = _LLAMA_INDEX.retriever
"""A LlamaIndex retriever through :class:`LlamaIndexRetrieverAdapter`; a rag-gates Retriever
as it is; None when ``optional``."""
