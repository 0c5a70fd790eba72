"""What rag-gates' agent tools say: names, descriptions and JSON content, framework-agnostic.

An agent that verifies itself gets two tools (both frameworks build them from this module,
so a LangChain agent and a LlamaIndex agent read the same text):

* ``verify_claims``: QuCo's :class:`~rag_gates.quco.ClaimVerifier` on the agent's draft; its
  content is ``json.dumps(Verification.summary())`` (flagged claims, their counts, the
  queries that would fix them);
* ``search_documents``: a gated retriever; its content is :func:`gated_retrieval_summary`
  (whether the gate retrieved, its reason, and the documents found).

Example:
    >>> from rag_gates.tools import gated_retrieval_summary
    >>> from rag_gates.types import GateDecision, Passage
    >>> decision = GateDecision(gate="quco", retrieve=True, score=0.14, threshold=0.01,
    ...                         reason="mean entity count 6 <= tau_entity 10: retrieve")
    >>> summary = gated_retrieval_summary(decision, [Passage(text="Ed Wood was ...",
    ...                                                      title="Ed Wood")])
    >>> summary["retrieved"], summary["documents"][0]["title"]
    (True, 'Ed Wood')
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, TypeVar

from rag_gates.types import GateDecision, Passage

__all__ = [
    "SEARCH_DOCUMENTS_DESCRIPTION",
    "SEARCH_DOCUMENTS_NAME",
    "VERIFY_CLAIMS_DESCRIPTION",
    "VERIFY_CLAIMS_NAME",
    "gated_retrieval_summary",
    "the_call_decision",
]

D = TypeVar("D")

VERIFY_CLAIMS_NAME = "verify_claims"
"""The claim verifier tool's default name."""

VERIFY_CLAIMS_DESCRIPTION = (
    "Verify these claims against corpus statistics; return the flagged ones with counts and "
    "the queries to run. Input: the draft text (one or more sentences). Output: JSON with "
    "'flagged' (claims whose entities never co-occur in the corpus: head, relation, tail, "
    "cooccurrence count, reason, query), 'queries' (search queries that would fix them), "
    "'claims_checked' and 'sentences', and 'unreadable' (sentences whose claims could not "
    "be read: each is flagged and searched whole) when there are any. An unflagged claim "
    "is not contradicted by the corpus; it is not proven true."
)
"""What an agent reads about ``verify_claims``."""

SEARCH_DOCUMENTS_NAME = "search_documents"
"""The gated retriever tool's default name."""

SEARCH_DOCUMENTS_DESCRIPTION = (
    "Search the documents. Input: a query (a question, or one of the 'queries' that "
    "verify_claims returned). A gate first decides whether retrieval is worth it for this "
    "query. Output: JSON with 'retrieved' (false when the gate decided not to retrieve), "
    "'gate' and 'reason' (the gate's decision), and 'documents' (title and text of each "
    "document found; empty when nothing was retrieved)."
)
"""What an agent reads about ``search_documents``."""


def gated_retrieval_summary(decision: GateDecision,
                            passages: Sequence[Passage]) -> dict[str, Any]:
    """The JSON-ready content of a gated retrieval: the gate's decision and the documents.

    Keys: ``retrieved`` (the gate's ``retrieve``), ``gate``, ``reason``, ``documents``
    (``{"title", "text"}`` per passage, in order).
    """
    if not isinstance(decision, GateDecision):
        raise TypeError(f"decision must be a rag_gates GateDecision, got "
                        f"{type(decision).__name__}")
    return {
        "retrieved": decision.retrieve,
        "gate": decision.gate,
        "reason": decision.reason,
        "documents": [{"title": p.title, "text": p.text} for p in passages],
    }


def the_call_decision(decisions: Sequence[tuple[Hashable, D]], needs: str) -> D:
    """The decision a gated-retriever tool call reports, from every decision seen during
    the call as ``(run or span of the retriever that made it, decision)`` in order: the
    tool's own retriever reports first (it decides before anything it wraps runs), and
    last when it overturned its first decision (a self-routing retriever whose
    verbalization came back empty retrieves after all), so its last one. None seen: a
    RuntimeError ending with ``needs`` (what the tool needs instead)."""
    if not decisions:
        raise RuntimeError(f"the tool's retriever reported no gate decision: {needs}")
    own = decisions[0][0]
    return [decision for run, decision in decisions if run == own][-1]
