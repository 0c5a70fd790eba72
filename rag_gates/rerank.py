"""The reranker protocol: order passages by their benefit to a query, with a score each.

A reranker never changes the passages it is given: it returns :class:`ScoredPassage` items
that point back to the input by ``index``, so framework adapters can copy and annotate their
own nodes/documents (and keep the retrieval score) without losing track of them.

Example:
    >>> class LengthReranker(BaseReranker):
    ...     name = "length"
    ...     def score_passages(self, query, passages, **signals):
    ...         return PassageScores(scores=[float(len(p.text)) for p in passages])
    >>> result = LengthReranker().rerank("q", [Passage(text="a"), Passage(text="abc")], top_n=1)
    >>> result.ranked[0].index, result.ranked[0].score
    (1, 3.0)
"""

from __future__ import annotations

import asyncio
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from rag_gates._text import check_encodable, check_text
from rag_gates.types import Passage

__all__ = ["BaseReranker", "PassageReranker", "PassageScores", "RerankResult", "ScoredPassage",
           "check_query", "check_reranker", "check_result", "check_top_n"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class PassageScores(BaseModel):
    """What :meth:`BaseReranker.score_passages` returns: one score per input passage."""

    model_config = _FROZEN

    scores: list[float]
    evidence: dict[str, JsonValue] = Field(default_factory=dict)
    per_passage: list[dict[str, JsonValue]] | None = None


class ScoredPassage(BaseModel):
    """One input passage with the reranker's score; ``index`` is its position in the input."""

    model_config = _FROZEN

    index: int = Field(..., ge=0, description="Position of the passage in the reranker's input.")
    score: float = Field(..., description="The reranker's score; higher = more useful.")
    passage: Passage = Field(..., description="The input passage, unchanged.")
    evidence: dict[str, JsonValue] = Field(
        default_factory=dict, description="Per-passage measurements (e.g. confidence with it).")


class RerankResult(BaseModel):
    """Passages best first (at most ``top_n``), with what the reranker measured."""

    model_config = _FROZEN

    reranker: str = Field(..., description="Name of the reranker that ordered the passages.")
    query: str
    ranked: list[ScoredPassage] = Field(default_factory=list, description="Best first.")
    candidates: int = Field(..., ge=0, description="How many passages were scored.")
    evidence: dict[str, JsonValue] = Field(
        default_factory=dict, description="Measurements for the whole call (truncations, ...).")
    latency_ms: float = Field(0.0, ge=0.0)

    @property
    def passages(self) -> list[Passage]:
        """The kept passages, best first, each carrying the reranker's score."""
        return [s.passage.model_copy(update={"score": s.score}) for s in self.ranked]

    def annotations(self) -> list[tuple[ScoredPassage, dict[str, JsonValue]]]:
        """Each kept passage, best first, with the record framework adapters attach to
        their copy of it: ``{"reranker", "rank" (1 = best), "score", "candidates",
        "evidence"}``."""
        return [(s, {"reranker": self.reranker, "rank": rank, "score": s.score,
                     "candidates": self.candidates, "evidence": dict(s.evidence)})
                for rank, s in enumerate(self.ranked, start=1)]


def check_result(result: object, reranker: object) -> RerankResult:
    """``result`` if it is a :class:`RerankResult`, else a TypeError naming ``reranker``
    (for adapters that accept any object following the protocol)."""
    if not isinstance(result, RerankResult):
        name = getattr(reranker, "name", type(reranker).__name__)
        raise TypeError(f"reranker {name!r} returned {type(result).__name__}, expected a "
                        "rag_gates RerankResult")
    return result


def check_query(query: object) -> str:
    """Validate a reranker's query (a non-empty, encodable str) before anything else, also
    when there are no candidates: adapters call it before their empty-list shortcut."""
    return check_text(query, "query")


def check_top_n(top_n: int | None) -> int | None:
    """Validate ``top_n`` (None = keep all); raise ValueError saying what is allowed."""
    if top_n is None:
        return None
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
        raise ValueError(f"top_n must be a positive int or None (keep all), got {top_n!r}")
    return top_n


@runtime_checkable
class PassageReranker(Protocol):
    """Scores passages for a query and returns them best first."""

    @property
    def name(self) -> str: ...

    def rerank(self, query: str, passages: Sequence[Passage], top_n: int | None = None,
               **signals: Any) -> RerankResult: ...

    async def arerank(self, query: str, passages: Sequence[Passage], top_n: int | None = None,
                      **signals: Any) -> RerankResult: ...


class BaseReranker(ABC):
    """Implement :meth:`score_passages`; ``rerank`` and ``arerank`` come free.

    Ties keep the input order (a stable sort), so equal scores never shuffle passages.
    """

    name: str = "reranker"

    @abstractmethod
    def score_passages(self, query: str, passages: Sequence[Passage], **signals: Any
                       ) -> PassageScores:
        """One score per passage (higher = better), with the evidence behind them."""

    def rerank(self, query: str, passages: Sequence[Passage], top_n: int | None = None,
               **signals: Any) -> RerankResult:
        """Passages best first (at most ``top_n``); ``signals`` pass to :meth:`score_passages`
        (e.g. ``question_confidence`` for the CBDR reranker, already known from the gate)."""
        query = check_query(query)
        top_n = check_top_n(top_n)
        if isinstance(passages, str | Passage) or not isinstance(passages, Sequence):
            raise TypeError("passages must be a list of rag_gates Passage objects")
        for i, p in enumerate(passages):
            if not isinstance(p, Passage):
                raise TypeError(f"passage {i} must be a rag_gates Passage, got "
                                f"{type(p).__name__}")
            check_encodable(p.text, f"passage {i} text")
            if p.title is not None:
                check_encodable(p.title, f"passage {i} title")
        start = time.perf_counter()
        if not passages:
            return RerankResult(reranker=self.name, query=query, candidates=0)
        out = self.score_passages(query, passages, **signals)
        scores = out.scores
        per_passage = out.per_passage or [{} for _ in passages]
        if len(scores) != len(passages) or len(per_passage) != len(passages):
            raise RuntimeError(f"{type(self).__name__}.score_passages returned {len(scores)} "
                               f"scores for {len(passages)} passages")
        evidence = out.evidence
        # NaN breaks sorted() (every comparison is False, so the order is arbitrary): a
        # passage whose score is not finite ranks last, and the evidence names it.
        broken = {i for i, x in enumerate(scores) if not math.isfinite(float(x))}
        if broken:
            evidence = {**evidence, "non_finite_scores": list[JsonValue](sorted(broken))}
        order = sorted(range(len(passages)),
                       key=lambda i: (i in broken, -scores[i] if i not in broken else 0.0))
        if top_n is not None:
            order = order[:top_n]
        return RerankResult(
            reranker=self.name, query=query, candidates=len(passages), evidence=evidence,
            ranked=[ScoredPassage(index=i, score=float(scores[i]), passage=passages[i],
                                  evidence=per_passage[i]) for i in order],
            latency_ms=(time.perf_counter() - start) * 1000.0,
        )

    async def arerank(self, query: str, passages: Sequence[Passage], top_n: int | None = None,
                      **signals: Any) -> RerankResult:
        """:meth:`rerank` in a worker thread, so a local model never blocks the event loop."""
        return await asyncio.to_thread(self.rerank, query, passages, top_n, **signals)


def check_reranker(value: object) -> PassageReranker:
    """``value`` if it follows the :class:`PassageReranker` protocol, else a TypeError
    saying what to pass (for the framework shells, which accept any reranker)."""
    if not isinstance(value, PassageReranker):
        raise TypeError(
            f"reranker must follow rag_gates' PassageReranker protocol (name, rerank, "
            f"arerank), got {type(value).__name__}; e.g. rag_gates.cbdr."
            "ConfidenceGainReranker(lm, probe), or use ConfidenceGainReranker.from_probe"
        )
    return value

