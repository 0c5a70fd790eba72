"""LangChain integration of rag-gates.

- :class:`ChatRagGates`: a LangChain chat model over a rag-gates white-box model.
- :func:`as_text_lm`: any LangChain chat model or LLM as a rag-gates ``TextLM``.
- :func:`document_to_passage` / :func:`passage_to_document`: LangChain ``Document`` <->
  rag-gates ``Passage``.

Importing this package does not import torch; a model is loaded on first use.
"""

from __future__ import annotations

from importlib import metadata

from langchain_rag_gates.chat_models import ChatRagGates
from langchain_rag_gates.documents import (
    document_to_passage,
    documents_to_passages,
    passage_to_document,
    passages_to_documents,
)
from langchain_rag_gates.language_models import LangChainTextLM, as_text_lm

try:
    __version__ = metadata.version("langchain-rag-gates")
except metadata.PackageNotFoundError:  # running from a source tree without installing
    __version__ = ""

__all__ = [
    "ChatRagGates",
    "LangChainTextLM",
    "__version__",
    "as_text_lm",
    "document_to_passage",
    "documents_to_passages",
    "passage_to_document",
    "passages_to_documents",
]
