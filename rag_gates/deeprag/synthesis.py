"""Training data for DeepRAG: Algorithm 1 over many questions, one JSON line per question.

Each row records the question, its gold answers, the search's status, the trajectory found
(or null), and its cost: expansions under the cap (the cap is on the row), model calls,
retrievals and seconds. The file's first line records the model, retriever and settings; a
second run with the same file skips the questions already written (an interruption loses at
most the question in progress) and refuses other settings.

``decomposition="given"`` searches over the rows' own subqueries instead of the model's
(:class:`~rag_gates.deeprag.search.TrajectorySearch`'s module docs): a row's
``meta["subqueries"]`` (``[{"question": ..., "answers": [...]}, ...]``, as the testbed's
two-hop rows carry), and a row without them is one subquery, the question itself.

Example:
    >>> from rag_gates.deeprag.search import TrajectorySearch
    >>> search = TrajectorySearch(lm, bm25, max_expansions=48)            # doctest: +SKIP
    >>> stats = synthesize(search, examples, Path("deeprag-rows.jsonl"))  # doctest: +SKIP
    >>> stats.found, stats.mean_retrievals                                # doctest: +SKIP
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rag_gates._io import JsonlLog
from rag_gates.deeprag.search import Decomposition, SearchOutcome, TrajectorySearch
from rag_gates.errors import ArtifactError
from rag_gates.types import QAExample

__all__ = ["SynthesisRow", "SynthesisStats", "given_decomposition", "read_rows", "synthesize"]

logger = logging.getLogger(__name__)


class SynthesisRow(SearchOutcome):
    """One question's search result, as written to the JSONL file."""

    id: str
    dataset: str
    question: str
    answers: list[str]


class SynthesisStats(BaseModel):
    """What a synthesis file holds after a :func:`synthesize` call."""

    model_config = ConfigDict(frozen=True)

    questions: int = Field(..., ge=0)
    written: int = Field(..., ge=0, description="Rows searched by this call.")
    already_written: int = Field(0, ge=0, description="Rows found in the file (resumed).")
    found: int = Field(0, ge=0, description="Questions with a trajectory.")
    expansion_cap: int = Field(0, ge=0, description="Questions that hit the expansion cap.")
    mean_retrievals: float | None = Field(None, description="On the trajectories found.")
    mean_expansions: float = 0.0
    mean_seconds: float = 0.0
    out: str = ""

    @property
    def found_share(self) -> float:
        return self.found / self.questions if self.questions else 0.0


def _header(search: TrajectorySearch, decomposition: str) -> dict[str, Any]:
    header = {"kind": "deeprag-synthesis",
              "model_id": str(getattr(search.lm, "model_id", "")),
              "retriever": str(getattr(search.retriever, "name", "")),
              "config": search.config.model_dump(mode="json"),
              "max_expansions": search.max_expansions, "match": search.match}
    if decomposition != "model":  # files written before the option keep their header
        header["decomposition"] = decomposition
    return header


def given_decomposition(example: QAExample) -> Decomposition:
    """The row's own subqueries with their gold answers (``meta["subqueries"]``), or the
    question itself as the one subquery of a row without them.

    Example:
        >>> from rag_gates.types import QAExample
        >>> given_decomposition(QAExample(id="1", dataset="d", question="Who?", answers=["A"]))
        [('Who?', ['A'])]
    """
    subqueries = example.meta.get("subqueries")
    if subqueries is None:
        return [(example.question, list(example.answers))]
    if not isinstance(subqueries, list) or not subqueries:
        raise ArtifactError(f"{example.dataset} row {example.id}: meta['subqueries'] must be a "
                            f"non-empty list, got {subqueries!r}")
    out: list[tuple[str, list[str]]] = []
    for sub in subqueries:
        question = sub.get("question") if isinstance(sub, dict) else None
        answers = sub.get("answers") if isinstance(sub, dict) else None
        if not isinstance(question, str) or not isinstance(answers, list):
            raise ArtifactError(f"{example.dataset} row {example.id}: each subquery must be "
                                f'{{"question": str, "answers": [str, ...]}}, got {sub!r}')
        out.append((question, [str(a) for a in answers]))
    return out


def _summary(rows: Sequence[SynthesisRow], written: int, out: Path) -> SynthesisStats:
    found = [r for r in rows if r.trajectory is not None]
    n = len(rows)
    return SynthesisStats(
        questions=n, written=written, already_written=n - written, found=len(found),
        expansion_cap=sum(r.status == "expansion_cap" for r in rows),
        mean_retrievals=(sum(r.trajectory.retrievals for r in found if r.trajectory)
                         / len(found)) if found else None,
        mean_expansions=sum(r.expansions for r in rows) / n if n else 0.0,
        mean_seconds=sum(r.seconds for r in rows) / n if n else 0.0, out=str(out))


def synthesize(search: TrajectorySearch, examples: Sequence[QAExample], out: str | Path, *,
               progress: Callable[[int, int, int], None] | None = None,
               decomposition: Literal["model", "given"] = "model") -> SynthesisStats:
    """Search every example, appending one row per question to ``out`` (resumable).

    ``progress(done, total, found_so_far)`` is called after each question.
    ``decomposition``: ``model`` (the model writes the subqueries, the paper's Algorithm 1)
    or ``given`` (each row's own, :func:`given_decomposition`).
    """
    if decomposition not in ("model", "given"):
        raise ValueError(f"decomposition must be 'model' or 'given', got {decomposition!r}")
    path = Path(out)
    log = JsonlLog(path, _header(search, decomposition))
    rows: dict[tuple[str, str], SynthesisRow] = {}
    with log:
        for record in log.open():
            row = SynthesisRow.model_validate(record)
            rows[(row.dataset, row.id)] = row
        written = 0
        wanted: list[SynthesisRow] = []
        for i, example in enumerate(examples, start=1):
            key = (example.dataset, example.id)
            if key not in rows:
                start = time.perf_counter()
                outcome = search.run(example.question, example.answers, decomposition=(
                    given_decomposition(example) if decomposition == "given" else None))
                rows[key] = SynthesisRow(
                    **{**outcome.model_dump(), "seconds": time.perf_counter() - start},
                    id=example.id, dataset=example.dataset, question=example.question,
                    answers=list(example.answers))
                log.append(rows[key].model_dump(mode="json"))
                written += 1
            wanted.append(rows[key])
            if progress is not None:
                progress(i, len(examples), sum(r.found for r in wanted))
    return _summary(wanted, written, path)


def read_rows(path: str | Path) -> list[SynthesisRow]:
    """The rows of a synthesis file (written by :func:`synthesize`)."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"synthesis file {file} not found; write one with: rag-gates "
                                "deeprag synthesize --dataset hotpotqa --out FILE")
    from rag_gates._files import parse_json, read_text
    from rag_gates.errors import ArtifactFileError

    out = []
    # The bounded reader: a non-UTF-8 or binary file is named, not a codec error.
    header, *lines = read_text(file, error=ArtifactFileError).splitlines(keepends=True) or [""]
    if '"deeprag-synthesis"' not in header:
        raise ArtifactFileError(f"{file} is not a deeprag synthesis file (its first line is "
                                f"{header[:120]!r})", path=file, line=1)
    for number, line in enumerate(lines, start=2):
        if line.strip():
            try:
                parse_json(line, file, line=number, finite=False)  # nesting, surrogates
                out.append(SynthesisRow.model_validate_json(line))
            except ValueError as exc:
                if not line.endswith("\n"):  # cut by an interruption: resumed later
                    logger.warning("%s:%d: skipping a half-written last line", file, number)
                    continue
                raise ArtifactFileError(f"{file}:{number} is not a synthesis row: {exc}",
                                        path=file, line=number) from exc
    return out
