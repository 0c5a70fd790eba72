"""The gate protocol: decide whether to retrieve, with a score, a threshold and a reason.

A gate's ``score`` is oriented so that higher means more need to retrieve; it retrieves when
``score >= threshold``. Thresholds are data: ``rag-gates eval-gate`` calibrates them.

The fail-closed rule: **when a gate cannot decide, it retrieves.** A score that is not a
finite number (NaN from a damaged probe, infinity from an empty answer) never turns retrieval
off: the decision is ``retrieve=True`` with ``score`` = :data:`UNDECIDED_SCORE` (the largest
finite float, so it ranks above every real score and stays valid JSON), the raw value as a
string in ``evidence["raw_score"]``, why in ``evidence["undecided"]``, and a reason that says
the gate could not decide. :class:`BaseGate` enforces it: every decision is built by
:meth:`BaseGate.decision`, also by subclasses that override ``decide_batch``.

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
import math
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import JsonValue

from rag_gates._text import check_text
from rag_gates.types import GateDecision

__all__ = ["UNDECIDED_SCORE", "BaseGate", "Gate", "json_safe"]

UNDECIDED_SCORE = sys.float_info.max
"""The score of a decision the gate could not make: finite (valid JSON), above any threshold."""


@runtime_checkable
class Gate(Protocol):
    """Decides, per query, whether retrieval is worth it.

    A gate that cannot decide (its score is not a finite number, a lookup failed) retrieves,
    and its decision's ``reason`` says why: a fault never silently turns retrieval off.
    """

    @property
    def name(self) -> str: ...

    threshold: float

    def decide(self, query: str, **signals: Any) -> GateDecision: ...

    async def adecide(self, query: str, **signals: Any) -> GateDecision: ...

    def decide_batch(self, queries: Sequence[str], **signals: Any) -> list[GateDecision]: ...


class BaseGate(ABC):
    """Implement :meth:`score`; ``decide``, ``adecide`` and ``decide_batch`` come free.

    Subclasses set ``name`` and may override :meth:`reason` for a better sentence and
    :meth:`undecided` to say why a non-finite score happened. A subclass that overrides
    ``decide`` or ``decide_batch`` builds its decisions with :meth:`decision`, which applies
    the fail-closed rule (see the module docstring).
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

    def undecided(self, score: float, evidence: dict[str, JsonValue]) -> str:
        """Why ``score`` is not a finite number (a clause for the reason); override to name
        the likely cause."""
        return f"its score is {score!r}"

    def decision(self, score: float, evidence: dict[str, JsonValue], *,
                 latency_ms: float = 0.0) -> GateDecision:
        """The decision for ``score``, under the fail-closed rule: a score that is not a
        finite number gives ``retrieve=True`` with a reason saying the gate could not decide.

        Example:
            >>> class Broken(BaseGate):
            ...     def score(self, query, **signals):
            ...         return float("nan"), {}
            >>> d = Broken(threshold=0.5).decide("Who wrote Hamlet?")
            >>> d.retrieve, d.evidence["raw_score"]
            (True, 'nan')
        """
        value = float(score)
        evidence = json_safe(evidence)
        if math.isfinite(value):
            retrieve = value >= self.threshold
            reason = self.reason(value, retrieve, evidence)
        else:
            why = self.undecided(value, evidence)
            evidence = {**evidence, "raw_score": repr(value), "undecided": why}
            value, retrieve = UNDECIDED_SCORE, True
            reason = f"{self.name} could not decide ({why}): retrieve"
        return GateDecision(
            gate=self.name, retrieve=retrieve, score=value, threshold=self.threshold,
            reason=reason, evidence=evidence, latency_ms=latency_ms,
        )

    def decide(self, query: str, **signals: Any) -> GateDecision:
        check_text(query, "query")
        start = time.perf_counter()
        value, evidence = self.score(query, **signals)
        return self.decision(value, evidence,
                             latency_ms=(time.perf_counter() - start) * 1000.0)

    async def adecide(self, query: str, **signals: Any) -> GateDecision:
        return await asyncio.to_thread(self.decide, query, **signals)

    def decide_batch(self, queries: Sequence[str], **signals: Any) -> list[GateDecision]:
        """Decisions in the order of ``queries``."""
        return [self.decide(q, **signals) for q in queries]


def json_safe(evidence: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """``evidence`` with every non-finite float (at any depth) replaced by its ``repr``
    (``'nan'``, ``'inf'``), so a decision always round-trips through JSON."""

    def fix(value: JsonValue) -> JsonValue:
        if isinstance(value, float) and not math.isfinite(value):
            return repr(value)
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fix(v) for v in value]
        return value

    return {k: fix(v) for k, v in evidence.items()}
