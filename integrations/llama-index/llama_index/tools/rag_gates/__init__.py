"""LlamaIndex tools of rag-gates.

* :func:`claim_verifier_tool`: QuCo-RAG's claim verifier as a ``FunctionTool``, so an agent
  can check its own draft (flagged claims, their corpus counts, the queries to run).
* :func:`gated_retriever_tool`: a gated retriever as a ``FunctionTool`` whose output says
  what the gate decided (and why) with the documents found.
"""

from llama_index.tools.rag_gates.base import (
    DEFAULT_DESCRIPTION,
    DEFAULT_NAME,
    SEARCH_DOCUMENTS_DESCRIPTION,
    SEARCH_DOCUMENTS_NAME,
    GatedRetrieval,
    SearchDocumentsInput,
    VerifyClaimsInput,
    claim_verifier_tool,
    gated_retriever_tool,
)

__all__ = [
    "DEFAULT_DESCRIPTION",
    "DEFAULT_NAME",
    "SEARCH_DOCUMENTS_DESCRIPTION",
    "SEARCH_DOCUMENTS_NAME",
    "GatedRetrieval",
    "SearchDocumentsInput",
    "VerifyClaimsInput",
    "claim_verifier_tool",
    "gated_retriever_tool",
]
