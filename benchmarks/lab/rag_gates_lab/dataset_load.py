"""What a dataset loader returns: :class:`DatasetLoad`, the questions loaded and the lines
skipped. Its own module so that the loaders of :mod:`rag_gates_lab.datasets` and of the
testbed (:mod:`rag_gates_lab.testbed.dataset`, which ``load_dataset`` dispatches to) share it
without importing each other."""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, ConfigDict, Field

from rag_gates.types import QAExample

__all__ = ["DatasetLoad"]


class DatasetLoad(BaseModel):
    """A loaded dataset and what was skipped on the way."""

    model_config = ConfigDict(frozen=True)

    name: str
    path: str
    examples: list[QAExample]
    skipped: list[tuple[int, str]] = Field(default_factory=list,
                                           description="(line number, reason) per bad line.")

    @property
    def fingerprint(self) -> str:
        """Hash of the questions loaded and their gold answers: a run directory records it
        to refuse mixing data, and eval-gate keys its label cache by it, so a file whose
        answers were edited in place is never scored with labels made from the old ones."""
        digest = hashlib.sha256()
        for e in self.examples:
            answers = json.dumps(e.answers, ensure_ascii=False)
            digest.update(f"{e.id}\x1f{e.question}\x1f{answers}\x1e".encode())
        return digest.hexdigest()[:16]

    @property
    def question_fingerprint(self) -> str:
        """The fingerprint of earlier versions (ids and questions only). Only to recognise
        their run directories, whose records must then be checked answer by answer
        (:func:`rag_gates_lab.runner.data_matches`)."""
        digest = hashlib.sha256()
        for e in self.examples:
            digest.update(f"{e.id}\x1f{e.question}\x1e".encode())
        return digest.hexdigest()[:16]
