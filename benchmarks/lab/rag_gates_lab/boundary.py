"""Knowledge-boundary agreement: does a method retrieve exactly where the model could not
answer alone?

The DeepRAG paper (Appendix B.2, Table 3) takes the model's closed-book answer as the truth of
"retrieval was needed" (wrong closed book: needed; right: not needed) and scores each adaptive
method's choice to retrieve (at least one retrieval for the question) against it with F1,
accuracy, balanced accuracy and the Matthews correlation coefficient (MCC: 1 perfect, 0 chance,
-1 inverted). Balanced accuracy and MCC matter because most questions need retrieval on small
models: a method that always retrieves scores a high accuracy and an MCC of 0 (undefined:
reported as None).

Here the closed-book truth is the bench's ``no-rag`` record for the same question (a direct
answer; the paper uses chain-of-thought), so the figures need a run that has ``no-rag`` for the
questions a method answered.

Example:
    >>> a = boundary_agreement(retrieved=[True, True, False, False],
    ...                        needed=[True, False, False, True])
    >>> (a.true_positive, a.false_positive, a.true_negative, a.false_negative), a.mcc
    ((1, 1, 1, 1), 0.0)
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["BoundaryAgreement", "SubqueryAgreement", "boundary_agreement", "boundary_by_method",
           "hop_of", "subquery_boundary"]


@dataclass(frozen=True)
class BoundaryAgreement:
    """The confusion counts of "retrieved" against "closed book was wrong", and the paper's
    four scores; a score whose denominator is zero is None (not 0: it is undefined)."""

    true_positive: int    # retrieved, and the closed-book answer was wrong
    false_positive: int   # retrieved, though the closed-book answer was right
    true_negative: int    # answered alone, and the closed-book answer was right
    false_negative: int   # answered alone, though the closed-book answer was wrong

    @property
    def questions(self) -> int:
        return self.true_positive + self.false_positive + self.true_negative + \
            self.false_negative

    @property
    def accuracy(self) -> float | None:
        n = self.questions
        return (self.true_positive + self.true_negative) / n if n else None

    @property
    def f1(self) -> float | None:
        denominator = 2 * self.true_positive + self.false_positive + self.false_negative
        return 2 * self.true_positive / denominator if denominator else None

    @property
    def balanced_accuracy(self) -> float | None:
        needed = self.true_positive + self.false_negative
        not_needed = self.true_negative + self.false_positive
        if not needed or not not_needed:
            return None
        return (self.true_positive / needed + self.true_negative / not_needed) / 2

    @property
    def mcc(self) -> float | None:
        tp, fp, tn, fn = (self.true_positive, self.false_positive, self.true_negative,
                          self.false_negative)
        denominator = (tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)
        if denominator == 0:
            return None
        return (tp * tn - fp * fn) / math.sqrt(denominator)

    def as_dict(self) -> dict[str, Any]:
        """Counts and scores, JSON-ready."""
        return {**asdict(self), "questions": self.questions, "f1": self.f1,
                "accuracy": self.accuracy, "balanced_accuracy": self.balanced_accuracy,
                "mcc": self.mcc}


def boundary_agreement(retrieved: Sequence[bool], needed: Sequence[bool]) -> BoundaryAgreement:
    """Confusion counts of ``retrieved`` (predicted) against ``needed`` (the truth).

    Raises:
        ValueError: the sequences differ in length.
    """
    if len(retrieved) != len(needed):
        raise ValueError(f"{len(retrieved)} retrieval choices but {len(needed)} truths; "
                         "pair them per question")
    pairs = list(zip((bool(r) for r in retrieved), (bool(n) for n in needed), strict=True))
    return BoundaryAgreement(
        true_positive=sum(r and n for r, n in pairs),
        false_positive=sum(r and not n for r, n in pairs),
        true_negative=sum(not r and not n for r, n in pairs),
        false_negative=sum(not r and n for r, n in pairs))


def boundary_by_method(records: Iterable[Any], reference: str = "no-rag",
                       ) -> dict[str, BoundaryAgreement]:
    """Per method, its retrieval choices against the ``reference`` method's wrong answers,
    on the questions both answered. ``records`` are bench records (``rag-gates bench``'s
    ``RunRecord``: ``id``, ``method``, ``accuracy``, ``retrievals``), from one run or pooled
    from several runs over the same dataset and model (a question answered twice by a method
    counts once: the later record). The reference itself is left out; methods that never
    vary (``single``) are included: their MCC is None, which is the point.

    Raises:
        ValueError: no ``reference`` record (run the bench with ``--methods no-rag,...``).
    """
    rows = list(records)
    closed_book_wrong = {r.id: r.accuracy < 1.0 for r in rows if r.method == reference}
    if not closed_book_wrong:
        raise ValueError(f"no {reference!r} records: the closed-book truth comes from them; "
                         f"add {reference} to the bench's --methods")
    choices: dict[str, dict[str, bool]] = {}
    for r in rows:
        if r.method != reference and r.id in closed_book_wrong:
            choices.setdefault(r.method, {})[r.id] = r.retrievals > 0
    return {method: boundary_agreement(list(by_id.values()),
                                       [closed_book_wrong[i] for i in by_id])
            for method, by_id in choices.items()}


@dataclass(frozen=True)
class SubqueryAgreement:
    """Per-subquery agreement of a decomposing method (DeepRAG) on two-hop questions whose
    hops are known: each step matched to the hop it asks about, "retrieved" against "the
    model could not answer that hop alone"."""

    agreement: BoundaryAgreement
    steps: int      # steps the method took on those questions
    unmatched: int  # steps naming neither hop's subject (left out of the agreement)

    def as_dict(self) -> dict[str, Any]:
        return {**self.agreement.as_dict(), "steps": self.steps, "unmatched": self.unmatched}


def hop_of(subquery: str, subjects: Sequence[str]) -> int | None:
    """The hop a subquery asks about: the latest hop whose subject it names (the second
    hop's subject, the bridge entity, is what a second subquery must name; the first
    subject may come back in it), or None. A subject counts only as whole words: short
    PopQA titles ("Ex", "10", "Once") are inside many unrelated words."""
    text = subquery.casefold()
    for i in reversed(range(len(subjects))):
        if subjects[i] and re.search(rf"(?<!\w){re.escape(subjects[i].casefold())}(?!\w)",
                                     text):
            return i
    return None


def subquery_boundary(records: Iterable[Any], hops: Mapping[str, Sequence[tuple[str, str]]],
                      hop_closed_book_wrong: Mapping[str, bool],
                      ) -> dict[str, SubqueryAgreement]:
    """Per method, its per-step retrieval choices against the hops' closed-book truth.

    ``records``: bench records of two-hop questions whose trace ends with DeepRAG's
    ``trajectory`` note (other methods are skipped); ``hops``: question id -> the hops as
    ``(hop id, subject)`` in order; ``hop_closed_book_wrong``: hop id -> whether the model's
    closed-book answer to that hop's own question was wrong (a ``no-rag`` run on
    ``testbed-hops:DIR``). Steps about a hop without a closed-book answer are unmatched.
    """
    steps: dict[str, list[tuple[bool, bool]]] = {}
    counts: dict[str, list[int]] = {}
    # As in boundary_by_method: a question answered in two pooled runs counts once (the later).
    latest = {(r.method, r.id): r for r in records}
    for r in latest.values():
        row = hops.get(r.id)
        events = (r.trace or {}).get("events") or []
        note = next((e for e in reversed(events)
                     if e.get("kind") == "note" and e.get("name") == "trajectory"), None)
        if row is None or note is None:
            continue
        seen = counts.setdefault(r.method, [0, 0])
        pairs = steps.setdefault(r.method, [])
        subjects = [subject for _, subject in row]
        for step in note["data"]["steps"]:
            seen[0] += 1
            hop = hop_of(str(step["subquery"]), subjects)
            hop_id = row[hop][0] if hop is not None else None
            if hop_id is None or hop_id not in hop_closed_book_wrong:
                seen[1] += 1
                continue
            pairs.append((bool(step["retrieve"]), hop_closed_book_wrong[hop_id]))
    return {method: SubqueryAgreement(
                agreement=boundary_agreement([p[0] for p in pairs], [p[1] for p in pairs]),
                steps=counts[method][0], unmatched=counts[method][1])
            for method, pairs in steps.items()}
