"""Core types: frozen, validated, JSON round-trip."""

from __future__ import annotations

import pydantic
import pytest

from rag_gates.types import (
    GateDecision,
    Generation,
    Passage,
    TokenLogprob,
    TopLogprob,
    Trace,
    TraceEvent,
    TraceRecorder,
)

DECISION = GateDecision(
    gate="quco", retrieve=True, score=2.0, threshold=1.0,
    reason="2 question entities occur fewer than 1000 times in the corpus",
    evidence={"entities": {"Ed Wood": 812, "Scott Derrickson": 95}}, latency_ms=1.5,
)


@pytest.mark.parametrize(
    "obj",
    [
        Passage(text="Paris is the capital.", id="p1", title="Paris", score=0.5,
                metadata={"source": "wiki", "rank": 1, "tags": ["a", "b"]}),
        DECISION,
        Generation(text="Paris", finish_reason="eos", prompt_tokens=5, completion_tokens=1,
                   logprobs=[TokenLogprob(token="Paris", logprob=-0.1, bytes=[80],
                                          top_logprobs=[TopLogprob(token="Paris", logprob=-0.1)])]),
        Trace(events=[TraceEvent(kind="retrieval", name="bm25", latency_ms=3.0,
                                 data={"k": 3})]),
    ],
)
def test_json_round_trip(obj: pydantic.BaseModel) -> None:
    again = type(obj).model_validate_json(obj.model_dump_json())
    assert again == obj


def test_models_are_frozen_and_strict() -> None:
    with pytest.raises(pydantic.ValidationError):
        DECISION.retrieve = False  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError, match="reasn"):
        GateDecision(gate="g", retrieve=False, score=0, threshold=0, reasn="typo")  # type: ignore[call-arg]
    with pytest.raises(pydantic.ValidationError):
        GateDecision(gate="g", retrieve=False, score=0, threshold=0, reason="")
    with pytest.raises(pydantic.ValidationError):
        Generation(text="x", finish_reason="maybe")  # type: ignore[arg-type]


def test_trace_recorder_counts_and_times() -> None:
    rec = TraceRecorder()
    rec.add_decision(DECISION)
    with rec.timed("retrieval", "bm25") as data:
        data["k"] = 3
    with rec.timed("llm_call", "smol") as data:
        data["tokens"] = 12
    trace = rec.trace()
    assert (trace.retrievals, trace.llm_calls, trace.generated_tokens) == (1, 1, 12)
    assert trace.decisions() == [DECISION]
    assert trace.latency_ms >= DECISION.latency_ms
    assert Trace.model_validate_json(trace.model_dump_json()) == trace
