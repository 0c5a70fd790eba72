"""LangChain integration of rag-gates.

- :class:`ChatRagGates`: a LangChain chat model over a rag-gates white-box model.
- :func:`as_text_lm`: any LangChain chat model or LLM as a rag-gates ``TextLM``.
- :class:`GatedRetriever`: any LangChain retriever behind any rag-gates gate (retrieve only
  when the gate says so; decisions in document metadata and callback events).
- :class:`GateRouter` / :func:`route_by_gate`: send each input through a retrieval chain or
  straight to the model, by the gate's decision.
- :class:`QuCoRunnable`: QuCo-RAG's loop (gate, generation, claim verification,
  re-retrieval) on any LangChain model and retriever.
- :class:`DeepRAGRunnable`: DeepRAG's step-by-step loop (a retrieve-or-answer decision per
  subquery) on any LangChain model and retriever, streaming its steps.
- :class:`SelfRoutingRetriever`: SR-RAG's routing: the wrapped retriever's documents, or
  one document of the model's own verbalized knowledge, by ``p_M * p_D >= tau``.
- :class:`TokRAGRunnable`: Tok-RAG (or CAD / AdaCAD) decoding over ``{"question",
  "documents"}``, per-token choices in the message metadata.
- :class:`ClaimVerifierTool`: QuCo's claim verifier as a tool (agent self-verification);
  :class:`GatedRetrieverTool`: a gated retriever as a tool that says what its gate decided.
- :class:`ConfidenceGainReranker`: CBDR's confidence-gain reranker (or a cross-encoder
  fine-tuned on it, or any rag-gates reranker) as a document compressor.
- :class:`LangChainRetrieverAdapter`: any LangChain retriever as a rag-gates ``Retriever``.
- :func:`document_to_passage` / :func:`passage_to_document`: LangChain ``Document`` <->
  rag-gates ``Passage``; :func:`annotate_document` for non-mutating annotation.

Importing this package does not import torch; a model is loaded on first use.
"""

from __future__ import annotations

from importlib import metadata

from langchain_rag_gates.chat_models import ChatRagGates
from langchain_rag_gates.deeprag import STEP_EVENT, DeepRAGRunnable
from langchain_rag_gates.document_compressors import ConfidenceGainReranker
from langchain_rag_gates.documents import (
    annotate_document,
    document_to_passage,
    documents_to_passages,
    passage_to_document,
    passages_to_documents,
)
from langchain_rag_gates.language_models import LangChainTextLM, as_text_lm
from langchain_rag_gates.quco import QuCoRunnable
from langchain_rag_gates.retrievers import GatedRetriever, LangChainRetrieverAdapter
from langchain_rag_gates.runnables import (
    DEFAULT_ABSTAIN_MESSAGE,
    GateRouter,
    closed_book_prompt,
    route_by_gate,
)
from langchain_rag_gates.srrag import SelfRoutingRetriever
from langchain_rag_gates.tokrag import CHOICES_KEY, TokRAGRunnable
from langchain_rag_gates.tools import (
    ClaimVerifierInput,
    ClaimVerifierTool,
    GatedRetrieval,
    GatedRetrieverInput,
    GatedRetrieverTool,
)

try:
    __version__ = metadata.version("langchain-rag-gates")
except metadata.PackageNotFoundError:  # running from a source tree without installing
    __version__ = ""

__all__ = [
    "CHOICES_KEY",
    "DEFAULT_ABSTAIN_MESSAGE",
    "STEP_EVENT",
    "ChatRagGates",
    "ClaimVerifierInput",
    "ClaimVerifierTool",
    "ConfidenceGainReranker",
    "DeepRAGRunnable",
    "GateRouter",
    "GatedRetrieval",
    "GatedRetriever",
    "GatedRetrieverInput",
    "GatedRetrieverTool",
    "LangChainRetrieverAdapter",
    "LangChainTextLM",
    "QuCoRunnable",
    "SelfRoutingRetriever",
    "TokRAGRunnable",
    "__version__",
    "annotate_document",
    "as_text_lm",
    "closed_book_prompt",
    "document_to_passage",
    "documents_to_passages",
    "passage_to_document",
    "passages_to_documents",
    "route_by_gate",
]
