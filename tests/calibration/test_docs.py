"""The snippet of docs/calibration.md runs as written (with the tiny model as ``lm`` and
records of its first-token-prob scores in records.jsonl)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import pytest

from rag_gates.calibration import CalibrationRecord, write_records
from rag_gates.confidence import FirstTokenProbGate

DOC = Path(__file__).resolve().parents[2] / "docs" / "calibration.md"


def test_the_calibration_page_snippet_runs(tiny: Any, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(r"<!-- run by tests/calibration/test_docs.py -->\n```python\n(.*?)```",
                      text, re.S)
    assert match, "the tested snippet is marked in docs/calibration.md"
    gate = FirstTokenProbGate(tiny)
    questions = [f"Who wrote the {c} book number {i}?" for i in range(60)
                 for c in ("red", "blue")]
    scores = [gate.decide(q).score for q in questions]
    cut = sorted(scores)[len(scores) // 2]
    write_records([CalibrationRecord(id=str(i), question=q, closed_book_correct=s < cut,
                                     retrieved_correct=True, scores={"first-token-prob": s})
                   for i, (q, s) in enumerate(zip(questions, scores, strict=True))],
                  tmp_path / "records.jsonl")
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(match.group(1), str(DOC), "exec"), {"lm": tiny})
    assert (tmp_path / "gate.json").is_file()
    assert "'epsilon': 0.05" in out.getvalue()
