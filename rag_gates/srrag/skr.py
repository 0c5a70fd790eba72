"""SKR, the peer users pick today (FlashRAG's SKR judger), over the same labels as SR-RAG.

SKR ("self-knowledge guided retrieval") finds the ``k`` = 5 training questions nearest to the
question in a sentence encoder's embedding space (here the embedded all-MiniLM-L6-v2) and
retrieves when the neighbours labelled "retrieval better" outweigh the others after dividing
each count by its label's share of the datastore (FlashRAG's prior correction). It is the
kNN half of SR-RAG with an off-the-shelf encoder instead of the model's own hidden states, so
the two differ only in what the neighbours are found by.

Score (higher = more need): ``(v_R / n_R) / (v_R / n_R + v_P / n_P)`` with ``v`` the votes
among the k neighbours and ``n`` the label counts in the datastore; threshold 0.5 is the
judger's own rule (a tie retrieves).

Example:
    >>> policy = SourcePolicy.open(EmbeddingKeys(), path="~/.cache/rag-gates/srrag/skr-policy")
    >>> SKRGate(policy).decide("Who wrote Hamlet?").evidence["votes_retrieval"]  # doctest: +SKIP
    2
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import JsonValue

from rag_gates.gate import BaseGate
from rag_gates.srrag.labels import RETRIEVAL
from rag_gates.srrag.policy import PolicyKeyError, PolicyStoreError, SourcePolicy, check_k

__all__ = ["SKR_K", "SKRGate"]

#: Neighbours SKR asks for (FlashRAG's default).
SKR_K = 5


class SKRGate(BaseGate):
    """Prior-corrected kNN vote over question embeddings (see the module docstring).

    Args:
        policy: a datastore keyed by question embeddings (built with
            ``rag-gates srrag build-policy --keys minilm``), or any :class:`SourcePolicy`.
        threshold: retrieve at ``score >= threshold`` (0.5: the judger's rule).
        k: neighbours (default 5).
        prior: label counts ``(retrieval, parametric)`` of the datastore; default: counted
            once from the datastore.
    """

    name = "skr"
    threshold_range = (0.0, 1.0)  # a probability

    def __init__(self, policy: SourcePolicy, threshold: float = 0.5, *, k: int = SKR_K,
                 prior: tuple[int, int] | None = None) -> None:
        super().__init__(threshold)
        if not isinstance(policy, SourcePolicy):
            raise TypeError(f"policy must be a SourcePolicy, got {type(policy).__name__}")
        self.policy = policy
        self.k = check_k(k)
        if prior is None:
            entries = policy.entries(limit=1_000_000)
            retrieval = sum(1 for e in entries if e.source == RETRIEVAL)
            prior = (retrieval, len(entries) - retrieval)
        self.prior = prior

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        n_r, n_p = self.prior
        evidence: dict[str, JsonValue] = {"k": self.k, "prior_retrieval": n_r,
                                          "prior_parametric": n_p}
        try:
            vote = self.policy.vote_question(query, self.k)
        except PolicyStoreError as exc:
            return math.nan, {**evidence, "lookup_error": str(exc)}
        except PolicyKeyError as exc:
            return math.nan, {**evidence, "vote_error": str(exc)}
        evidence.update({"found": vote.found, "votes_retrieval": vote.retrieval,
                         "votes_parametric": vote.parametric,
                         "neighbours": [n.model_dump(mode="json") for n in vote.neighbours]})
        if not vote.found:
            return math.nan, evidence
        # A label absent from the datastore cannot be corrected for: use the raw shares.
        r = vote.retrieval / n_r if n_r and n_p else float(vote.retrieval)
        p = vote.parametric / n_p if n_r and n_p else float(vote.parametric)
        return r / (r + p), evidence

    def undecided(self, score: float, evidence: dict[str, JsonValue]) -> str:
        if "lookup_error" in evidence:
            return f"the datastore lookup failed: {evidence['lookup_error']}"
        if "vote_error" in evidence:
            return f"no kNN vote: {evidence['vote_error']}"
        return "the SKR datastore is empty (build it with rag-gates srrag build-policy " \
            "--keys minilm)"
