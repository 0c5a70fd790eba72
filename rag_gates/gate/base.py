"""The gate protocol and its base: :class:`Gate`, :class:`BaseGate` (one decision per
score, under the fail-closed rule), the range checks every number that reaches a decision
passes, and :func:`fail_closed` for decisions made elsewhere. See :mod:`rag_gates.gate`."""

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

UNDECIDED_SCORE = sys.float_info.max
"""The score of a decision the gate could not make: finite (valid JSON), above any threshold."""


def gate_error_decision(gate: Any, error: BaseException) -> GateDecision:
    """The fail-closed decision for a gate whose ``decide`` raised: retrieve, at
    :data:`UNDECIDED_SCORE`, the error in the reason and in ``evidence["error"]``. For a
    caller that must not let the exception through (an agent's tool: LlamaIndex turns it
    into an error message and the LLM answers without the documents).

    Example:
        >>> from rag_gates.confidence import FirstTokenProbGate
        >>> gate = FirstTokenProbGate(lm)                                  # doctest: +SKIP
        >>> d = gate_error_decision(gate, TimeoutError("no answer in 30 s"))  # doctest: +SKIP
        >>> d.retrieve, d.evidence["error"]                                # doctest: +SKIP
        (True, 'TimeoutError: no answer in 30 s')
    """
    said = f"{type(error).__name__}: {error}"[:500]
    why = f"it raised {said}"
    threshold = getattr(gate, "threshold", 0.0)
    evidence: dict[str, JsonValue] = {"undecided": why, "error": said}
    spec = getattr(gate, "spec_evidence", None)  # a loaded spec: its name and guarantee,
    if isinstance(spec, dict):                   # or that an override voids it
        evidence["spec"] = json_safe(spec)
    return GateDecision(
        gate=str(getattr(gate, "name", type(gate).__name__)), retrieve=True,
        score=UNDECIDED_SCORE,
        threshold=threshold if isinstance(threshold, int | float) and math.isfinite(threshold)
        else 0.0,
        reason=f"{getattr(gate, 'name', type(gate).__name__)} could not decide ({why}): "
               "retrieve",
        evidence=evidence)


def out_of_range(value: object, low: float = -math.inf, high: float = math.inf, *,
                 tolerance: float = 0.0) -> str | None:
    """What is wrong with ``value`` as a number in ``[low, high]`` (each bound widened by
    ``tolerance``, for float rounding), or None when it is a finite number in range.

    The one check of every number that reaches a decision: a gate's score
    (:meth:`BaseGate.decision`: not finite -> retrieve), a kNN policy's keys and neighbour
    similarities (``SourcePolicy.vote``), a served model's log-probabilities (``<= 0``,
    ``OpenAICompatibleLM``). The caller turns the answer into its own typed error or a
    fail-closed decision.

    Example:
        >>> out_of_range(5.0, high=0.0, tolerance=1e-6)
        '5.0 is above 0.0 (tolerance 1e-06)'
        >>> out_of_range(-0.25, high=0.0) is None
        True
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{value!r} is not a number"
    number = float(value)
    if not math.isfinite(number):
        return f"{number!r} is not finite"
    said = f" (tolerance {tolerance:g})" if tolerance else ""
    if number < low - tolerance:
        return f"{number!r} is below {low!r}{said}"
    if number > high + tolerance:
        return f"{number!r} is above {high!r}{said}"
    return None


#: How far above 0 a reported log-probability may be (float rounding of log p for p near 1);
#: such a value is read as 0. Anything higher, or not finite, is not a log-probability.
LOGPROB_TOLERANCE = 1e-6


def logprob_problem(value: object) -> str | None:
    """What is wrong with ``value`` as a log-probability (finite, <= 0 within
    :data:`LOGPROB_TOLERANCE`), or None. Every gate that decides on reported
    log-probabilities checks them with this, whatever LLM wrapper (a server, a LangChain or
    LlamaIndex adapter) delivered them: a value above 0 would read as "more than certain".

    Example:
        >>> logprob_problem(0.3)
        '0.3 is above 0.0 (tolerance 1e-06)'
        >>> logprob_problem(-1.5) is None
        True
    """
    return out_of_range(value, high=0.0, tolerance=LOGPROB_TOLERANCE)


def _range_words(low: float, high: float) -> str:
    if math.isfinite(low) and math.isfinite(high):
        return f"a number in [{low:g}, {high:g}]"
    if math.isfinite(low):
        return f"a number >= {low:g}"
    if math.isfinite(high):
        return f"a number <= {high:g}"
    return "a finite number"


def check_in_range(value: object, what: str, low: float = -math.inf, high: float = math.inf,
                   ) -> float:
    """``value`` as a float if it is a finite number in ``[low, high]``, else a ValueError
    ``"{what}, a number in [low, high]"``. The one range check of thresholds and options:
    gates' thresholds (:attr:`BaseGate.threshold_range`, gate expressions) and the bench's
    ``METHOD@OPTION`` values.

    Example:
        >>> check_in_range(0.4, "cbdr's threshold", 0.0, 1.0)
        0.4
        >>> check_in_range(2, "cbdr's threshold", 0.0, 1.0)
        Traceback (most recent call last):
        ...
        ValueError: cbdr's threshold, a number in [0, 1]
    """
    if out_of_range(value, low, high) is not None:
        raise ValueError(f"{what}, {_range_words(low, high)}")
    return float(value)  # type: ignore[arg-type]


def check_threshold(gate: str, threshold: object, threshold_range: tuple[float, float]
                    ) -> float:
    """``threshold`` as a float if it lies on the gate's score scale ``threshold_range`` (one
    step above its top is allowed: the "never retrieve" threshold ``eval-gate`` calibrates
    when the largest score seen is the top), else a ValueError naming the gate and the range.
    The one check of a gate's threshold: :class:`BaseGate` applies it when a gate is built,
    and ``make_gate`` to every ``NAME:THRESHOLD`` of an expression before any gate is built.

    Example:
        >>> check_threshold("cbdr", 2.0, (0.0, 1.0))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: gate 'cbdr' at threshold 2.0: the threshold is on the gate's score ...
    """
    low, high = threshold_range
    return check_in_range(threshold, f"gate {gate!r} at threshold {threshold!r}: the threshold "
                          "is on the gate's score scale", low, math.nextafter(high, math.inf))


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

    Subclasses set ``name`` and may override :meth:`reason` for a better sentence (or only
    :meth:`score_label`, what it calls the score) and :meth:`undecided` to say why a
    non-finite score happened. A subclass that overrides
    ``decide`` or ``decide_batch`` builds its decisions with :meth:`decision`, which applies
    the fail-closed rule (see the module docstring).
    """

    name: str = "gate"
    #: The scale of this gate's score, where its threshold must lie (a subclass narrows it:
    #: ``(0.0, 1.0)`` for a probability); checked when the gate is built.
    threshold_range: tuple[float, float] = (-math.inf, math.inf)

    def __init__(self, threshold: float) -> None:
        self.threshold = check_threshold(self.name, threshold, self.threshold_range)

    @abstractmethod
    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        """The gate's score for ``query`` (higher = more need) and the evidence behind it."""

    def reason(self, score: float, retrieve: bool, evidence: dict[str, JsonValue]) -> str:
        verb = "retrieve" if retrieve else "answer without retrieval"
        relation = ">=" if retrieve else "<"
        return (f"{self.score_label(evidence)} {score:.4g} {relation} threshold "
                f"{self.threshold:.4g}: {verb}")

    def score_label(self, evidence: dict[str, JsonValue]) -> str:
        """What :meth:`reason` calls the score (``"<name> score"``); override to say what
        it measures, keeping the rest of the sentence."""
        return f"{self.name} score"

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
        if out_of_range(value) is None:
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



def is_undecided(decision: GateDecision) -> bool:
    """Could the gate not decide (its evidence says so, or its score is no finite number
    or the undecided sentinel)? The one test of it: composites, :func:`fail_closed` and a
    loaded spec's :class:`~rag_gates.calibration.CertifiedGate` all ask it."""
    return "undecided" in decision.evidence or not math.isfinite(decision.score) \
        or decision.score >= UNDECIDED_SCORE


def fail_closed(decision: GateDecision) -> GateDecision:
    """``decision``, unless it skips retrieval on a score that is no number (NaN, inf) or
    that its gate marked undecided: then a copy that retrieves and says why. :class:`BaseGate`
    never makes such a decision; a gate that follows the :class:`Gate` protocol without it
    can, and the framework wrappers pass every decision through this, as composites do.

    Example:
        >>> d = GateDecision(gate="remote", retrieve=False, score=float("nan"),
        ...                  threshold=0.5, reason="nan < 0.5")
        >>> fixed = fail_closed(d)
        >>> fixed.retrieve, fixed.evidence["raw_score"]
        (True, 'nan')
    """
    marked = decision.evidence.get("undecided")
    finite = math.isfinite(decision.score) and decision.score < UNDECIDED_SCORE
    if decision.retrieve or (finite and not marked):
        return decision
    why = (str(marked) if marked else
           f"its score {decision.score!r} is not a finite number" if not
           math.isfinite(decision.score) else
           f"its score {decision.score!r} is the undecided sentinel")
    return decision.model_copy(update={
        "retrieve": True, "score": UNDECIDED_SCORE,
        "reason": f"{decision.gate} could not decide ({why}): retrieve",
        "evidence": json_safe({**decision.evidence, "raw_score": repr(decision.score),
                               "undecided": why, "gate_said": decision.reason})})


def decision_margin(decision: GateDecision) -> float:
    """``score - threshold`` of a decision, with its sign forced to agree with
    ``retrieve`` (a gate that retrieves on ``score > threshold`` can have margin 0 and not
    retrieve): non-negative when it retrieves, negative when it does not."""
    margin = decision.score - decision.threshold
    if decision.retrieve:
        return max(margin, 0.0)
    return min(margin, math.nextafter(0.0, -1.0))

