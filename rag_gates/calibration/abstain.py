"""Certified abstention: a three-way policy (answer closed book -> retrieve -> abstain) with two
risks controlled at once: :func:`calibrate_abstention` (``calibrate(abstain=ALPHA)``).

The policy, for a gate score ``s1`` (higher = retrieve) and a with-passages score ``s2``
(higher = the answer from the passages is less reliable; ``answer-logprob``: ``-mean log p``
of the answer generated from the passages):

* ``s1 < t1``: answer closed book (skip retrieval);
* otherwise retrieve, and answer from the passages when ``s2 < t2``, else abstain.

The promise: with probability at least ``1 - delta`` over the draw of the calibration
questions, on the population they came from, at once

1. skipping costs at most ``epsilon`` accuracy against always retrieving (the certificate
   :func:`~rag_gates.calibration.calibrate` gives, unchanged), and
2. the share of **all** questions that get a wrong answer (``P(answered and wrong)``, the
   risk conformal abstention controls, arXiv 2405.01563) is at most ``alpha``.

How (Learn-then-Test, arXiv 2110.01052, with Bonferroni over a small grid). Risk 2 splits:
``P(answered and wrong) <= A(t1) + B(t2)`` with ``A(t1) = P(s1 < t1 and closed-book wrong)``
and ``B(t2) = P(s2 < t2 and retrieved answer wrong)`` over every question (the retrieved ones
are a subset, so ``B`` bounds their part). Each depends on one threshold, so each is a 1-D
fixed sequence from its safe end ("retrieve always", "abstain always") upward, like the skip
certificate: ``t1`` must pass both the skip test (the user's bound, at ``delta / 2``) and
``A <= s * alpha`` (exact binomial tail), ``t2`` must pass ``B <= (1 - s) * alpha``. The split
``s`` is one of :data:`CLOSED_SHARES`, fixed before the data are seen; the ``A`` and ``B``
tests of every split share the other ``delta / 2`` (each at ``delta / (4 * len(splits))``),
so whichever split is picked, by the union bound the chance that any certificate used is
wrong is at most ``delta``. The pair picked skips most, then abstains least, on the
calibration questions. A question whose with-passages score could not be computed is
abstained on (fail closed for this outcome: no answer is safer than an unchecked one).

Example:
    >>> from rag_gates.calibration import calibrate, read_records, ModelIdentity
    >>> report = calibrate(read_records("records.jsonl"), max_loss=0.05, delta=0.1,
    ...     abstain=0.3, model=ModelIdentity.of(lm), retriever="bm25")  # doctest: +SKIP
    >>> spec = report.best; spec.threshold, spec.abstain.threshold          # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from rag_gates.calibration.bounds import clopper_pearson
from rag_gates.calibration.certify import Bound, certified_cut, cut_table
from rag_gates.calibration.fit import usable_score
from rag_gates.calibration.records import CalibrationRecord
from rag_gates.calibration.rows import row_named
from rag_gates.calibration.spec import (
    ASSUMPTION,
    AbstainCertificate,
    GateSpec,
    ModelIdentity,
    RateInterval,
    package_versions,
    utc_now,
)
from rag_gates.errors import CalibrationError

__all__ = ["CLOSED_SHARES", "PASSAGE_SCORE", "AbstentionReport", "AbstentionRow",
           "calibrate_abstention", "policy_outcomes"]

PASSAGE_SCORE = "answer-logprob"
"""The with-passages score ``rag-gates calibrate`` records: ``-mean log p`` of the answer the
model generates from the retrieved passages (the closed-book ``answer-logprob`` gate's
arithmetic, with the passages in the prompt)."""

CLOSED_SHARES = (0.25, 0.5, 0.75)
"""The splits of alpha tried: the share given to skipped questions answered wrongly."""


class AbstentionRow(BaseModel):
    """One gate's three-way certification: its skip threshold and the abstention threshold
    picked with it."""

    model_config = ConfigDict(frozen=True)

    gate: str
    threshold: float | None = Field(..., description="Skip retrieval when the gate's score "
                                    "< threshold; None = always retrieve.")
    abstain: AbstainCertificate
    n: int
    delta: float = Field(..., description="This gate's share of delta (family-wise).")
    unscored: int = 0
    skip_rate: RateInterval
    observed_drop: float
    observed_accuracy: float = Field(..., description="Share of the calibration questions "
                                     "answered rightly by the policy.")

    @property
    def observed_skip_rate(self) -> float:
        return self.skip_rate.observed

    @property
    def certified_skip_rate(self) -> float:
        return self.skip_rate.lower if self.threshold is not None else 0.0


class AbstentionReport(BaseModel):
    """Every gate's three-way certification at one (epsilon, alpha, delta, bound)."""

    model_config = ConfigDict(frozen=True)

    rows: list[AbstentionRow]
    epsilon: float
    max_error: float
    delta: float
    bound: Bound
    questions: int
    model: ModelIdentity
    retriever: str
    seed: int
    family: int
    score: str
    options: dict[str, object] = Field(default_factory=dict)

    def row(self, gate: str) -> AbstentionRow:
        return row_named(self.rows, gate)

    @property
    def best(self) -> GateSpec:
        """The spec that skips most (its certified lower bound, then observed), then
        abstains least."""
        def key(row: AbstentionRow) -> tuple[float, float, float]:
            return (row.certified_skip_rate, row.observed_skip_rate,
                    -row.abstain.abstain_rate.observed)

        return self.spec_for(max(self.rows, key=key).gate)

    def spec_for(self, gate: str) -> GateSpec:
        row = self.row(gate)
        retrieval = row.skip_rate.complement()
        skip = (f"skipping retrieval when the {gate} score is below {row.threshold:.6g} loses "
                f"at most {self.epsilon:g} accuracy against always retrieving"
                if row.threshold is not None else "retrieving always")
        note = (f"With probability >= {1 - self.delta:g} over the {row.n} certification "
                f"questions, at once: {skip}, and {row.abstain.note}")
        return GateSpec(
            gate=gate, options=dict(self.options), threshold=row.threshold,
            certified=row.threshold is not None, epsilon=self.epsilon, delta=self.delta,
            family=self.family, bound=self.bound, n=row.n, unscored=row.unscored,
            auroc=None, skip_rate=row.skip_rate, retrieval_rate=retrieval,
            observed_drop=row.observed_drop, model=self.model, retriever=self.retriever,
            versions=package_versions(), created=utc_now(), assumption=ASSUMPTION,
            note=note, abstain=row.abstain).sealed()


def _column(values: Sequence[float | None]) -> NDArray[np.float64]:
    return np.array([float(v) if v is not None and usable_score(v) else math.nan
                     for v in values], dtype=np.float64)


def _threshold(ranked: NDArray[np.float64], cut: int) -> float | None:
    """The threshold of a cut over ascending scores (NaN last): None for cut 0."""
    if cut == 0:
        return None
    scored = int(np.isfinite(ranked).sum())
    top = float(ranked[cut - 1])
    return float(ranked[cut]) if cut < scored else math.nextafter(top, math.inf)


def _fixed_sequence(scores: NDArray[np.float64], event: NDArray[np.bool_], rate: float,
                    delta: float) -> int:
    """The largest cut (the lowest-scoring rows taken) of the fixed sequence from cut 0
    upward, each cut tested at ``delta`` by the exact binomial tail for "the share of all
    rows that are taken and have ``event`` exceeds ``rate``": the skip certificate's
    ``binomial`` test with ``event`` as the harm."""
    pos, ok, _ = cut_table(scores[None, :])
    return int(certified_cut(pos, event.astype(np.float64)[None, :], ok, epsilon=rate,
                             delta=delta, bound="binomial")[0])


def policy_outcomes(s1: NDArray[np.float64], s2: NDArray[np.float64], t1: float | None,
                    t2: float | None, closed_right: NDArray[np.bool_],
                    retrieved_right: NDArray[np.bool_]) -> dict[str, NDArray[np.bool_]]:
    """What the three-way policy does on each question (NaN scores: retrieve, then abstain):
    boolean arrays ``skipped``, ``answered_retrieved``, ``abstained``, ``wrong`` (answered
    and wrong) and ``right``."""
    skipped = np.isfinite(s1) & (s1 < t1) if t1 is not None else np.zeros(s1.shape, bool)
    passes = np.isfinite(s2) & (s2 < t2) if t2 is not None else np.zeros(s2.shape, bool)
    answered_retrieved = ~skipped & passes
    abstained = ~skipped & ~passes
    wrong = (skipped & ~closed_right) | (answered_retrieved & ~retrieved_right)
    right = (skipped & closed_right) | (answered_retrieved & retrieved_right)
    return {"skipped": skipped, "answered_retrieved": answered_retrieved,
            "abstained": abstained, "wrong": wrong, "right": right}


def calibrate_abstention(records: Sequence[CalibrationRecord], *, max_loss: float = 0.05,
                         max_error: float, delta: float = 0.1, bound: Bound = "exact",
                         model: ModelIdentity, retriever: str,
                         gates: Sequence[str] | None = None, seed: int = 0,
                         family_wise: bool = True, score: str = PASSAGE_SCORE,
                         options: dict[str, object] | None = None) -> AbstentionReport:
    """Certify a skip threshold and an abstention threshold for every gate scored in
    ``records`` (the module's docstring states the guarantee and how).

    Args:
        records: labelled records (gold answers: an unlabelled record says nothing about
            whether the answer with retrieval is right) carrying the with-passages
            ``score`` in ``retrieved_scores`` (``rag-gates calibrate`` records it).
        max_loss: epsilon, the accuracy the skips may cost against always retrieving.
        max_error: alpha, the share of all questions that may get a wrong answer.
        delta: the probability that either bound fails.
        bound: the skip test (as :func:`~rag_gates.calibration.calibrate`); the error
            tests are exact binomial tails.
        family_wise: share delta among the gates (Bonferroni), so the guarantee holds for
            the one :attr:`AbstentionReport.best` picks.

    Raises:
        CalibrationError: what :func:`~rag_gates.calibration.calibrate` refuses, alpha
            outside (0, 1), unlabelled records, or records without the with-passages score.
    """
    from rag_gates.calibration.rows import _check, _gate_names, random_u

    _check(records, max_loss, delta, bound, seed)
    if isinstance(max_error, bool) or not isinstance(max_error, int | float) \
            or not 0.0 < float(max_error) < 1.0:
        raise CalibrationError(f"max_error (alpha) must lie strictly between 0 and 1, got "
                               f"{max_error!r}")
    unlabelled = [r.id for r in records if r.labels != "gold"]
    if unlabelled:
        raise CalibrationError(
            f"{len(unlabelled)} records are labelled by agreement (e.g. {unlabelled[0]!r}): "
            "certifying abstention needs gold answers, since it bounds how often the answer "
            "with retrieval is wrong; drop --no-labels or label those questions")
    missing = [r.id for r in records if score not in r.retrieved_scores]
    if missing:
        raise CalibrationError(
            f"{len(missing)} of {len(records)} records carry no with-passages score "
            f"{score!r} (e.g. {missing[0]!r}): they were written before abstention existed; "
            "re-run rag-gates calibrate in a new --work-dir to record it")
    names = _gate_names(records, gates)
    epsilon, alpha = float(max_loss), float(max_error)
    family = len(names) if family_wise else 1
    share = float(delta) / family
    per_split = share / (4 * len(CLOSED_SHARES))
    order = np.random.default_rng(seed).permutation(len(records))
    rows_in_order = [records[i] for i in order]
    loss = np.array([r.signed_loss_if_skipped for r in rows_in_order], dtype=np.float64)
    closed_right = np.array([r.closed_book_correct for r in rows_in_order])
    retrieved_right = np.array([r.retrieved_correct for r in rows_in_order])
    s2 = _column([r.retrieved_scores.get(score) for r in rows_in_order])
    n = len(records)
    ranked2 = cut_table(s2[None, :])[2]
    out = []
    for name in names:
        s1 = _column([r.scores.get(name) for r in rows_in_order])
        pos1, ok1, ranked1 = cut_table(s1[None, :])
        skip_cut = int(certified_cut(pos1, loss[None, :], ok1, epsilon=epsilon,
                                     delta=share / 2, bound=bound,
                                     u=np.array([random_u(seed)]))[0])
        best: tuple[tuple[int, int], int, int, float] | None = None
        for closed_share in CLOSED_SHARES:
            cut_a = _fixed_sequence(s1, ~closed_right, closed_share * alpha, per_split)
            cut_b = _fixed_sequence(s2, ~retrieved_right, (1 - closed_share) * alpha,
                                    per_split)
            cut1 = min(skip_cut, cut_a)
            allowed = np.nonzero(ok1[0][:cut1 + 1])[0]
            cut1 = int(allowed.max())
            t1, t2 = _threshold(ranked1[0], cut1), _threshold(ranked2[0], cut_b)
            abstained = int(policy_outcomes(s1, s2, t1, t2, closed_right,
                                            retrieved_right)["abstained"].sum())
            key = (cut1, -abstained)
            if best is None or key > best[0]:
                best = (key, cut1, cut_b, closed_share)
        assert best is not None
        _, cut1, cut_b, closed_share = best
        t1, t2 = _threshold(ranked1[0], cut1), _threshold(ranked2[0], cut_b)
        outcome = policy_outcomes(s1, s2, t1, t2, closed_right, retrieved_right)
        answered = int(n - outcome["abstained"].sum())
        wrong = int(outcome["wrong"].sum())
        abstained = int(outcome["abstained"].sum())
        lo, hi = clopper_pearson(abstained, n, 1.0 - share)
        answer_rule = (f"answering after retrieval only when the with-passages {score} score "
                       f"is below {t2:.6g}" if t2 is not None else
                       "abstaining after every retrieval")
        note = (f"{answer_rule}, the share of questions answered wrongly is at most {alpha:g} "
                f"(alpha split {closed_share:g} closed book / {1 - closed_share:g} with "
                f"passages; exact binomial tests; delta shared by Bonferroni).")
        certificate = AbstainCertificate(
            score=score, threshold=t2, max_error=alpha, closed_share=closed_share,
            abstain_rate=RateInterval(observed=abstained / n, lower=lo, upper=hi),
            observed_error=wrong / n,
            observed_answered_error=(wrong / answered) if answered else None,
            unscored=int(np.isnan(s2).sum()), note=note)
        skipped = outcome["skipped"]
        slo, shi = clopper_pearson(int(skipped.sum()), n, 1.0 - share)
        out.append(AbstentionRow(
            gate=name, threshold=t1, abstain=certificate, n=n, delta=share,
            unscored=int(np.isnan(s1).sum()),
            skip_rate=RateInterval(observed=float(skipped.mean()), lower=slo, upper=shi),
            observed_drop=float(loss[skipped].sum() / n),
            observed_accuracy=float(outcome["right"].mean())))
    return AbstentionReport(rows=out, epsilon=epsilon, max_error=alpha, delta=float(delta),
                            bound=bound, questions=n, model=model, retriever=retriever,
                            seed=seed, family=family, score=score,
                            options=dict(options or {}))
