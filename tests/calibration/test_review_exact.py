"""Adversarial review of the certified threshold (issue 33): the served gate must make the
decisions that were certified.

A composite's threshold is one of the certification rows' own composite scores (the first
row retrieved). When gate scores are tied (a discrete gate, repeated questions), a whole
tie group sits exactly at the threshold: if serving computes the composite's score even one
ulp differently from calibration, that group is skipped in serving although the
certification counted it as retrieved, and the population drop can exceed epsilon.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from rag_gates.calibration import CalibrationRecord, ModelIdentity, calibrate, load_gate
from rag_gates.calibration.calibrate import _weighted_scores, cascade_scores
from rag_gates.calibration.load import GateContext, register_gate
from rag_gates.gate import BaseGate, Gate

# Eight question kinds, each asked many times: two discrete gate scores per kind.
KINDS = {f"kind{k}": (0.05 + 0.11 * k, (0.93 - 0.07 * k) ** 2) for k in range(8)}


class Table(BaseGate):
    """A real gate that reads its score from a table keyed by the question's kind."""

    def __init__(self, column: int, threshold: float = 0.5) -> None:
        super().__init__(threshold)
        self.column = column
        self.name = f"table{column}"

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, Any]]:
        return KINDS[query.split()[0]][self.column], {}


def _table(column: int) -> Any:
    def build(ctx: GateContext, threshold: float | None) -> Gate:
        return Table(column, 0.5 if threshold is None else threshold)
    return build


register_gate("table0", _table(0))
register_gate("table1", _table(1))


def _records(seed: int) -> list[CalibrationRecord]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(160):
        k = int(rng.integers(8))
        kind = f"kind{k}"
        # Higher kinds need retrieval more often.
        closed = bool(rng.random() > 0.1 * k)
        out.append(CalibrationRecord(
            id=str(i), question=f"{kind} question {i}", closed_book_correct=closed,
            retrieved_correct=bool(rng.random() < 0.9),
            scores={"table0": KINDS[kind][0], "table1": KINDS[kind][1]}))
    return out


def test_a_loaded_composite_skips_exactly_what_was_certified(tmp_path: Path) -> None:
    model = ModelIdentity(name="m", fingerprint="1" * 64)
    disagreements = []
    for seed in range(12):
        records = _records(seed)
        table = np.array([[r.scores["table0"], r.scores["table1"]] for r in records]).T
        report = calibrate(records, max_loss=0.1, delta=0.2, model=model, retriever="-",
                           seed=seed)
        for name in ("weighted(table0,table1)", "cascade(table0,table1)"):
            spec = report.spec_for(name)
            if spec.threshold is None:
                continue
            if spec.composite is not None:
                certified_scores = _weighted_scores(spec.composite, table)
            else:
                assert spec.cascade is not None
                certified_scores = cascade_scores(spec.cascade, table[0], table[1])
            gate = load_gate(spec, allow_other_model=True)
            for record, certified in zip(records, certified_scores, strict=True):
                served = gate.decide(record.question)
                if served.retrieve != bool(certified >= spec.threshold):
                    disagreements.append((seed, name, record.question.split()[0],
                                          served.score, float(certified), spec.threshold))
    assert not disagreements, (f"{len(disagreements)} served decisions differ from the "
                               f"certified ones, e.g. {disagreements[:3]}")


def test_served_composite_scores_equal_the_certified_ones_bit_for_bit() -> None:
    """The same fitted composite, scored by calibration and by the served gate, on
    continuous scores: any difference is a float-rounding disagreement."""
    model = ModelIdentity(name="m", fingerprint="1" * 64)
    records = _records(0)
    report = calibrate(records, max_loss=0.1, delta=0.2, model=model, retriever="-")
    spec = report.spec_for("weighted(table0,table1)")
    assert spec.composite is not None
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, size=(2, 500))
    certified = _weighted_scores(spec.composite, x)
    from rag_gates.gate import Weighted

    class Fixed(BaseGate):
        def __init__(self, values: np.ndarray) -> None:
            super().__init__(0.5)
            self.values = values
            self.name = "fixed"

        def score(self, query: str, **signals: Any) -> tuple[float, dict[str, Any]]:
            return float(self.values[int(query)]), {}

    fit = spec.composite
    served = Weighted([Fixed(x[0]), Fixed(x[1])], fit.weights, fit.bias, center=fit.center,
                      scale=fit.scale, threshold=0.5)
    differ = [i for i in range(x.shape[1])
              if served.decide(str(i)).score != certified[i]]
    assert not differ, f"{len(differ)} of {x.shape[1]} scores differ, e.g. " + ", ".join(
        f"{served.decide(str(i)).score!r} vs {certified[i]!r}" for i in differ[:2])
    assert math.isfinite(float(certified[0]))
