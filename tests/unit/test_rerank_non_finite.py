"""A reranker score that is not a finite number (an fp16 overflow, a damaged probe) must not
scramble the order: NaN compares False both ways, so a plain sort leaves it arbitrary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rag_gates.rerank import BaseReranker, PassageScores
from rag_gates.types import Passage


class FixedScores(BaseReranker):
    name = "fixed"

    def __init__(self, scores: list[float]) -> None:
        self.scores = scores

    def score_passages(self, query: str, passages: Sequence[Passage],
                       **signals: Any) -> PassageScores:
        return PassageScores(scores=self.scores)


PASSAGES = [Passage(text=t) for t in ("low", "broken", "high", "middle")]


def test_a_nan_score_ranks_last_and_is_named() -> None:
    result = FixedScores([0.1, float("nan"), 0.9, 0.5]).rerank("q", PASSAGES, top_n=1)
    assert [p.index for p in result.ranked] == [2]
    assert result.evidence["non_finite_scores"] == [1]
    full = FixedScores([0.1, float("nan"), 0.9, float("inf")]).rerank("q", PASSAGES)
    assert [p.index for p in full.ranked] == [2, 0, 1, 3]
    assert full.evidence["non_finite_scores"] == [1, 3]


def test_finite_scores_leave_no_trace() -> None:
    result = FixedScores([0.1, 0.3, 0.9, 0.5]).rerank("q", PASSAGES)
    assert [p.index for p in result.ranked] == [2, 3, 1, 0]
    assert "non_finite_scores" not in result.evidence
