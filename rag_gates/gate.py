"""The gate protocol: decide whether to retrieve, with a score, a threshold and a reason.

A gate's ``score`` is oriented so that higher means more need to retrieve; it retrieves when
``score >= threshold``. Thresholds are data: ``rag-gates eval-gate`` calibrates them.

Example:
    >>> class LengthGate(BaseGate):
    ...     name = "length"
    ...     def score(self, query: str, **signals: object) -> tuple[float, dict]:
    ...         return float(len(query.split())), {"words": len(query.split())}
    >>> LengthGate(threshold=8).decide("Who wrote Hamlet?").retrieve
    False
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import JsonValue

from rag_gates.types import GateDecision

__all__ = ["BaseGate", "Gate"]


@runtime_checkable
class Gate(Protocol):
    """Decides, per query, whether retrieval is worth it."""

    @property
    def name(self) -> str: ...

    threshold: float

    def decide(self, query: str, **signals: Any) -> GateDecision: ...

    async def adecide(self, query: str, **signals: Any) -> GateDecision: ...

    def decide_batch(self, queries: Sequence[str], **signals: Any) -> list[GateDecision]: ...


class BaseGate(ABC):
    """Implement :meth:`score`; ``decide``, ``adecide`` and ``decide_batch`` come free.

    Subclasses set ``name`` and may override :meth:`reason` for a better sentence.
    """

    name: str = "gate"

    def __init__(self, threshold: float) -> None:
        if not isinstance(threshold, int | float) or threshold != threshold:
            raise ValueError(f"threshold must be a number, got {threshold!r}")
        self.threshold = float(threshold)

    @abstractmethod
    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        """The gate's score for ``query`` (higher = more need) and the evidence behind it."""

    def reason(self, score: float, retrieve: bool, evidence: dict[str, JsonValue]) -> str:
        verb = "retrieve" if retrieve else "answer without retrieval"
        relation = ">=" if retrieve else "<"
        return f"{self.name} score {score:.4g} {relation} threshold {self.threshold:.4g}: {verb}"

    def decide(self, query: str, **signals: Any) -> GateDecision:
        if not isinstance(query, str):
            raise TypeError(f"query must be a str, got {type(query).__name__}")
        if not query.strip():
            raise ValueError("query is empty or whitespace")
        start = time.perf_counter()
        value, evidence = self.score(query, **signals)
        retrieve = value >= self.threshold
        return GateDecision(
            gate=self.name, retrieve=retrieve, score=value, threshold=self.threshold,
            reason=self.reason(value, retrieve, evidence), evidence=evidence,
            latency_ms=(time.perf_counter() - start) * 1000.0,
        )

    async def adecide(self, query: str, **signals: Any) -> GateDecision:
        return await asyncio.to_thread(self.decide, query, **signals)

    def decide_batch(self, queries: Sequence[str], **signals: Any) -> list[GateDecision]:
        """Decisions in the order of ``queries``."""
        return [self.decide(q, **signals) for q in queries]
