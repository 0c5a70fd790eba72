"""Shared vocabulary of rag-gates: frozen pydantic models that every component speaks.

All models are immutable and round-trip through JSON (``Model.model_validate_json(
m.model_dump_json()) == m``), so decisions and traces can be logged and reloaded.

Example:
    >>> from rag_gates.types import GateDecision
    >>> d = GateDecision(gate="quco", retrieve=True, score=3.0, threshold=1.0,
    ...                  reason="2 rare entities in the question")
    >>> GateDecision.model_validate_json(d.model_dump_json()) == d
    True
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator

__all__ = [
    "AbstainDecision",
    "ChatMessage",
    "GateDecision",
    "Generation",
    "Passage",
    "PipelineResult",
    "QAExample",
    "TokenChoice",
    "TokenLogprob",
    "TopLogprob",
    "Trace",
    "TraceEvent",
    "TraceRecorder",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class Passage(BaseModel):
    """A retrieved piece of text, independent of any framework's node or document type."""

    model_config = _FROZEN

    text: str = Field(..., description="The passage text given to the model.")
    id: str | None = Field(None, description="Stable identifier (node id, document id, ...).")
    title: str | None = Field(None, description="Title of the source document, if any.")
    score: float | None = Field(None, description="Retriever or reranker score, if any.")
    metadata: dict[str, JsonValue] = Field(
        default_factory=dict, description="Free-form JSON metadata carried along unchanged."
    )


class GateDecision(BaseModel):
    """Whether to retrieve, with the number behind it and what was measured.

    ``score`` is the gate's own number, oriented so that higher means more need to retrieve;
    the gate retrieves when ``score`` exceeds (or meets, as each gate documents) ``threshold``.
    """

    model_config = _FROZEN

    gate: str = Field(..., description="Name of the gate that decided, e.g. 'quco', 'cbdr'.")
    retrieve: bool = Field(..., description="True when the gate asks for retrieval.")
    score: float = Field(..., description="The gate's score; higher = more need to retrieve.")
    threshold: float = Field(..., description="Threshold the score was compared against.")
    reason: str = Field(..., min_length=1, description="One human sentence explaining it.")
    evidence: dict[str, JsonValue] = Field(
        default_factory=dict,
        description="What was measured: entities and counts, probe confidence, votes, ...",
    )
    latency_ms: float = Field(0.0, ge=0.0, description="Time the decision took.")


class AbstainDecision(BaseModel):
    """After retrieval, whether to answer from the passages or abstain ("I don't know"): the
    third outcome of a three-way spec (``CertifiedGate.after_retrieval``)."""

    model_config = _FROZEN

    abstain: bool = Field(..., description="True: reply that the answer is not known.")
    score: float = Field(..., description="The with-passages score (higher = less reliable; "
                         "nan when it could not be computed: abstain).")
    threshold: float | None = Field(..., description="Answer when score < threshold; None: "
                                    "abstain after every retrieval.")
    reason: str = Field(..., min_length=1, description="One human sentence explaining it.")
    evidence: dict[str, JsonValue] = Field(default_factory=dict,
                                           description="The spec and the score's source.")


class TopLogprob(BaseModel):
    """One alternative token at a position (OpenAI ``top_logprobs`` entry)."""

    model_config = _FROZEN

    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(BaseModel):
    """Log-probability of one generated token, in the OpenAI ``logprobs.content`` shape."""

    model_config = _FROZEN

    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class TokenChoice(BaseModel):
    """One generated token of a two-stream decoder (Tok-RAG, CAD, AdaCAD): what the stream
    with the retrieved passages (RAG) and the stream without them (LLM) proposed, and which
    token was kept.

    ``side`` is ``"agree"`` when both greedy tokens were the same and kept, ``"rag"`` or
    ``"llm"`` when they differed and that stream's token was kept, ``"fused"`` when a
    contrastive rule (CAD) kept a third token. ``score`` is Tok-RAG's benefit-minus-detriment
    estimate ``cos(w_RAG, w_IR) - cos(w_RAG, w_LLM)`` (>= 0 keeps the RAG token), ``layer``
    its fusion layer l*, ``alpha`` the CAD/AdaCAD weight of the step.
    """

    model_config = _FROZEN

    position: int = Field(..., ge=0, description="Index of the token in the generated text.")
    token: str
    token_id: int
    side: Literal["agree", "rag", "llm", "fused"]
    rag_token: str
    rag_token_id: int
    llm_token: str
    llm_token_id: int
    rag_logprob: float = Field(..., description="log p_RAG of the RAG stream's top token.")
    llm_logprob: float = Field(..., description="log p_LLM of the LLM stream's top token.")
    score: float | None = None
    layer: int | None = None
    alpha: float | None = None


class Generation(BaseModel):
    """The result of one text generation."""

    model_config = _FROZEN

    text: str = Field(..., description="Generated text, stop string excluded.")
    finish_reason: Literal["stop", "length", "eos"] = Field(
        ..., description="'stop': a stop string matched; 'eos': end-of-sequence; 'length'."
    )
    logprobs: list[TokenLogprob] | None = Field(
        None, description="Per-token log-probabilities when requested (OpenAI shape)."
    )
    prompt_tokens: int = Field(0, ge=0)
    completion_tokens: int = Field(0, ge=0)
    latency_ms: float = Field(0.0, ge=0.0)


class ChatMessage(BaseModel):
    """One chat turn; ``role`` follows the OpenAI/HF chat-template convention."""

    model_config = _FROZEN

    role: Literal["system", "user", "assistant"]
    content: str


class TraceEvent(BaseModel):
    """One step of a pipeline run: a decision, a retrieval, a model call, ..."""

    model_config = _FROZEN

    kind: Literal["decision", "retrieval", "llm_call", "verification", "note"]
    name: str = Field(..., description="Which component acted.")
    latency_ms: float = Field(0.0, ge=0.0)
    tokens: int = Field(0, ge=0, description="Tokens generated by this step, if a model call.")
    data: dict[str, JsonValue] = Field(default_factory=dict)


class Trace(BaseModel):
    """Everything a pipeline did to answer one question, in order, with totals."""

    model_config = _FROZEN

    events: tuple[TraceEvent, ...] = ()

    @field_validator("events", mode="before")
    @classmethod
    def _as_tuple(cls, value: Any) -> Any:
        return tuple(value) if isinstance(value, list) else value

    @property
    def retrievals(self) -> int:
        return sum(1 for e in self.events if e.kind == "retrieval")

    @property
    def llm_calls(self) -> int:
        return sum(1 for e in self.events if e.kind == "llm_call")

    @property
    def generated_tokens(self) -> int:
        return sum(e.tokens for e in self.events)

    @property
    def latency_ms(self) -> float:
        return sum(e.latency_ms for e in self.events)

    @property
    def reused_ms(self) -> float:
        """Time of work this run reused from an earlier identical call instead of doing it
        (an event's ``data["reused_ms"]``: a shared greedy verbalization), at that call's cost:
        add it to a wall time to get the cost of running alone."""
        total = 0.0
        for e in self.events:
            value = e.data.get("reused_ms")
            if isinstance(value, int | float) and not isinstance(value, bool):
                total += float(value)
        return total

    def decisions(self) -> list[GateDecision]:
        """The gate decisions recorded in this trace, re-validated as models."""
        return [
            GateDecision.model_validate(e.data) for e in self.events if e.kind == "decision"
        ]


class TraceRecorder:
    """Mutable builder for a :class:`Trace`; pipelines record into it, then freeze it.

    Example:
        >>> rec = TraceRecorder()
        >>> with rec.timed("retrieval", "bm25") as data:
        ...     data["n"] = 3
        >>> rec.trace().retrievals
        1
    """

    def __init__(self) -> None:
        self._events: list[TraceEvent] = []

    def add(self, event: TraceEvent) -> None:
        self._events.append(event)

    def add_decision(self, decision: GateDecision) -> None:
        self.add(
            TraceEvent(
                kind="decision",
                name=decision.gate,
                latency_ms=decision.latency_ms,
                data=decision.model_dump(mode="json"),
            )
        )

    @contextmanager
    def timed(
        self, kind: Literal["decision", "retrieval", "llm_call", "verification", "note"], name: str
    ) -> Iterator[dict[str, JsonValue]]:
        """Time a block and record it; the block may fill the yielded ``data`` dict."""
        data: dict[str, JsonValue] = {}
        start = time.perf_counter()
        yield data
        tokens = data.pop("tokens", 0)
        self.add(
            TraceEvent(
                kind=kind,
                name=name,
                latency_ms=(time.perf_counter() - start) * 1000.0,
                tokens=int(tokens) if isinstance(tokens, int | float) else 0,
                data=data,
            )
        )

    def trace(self) -> Trace:
        return Trace(events=tuple(self._events))


class PipelineResult(BaseModel):
    """What any rag-gates pipeline returns for one question: the answer, the passages it
    used, and the :class:`Trace` of every decision, retrieval and model call.

    Method-specific results extend it (``QuCoResult`` adds the verifications); the benchmark
    reads this shape, so a pipeline needs no benchmark code to be benchmarked.

    Example:
        >>> r = PipelineResult(answer="Paris", trace=Trace())
        >>> r.decisions, r.trace.retrievals
        ([], 0)
    """

    model_config = ConfigDict(frozen=True)

    answer: str = Field(..., description="The final answer text.")
    trace: Trace = Field(..., description="Every decision, retrieval and model call, in order.")
    passages: list[Passage] = Field(default_factory=list, description="Passages it used.")

    @property
    def decisions(self) -> list[GateDecision]:
        """The gate decisions of the run (from the trace)."""
        return self.trace.decisions()


class QAExample(BaseModel):
    """One labelled question: the unit of calibration, probe training and evaluation data."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(..., description="Dataset id, or '<dataset>-<line>' when it has none.")
    dataset: str
    question: str = Field(..., min_length=1)
    answers: list[str] = Field(..., min_length=1, description="Gold answer and aliases.")
    context: list[Passage] = Field(default_factory=list, description="The row's paragraphs.")
    supporting_titles: list[str] = Field(default_factory=list)
    meta: dict[str, JsonValue] = Field(default_factory=dict)
