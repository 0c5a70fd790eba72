"""LlamaIndex tools of rag-gates.

* :func:`claim_verifier_tool`: QuCo-RAG's claim verifier as a ``FunctionTool``, so an agent
  can check its own draft (flagged claims, their corpus counts, the queries to run).
"""

from llama_index.tools.rag_gates.base import (
    DEFAULT_DESCRIPTION,
    DEFAULT_NAME,
    VerifyClaimsInput,
    claim_verifier_tool,
)

__all__ = ["DEFAULT_DESCRIPTION", "DEFAULT_NAME", "VerifyClaimsInput", "claim_verifier_tool"]
