"""Gates made of gates: :class:`AllOf`, :class:`AnyOf`, :class:`Cascade` and
:class:`Weighted` (docs/composition.md).

Gates on different scales (a corpus count, a probe's probability, a log-probability) are
combined through their *margins*, ``score - threshold``: each sub-gate keeps its own
calibrated threshold, and the sign of a margin is that gate's decision."""

from __future__ import annotations

import asyncio
import math
import time
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

from pydantic import JsonValue

from rag_gates._text import check_text
from rag_gates.gate.base import (
    BaseGate,
    Gate,
    decision_margin,
    is_undecided,
)
from rag_gates.types import GateDecision


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
        bad = next((d for d in decisions if is_undecided(d)), None)
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
        return is_undecided(decision) or (self.short_circuit and decision.retrieve is self._settles)

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
        return not is_undecided(cheap) and self.band[0] <= cheap.score <= self.band[1]

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
