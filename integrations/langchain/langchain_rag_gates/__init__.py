"""LangChain integration of rag-gates.

- :class:`ChatRagGates`: a LangChain chat model over a rag-gates white-box model.
- :func:`as_text_lm`: any LangChain chat model or LLM as a rag-gates ``TextLM``.
- :class:`GatedRetriever`: any LangChain retriever behind any rag-gates gate (retrieve only
  when the gate says so; decisions in document metadata and callback events).
- :class:`GateRouter` / :func:`route_by_gate`: send each input through a retrieval chain or
  straight to the model, by the gate's decision.
- :func:`document_to_passage` / :func:`passage_to_document`: LangChain ``Document`` <->
  rag-gates ``Passage``; :func:`annotate_document` for non-mutating annotation.

Importing this package does not import torch; a model is loaded on first use.
"""

from __future__ import annotations

from importlib import metadata

from langchain_rag_gates.chat_models import ChatRagGates
from langchain_rag_gates.documents import (
    annotate_document,
    document_to_passage,
    documents_to_passages,
    passage_to_document,
    passages_to_documents,
)
from langchain_rag_gates.language_models import LangChainTextLM, as_text_lm
from langchain_rag_gates.retrievers import GatedRetriever
from langchain_rag_gates.runnables import GateRouter, route_by_gate

try:
    __version__ = metadata.version("langchain-rag-gates")
except metadata.PackageNotFoundError:  # running from a source tree without installing
    __version__ = ""

__all__ = [
    "ChatRagGates",
    "GateRouter",
    "GatedRetriever",
    "LangChainTextLM",
    "__version__",
    "annotate_document",
    "as_text_lm",
    "document_to_passage",
    "documents_to_passages",
    "passage_to_document",
    "passages_to_documents",
    "route_by_gate",
]
