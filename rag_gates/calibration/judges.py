"""Judges of "the same answer": what lets ``rag-gates calibrate --no-labels`` certify a
threshold from questions without gold answers.

Skipping retrieval on a question can only cost accuracy when the closed-book reply and the
reply with retrieval differ: where they are the same answer, both are right or both are
wrong. So the share of skipped questions whose two replies *differ* bounds the accuracy
drop from above, and certifying that share at epsilon certifies the drop. How much is
saved depends on the judge:

- ``exact`` (the default): the two replies are equal after the answer matcher's
  normalisation (case, punctuation, articles, spaces). Always valid: the package's answer
  check (:func:`rag_gates.answers.accuracy`) reads only the normalised reply, so two such
  replies are right or wrong together for any gold answer.
- ``f1:CUT``: token F1 of the two normalised replies at least ``CUT`` (0 < CUT <= 1). Looser,
  so it certifies more skips, and valid only as far as it never calls a right and a wrong
  reply the same; that false-agreement rate must be measured on labelled questions and is
  stated beside any certificate that uses it (docs/calibration.md).

Example:
    >>> same = parse_same_answer("exact")
    >>> same("Paris.", "paris"), same("Paris", "Lyon")
    (True, False)
    >>> parse_same_answer("f1:0.4")("The city of Paris", "Paris, France")
    True
"""

from __future__ import annotations

from dataclasses import dataclass

from rag_gates.answers import _f1_one, normalize_answer

__all__ = ["JUDGE_SYNTAX", "SameAnswer", "parse_same_answer"]

JUDGE_SYNTAX = "exact | f1:CUT (0 < CUT <= 1)"


@dataclass(frozen=True)
class SameAnswer:
    """A judge of whether two replies are the same answer: ``judge(a, b) -> bool``.

    ``name`` is what a spec records (``exact``, ``f1:0.8``); ``always_valid`` says whether
    the label-free bound holds whatever the gold answers are (only ``exact``)."""

    name: str
    f1_cut: float | None = None

    @property
    def always_valid(self) -> bool:
        return self.f1_cut is None

    def __call__(self, first: str, second: str) -> bool:
        if self.f1_cut is None:
            return normalize_answer(first) == normalize_answer(second)
        if normalize_answer(first) == normalize_answer(second):
            return True  # two empty replies have F1 0, yet are the same reply
        return _f1_one(first, second) >= self.f1_cut


def parse_same_answer(text: str) -> SameAnswer:
    """``exact`` or ``f1:CUT``; anything else raises ValueError naming the syntax."""
    spec = text.strip().lower()
    if spec == "exact":
        return SameAnswer("exact")
    kind, _, cut = spec.partition(":")
    if kind == "f1" and cut:
        try:
            value = float(cut)
        except ValueError:
            value = float("nan")
        if 0.0 < value <= 1.0:
            return SameAnswer(f"f1:{value:g}", f1_cut=value)
    raise ValueError(f"--same-answer {text!r}: give {JUDGE_SYNTAX}")
