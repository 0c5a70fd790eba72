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
import contextvars
import math
import re
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import JsonValue

from rag_gates._files import read_json
from rag_gates._text import check_text
from rag_gates.errors import WeightsFileError
from rag_gates.types import GateDecision

__all__ = [
    "GATE_GRAMMAR",
    "LOGPROB_TOLERANCE",
    "MAX_EXPRESSION_CHARS",
    "MAX_EXPRESSION_DEPTH",
    "MAX_EXPRESSION_TERMS",
    "MAX_WEIGHTS_FILE_BYTES",
    "UNDECIDED_SCORE",
    "AllOf",
    "AnyOf",
    "BaseGate",
    "Cascade",
    "Gate",
    "Weighted",
    "check_in_range",
    "check_threshold",
    "decision_margin",
    "fail_closed",
    "gate_error_decision",
    "is_gate_expression",
    "json_safe",
    "logistic_combination",
    "logprob_problem",
    "out_of_range",
    "parse_gate_expression",
]

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
    return GateDecision(
        gate=str(getattr(gate, "name", type(gate).__name__)), retrieve=True,
        score=UNDECIDED_SCORE,
        threshold=threshold if isinstance(threshold, int | float) and math.isfinite(threshold)
        else 0.0,
        reason=f"{getattr(gate, 'name', type(gate).__name__)} could not decide ({why}): "
               "retrieve",
        evidence={"undecided": why, "error": said})


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

    Subclasses set ``name`` and may override :meth:`reason` for a better sentence and
    :meth:`undecided` to say why a non-finite score happened. A subclass that overrides
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


# --- Composition ------------------------------------------------------------------------
#
# Gates on different scales (a corpus count, a probe's probability, a log-probability) are
# combined through their *margins*, ``score - threshold``: each sub-gate keeps its own
# calibrated threshold, and the sign of a margin is that gate's decision.


def _undecided(decision: GateDecision) -> bool:
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


def _dump(decision: GateDecision | None) -> JsonValue:
    return None if decision is None else decision.model_dump(mode="json")


def _check_gates(kind: str, gates: Sequence[Any], at_least: int) -> tuple[Gate, ...]:
    if len(gates) < at_least:
        raise ValueError(f"{kind} needs at least {at_least} gates, got {len(gates)}")
    for i, g in enumerate(gates):
        if not isinstance(g, Gate):
            raise TypeError(f"{kind}: argument {i} is a {type(g).__name__}, not a gate "
                            "(an object with name, threshold, decide, adecide, decide_batch)")
    return tuple(gates)


class _Composite(BaseGate):
    """A gate made of gates: its decisions carry the sub-decisions in their evidence and
    retrieve when any consulted sub-gate could not decide (the fail-closed rule)."""

    gates: tuple[Gate, ...]

    def decide(self, query: str, **signals: Any) -> GateDecision:
        check_text(query, "query")
        start = time.perf_counter()
        decisions = self._consult_one(query, signals)
        value, evidence = self._combine(decisions)
        return self.decision(value, evidence, latency_ms=(time.perf_counter() - start) * 1e3)

    async def adecide(self, query: str, **signals: Any) -> GateDecision:
        check_text(query, "query")
        start = time.perf_counter()
        decisions = await self._aconsult_one(query, signals)
        value, evidence = self._combine(decisions)
        return self.decision(value, evidence, latency_ms=(time.perf_counter() - start) * 1e3)

    def decide_batch(self, queries: Sequence[str], **signals: Any) -> list[GateDecision]:
        """Each sub-gate decides its whole batch at once, over the queries still open."""
        for q in queries:
            check_text(q, "query")
        start = time.perf_counter()
        per_query = self._consult_batch(list(queries), signals)
        share = (time.perf_counter() - start) * 1e3 / max(1, len(queries))
        return [self.decision(*self._combine(d), latency_ms=share) for d in per_query]

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        return self._combine(self._consult_one(query, signals))

    def undecided(self, score: float, evidence: dict[str, JsonValue]) -> str:
        if evidence.get("undecided_gate") is None:  # every sub-gate decided; the sum did not
            return f"its combined score is {score!r}"
        return f"sub-gate {evidence['undecided_gate']!s} could not decide"

    # Subclasses: which sub-gates to consult, and how their decisions combine.
    @abstractmethod
    def _consult_one(self, query: str, signals: dict[str, Any]) -> list[GateDecision]: ...

    @abstractmethod
    async def _aconsult_one(self, query: str, signals: dict[str, Any]
                            ) -> list[GateDecision]: ...

    @abstractmethod
    def _consult_batch(self, queries: list[str], signals: dict[str, Any]
                       ) -> list[list[GateDecision]]: ...

    @abstractmethod
    def _combine(self, decisions: list[GateDecision]) -> tuple[float, dict[str, JsonValue]]:
        ...

    def _fault(self, decisions: list[GateDecision], evidence: dict[str, JsonValue]
               ) -> tuple[float, dict[str, JsonValue]] | None:
        bad = next((d for d in decisions if _undecided(d)), None)
        if bad is None:
            return None
        return float("nan"), {**evidence, "undecided_gate": bad.gate}


class _Vote(_Composite):
    """AllOf / AnyOf: consult in order, stop at the first decision that settles it."""

    _settles: bool  # the sub-decision that settles the vote: AnyOf True, AllOf False
    _joiner: str

    def __init__(self, *gates: Gate, short_circuit: bool = True, name: str | None = None
                 ) -> None:
        super().__init__(threshold=0.0)
        self.gates = _check_gates(type(self).__name__, gates, 2)
        self.short_circuit = short_circuit
        self.name = name or f"({self._joiner.join(g.name for g in self.gates)})"

    def _stops(self, decision: GateDecision) -> bool:
        return _undecided(decision) or (self.short_circuit and decision.retrieve is self._settles)

    def _consult_one(self, query: str, signals: dict[str, Any]) -> list[GateDecision]:
        out: list[GateDecision] = []
        for gate in self.gates:
            out.append(gate.decide(query, **signals))
            if self._stops(out[-1]):
                break
        return out

    async def _aconsult_one(self, query: str, signals: dict[str, Any]) -> list[GateDecision]:
        out: list[GateDecision] = []
        for gate in self.gates:
            out.append(await gate.adecide(query, **signals))
            if self._stops(out[-1]):
                break
        return out

    def _consult_batch(self, queries: list[str], signals: dict[str, Any]
                       ) -> list[list[GateDecision]]:
        out: list[list[GateDecision]] = [[] for _ in queries]
        open_ = list(range(len(queries)))
        for gate in self.gates:
            if not open_:
                break
            for i, d in zip(open_, gate.decide_batch([queries[i] for i in open_], **signals),
                            strict=True):
                out[i].append(d)
            open_ = [i for i in open_ if not self._stops(out[i][-1])]
        return out

    def _combine(self, decisions: list[GateDecision]) -> tuple[float, dict[str, JsonValue]]:
        evidence: dict[str, JsonValue] = {
            "decisions": [_dump(d) for d in decisions], "consulted": len(decisions),
            "skipped": [g.name for g in self.gates[len(decisions):]]}
        fault = self._fault(decisions, evidence)
        if fault is not None:
            return fault
        margins = [decision_margin(d) for d in decisions]
        return (max(margins) if self._settles else min(margins)), evidence

    def reason(self, score: float, retrieve: bool, evidence: dict[str, JsonValue]) -> str:
        decisions = evidence["decisions"]
        assert isinstance(decisions, list)
        said = ", ".join(f"{d['gate']} {'retrieve' if d['retrieve'] else 'skip'}"  # type: ignore[index,call-overload]
                         for d in decisions)
        verb = "retrieve" if retrieve else "answer without retrieval"
        skipped = evidence["skipped"]
        rest = f"; not consulted: {', '.join(map(str, skipped))}" \
            if isinstance(skipped, list) and skipped else ""
        return f"{self.name}: {said}{rest}: {verb}"


class AllOf(_Vote):
    """Retrieve only when every gate asks for retrieval (fewer retrievals than any one).

    Gates are consulted in order and the first that says "no retrieval" settles it, so put
    the cheapest first. The score is the smallest margin (``score - threshold``) of the
    consulted gates, threshold 0; the sub-decisions are in ``evidence["decisions"]``. A
    sub-gate that cannot decide makes the whole decision retrieve, and the reason names it.

    Example:
        >>> from rag_gates.gate import AllOf
        >>> gate = AllOf(corpus_gate, probe_gate)          # doctest: +SKIP
        >>> gate.decide("Who wrote Hamlet?").evidence["consulted"]   # doctest: +SKIP
        1
    """

    _settles = False
    _joiner = "&"


class AnyOf(_Vote):
    """Retrieve when any gate asks for retrieval (fewer missed retrievals than any one).

    The first gate that asks for retrieval settles it; the score is the largest margin of
    the consulted gates, threshold 0. Otherwise as :class:`AllOf`.
    """

    _settles = True
    _joiner = "|"


class Cascade(_Composite):
    """Ask the cheap gate; only when its score falls in ``band`` (inclusive) ask the
    expensive one, whose decision then stands.

    The band is on the cheap gate's own score scale: put it around the cheap gate's
    threshold, where it is unsure. The score is the deciding gate's margin, threshold 0;
    ``evidence["expensive_called"]`` says whether the expensive gate ran, so a log counts
    the calls saved. A cheap gate that cannot decide retrieves (it is not passed on).

    Example:
        >>> gate = Cascade(QuCoGate(stats), CBDRGate(lm, probe), band=(0.3, 0.7))  # doctest: +SKIP
    """

    def __init__(self, cheap: Gate, expensive: Gate, band: tuple[float, float], *,
                 name: str | None = None) -> None:
        super().__init__(threshold=0.0)
        self.gates = _check_gates("Cascade", (cheap, expensive), 2)
        lo, hi = (float(x) for x in band)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise ValueError(f"Cascade band must be two finite numbers lo <= hi, got {band!r}")
        self.band = (lo, hi)
        self.name = name or f"cascade({cheap.name},{expensive.name},{lo:g},{hi:g})"

    def _passes_on(self, cheap: GateDecision) -> bool:
        return not _undecided(cheap) and self.band[0] <= cheap.score <= self.band[1]

    def _consult_one(self, query: str, signals: dict[str, Any]) -> list[GateDecision]:
        first = self.gates[0].decide(query, **signals)
        return [first, self.gates[1].decide(query, **signals)] if self._passes_on(first) \
            else [first]

    async def _aconsult_one(self, query: str, signals: dict[str, Any]) -> list[GateDecision]:
        first = await self.gates[0].adecide(query, **signals)
        return [first, await self.gates[1].adecide(query, **signals)] \
            if self._passes_on(first) else [first]

    def _consult_batch(self, queries: list[str], signals: dict[str, Any]
                       ) -> list[list[GateDecision]]:
        out = [[d] for d in self.gates[0].decide_batch(queries, **signals)]
        passed = [i for i, ds in enumerate(out) if self._passes_on(ds[0])]
        if passed:
            later = self.gates[1].decide_batch([queries[i] for i in passed], **signals)
            for i, d in zip(passed, later, strict=True):
                out[i].append(d)
        return out

    def _combine(self, decisions: list[GateDecision]) -> tuple[float, dict[str, JsonValue]]:
        evidence: dict[str, JsonValue] = {
            "cheap": _dump(decisions[0]),
            "expensive": _dump(decisions[1] if len(decisions) > 1 else None),
            "expensive_called": len(decisions) > 1, "band": list(self.band)}
        fault = self._fault(decisions, evidence)
        return fault if fault is not None else (decision_margin(decisions[-1]), evidence)

    def reason(self, score: float, retrieve: bool, evidence: dict[str, JsonValue]) -> str:
        verb = "retrieve" if retrieve else "answer without retrieval"
        cheap = self.gates[0].name
        if evidence["expensive_called"]:
            return (f"{cheap} score in its band {self.band[0]:g}..{self.band[1]:g}, "
                    f"{self.gates[1].name} decided: {verb}")
        return f"{cheap} decided outside its band {self.band[0]:g}..{self.band[1]:g}: {verb}"


class Weighted(_Composite):
    """A logistic combination of gate scores: retrieve when
    ``sigmoid(bias + sum_i w_i * (s_i - center_i) / scale_i) >= threshold``.

    Fit the weights with ``rag-gates fit-weighted`` (a logistic regression on the
    ``eval-gate`` decisions of calibration rows, saved as JSON) and load them with
    :meth:`from_json` or the expression ``weighted(FILE)``. Every gate is
    consulted (no short-circuit: every score enters the sum). A sub-gate that cannot decide
    makes the decision retrieve.

    Example:
        >>> gate = Weighted([quco, probe], weights=[0.8, 1.9], bias=-0.4)   # doctest: +SKIP
        >>> gate.decide("Who wrote Hamlet?").score      # the probability   # doctest: +SKIP
        0.62
    """

    name = "weighted"
    threshold_range = (0.0, 1.0)  # the score is a probability

    def __init__(self, gates: Sequence[Gate], weights: Sequence[float], bias: float = 0.0, *,
                 center: Sequence[float] | None = None, scale: Sequence[float] | None = None,
                 threshold: float = 0.5, name: str | None = None) -> None:
        super().__init__(threshold=threshold)
        self.gates = _check_gates("Weighted", gates, 1)
        n = len(self.gates)
        self.weights = self._numbers("weights", weights, n)
        self.center = self._numbers("center", center if center is not None else [0.0] * n, n)
        self.scale = self._numbers("scale", scale if scale is not None else [1.0] * n, n)
        if any(s <= 0 for s in self.scale):
            raise ValueError(f"Weighted scale must be positive, got {self.scale}")
        if not math.isfinite(bias):
            raise ValueError(f"Weighted bias must be finite, got {bias!r}")
        self.bias = float(bias)
        self.name = name or f"weighted({','.join(g.name for g in self.gates)})"

    @staticmethod
    def _numbers(what: str, values: Sequence[float], n: int) -> list[float]:
        out = [float(v) for v in values]
        if len(out) != n or not all(math.isfinite(v) for v in out):
            raise ValueError(f"Weighted {what} must be {n} finite numbers (one per gate), "
                             f"got {list(values)!r}")
        return out

    def to_json(self) -> dict[str, JsonValue]:
        """The fitted combination; :meth:`from_json` rebuilds it given the gates."""
        return {"gates": [g.name for g in self.gates], "weights": list(self.weights),
                "bias": self.bias, "center": list(self.center), "scale": list(self.scale),
                "threshold": self.threshold}

    @classmethod
    def from_json(cls, data: dict[str, Any], gates: Sequence[Gate]) -> Weighted:
        """Rebuild from :meth:`to_json`; ``gates`` must be the named gates, in order."""
        names = [g.name for g in gates]
        if list(data.get("gates", [])) != names:
            raise ValueError(f"these weights were fitted for gates {data.get('gates')}, "
                             f"not {names}")
        return cls(gates, data["weights"], data.get("bias", 0.0), center=data.get("center"),
                   scale=data.get("scale"), threshold=data.get("threshold", 0.5))

    def _consult_one(self, query: str, signals: dict[str, Any]) -> list[GateDecision]:
        return [g.decide(query, **signals) for g in self.gates]

    async def _aconsult_one(self, query: str, signals: dict[str, Any]) -> list[GateDecision]:
        return list(await asyncio.gather(*(g.adecide(query, **signals) for g in self.gates)))

    def _consult_batch(self, queries: list[str], signals: dict[str, Any]
                       ) -> list[list[GateDecision]]:
        columns = [g.decide_batch(queries, **signals) for g in self.gates]
        return [list(row) for row in zip(*columns, strict=True)]

    def _combine(self, decisions: list[GateDecision]) -> tuple[float, dict[str, JsonValue]]:
        evidence: dict[str, JsonValue] = {"decisions": [_dump(d) for d in decisions]}
        fault = self._fault(decisions, evidence)
        if fault is not None:
            return fault
        p, z = logistic_combination([d.score for d in decisions], self.weights, self.bias,
                                    self.center, self.scale)
        evidence["logit"] = z
        return p, evidence


def logistic_combination(scores: Sequence[float], weights: Sequence[float], bias: float,
                         center: Sequence[float], scale: Sequence[float]) -> tuple[float, float]:
    """``(sigmoid(z), z)`` with ``z = bias + sum_i w_i (s_i - center_i) / scale_i``: the one
    implementation of :class:`Weighted`'s score. Calibration scores composites with it too,
    because a certified threshold is one of the calibration rows' own scores: a score
    computed one ulp lower in serving would skip that whole tie group uncertified.

    Example:
        >>> logistic_combination([2.0], [1.0], 0.0, [2.0], [1.0])
        (0.5, 0.0)
    """
    z = bias + sum(w * (x - c) / s for w, x, c, s in
                   zip(weights, scores, center, scale, strict=True))
    if math.isnan(z):  # terms overflowed to +inf and -inf: undecided, so the gate retrieves
        return math.nan, z
    return (1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0), z


# --- The gate-expression grammar (``rag-gates bench`` / ``eval-gate`` names) ---------------

GATE_GRAMMAR = """\
expr     := any
any      := all ('|' all)*                      AnyOf: retrieve if any retrieves
all      := unit ('&' unit)*                    AllOf: retrieve if all do ('&' binds tighter)
unit     := '(' expr ')'
          | 'cascade(' expr ',' expr ',' LO ',' HI ')'
                                                the second decides when the first's score
                                                is in [LO, HI], else the first does
          | 'weighted(' FILE ')'                weights fitted by rag-gates fit-weighted
          | NAME [':' THRESHOLD]                a registered gate, optionally at a threshold
                                                (on the gate's score scale)
limits:   4096 characters, 64 gate names, 32 levels of nesting ('(', cascade, weighted,
          counted through the gates a weights file names)
examples: quco&cbdr   quco|answer-logprob:1.2   cascade(quco,cbdr,0.2,0.8)
          (quco&cbdr)|first-token-prob"""

#: The longest gate expression read (checked before it is tokenized).
MAX_EXPRESSION_CHARS = 4096
#: The most gate names one expression holds (each may load a model or an index).
MAX_EXPRESSION_TERMS = 64
#: The deepest nesting of '(', cascade( and weighted(, through weights files too (the parser
#: and the composite gates recurse once per level).
MAX_EXPRESSION_DEPTH = 32
#: The largest weights file read (a fitted file is well under 10 KB).
MAX_WEIGHTS_FILE_BYTES = 1024 * 1024

_TOKEN = re.compile(r"\s*(?:(?P<punct>[()&|,])|(?P<word>[^\s()&|,]+))")
# Nesting and the weights files being read, across the nested parses a weights file's gate
# names start (resolve -> make_gate -> parse_gate_expression): per thread and task.
_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("rag_gates_gate_depth",
                                                             default=0)
_READING: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "rag_gates_weights_files", default=())


def is_gate_expression(text: str) -> bool:
    """True when ``text`` is a composite expression rather than one gate's name."""
    return any(c in text for c in "()&|,")


def _is_gate_name(tokens: list[tuple[str, int]], i: int) -> bool:
    """Whether token ``i`` names a gate (not punctuation, a keyword, a band or a file)."""
    word = tokens[i][0]
    if word in "()&|," or (i + 1 < len(tokens) and tokens[i + 1][0] == "("):
        return False
    if i >= 2 and tokens[i - 1][0] == "(" and tokens[i - 2][0] == "weighted":
        return False
    try:
        float(word)
    except ValueError:
        return True
    return False


def _shown(text: str) -> str:
    return repr(text if len(text) <= 80 else f"{text[:60]}...{text[-12:]}")


def parse_gate_expression(text: str, resolve: Callable[[str, float | None], Gate],
                          load_weights: Callable[[str], dict[str, Any]] | None = None
                          ) -> Gate:
    """Build the gate an expression names (grammar and limits: :data:`GATE_GRAMMAR`).

    ``resolve(name, threshold)`` builds one registered gate (threshold None: its default);
    ``load_weights(path)`` reads a ``weighted(FILE)`` JSON (default: the file, at most
    :data:`MAX_WEIGHTS_FILE_BYTES`). A malformed expression raises :class:`ValueError`
    saying where and what was expected; one over a limit (:data:`MAX_EXPRESSION_CHARS`,
    :data:`MAX_EXPRESSION_TERMS`, :data:`MAX_EXPRESSION_DEPTH`) names the limit, and is
    refused before any gate is built for the terms past it. A weights file that is not the
    JSON ``rag-gates fit-weighted`` writes, or whose gates name the file itself, raises
    :class:`~rag_gates.errors.WeightsFileError` naming the file.

    Example:
        >>> class Words(BaseGate):
        ...     def score(self, query, **signals):
        ...         return float(len(query.split())), {}
        >>> def resolve(name, threshold):
        ...     gate = Words(threshold if threshold is not None else 3.0)
        ...     gate.name = name
        ...     return gate
        >>> parse_gate_expression("short:2&long:9", resolve).name
        '(short&long)'
    """
    if not isinstance(text, str):
        raise TypeError(f"a gate expression is a str, got {type(text).__name__}")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"gate expression {_shown(text)} is {len(text):,} characters long, "
                         f"more than the limit of {MAX_EXPRESSION_CHARS:,} characters")
    tokens: list[tuple[str, int]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            break
        tokens.append((m.group("punct") or m.group("word"), m.start(m.lastindex or 0)))
        pos = m.end()
    if not tokens:
        raise ValueError(f"empty gate expression {text!r}\n{GATE_GRAMMAR}")
    # Count the gate names first: none is built (a model, an index) if there are too many.
    names = sum(1 for i in range(len(tokens)) if _is_gate_name(tokens, i))
    if names > MAX_EXPRESSION_TERMS:
        raise ValueError(f"gate expression {_shown(text)} names {names} gates, more than the "
                         f"limit of {MAX_EXPRESSION_TERMS} gates in one expression")
    cursor = 0

    def fail(expected: str) -> ValueError:
        where = (f"at {tokens[cursor][0]!r} (character {tokens[cursor][1]})"
                 if cursor < len(tokens) else "at its end")
        return ValueError(f"gate expression {text!r}: expected {expected} {where}\n"
                          f"{GATE_GRAMMAR}")

    def peek() -> str | None:
        return tokens[cursor][0] if cursor < len(tokens) else None

    def take(expected: str) -> str:
        nonlocal cursor
        if cursor >= len(tokens) or (expected not in ("a gate name", "a number", "a file")
                                     and tokens[cursor][0] != expected):
            raise fail(repr(expected) if len(expected) == 1 else expected)
        cursor += 1
        return tokens[cursor - 1][0]

    def number() -> float:
        word = take("a number")
        try:
            value = float(word)
        except ValueError:
            cursor_back()
            raise fail("a number") from None
        if not math.isfinite(value):
            cursor_back()
            raise fail("a finite number")
        return value

    def cursor_back() -> None:
        nonlocal cursor
        cursor -= 1

    def any_() -> Gate:
        parts = [all_()]
        while peek() == "|":
            take("|")
            parts.append(all_())
        return parts[0] if len(parts) == 1 else AnyOf(*parts)

    def all_() -> Gate:
        parts = [unit()]
        while peek() == "&":
            take("&")
            parts.append(unit())
        return parts[0] if len(parts) == 1 else AllOf(*parts)

    def unit() -> Gate:
        word = peek()
        if word is None or word in "&|,)":
            raise fail("a gate name or '('")
        nested = word == "(" or (word in ("cascade", "weighted") and cursor + 1 < len(tokens)
                                 and tokens[cursor + 1][0] == "(")
        if not nested:
            return named(take("a gate name"))
        depth = _DEPTH.get() + 1
        if depth > MAX_EXPRESSION_DEPTH:
            raise ValueError(
                f"gate expression {_shown(text)} is nested deeper than "
                f"{MAX_EXPRESSION_DEPTH} levels (the limit; '(', cascade( and weighted( "
                "count, through the gates of weights files too)")
        token = _DEPTH.set(depth)
        try:
            return inner()
        finally:
            _DEPTH.reset(token)

    def inner() -> Gate:
        word = take("a gate name")
        if word == "(":
            gate = any_()
            take(")")
            return gate
        take("(")
        if word == "cascade":
            cheap = any_()
            take(",")
            expensive = any_()
            take(",")
            lo = number()
            take(",")
            hi = number()
            take(")")
            if lo > hi:
                raise ValueError(f"gate expression {text!r}: cascade band {lo:g}..{hi:g} "
                                 "is empty (LO must be <= HI)")
            return Cascade(cheap, expensive, (lo, hi))
        path = take("a file")
        take(")")
        return _weighted_from_file(path, resolve, load_weights)

    def named(word: str) -> Gate:
        name, colon, threshold = word.partition(":")
        if colon:
            try:
                value = float(threshold)
            except ValueError:
                raise ValueError(f"gate expression {text!r}: {word!r} has threshold "
                                 f"{threshold!r}, not a number\n{GATE_GRAMMAR}") from None
            if not math.isfinite(value):
                raise ValueError(f"gate expression {text!r}: threshold of {name!r} must be "
                                 f"finite, got {threshold!r}")
            return resolve(name, value)
        return resolve(name, None)

    gate = any_()
    if cursor != len(tokens):
        raise fail("'&', '|' or the end")
    return gate


def _read_weights(path: str) -> Any:
    """A weights file's JSON, bounded in size and depth before it is parsed."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"weighted({path}): no such file; fit one with "
                                "rag-gates fit-weighted")
    # The bounded reader: size, nesting, UTF-8 and finite numbers, each failure naming it.
    return read_json(file, max_bytes=MAX_WEIGHTS_FILE_BYTES, max_depth=8,
                     fix=f"weighted({path}) expects the JSON written by rag-gates "
                         "fit-weighted (a few hundred bytes)", error=WeightsFileError)


_WEIGHTS_SHAPE = ('an object {"gates": [names], "weights": [numbers, one per gate], "bias": '
                  'number, and optionally "center"/"scale" (numbers, one per gate), '
                  '"threshold" (a probability in [0, 1]) and "gate_thresholds" (a number or '
                  'null per gate)}, as rag-gates fit-weighted writes it')


def _check_weights(path: str, data: Any) -> tuple[list[str], list[float | None]]:
    """The gate names and their thresholds of a weights file's data, or WeightsFileError
    naming the file, what is wrong and the shape expected."""

    def bad(what: str) -> WeightsFileError:
        return WeightsFileError(f"weighted({path}): {what}; expected {_WEIGHTS_SHAPE}")

    def is_number(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)

    if not isinstance(data, dict):
        raise bad(f"the file holds a JSON {type(data).__name__}, not a JSON object")
    names = data.get("gates")
    if not isinstance(names, list) or not names or not all(
            isinstance(n, str) and n for n in names):
        raise bad("'gates' is not a non-empty list of gate names")
    if len(names) > MAX_EXPRESSION_TERMS:
        raise bad(f"it names {len(names)} gates, more than the limit of "
                  f"{MAX_EXPRESSION_TERMS}")
    n = len(names)
    for key, required in (("weights", True), ("center", False), ("scale", False),
                          ("gate_thresholds", False)):
        value = data.get(key)
        if value is None and not required:
            continue
        allowed_null = key == "gate_thresholds"
        if not isinstance(value, list) or len(value) != n or not all(
                is_number(v) or (allowed_null and v is None) for v in value):
            got = f"{len(value)} values" if isinstance(value, list) else repr(value)[:40]
            raise bad(f"{key!r} must be {n} finite numbers{' or nulls' if allowed_null else ''}"
                      f" (one per gate), got {got}")
    for key in ("bias", "threshold"):
        if key in data and not is_number(data[key]):
            raise bad(f"{key!r} must be a finite number, got {data[key]!r}")
    thresholds = data.get("gate_thresholds") or [None] * n
    return names, [None if t is None else float(t) for t in thresholds]


def _weighted_from_file(path: str, resolve: Callable[[str, float | None], Gate],
                        load: Callable[[str], dict[str, Any]] | None) -> Weighted:
    key = str(Path(path).expanduser().resolve()) if load is None else path
    reading = _READING.get()
    if key in reading:
        chain = " -> ".join(f"weighted({p})" for p in (*reading[reading.index(key):], key))
        raise WeightsFileError(f"weighted({path}) names itself through its gates ({chain}): "
                               "a weights file cannot include itself")
    data = _read_weights(path) if load is None else load(path)
    names, thresholds = _check_weights(path, data)
    token = _READING.set((*reading, key))
    try:
        gates = [resolve(name, t) for name, t in zip(names, thresholds, strict=True)]
    finally:
        _READING.reset(token)
    try:
        return Weighted.from_json(data, gates)
    except ValueError as exc:
        raise WeightsFileError(f"weighted({path}): {exc}") from None
