"""Certify a gate threshold on labelled questions: :func:`calibrate`.

The promise: with probability at least ``1 - delta`` over the draw of the calibration
questions, skipping retrieval below the certified threshold costs at most ``max_loss``
(epsilon) accuracy against always retrieving, on the population the questions came from.
It assumes the calibration questions and future questions are exchangeable (drawn from the
same distribution, same model, retriever and corpus):
:data:`~rag_gates.calibration.spec.ASSUMPTION`.

How: Learn-then-Test fixed-sequence testing (:mod:`rag_gates.calibration.certify`) over the
thresholds from "retrieve always" upward, with one of three tests
(:mod:`rag_gates.calibration.bounds`): ``"exact"`` (the default: an exact unconditional
test on the counts of skipped questions retrieval would have fixed and would have misled),
``"binomial"`` (exact tail on the first count only; conservative) or ``"wsr"`` (a betting
test on the signed loss).
A gate that could not score a question (None / NaN) never skips it (fail closed).
Two composites are fitted on one half of the questions and certified on the other, never
both on the same rows: a :class:`~rag_gates.gate.Weighted` logistic combination of the
gates (predicting "closed-book answer wrong"), and a :class:`~rag_gates.gate.Cascade`
(:func:`fit_cascade`: which gate asks first, which decides in the band, and the band,
chosen on the fitting half).

Example:
    >>> from rag_gates.calibration import calibrate, read_records, ModelIdentity
    >>> report = calibrate(read_records("records.jsonl"), max_loss=0.05, delta=0.1,
    ...     model=ModelIdentity.of(lm), retriever="bm25 over docs/")  # doctest: +SKIP
    >>> [(r.gate, r.threshold, r.observed_skip_rate) for r in report.rows]  # doctest: +SKIP
    >>> report.best.save("gate.json")                                             # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, overload

from pydantic import BaseModel, ConfigDict, Field

from rag_gates.calibration.certify import Bound
from rag_gates.calibration.records import CalibrationRecord
from rag_gates.calibration.rows import (
    CASCADE_SHARES,
    MIN_QUESTIONS,
    GateRow,
    _auroc,
    _certify,
    _check,
    _Column,
    _columns,
    _gate_names,
    _labels_of,
    _score,
    _weighted_scores,
    cascade_scores,
    fit_cascade,
    fit_composite,
    random_u,
    row_named,
)
from rag_gates.calibration.spec import (
    ASSUMPTION,
    CascadeFit,
    GateSpec,
    ModelIdentity,
    WeightedFit,
    package_versions,
    utc_now,
)
from rag_gates.errors import CalibrationError

if TYPE_CHECKING:
    from rag_gates.calibration.groups import GroupCalibrationReport

__all__ = ["CASCADE_SHARES", "MIN_QUESTIONS", "CalibrationReport", "GateRow", "calibrate",
           "cascade_scores", "fit_cascade", "fit_composite", "random_u", "skip_curve"]
# Re-exported for the benchmarks and tests that import them from here.
_REEXPORTED = (_Column, _auroc, _score, _weighted_scores)


class CalibrationReport(BaseModel):
    """Every gate's certification at one (epsilon, delta, bound); :attr:`best` and
    :meth:`spec_for` give the spec to save."""

    model_config = ConfigDict(frozen=True)

    rows: list[GateRow]
    epsilon: float
    delta: float
    bound: Bound
    questions: int
    model: ModelIdentity
    retriever: str
    seed: int
    family: int = Field(1, description="Rows certified together: each at delta / family, so "
                        "the guarantee holds for any one picked from them (Bonferroni).")
    composite: WeightedFit | None = None
    composite_name: str | None = None
    cascade: CascadeFit | None = None
    cascade_name: str | None = None
    options: dict[str, object] = Field(default_factory=dict)
    labels: Literal["gold", "none", "mixed"] = "gold"
    judge: str | None = None

    def row(self, gate: str) -> GateRow:
        return row_named(self.rows, gate)

    @property
    def best(self) -> GateSpec:
        """The spec with the highest certified skip rate (ties: observed skip rate, then
        AUROC); when no gate certified a threshold, the best-AUROC gate's "always retrieve"
        spec."""
        def key(row: GateRow) -> tuple[float, float, float]:
            return (row.certified_skip_rate, row.observed_skip_rate if row.certified else -1,
                    row.auroc if row.auroc is not None else -1.0)

        return self.spec_for(max(self.rows, key=key).gate)

    def spec_for(self, gate: str) -> GateSpec:
        """The spec of one gate of this report (its threshold, guarantee and provenance)."""
        row = self.row(gate)
        composite = self.composite if gate == self.composite_name else None
        cascade = self.cascade if gate == self.cascade_name else None
        retrieval = row.skip_rate.complement()
        if row.certified:
            picked = (f" (each of {self.family} gates certified at delta/{self.family}, so "
                      "the guarantee holds for the one picked)") if self.family > 1 else ""
            note = (f"With probability >= {1 - self.delta:g} over the {row.n} certification "
                    f"questions, skipping retrieval when the {gate} score is below "
                    f"{row.threshold:.6g} loses at most {self.epsilon:g} accuracy against "
                    f"always retrieving ({self.bound} bound){picked}.")
        else:
            note = f"no threshold certified: always retrieve. {row.note}".strip()
        if self.labels != "gold":
            which = "without labels" if self.labels == "none" else \
                "with labels where the data had them"
            note += (f" Certified {which}: on an unlabelled question a skip counts as a loss "
                     f"whenever the closed-book reply and the reply with retrieval are not "
                     f"the same answer ({self.judge}), which bounds the accuracy it can "
                     "cost" + (" whatever the gold answers are." if self.judge == "exact" else
                               " as long as the judge never calls a right and a wrong reply "
                               "the same (its measured false-agreement rate: "
                               "docs/calibration.md)."))
        return GateSpec(
            gate=gate, composite=composite, cascade=cascade, options=dict(self.options),
            threshold=row.threshold, certified=row.certified,
            epsilon=self.epsilon, delta=self.delta, family=self.family, bound=self.bound,
            n=row.n,
            unscored=row.unscored, auroc=row.auroc, skip_rate=row.skip_rate,
            retrieval_rate=retrieval, observed_drop=row.observed_drop, model=self.model,
            retriever=self.retriever, versions=package_versions(), created=utc_now(),
            assumption=ASSUMPTION, note=note, labels=self.labels, judge=self.judge).sealed()


@overload
def calibrate(records: Sequence[CalibrationRecord], *, max_loss: float = ...,
              delta: float = ..., bound: Bound = ..., model: ModelIdentity, retriever: str,
              gates: Sequence[str] | None = ..., composite: bool = ..., seed: int = ...,
              family_wise: bool = ..., options: dict[str, object] | None = ...,
              by_group: Literal[False] = ...) -> CalibrationReport: ...


@overload
def calibrate(records: Sequence[CalibrationRecord], *, max_loss: float = ...,
              delta: float = ..., bound: Bound = ..., model: ModelIdentity, retriever: str,
              gates: Sequence[str] | None = ..., composite: bool = ..., seed: int = ...,
              family_wise: bool = ..., options: dict[str, object] | None = ...,
              by_group: Literal[True]) -> GroupCalibrationReport: ...


@overload
def calibrate(records: Sequence[CalibrationRecord], *, max_loss: float = ...,
              delta: float = ..., bound: Bound = ..., model: ModelIdentity, retriever: str,
              gates: Sequence[str] | None = ..., composite: bool = ..., seed: int = ...,
              family_wise: bool = ..., options: dict[str, object] | None = ...,
              by_group: bool) -> CalibrationReport | GroupCalibrationReport: ...


def calibrate(records: Sequence[CalibrationRecord], *, max_loss: float = 0.05,
              delta: float = 0.1, bound: Bound = "exact",
              model: ModelIdentity, retriever: str, gates: Sequence[str] | None = None,
              composite: bool = True, seed: int = 0, family_wise: bool = True,
              options: dict[str, object] | None = None,
              by_group: bool = False) -> CalibrationReport | GroupCalibrationReport:
    """Certify a threshold for every gate scored in ``records`` (and a fitted composite).

    Args:
        records: one :class:`CalibrationRecord` per labelled question (at least
            :data:`MIN_QUESTIONS`; the closed-book labels must hold both classes).
        max_loss: epsilon, the accuracy drop against always retrieving the threshold may
            cost, in (0, 1).
        delta: the probability that the guarantee fails, in (0, 1).
        bound: ``"exact"`` (exact unconditional test on the counts of harms and helps,
            up to :data:`~rag_gates.calibration.bounds.EXACT_MAX_N` questions),
            ``"exact-random"`` (its randomised version: a uniform draw from ``seed``,
            :func:`random_u`, spends the whole delta on discrete counts; another seed can
            give another threshold), ``"wsr"`` (betting test on the signed loss, any n) or
            ``"binomial"`` (exact tail on the harm count; conservative).
        model: the identity of the model that answered (:meth:`ModelIdentity.of`).
        retriever: one line describing the retriever and corpus behind the labels.
        gates: the gates to certify (default: every gate scored in the records).
        composite: also fit and certify the Weighted and Cascade composites of the gates
            (two or more), each fitted on one half of the questions and certified on the
            other.
        seed: the random order the betting test reads the questions in, the composites'
            fit/certify split, and the randomised exact test's uniform draw.
        family_wise: certify each of the G rows (gates and composite) at ``delta / G``, so
            that the one :attr:`CalibrationReport.best` picks keeps the guarantee at
            ``delta`` (Bonferroni). With False each row holds at ``delta`` on its own, and
            picking the best of several breaks it (measured: benchmarks/calibration_mc.py,
            row "best"). With one gate the two are the same.
        options: the gates' factory options, recorded in every spec (e.g. the dataset of
            the QA prompt).
        by_group: certify one threshold per ``group`` of the records instead, every group
            at once at ``delta`` (Bonferroni over groups and gates; no composites), and
            return a :class:`~rag_gates.calibration.groups.GroupCalibrationReport`
            (:func:`~rag_gates.calibration.groups.calibrate_by_group`).

    The guarantee, per gate: with probability >= 1 - delta over the draw of the
    calibration questions, the accuracy drop against always retrieving is <= max_loss on
    the population they came from. It assumes calibration and future questions are
    exchangeable (same distribution, model, retriever and corpus). With ``family_wise``
    (the default) it also holds for the gate :attr:`CalibrationReport.best` picks.

    Raises:
        CalibrationError: fewer than 30 questions, one closed-book class, epsilon or delta
            outside (0, 1), an unknown bound, a negative seed, duplicate ids, or gates
            nobody scored.
    """
    if by_group:
        from rag_gates.calibration.groups import calibrate_by_group

        return calibrate_by_group(records, max_loss=max_loss, delta=delta, bound=bound,
                                  model=model, retriever=retriever, gates=gates, seed=seed,
                                  family_wise=family_wise, options=options)
    _check(records, max_loss, delta, bound, seed)
    names = _gate_names(records, gates)
    columns = _columns(records, names, composite, seed, float(max_loss))
    family = len(columns) if family_wise else 1
    rows = [_certify(col, name, float(max_loss), float(delta) / family, bound, seed)
            for name, col in columns.items()]
    weighted = next(((n, c.fit) for n, c in columns.items() if n.startswith("weighted(")),
                    (None, None))
    cascade = next(((n, c.cascade) for n, c in columns.items() if n.startswith("cascade(")),
                   (None, None))
    labels, judge = _labels_of(records)
    return CalibrationReport(rows=rows, epsilon=float(max_loss), delta=float(delta),
                             bound=bound, questions=len(records), model=model,
                             retriever=retriever, seed=seed, family=family,
                             composite=weighted[1], composite_name=weighted[0],
                             cascade=cascade[1], cascade_name=cascade[0],
                             options=dict(options or {}), labels=labels, judge=judge)


def skip_curve(records: Sequence[CalibrationRecord], gate: str, epsilons: Sequence[float], *,
               delta: float = 0.1, bound: Bound = "exact",
               seed: int = 0) -> list[tuple[float, float]]:
    """``(epsilon, skip rate at the certified threshold on the certification rows)`` for
    each epsilon: the price of the guarantee, for a plot. ``gate`` is a gate scored in the
    records, or a composite's name (``weighted(A,B,...)`` or ``cascade(A,B,...)``, fitted
    as :func:`calibrate` does with the same ``seed``; the cascade is refitted at each
    epsilon, as calibrate() would choose it).

    Example:
        >>> skip_curve(records, "answer-logprob", [0.01, 0.02, 0.05])   # doctest: +SKIP
        [(0.01, 0.0), (0.02, 0.11), (0.05, 0.31)]
    """
    if not epsilons:
        return []
    _check(records, float(epsilons[0]), delta, bound, seed)
    composite = gate.startswith(("weighted(", "cascade("))
    names = _gate_names(records, None) if composite else _gate_names(records, [gate])
    out = []
    for eps in epsilons:
        _check(records, float(eps), delta, bound)
        columns = _columns(records, names, composite, seed, float(eps))
        if gate not in columns:
            raise CalibrationError(f"no gate {gate!r} to certify; available: "
                                   f"{', '.join(columns)}")
        row = _certify(columns[gate], gate, float(eps), delta, bound, seed)
        out.append((float(eps), row.observed_skip_rate))
    return out
