"""BaseGate's reason sentence: the score's label is the one part a subclass may change."""

from __future__ import annotations

from typing import Any

from pydantic import JsonValue

from rag_gates.gate import BaseGate


class _Words(BaseGate):
    name = "words"

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        return float(len(query.split())), {"unit": "words"}


class _Labelled(_Words):
    def score_label(self, evidence: dict[str, JsonValue]) -> str:
        return f"question length in {evidence['unit']}"


def test_the_default_reason_names_the_gate_score() -> None:
    assert _Words(threshold=3).decide("Who wrote Hamlet?").reason == \
        "words score 3 >= threshold 3: retrieve"
    assert _Words(threshold=4.5).decide("Who wrote Hamlet?").reason == \
        "words score 3 < threshold 4.5: answer without retrieval"


def test_a_score_label_changes_only_what_the_score_is_called() -> None:
    assert _Labelled(threshold=4.5).decide("Who wrote Hamlet?").reason == \
        "question length in words 3 < threshold 4.5: answer without retrieval"
