"""The rows of a certification: each gate's column of scores and signed losses, the
composites' fits, and one gate's certified threshold (:func:`certify_column`). Shared by
:func:`~rag_gates.calibration.calibrate`, the per-group certificates
(:mod:`rag_gates.calibration.groups`) and the three-way policy
(:mod:`rag_gates.calibration.abstain`), which all sit above it."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from rag_gates.calibration.bounds import EXACT_MAX_N, clopper_pearson
from rag_gates.calibration.certify import BOUNDS, Bound, certified_cut, cut_table, empirical_cut
from rag_gates.calibration.fit import cascade_band, fit_logistic, usable_score
from rag_gates.calibration.records import CalibrationRecord
from rag_gates.calibration.spec import CascadeFit, RateInterval, WeightedFit
from rag_gates.errors import CalibrationError
from rag_gates.gate import logistic_combination

__all__ = ["CASCADE_SHARES", "MIN_QUESTIONS", "GateRow", "cascade_scores", "fit_cascade",
           "fit_composite", "random_u", "row_named"]

class _Named(Protocol):
    @property
    def gate(self) -> str: ...


NamedRow = TypeVar("NamedRow", bound=_Named)


def row_named(rows: Sequence[NamedRow], gate: str) -> NamedRow:
    """The row of ``gate`` in a report's rows; KeyError naming the gates there."""
    for row in rows:
        if row.gate == gate:
            return row
    raise KeyError(f"no gate {gate!r} in this report; gates: "
                   f"{', '.join(r.gate for r in rows)}")


MIN_QUESTIONS = 30
"""Fewer calibration questions than this are refused: no bound certifies anything useful."""

CASCADE_SHARES = (0.1, 0.25, 0.5)
"""The band widths :func:`fit_cascade` tries: the share of fitting rows nearest the cheap
gate's own threshold that go to the expensive gate."""


class GateRow(BaseModel):
    """One gate's certification.

    ``skip_rate.observed`` is the share of certification questions that skip retrieval at
    the certified threshold (:attr:`observed_skip_rate`), ``skip_rate.lower`` /
    ``skip_rate.upper`` its Clopper-Pearson interval (confidence ``1 - delta``) for the
    population; :attr:`certified_skip_rate` is the lower end: the saving you can count on.
    """

    model_config = ConfigDict(frozen=True)

    gate: str
    auroc: float | None = Field(None, description="AUROC for 'closed-book answer wrong' on "
                                "the certification rows (None with one class there).")
    threshold: float | None = Field(..., description="Skip when score < threshold; None = "
                                    "no threshold certified: always retrieve.")
    n: int = Field(..., description="Certification rows.")
    delta: float = Field(..., description="The level this row was certified at: the report's "
                         "delta divided by the family size when family_wise.")
    n_fit: int = Field(0, description="Rows the composite was fitted on (not certified on).")
    unscored: int = Field(0, description="Certification rows the gate could not score.")
    skip_rate: RateInterval
    observed_drop: float = Field(..., description="Accuracy drop against always retrieving "
                                 "on the certification rows.")
    note: str = ""

    @property
    def certified(self) -> bool:
        return self.threshold is not None

    @property
    def observed_skip_rate(self) -> float:
        return self.skip_rate.observed

    @property
    def certified_skip_rate(self) -> float:
        return self.skip_rate.lower if self.certified else 0.0




@dataclass(frozen=True)
class _Column:
    """One gate's scores (NaN = could not score) and signed losses, certification rows in
    the order the betting test reads them."""

    scores: NDArray[np.float64]
    loss: NDArray[np.float64]
    closed: NDArray[np.float64]
    n_fit: int = 0
    fit: WeightedFit | None = None
    cascade: CascadeFit | None = None
    note: str = ""


def _check(records: Sequence[CalibrationRecord], max_loss: float, delta: float,
           bound: str, seed: int = 0) -> None:
    # numpy seeds are non-negative: a negative one failed deep in the fit or the exact
    # test ("expected non-negative integer"), naming no option.
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise CalibrationError(f"seed must be a non-negative integer, got {seed!r}")
    for what, value in (("max_loss (epsilon)", max_loss), ("delta", delta)):
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not 0.0 < float(value) < 1.0:
            raise CalibrationError(f"{what} must lie strictly between 0 and 1, got {value!r}")
    if bound not in BOUNDS:
        raise CalibrationError(f"bound must be one of {', '.join(BOUNDS)}, got {bound!r}")
    if bound in ("exact", "exact-random") and len(records) > EXACT_MAX_N:
        raise CalibrationError(
            f"{len(records)} calibration questions: the exact bound tabulates up to "
            f"{EXACT_MAX_N}; pass bound='wsr' (the betting test has no limit)")
    if len(records) < MIN_QUESTIONS:
        raise CalibrationError(
            f"{len(records)} calibration questions; at least {MIN_QUESTIONS} are needed (a "
            "few hundred to skip a useful share of retrievals): label more questions")
    closed = {r.closed_book_correct for r in records}
    if len(closed) < 2:
        state = "right" if closed == {True} else "wrong"
        raise CalibrationError(
            f"all {len(records)} closed-book answers are {state}: the labels hold one class, "
            "so no gate can be told apart from a constant; calibrate on questions where the "
            "model is sometimes right and sometimes wrong without retrieval")
    ids = [r.id for r in records]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise CalibrationError(f"question id {dup!r} appears more than once; each question "
                               "must be one record")


def _score(value: float | None) -> float:
    return float(value) if value is not None and usable_score(value) else math.nan


def _gate_names(records: Sequence[CalibrationRecord], gates: Sequence[str] | None) -> list[str]:
    if gates is not None:
        # One name given as a string is that gate, not its letters (each a "gate").
        names = [gates] if isinstance(gates, str) else list(dict.fromkeys(gates))
        if not names:  # else an empty report, whose best() failed in max()
            raise CalibrationError("gates is empty: name at least one gate scored in the "
                                   f"records ({', '.join(_gate_names(records, None))}), "
                                   "or pass None for all of them")
        missing = [g for g in names if not any(g in r.scores for r in records)]
        if missing:
            raise CalibrationError(f"no record holds a score for {', '.join(missing)}; gates "
                                   f"scored: {', '.join(_gate_names(records, None))}")
        return names
    names = list(dict.fromkeys(k for r in records for k in r.scores))
    if not names:
        raise CalibrationError("the records hold no gate scores; score a gate first")
    return names


def _columns(records: Sequence[CalibrationRecord], names: list[str], composite: bool,
             seed: int, epsilon: float) -> dict[str, _Column]:
    """Each gate's certification column (all rows, in a seeded random order), plus the
    composites' (fitted on the first half of that order, certified on the second)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(records))
    ordered = [records[i] for i in order]
    loss = np.array([r.signed_loss_if_skipped for r in ordered], dtype=np.float64)
    closed = np.array([float(r.closed_book_correct) for r in ordered])
    table = {g: np.array([_score(r.scores.get(g)) for r in ordered]) for g in names}
    out = {g: _Column(table[g], loss, closed) for g in names}
    usable = [g for g in names if np.isfinite(table[g]).any()]
    if not composite or len(usable) < 2:
        return out
    half = len(ordered) // 2
    fit_rows, cert_rows = np.arange(half), np.arange(half, len(ordered))
    x_fit = np.stack([table[g][fit_rows] for g in usable])
    x_cert = np.stack([table[g][cert_rows] for g in usable])
    one_class = ("the composite could not be fitted: in its fitting half the closed-book "
                 "answers are all right or all wrong")
    unfitted = _Column(np.full(len(cert_rows), math.nan), loss[cert_rows], closed[cert_rows],
                       n_fit=half, note=one_class)
    fit = fit_composite(usable, x_fit, closed[fit_rows])
    out[f"weighted({','.join(usable)})"] = unfitted if fit is None else _Column(
        _weighted_scores(fit, x_cert), loss[cert_rows], closed[cert_rows], n_fit=half, fit=fit)
    cascade = fit_cascade(usable, x_fit, loss[fit_rows], closed[fit_rows], epsilon)
    if cascade is None:
        out[f"cascade({','.join(usable)})"] = unfitted
    else:
        i, j = usable.index(cascade.cheap.gates[0]), usable.index(cascade.expensive.gates[0])
        out[f"cascade({','.join(usable)})"] = _Column(
            cascade_scores(cascade, x_cert[i], x_cert[j]), loss[cert_rows], closed[cert_rows],
            n_fit=half, cascade=cascade)
    return out


def cascade_scores(fit: CascadeFit, cheap: NDArray[np.float64],
                   expensive: NDArray[np.float64]) -> NDArray[np.float64]:
    """The cascade's score per row from its two gates' raw scores (NaN = unscored): the
    deciding gate's probability minus ``inner_threshold``, what the loaded
    :class:`~rag_gates.gate.Cascade` of two one-gate :class:`~rag_gates.gate.Weighted`
    returns. NaN where the cheap gate could not score, or it passed on and the expensive
    gate could not (the cascade then retrieves)."""
    p_cheap = _weighted_scores(fit.cheap, np.asarray(cheap, dtype=np.float64)[None, :])
    p_exp = _weighted_scores(fit.expensive, np.asarray(expensive, dtype=np.float64)[None, :])
    in_band = (p_cheap >= fit.band[0]) & (p_cheap <= fit.band[1])
    out: NDArray[np.float64] = np.where(in_band, p_exp, p_cheap) - fit.inner_threshold
    return out


def fit_cascade(names: list[str], x_fit: NDArray[np.float64], loss_fit: NDArray[np.float64],
                closed_fit: NDArray[np.float64], epsilon: float,
                shares: Sequence[float] = CASCADE_SHARES) -> CascadeFit | None:
    """Choose a cascade on its fitting rows only: every ordered pair (cheap, expensive) of
    the gates, each on a one-gate logistic scale (probability that the closed-book answer
    is wrong), and a band holding each of ``shares`` of the rows nearest the cheap gate's
    own cut (the largest skip whose observed drop on these rows is at most ``epsilon``).
    The candidate that skips most on these rows at drop <= epsilon wins (ties: fewer
    expensive calls). None when the rows hold one closed-book class."""
    n = x_fit.shape[1]
    rows = {g: x_fit[i] for i, g in enumerate(names)}
    scales = {g: fit_composite([g], rows[g][None, :], closed_fit) for g in names}
    fitted = {g: f for g, f in scales.items() if f is not None}
    probs = {g: _weighted_scores(f, rows[g][None, :]) for g, f in fitted.items()}
    loss = loss_fit[None, :]

    def skip(score: NDArray[np.float64]) -> tuple[int, float]:
        """The empirical cut and its threshold (inf: everything scored is skipped)."""
        pos, ok, ranked = cut_table(score[None, :])
        cut = int(empirical_cut(pos, loss, ok, epsilon)[0])
        scored = int(np.isfinite(score).sum())
        return cut, float(ranked[0, cut]) if cut < scored else math.inf

    best: tuple[tuple[int, float], CascadeFit] | None = None
    for cheap, p_cheap in probs.items():
        finite = p_cheap[np.isfinite(p_cheap)]
        anchor = min(skip(p_cheap)[1], float(finite.max()))    # the cheap gate's own cut
        for expensive in probs:
            if expensive == cheap:
                continue
            for share in shares:
                lo, hi = cascade_band(finite.tolist(), anchor, share)
                in_band = (p_cheap >= lo) & (p_cheap <= hi)
                fit = CascadeFit(cheap=fitted[cheap], expensive=fitted[expensive],
                                 band=[lo, hi], fit_rows=n,
                                 expensive_share=float(in_band.mean()),
                                 chosen_by=f"largest skip at observed drop <= {epsilon:g} "
                                           f"on the {n} fitting rows")
                key = (skip(cascade_scores(fit, rows[cheap], rows[expensive]))[0],
                       -fit.expensive_share)
                if best is None or key > best[0]:
                    best = (key, fit)
    return None if best is None else best[1]


def fit_composite(names: list[str], x_fit: NDArray[np.float64],
                  closed_fit: NDArray[np.float64]) -> WeightedFit | None:
    """The composite's logistic fit on its fitting rows (``x_fit``: one row of scores per
    gate, NaN = unscored, left out): label "closed-book answer wrong", the questions a gate
    should send to retrieval. None when those rows hold one class."""
    keep = np.isfinite(x_fit).all(axis=0)
    wrong = (closed_fit[keep] == 0).astype(int)
    if keep.sum() < 2 or len(set(wrong.tolist())) < 2:
        return None
    fit = fit_logistic(x_fit[:, keep].tolist(), wrong.tolist())
    return WeightedFit(gates=list(names), weights=fit.weights, bias=fit.bias,
                       center=fit.center, scale=fit.scale, label="closed-book wrong",
                       fit_rows=int(x_fit.shape[1]))


def _weighted_scores(fit: WeightedFit, x: NDArray[np.float64]) -> NDArray[np.float64]:
    """The composite's probability per row (NaN where a sub-gate could not score), by the
    served :class:`~rag_gates.gate.Weighted` gate's own arithmetic, bit for bit: the
    certified threshold is one of these values, and a tie group scored one ulp lower in
    serving would be skipped without having been certified."""
    x = np.asarray(x, dtype=np.float64)
    out = np.full(x.shape[1], math.nan)
    for j in np.nonzero(np.isfinite(x).all(axis=0))[0]:
        out[j] = logistic_combination(x[:, j].tolist(), fit.weights, fit.bias, fit.center,
                                      fit.scale)[0]
    return out


def _auroc(scores: NDArray[np.float64], wrong: NDArray[np.float64]) -> float | None:
    """Mann-Whitney AUROC (ties count half); an unscored row ranks above every score."""
    s = np.where(np.isnan(scores), np.inf, scores)
    pos, neg = s[wrong > 0], s[wrong <= 0]
    if pos.size == 0 or neg.size == 0:
        return None
    greater = (pos[:, None] > neg[None, :]).sum()
    ties = (pos[:, None] == neg[None, :]).sum()
    return float((greater + 0.5 * ties) / (pos.size * neg.size))


def random_u(seed: int) -> float:
    """The uniform draw of the randomised exact test (``bound="exact-random"``) for a
    seed: independent of the data, reproducible from the report's ``seed``."""
    return float(np.random.default_rng([seed, 1]).random())


def _certify(column: _Column, name: str, epsilon: float, delta: float, bound: Bound,
             seed: int = 0) -> GateRow:
    n = column.scores.size
    unscored = int(np.isnan(column.scores).sum())
    pos, ok, ranked = cut_table(column.scores[None, :])
    cut = int(certified_cut(pos, column.loss[None, :], ok, epsilon=epsilon, delta=delta,
                            bound=bound, u=np.array([random_u(seed)]))[0])
    auroc = _auroc(column.scores, 1.0 - column.closed)
    note = column.note
    if unscored == n and not note:
        note = f"{name} could not score any certification question"
    threshold: float | None
    if cut == 0:
        threshold = None
        if not note:
            note = (f"not even the first threshold above 'retrieve always' passed the "
                    f"{bound} test at epsilon {epsilon:g}, delta {delta:g} on {n} questions")
    else:
        scored = int(n - unscored)
        top = float(ranked[0, cut - 1])
        threshold = float(ranked[0, cut]) if cut < scored else math.nextafter(top, math.inf)
    skipped = pos[0] < cut
    lo, hi = clopper_pearson(cut, n, 1.0 - delta)
    return GateRow(gate=name, auroc=auroc, threshold=threshold, n=n, delta=delta,
                   n_fit=column.n_fit,
                   unscored=unscored,
                   skip_rate=RateInterval(observed=cut / n, lower=lo, upper=hi),
                   observed_drop=float(column.loss[skipped].sum() / n), note=note)


Labels = Literal["gold", "none", "mixed"]


def _labels_of(records: Sequence[CalibrationRecord]) -> tuple[Labels, str | None]:
    """What the records were labelled by, and the one same-answer judge of the unlabelled
    ones (records judged by two judges are refused: the spec could state neither)."""
    judges = {r.judge for r in records if r.labels == "agreement"}
    if len(judges) > 1:
        raise CalibrationError(f"the records' unlabelled questions were judged by "
                               f"{sorted(str(j) for j in judges)}: one judge per "
                               "certificate (re-run calibrate with one --same-answer)")
    unlabelled = sum(r.labels == "agreement" for r in records)
    if unlabelled == 0:
        return "gold", None
    judge = next(iter(judges))
    return ("none" if unlabelled == len(records) else "mixed"), judge
