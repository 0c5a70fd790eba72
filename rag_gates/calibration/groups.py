"""Certificates per group (Mondrian): one certified threshold per group of questions.

One threshold certifies the accuracy drop averaged over every question; a group where
retrieval matters more (a relation the model rarely knows, a tenant with fresher documents)
can lose far more than epsilon while the average stays under it. With a group on every
record (``--data``'s ``group``: a relation, a topic, a tenant), :func:`calibrate_by_group`
certifies one threshold per group, each on that group's questions alone, so that

    with probability at least ``1 - delta`` over the draw of the calibration questions,
    **for every group at once**, skipping retrieval below the group's threshold costs at
    most ``epsilon`` accuracy within that group against always retrieving.

Which implies the overall guarantee too (the overall drop is a mixture of the groups').

**The split of delta: Bonferroni.** Each of the ``F`` gates (one is served: the one
:attr:`GroupCalibrationReport.best` picks) is certified in each of the ``G`` tested groups
at ``delta / (F * G)``; by the union bound the chance that any (gate, group) certificate
fails is at most ``delta``, whatever the dependence between groups. Given the groups'
labels, their questions are independent, so Sidak's ``1 - (1 - delta)^(1/G)`` would also be
valid, but gains under 3% of a group's share (0.0513 against 0.05 at delta 0.1, G = 2),
and Bonferroni holds even when the groups were not drawn independently (fixed quotas per
tenant, one pool shared out).

**Which groups share delta.** A group too small for any test to certify a skip (even with
no harm among its questions the chance ``(1 - epsilon)^n`` of seeing none must be at most
its share) would only dilute the others' shares. So the groups are tested largest first:
the largest ``G`` such that each of the ``G`` largest groups has at least
``ceil(log(delta / (F * G)) / log(1 - epsilon))`` questions (groups of equal size enter
together or not at all). The rule reads only the groups' sizes, never their labels, so the
guarantee holds conditionally on the sizes, hence unconditionally. A group left out always
retrieves, and says so; so does a group whose test did not pass, and, when served, a group
the spec has not seen, or a question without a group (fail closed).

Each group's threshold is exactly what ``calibrate(group_records, delta=share,
gates=[gate], composite=False, family_wise=False, seed=seed)`` certifies on the group's
records alone. Composites are not fitted per group (a group's fitting half would be
small): the gates themselves are certified.

Example:
    >>> report = calibrate(records, max_loss=0.05, delta=0.1, by_group=True,
    ...                    model=ModelIdentity.of(lm), retriever="bm25")  # doctest: +SKIP
    >>> [(g.group, g.threshold, g.n) for g in report.best.groups]          # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from rag_gates.calibration.bounds import EXACT_MAX_N, clopper_pearson
from rag_gates.calibration.certify import BOUNDS, Bound
from rag_gates.calibration.records import CalibrationRecord
from rag_gates.calibration.rows import row_named
from rag_gates.calibration.spec import (
    ASSUMPTION,
    GateSpec,
    GroupCertificate,
    ModelIdentity,
    RateInterval,
    package_versions,
    utc_now,
)
from rag_gates.errors import CalibrationError

__all__ = ["GroupCalibrationReport", "GroupedGateRow", "calibrate_by_group",
           "group_questions_needed", "tested_groups"]

SPLIT: Literal["bonferroni"] = "bonferroni"
"""How delta is shared out: each (gate, tested group) at delta / (gates * groups)."""


def group_questions_needed(epsilon: float, delta: float) -> int:
    """The fewest questions with which any test can certify a skip at level ``delta``:
    with no harm among them, the chance ``(1 - epsilon)^n`` of seeing none at the null's
    edge must be at most ``delta``.

    Example:
        >>> group_questions_needed(0.05, 0.1 / 6)
        80
    """
    return math.ceil(math.log(delta) / math.log1p(-epsilon))


def tested_groups(sizes: Mapping[str, int], epsilon: float, delta: float,
                  family: int = 1) -> list[str]:
    """The groups that share ``delta`` (each at ``delta / (family * len(result))``): the
    largest set of the largest groups in which every group has the questions a test needs
    at that share (:func:`group_questions_needed`); groups of equal size enter together.
    Reads the sizes only, so the split is fixed before any label is seen.

    Example:
        >>> tested_groups({"a": 200, "b": 90, "c": 12}, 0.05, 0.1)
        ['a', 'b']
    """
    order = sorted(sizes, key=lambda g: (-sizes[g], g))
    for k in range(len(order), 0, -1):
        if k < len(order) and sizes[order[k]] == sizes[order[k - 1]]:
            continue  # a tie across the cut: all of them or none
        if sizes[order[k - 1]] >= group_questions_needed(epsilon, delta / (family * k)):
            return order[:k]
    return []


class GroupedGateRow(BaseModel):
    """One gate certified per group: each group's certificate, and what they skip
    together on the certification questions."""

    model_config = ConfigDict(frozen=True)

    gate: str
    auroc: float | None = Field(None, description="AUROC for 'closed-book answer wrong' on "
                                "all the certification questions.")
    n: int = Field(..., description="Certification questions, every group.")
    unscored: int = 0
    groups: list[GroupCertificate]
    skip_rate: RateInterval = Field(..., description="Share of all certification questions "
                                    "skipped by their groups' thresholds, Clopper-Pearson "
                                    "interval at confidence 1 - delta.")
    observed_drop: float = Field(..., description="Accuracy drop against always retrieving "
                                 "on all the certification questions.")

    @property
    def certified(self) -> bool:
        return any(g.certified for g in self.groups)

    @property
    def observed_skip_rate(self) -> float:
        return self.skip_rate.observed

    @property
    def certified_skip_rate(self) -> float:
        """The groups' certified skip rates (their intervals' lower ends) weighted by
        their shares of the questions: what :attr:`GroupCalibrationReport.best` ranks."""
        return sum(g.n * g.skip_rate.lower for g in self.groups if g.certified) / self.n

    def group(self, name: str) -> GroupCertificate:
        for certificate in self.groups:
            if certificate.group == name:
                return certificate
        raise KeyError(f"no group {name!r}; groups: "
                       f"{', '.join(g.group for g in self.groups)}")


class GroupCalibrationReport(BaseModel):
    """Every gate's per-group certification at one (epsilon, delta, bound);
    :attr:`best` and :meth:`spec_for` give the spec to save."""

    model_config = ConfigDict(frozen=True)

    rows: list[GroupedGateRow]
    epsilon: float
    delta: float
    bound: Bound
    questions: int
    model: ModelIdentity
    retriever: str
    seed: int
    family: int = Field(1, description="Gates certified together (the spec serves one).")
    tested: int = Field(..., description="Groups that share delta (the others always "
                        "retrieve: too few questions).")
    group_delta: float = Field(..., description="The level of each (gate, tested group): "
                               "delta / (family * tested); 0 when no group is tested.")
    split: Literal["bonferroni"] = SPLIT
    options: dict[str, object] = Field(default_factory=dict)
    labels: Literal["gold", "none", "mixed"] = "gold"
    judge: str | None = None

    def row(self, gate: str) -> GroupedGateRow:
        return row_named(self.rows, gate)

    @property
    def best(self) -> GateSpec:
        """The spec of the gate that skips most with a guarantee (the groups' certified
        skip rates weighted by size; ties: observed skip rate, then AUROC)."""
        def key(row: GroupedGateRow) -> tuple[float, float, float]:
            return (row.certified_skip_rate, row.observed_skip_rate if row.certified else -1,
                    row.auroc if row.auroc is not None else -1.0)

        return self.spec_for(max(self.rows, key=key).gate)

    def spec_for(self, gate: str) -> GateSpec:
        """The per-group spec of one gate of this report."""
        row = self.row(gate)
        retrieval = row.skip_rate.complement()
        certified = [g.group for g in row.groups if g.certified]
        if certified:
            note = (f"Per group: with probability >= {1 - self.delta:g} over the {row.n} "
                    f"certification questions, for every group at once, skipping retrieval "
                    f"when the {gate} score is below the group's threshold loses at most "
                    f"{self.epsilon:g} accuracy within that group against always retrieving "
                    f"({self.bound} bound; each of {self.tested} groups and {self.family} "
                    f"gates at delta/{self.tested * self.family}, Bonferroni). Thresholds "
                    f"certified for {len(certified)} of {len(row.groups)} groups; the others, "
                    "a group not listed and a question without a group always retrieve.")
        else:
            note = ("no threshold certified for any group: always retrieve. "
                    + "; ".join(f"{g.group}: {g.note}" for g in row.groups))
        if self.labels != "gold":
            which = "without labels" if self.labels == "none" else \
                "with labels where the data had them"
            note += (f" Certified {which}: on an unlabelled question a skip counts as a loss "
                     f"whenever its two replies are not the same answer ({self.judge}).")
        return GateSpec(
            gate=gate, options=dict(self.options), threshold=None, certified=row.certified,
            epsilon=self.epsilon, delta=self.delta, family=self.family, bound=self.bound,
            n=row.n, unscored=row.unscored, auroc=row.auroc, skip_rate=row.skip_rate,
            retrieval_rate=retrieval, observed_drop=row.observed_drop, model=self.model,
            retriever=self.retriever, versions=package_versions(), created=utc_now(),
            assumption=ASSUMPTION, note=note, labels=self.labels, judge=self.judge,
            groups=list(row.groups)).sealed()


def calibrate_by_group(records: Sequence[CalibrationRecord], *, max_loss: float = 0.05,
                       delta: float = 0.1, bound: Bound = "exact", model: ModelIdentity,
                       retriever: str, gates: Sequence[str] | None = None, seed: int = 0,
                       family_wise: bool = True,
                       options: dict[str, object] | None = None) -> GroupCalibrationReport:
    """Certify one threshold per group for every gate scored in ``records``
    (:func:`rag_gates.calibration.calibrate` with ``by_group=True``; the module's docstring
    states the guarantee and the split of delta).

    Every record needs a ``group``. ``bound``'s limits apply per group (``exact``: up to
    :data:`~rag_gates.calibration.bounds.EXACT_MAX_N` questions in each tested group).
    ``family_wise``: share delta among the gates too (the spec serves the one
    :attr:`GroupCalibrationReport.best` picks); with False each gate holds on its own.

    Raises:
        CalibrationError: a record without a group, and whatever
            :func:`~rag_gates.calibration.calibrate` refuses (fewer than 30 questions in
            all, one closed-book class, epsilon or delta outside (0, 1), duplicate ids,
            gates nobody scored).
    """
    from rag_gates.calibration.rows import (
        _auroc,
        _certify,
        _check,
        _columns,
        _gate_names,
        _labels_of,
    )

    if bound not in BOUNDS:
        raise CalibrationError(f"bound must be one of {', '.join(BOUNDS)}, got {bound!r}")
    # The exact table's limit applies per group (checked below), not to all questions.
    _check(records, max_loss, delta, "binomial" if bound.startswith("exact") else bound, seed)
    ungrouped = [r.id for r in records if r.group is None]
    if ungrouped:
        raise CalibrationError(
            f"{len(ungrouped)} of {len(records)} records have no group (e.g. id "
            f"{ungrouped[0]!r}): certifying per group needs a 'group' on every --data line")
    names = _gate_names(records, gates)
    epsilon = float(max_loss)
    family = len(names) if family_wise else 1
    members: dict[str, list[CalibrationRecord]] = {}
    for record in records:
        members.setdefault(str(record.group), []).append(record)
    sizes = {g: len(rs) for g, rs in members.items()}
    tested = tested_groups(sizes, epsilon, float(delta), family)
    share = float(delta) / (family * len(tested)) if tested else 0.0
    too_big = [g for g in tested if sizes[g] > EXACT_MAX_N]
    if bound.startswith("exact") and too_big:
        raise CalibrationError(
            f"group {too_big[0]!r} has {sizes[too_big[0]]} questions: the exact bound "
            f"tabulates up to {EXACT_MAX_N} per group; pass bound='wsr'")
    everything = _columns(records, names, False, seed, epsilon)
    rows = []
    for name in names:
        certificates = []
        skipped = 0
        drop = 0.0
        for group in sorted(members, key=lambda g: (-sizes[g], g)):
            column = _columns(members[group], [name], False, seed, epsilon)[name]
            n = sizes[group]
            if group in tested:
                row = _certify(column, name, epsilon, share, bound, seed)
                cut = round(row.skip_rate.observed * n)
                note = (f"certified: accuracy drop within the group <= {epsilon:g} "
                        f"({bound}, n={n}, delta share {share:.4g})" if row.certified
                        else f"always retrieve: {row.note}")
                certificate = GroupCertificate(
                    group=group, threshold=row.threshold, n=n, delta=share,
                    unscored=row.unscored, auroc=row.auroc, skip_rate=row.skip_rate,
                    observed_drop=row.observed_drop, note=note)
                skipped += cut
                drop += row.observed_drop * n
            else:
                certificate = GroupCertificate(
                    group=group, threshold=None, n=n, delta=0.0,
                    unscored=int(np.isnan(column.scores).sum()),
                    auroc=_auroc(column.scores, 1.0 - column.closed),
                    skip_rate=RateInterval(observed=0.0, lower=0.0, upper=0.0),
                    observed_drop=0.0,
                    note=_untested_note(group, sizes, len(tested), epsilon, float(delta),
                                        family))
            certificates.append(certificate)
        total = len(records)
        lo, hi = clopper_pearson(skipped, total, 1.0 - float(delta))
        column = everything[name]
        rows.append(GroupedGateRow(
            gate=name, auroc=_auroc(column.scores, 1.0 - column.closed), n=total,
            unscored=int(np.isnan(column.scores).sum()), groups=certificates,
            skip_rate=RateInterval(observed=skipped / total, lower=lo, upper=hi),
            observed_drop=drop / total))
    labels, judge = _labels_of(records)
    return GroupCalibrationReport(
        rows=rows, epsilon=epsilon, delta=float(delta), bound=bound, questions=len(records),
        model=model, retriever=retriever, seed=seed, family=family, tested=len(tested),
        group_delta=share, options=dict(options or {}), labels=labels, judge=judge)


def _untested_note(group: str, sizes: Mapping[str, int], tested: int, epsilon: float,
                   delta: float, family: int) -> str:
    """Why a group was left out of the split: too few questions for the share of delta it
    would have had."""
    n = sizes[group]
    tied = sum(size == n for size in sizes.values())
    needed = group_questions_needed(epsilon, delta / (family * (tested + 1)))
    if n >= needed and tied > 1:
        return (f"always retrieve: {n} questions, like {tied - 1} other group(s); together "
                f"their share of delta would be too small to certify a skip at epsilon "
                f"{epsilon:g} (groups of one size enter together or not at all): add "
                "questions")
    return (f"always retrieve: {n} questions, too few to certify a skip at epsilon "
            f"{epsilon:g}: any test needs at least {needed} at the share of delta this group "
            f"would get ((1 - epsilon)^n <= delta / {family * (tested + 1)}): add questions "
            "of this group")
