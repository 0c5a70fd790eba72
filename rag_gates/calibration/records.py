"""Per-question calibration records: what a certified threshold is computed from.

One record per labelled question: each gate's score on it (higher = more need to retrieve,
``None`` when the gate could not score it) and whether the closed-book answer and the
answer with retrieval were right. ``rag-gates calibrate`` writes them as JSONL; the
certification in :mod:`rag_gates.calibration` reads nothing else.

Example:
    >>> from rag_gates.calibration.records import CalibrationRecord
    >>> r = CalibrationRecord(id="q1", question="Who wrote Hamlet?", closed_book_correct=True,
    ...                       retrieved_correct=True, scores={"answer-logprob": 0.12})
    >>> r.harm_if_skipped, r.help_if_skipped
    (False, False)
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["MAX_GROUP_CHARS", "CalibrationRecord", "read_records", "write_records"]

MAX_RECORD_DEPTH = 8
"""A record nests 2 levels (its scores)."""
MAX_GROUP_CHARS = 200
"""A group is a name (a relation, a topic, a tenant), not a text."""


class CalibrationRecord(BaseModel):
    """One question with every gate's score on it, labelled by its gold answers or, without
    them, by whether its two replies agree (:meth:`from_agreement`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(..., min_length=1, description="Stable question id.")
    question: str = Field(..., description="The question as asked.")
    closed_book_correct: bool = Field(..., description="The answer without retrieval is right.")
    retrieved_correct: bool = Field(..., description="The answer with retrieval is right.")
    scores: dict[str, float | None] = Field(
        default_factory=dict,
        description="Gate name or expression -> score (higher = retrieve); None = could not score.")
    closed_book_answer: str | None = Field(None, description="The closed-book reply, if kept.")
    retrieved_answer: str | None = Field(None, description="The reply with retrieval, if kept.")
    labels: Literal["gold", "agreement"] = Field(
        "gold", description="'gold': the two *_correct fields are checked against gold "
        "answers. 'agreement': the question has none; retrieved_correct is True and "
        "closed_book_correct says whether the two replies are the same answer under "
        "``judge``, so a skip counts as a harm exactly when they differ (an upper bound on "
        "the accuracy it can cost: rag_gates.calibration.judges).")
    judge: str | None = Field(None, description="The same-answer judge of an 'agreement' "
                              "record (exact, f1:CUT).")
    retrieved_scores: dict[str, float | None] = Field(
        default_factory=dict,
        description="With-passages score name -> its value on the answer with retrieval "
        "(higher = less reliable; None = could not score): what calibrate(abstain=...) "
        "certifies the abstention threshold on. Empty in records written before it existed.")
    group: str | None = Field(None, min_length=1, max_length=MAX_GROUP_CHARS,
                              description="The question's group (a relation, a topic, a "
                              "tenant), from --data's 'group'; ``calibrate(by_group=True)`` "
                              "certifies one threshold per group. None: no group.")

    @classmethod
    def from_agreement(cls, *, id: str, question: str, closed_book_answer: str,
                       retrieved_answer: str, judge: Any,
                       scores: dict[str, float | None],
                       retrieved_scores: dict[str, float | None] | None = None
                       ) -> CalibrationRecord:
        """The record of a question without gold answers: a harm if skipped exactly when
        ``judge`` (a :class:`~rag_gates.calibration.judges.SameAnswer`) says the two
        replies differ, and never a help."""
        return cls(id=id, question=question, retrieved_correct=True,
                   closed_book_correct=bool(judge(closed_book_answer, retrieved_answer)),
                   scores=scores, closed_book_answer=closed_book_answer,
                   retrieved_answer=retrieved_answer, labels="agreement", judge=judge.name,
                   retrieved_scores=dict(retrieved_scores or {}))

    def dump_json(self) -> str:
        """The record as one JSON line's text; a record without a group or with-passages
        scores is written as before they existed (no such key), so its line is unchanged."""
        absent = ({"group"} if self.group is None else set()) | (
            set() if self.retrieved_scores else {"retrieved_scores"})
        return self.model_dump_json(exclude=absent or None)

    @property
    def harm_if_skipped(self) -> bool:
        """Skipping retrieval here loses a right answer."""
        return self.retrieved_correct and not self.closed_book_correct

    @property
    def help_if_skipped(self) -> bool:
        """Skipping retrieval here gains a right answer (retrieval would have misled)."""
        return self.closed_book_correct and not self.retrieved_correct

    @property
    def signed_loss_if_skipped(self) -> int:
        """Accuracy change of skipping against retrieving, in {-1, 0, 1} (1 = a loss)."""
        return int(self.retrieved_correct) - int(self.closed_book_correct)


def write_records(records: Iterable[CalibrationRecord], path: str | Path) -> None:
    """Write records as JSONL (one object per line)."""
    with Path(path).open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(record.dump_json() + "\n")


def read_records(path: str | Path) -> list[CalibrationRecord]:
    """Read records written by :func:`write_records`; a line that is not one (not UTF-8,
    not JSON, nested too deep, a non-finite score, not a record) raises
    :class:`~rag_gates.errors.InputFileError` naming ``FILE:LINE``."""
    from rag_gates._files import iter_models

    fix = ("delete that line (it is answered again) or the work directory's records.jsonl")
    return list(iter_models(path, CalibrationRecord, what="a calibration record", fix=fix,
                            max_depth=MAX_RECORD_DEPTH))
