"""CBDR preference data: which passages raise (and which lower) *this* model's confidence.

For each question, every candidate passage (the dataset row's own paragraphs) is scored by the
zero-shot :class:`~rag_gates.cbdr.rerank.ConfidenceGainReranker`,
``Inc(q, c) = Conf(q + c) - Conf(q)``. Up to ``max_pos`` passages with ``Inc > 0`` become
positives (highest first) and up to ``max_neg`` with ``Inc < 0`` negatives (lowest first); a
question lacking either is skipped and counted. One JSON line per kept question::

    {"id": "...", "query": "...", "pos": ["Title: text", ...], "neg": [...],
     "pos_inc": [0.21, ...], "neg_inc": [-0.34, ...]}

A passage is written as ``"Title: text"`` (just ``text`` without a title), the same string
:class:`~rag_gates.cbdr.rerank.CrossEncoderReranker` scores, so training and use agree.

Resumable: records are appended (and flushed) one question at a time; a second call with the
same output skips the questions already written, drops a half-written last line left by an
interruption, and skips again the questions it had skipped (they are listed, with the settings
the file was built with, in ``<out>.state`` beside it). Resuming with another model, probe or
limits is refused, so one file never mixes two preference signals.

Example:
    >>> from rag_gates.cbdr import ConfidenceGainReranker, load_default_probe
    >>> from rag_gates_lab.datasets import load_dataset
    >>> reranker = ConfidenceGainReranker(lm, load_default_probe(lm))
    >>> examples = load_dataset("hotpotqa", n=300, offset=500).examples
    >>> stats = build_preferences(reranker, examples, out=Path("prefs.jsonl"))
    >>> stats.written, stats.skipped_no_pos, stats.skipped_no_neg
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rag_gates._io import append_locked, write_text_atomic
from rag_gates.cbdr.rerank import ConfidenceGainReranker
from rag_gates.types import Passage, QAExample

__all__ = [
    "PreferenceRecord",
    "PreferenceStats",
    "build_preferences",
    "passage_text",
    "read_preferences",
    "state_path",
]

logger = logging.getLogger(__name__)

SkipReason = Literal["no_context", "no_pos", "no_neg"]


class PreferenceRecord(BaseModel):
    """One question's preference pairs: passages that raised / lowered the model's confidence."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(..., min_length=1)
    query: str = Field(..., min_length=1)
    pos: list[str] = Field(..., description="Passages with Inc > 0, highest Inc first.")
    neg: list[str] = Field(..., description="Passages with Inc < 0, lowest Inc first.")
    pos_inc: list[float]
    neg_inc: list[float]

    @model_validator(mode="after")
    def _aligned(self) -> PreferenceRecord:
        if len(self.pos) != len(self.pos_inc) or len(self.neg) != len(self.neg_inc):
            raise ValueError("pos/pos_inc and neg/neg_inc must have the same lengths")
        return self


class PreferenceStats(BaseModel):
    """What one :func:`build_preferences` call did.

    ``questions = written + already_written + skipped_no_context + skipped_no_pos +
    skipped_no_neg`` (skips include those recorded by an earlier, interrupted call).
    """

    model_config = ConfigDict(frozen=True)

    questions: int = Field(..., ge=0, description="Distinct questions given.")
    written: int = Field(..., ge=0, description="Records written by this call.")
    already_written: int = Field(0, ge=0, description="Records found in the file (resumed).")
    skipped_no_context: int = Field(0, ge=0, description="Questions without candidates.")
    skipped_no_pos: int = Field(0, ge=0, description="No passage raised the confidence.")
    skipped_no_neg: int = Field(
        0, ge=0, description="Some passage raised the confidence, none lowered it.")
    seconds: float = Field(..., ge=0.0)
    out: str = Field("", description="The preference file.")

    @property
    def records(self) -> int:
        """Records now in the file."""
        return self.written + self.already_written


def passage_text(passage: Passage) -> str:
    """``"Title: text"`` (or the text alone): the string a cross-encoder sees for a passage."""
    return f"{passage.title}: {passage.text}" if passage.title else passage.text


def state_path(out: Path) -> Path:
    """The side file holding the settings a preference file was built with and its skips."""
    return out.with_name(out.name + ".state")


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _identity(reranker: ConfidenceGainReranker, max_pos: int, max_neg: int) -> dict[str, Any]:
    probe = reranker.probe
    weights = hashlib.sha256()
    for name, tensor in sorted(probe.module.state_dict().items()):
        weights.update(name.encode())
        weights.update(tensor.detach().float().cpu().numpy().tobytes())
    weights.update(probe.mean.float().numpy().tobytes())
    weights.update(probe.std.float().numpy().tobytes())
    return {"model_id": str(reranker.lm.model_id),
            "probe": _digest(probe.config.model_dump(mode="json")) + weights.hexdigest()[:16],
            "layer": probe.layer, "max_passage_tokens": reranker.max_passage_tokens,
            "max_pos": max_pos, "max_neg": max_neg}


def _read_lines(path: Path) -> tuple[list[tuple[int, dict[str, Any]]], int | None]:
    """Parsed JSON lines of ``path`` (line number, object), and the byte offset to truncate
    to when the last line is incomplete (an interrupted write); a bad line before the last
    raises ValueError."""
    from rag_gates._files import parse_json, read_bytes
    from rag_gates.errors import ArtifactFileError, InputFileError

    data = read_bytes(path, error=ArtifactFileError)
    lines = data.split(b"\n")
    parsed: list[tuple[int, dict[str, Any]]] = []
    offset = 0
    for number, raw in enumerate(lines, start=1):
        end = offset + len(raw) + 1
        if raw.strip():
            try:  # bounded: UTF-8, nesting, no lone surrogates, an object
                obj = parse_json(raw, path, line=number, finite=False, expect=dict,
                                 fix="delete that line or the file, or write to another file",
                                 error=ArtifactFileError)
            except InputFileError:
                if number == len(lines) or all(not r.strip() for r in lines[number:]):
                    logger.warning("%s:%d: dropping an incomplete last line (interrupted write)",
                                   path, number)
                    return parsed, offset
                raise
            parsed.append((number, obj))
        offset = end
    return parsed, None


def _repair_tail(path: Path, cut: int | None) -> None:
    """Drop a half-written last line, and end the file with a newline before appending."""
    if cut is not None:
        os.truncate(path, cut)
    size = path.stat().st_size
    if size:
        with path.open("rb") as handle:
            handle.seek(size - 1)
            last = handle.read(1)
        if last != b"\n":
            with path.open("ab") as handle:
                handle.write(b"\n")


def read_preferences(path: str | Path) -> list[PreferenceRecord]:
    """The records of a preference file (a half-written last line is dropped with a warning).

    Raises FileNotFoundError (saying how to build one) or ValueError naming the bad line.
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(
            f"preference file {file} not found; build one with: rag-gates cbdr "
            "build-preferences --dataset hotpotqa --out FILE")
    lines, _ = _read_lines(file)
    out: list[PreferenceRecord] = []
    for number, obj in lines:
        try:
            out.append(PreferenceRecord.model_validate(obj))
        except ValueError as exc:
            raise ValueError(f"{file}:{number} is not a preference record "
                             f"(needs id, query, pos, neg, pos_inc, neg_inc): {exc}") from exc
    return out


def _load_state(out: Path, identity: dict[str, Any]) -> tuple[set[str], dict[str, SkipReason]]:
    """Ids already written to ``out`` and ids skipped before (resume); prepares both files."""
    state = state_path(out)
    if out.stat().st_size == 0 and not state.is_file():  # new: the caller's lock created it
        write_text_atomic(state, json.dumps({"identity": identity}) + "\n")
        return set(), {}
    skipped: dict[str, SkipReason] = {}
    if state.is_file():
        lines, cut = _read_lines(state)
        if not lines or lines[0][1] != {"identity": identity}:
            found = lines[0][1].get("identity") if lines else None
            raise ValueError(
                f"{out} was built with other settings ({found}) than now ({identity}); "
                "write to another --out, or delete the file (and its .state) to start over")
        for number, obj in lines[1:]:
            reason = obj.get("skipped")
            if not isinstance(obj.get("id"), str) or reason not in ("no_context", "no_pos",
                                                                    "no_neg"):
                raise ValueError(f"{state}:{number} is not a skip record; delete {state} "
                                 "(skipped questions are then scored again)")
            skipped[obj["id"]] = reason
        _repair_tail(state, cut)
    else:
        logger.warning("%s has no %s; resuming without checking the settings it was built "
                       "with", out, state.name)
        write_text_atomic(state, json.dumps({"identity": identity}) + "\n")
    lines, cut = _read_lines(out)
    done: set[str] = set()
    for number, obj in lines:
        try:
            done.add(PreferenceRecord.model_validate(obj).id)
        except ValueError as exc:
            raise ValueError(f"{out}:{number} is not a preference record ({exc}); delete that "
                             "line or write to another --out") from exc
    _repair_tail(out, cut)
    return done, skipped


def _append(handle: IO[str], obj: dict[str, Any]) -> None:
    handle.write(json.dumps(obj, ensure_ascii=False) + "\n")
    handle.flush()
    os.fsync(handle.fileno())


def build_preferences(
    reranker: ConfidenceGainReranker,
    examples: Sequence[QAExample],
    *,
    max_pos: int = 5,
    max_neg: int = 5,
    out: Path,
    progress: Callable[[int, int, int], None] | None = None,
) -> PreferenceStats:
    """Score each question's candidate passages by ``Inc`` and append preference records.

    Args:
        reranker: the zero-shot confidence-gain reranker (model + trained probe).
        examples: questions whose ``context`` paragraphs are the candidates (HotpotQA, 2Wiki).
        max_pos: at most this many positives (``Inc > 0``, highest first) per question.
        max_neg: at most this many negatives (``Inc < 0``, lowest first) per question.
        out: the JSONL file; appended to and resumed if it exists (see the module docs).
        progress: called as ``progress(done, total, records_so_far)`` after each question.

    Returns:
        :class:`PreferenceStats` (records written, questions skipped and why, seconds).

    Example:
        >>> stats = build_preferences(reranker, examples, out=Path("prefs.jsonl"))
        >>> print(f"{stats.records} records, {stats.skipped_no_neg} without a negative")
    """
    if not isinstance(reranker, ConfidenceGainReranker):
        raise TypeError("reranker must be a ConfidenceGainReranker (a model and its probe), "
                        f"got {type(reranker).__name__}")
    if max_pos < 1 or max_neg < 1:
        raise ValueError(f"max_pos and max_neg must be >= 1, got {max_pos} and {max_neg}")
    if examples and not any(e.context for e in examples):
        raise ValueError(
            f"none of the {len(examples)} questions has candidate passages (QAExample.context);"
            " use a dataset whose rows carry paragraphs: hotpotqa or 2wiki")
    start = time.perf_counter()
    out = Path(out)
    identity = _identity(reranker, max_pos, max_neg)
    unique: dict[str, QAExample] = {}
    for example in examples:
        unique.setdefault(example.id, example)
    counts: dict[str, int] = {"written": 0, "already_written": 0, "no_context": 0, "no_pos": 0,
                              "no_neg": 0}
    total = len(unique)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Locked before the records are read: a second run on the same --out stops here
    # (FileInUseError) instead of writing every record a second time.
    records = append_locked(out)
    try:
        done, skipped = _load_state(out, identity)
        state = state_path(out).open("a", encoding="utf-8")
    except BaseException:
        records.close()
        raise
    with records, state:
        for i, example in enumerate(unique.values(), start=1):
            if example.id in done:
                counts["already_written"] += 1
            elif example.id in skipped:
                counts[skipped[example.id]] += 1
            else:
                record, reason = _score(reranker, example, max_pos, max_neg)
                if record is not None:
                    _append(records, record.model_dump(mode="json"))
                    counts["written"] += 1
                else:
                    assert reason is not None
                    _append(state, {"id": example.id, "skipped": reason})
                    counts[reason] += 1
                    logger.debug("%s: skipped (%s)", example.id, reason)
            if progress is not None:
                progress(i, total, counts["written"] + counts["already_written"])
    return PreferenceStats(
        questions=total, written=counts["written"], already_written=counts["already_written"],
        skipped_no_context=counts["no_context"], skipped_no_pos=counts["no_pos"],
        skipped_no_neg=counts["no_neg"], seconds=time.perf_counter() - start, out=str(out))


def _score(reranker: ConfidenceGainReranker, example: QAExample, max_pos: int, max_neg: int
           ) -> tuple[PreferenceRecord | None, SkipReason | None]:
    """One question's record, or why it has none."""
    passages = [p for p in example.context if p.text.strip()]
    if not passages:
        return None, "no_context"
    ranked = reranker.rerank(example.question, passages).ranked  # highest Inc first
    pos = [s for s in ranked if s.score > 0][:max_pos]
    neg = [s for s in reversed(ranked) if s.score < 0][:max_neg]
    if not pos:
        return None, "no_pos"
    if not neg:
        return None, "no_neg"
    return PreferenceRecord(
        id=example.id, query=example.question,
        pos=[passage_text(s.passage) for s in pos], neg=[passage_text(s.passage) for s in neg],
        pos_inc=[s.score for s in pos], neg_inc=[s.score for s in neg]), None
