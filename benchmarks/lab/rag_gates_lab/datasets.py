"""QA datasets in the formats of the shared development data: HotpotQA (distractor),
2WikiMultihopQA, PopQA and PubMedQA.

Every loader yields :class:`QAExample` objects: id, question, gold answers (aliases included),
context paragraphs where the dataset has them, and the dataset's own extra fields in ``meta``.
A malformed line is reported with its line number and skipped, never a crash.

Example:
    >>> from rag_gates_lab.datasets import load_dataset
    >>> data = load_dataset("hotpotqa", n=200)      # ../shared/data, else the shipped slice
    >>> data.examples[0].question, data.examples[0].answers
    >>> data.skipped                                 # [(line number, reason), ...]
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rag_gates._text import check_encodable
from rag_gates.types import Passage, QAExample
from rag_gates_lab.dataset_load import DatasetLoad
from rag_gates_lab.testbed.dataset import is_testbed, load_testbed_dataset, testbed_dir

__all__ = [
    "DATASETS",
    "DatasetLoad",
    "QAExample",
    "data_search_path",
    "find_dataset_file",
    "load_dataset",
    "resolve_dataset_file",
]

logger = logging.getLogger(__name__)

# benchmarks/lab/rag_gates_lab/datasets.py -> the repository root (an editable install).
_PROJECT_ROOT = Path(__file__).resolve().parents[3]


def _paragraphs(context: Any) -> list[Passage]:
    out = []
    for title, sentences in context:
        text = "".join(sentences) if isinstance(sentences, list) else str(sentences)
        out.append(Passage(id=str(title), title=str(title), text=text.strip()))
    return out


def _hotpot_like(dataset: str) -> Callable[[dict[str, Any], int], QAExample]:
    def parse(row: dict[str, Any], line: int) -> QAExample:
        answers = [str(row["answer"])]
        answers += [str(a) for a in row.get("answer_aliases") or [] if str(a) not in answers]
        return QAExample(
            id=str(row.get("_id") or f"{dataset}-{line}"),
            dataset=dataset,
            question=str(row["question"]),
            answers=answers,
            context=_paragraphs(row.get("context") or []),
            supporting_titles=list(dict.fromkeys(str(t) for t, _ in row["supporting_facts"])),
            meta={"type": row.get("type"), "level": row.get("level")},
        )

    return parse


def _popqa(row: dict[str, Any], line: int) -> QAExample:
    answers = row["possible_answers"]
    if isinstance(answers, str):  # upstream stores a JSON list as a string
        answers = json.loads(answers)
    gold = [Passage(id=str(p.get("title")), title=str(p.get("title")), text=str(p["text"]))
            for p in row.get("gold_paragraphs") or []]
    return QAExample(
        id=str(row.get("id") or f"popqa-{row.get('popqa_row_index', line)}"),
        dataset="popqa",
        question=str(row["question"]),
        answers=[str(a) for a in answers],
        context=gold,
        meta={"s_pop": row.get("s_pop"), "o_pop": row.get("o_pop"), "subj": row.get("subj"),
              "prop": row.get("prop"), "obj": row.get("obj")},
    )


def _pubmedqa(row: dict[str, Any], line: int) -> QAExample:
    decision = str(row["final_decision"]).strip().lower()
    if decision not in ("yes", "no", "maybe"):
        raise ValueError(f"final_decision must be yes/no/maybe, got {decision!r}")
    pubid = str(row.get("pubid") or f"pubmedqa-{line}")
    return QAExample(
        id=pubid,
        dataset="pubmedqa",
        question=str(row["question"]),
        answers=[decision],
        context=[Passage(id=pubid, title=None, text=str(row["context"]))],
        meta={"final_decision": decision},
    )


# name -> (file stem in the shared data, row parser)
DATASETS: dict[str, tuple[str, Callable[[dict[str, Any], int], QAExample]]] = {
    "hotpotqa": ("hotpotqa_dev", _hotpot_like("hotpotqa")),
    "2wiki": ("2wikimultihopqa_dev", _hotpot_like("2wiki")),
    "popqa": ("popqa_dev", _popqa),
    "pubmedqa": ("pubmedqa_dev", _pubmedqa),
}


def data_search_path() -> list[Path]:
    """Where dataset files are looked for, in order."""
    paths = []
    if os.environ.get("RAG_GATES_DATA"):
        paths.append(Path(os.environ["RAG_GATES_DATA"]))
    paths += [Path.cwd() / ".." / "shared" / "data", _PROJECT_ROOT / ".." / "shared" / "data",
              _PROJECT_ROOT / "examples" / "data"]
    return paths


def _check_name(name: str) -> str:
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(sorted(DATASETS))}")
    return name


def find_dataset_file(name: str) -> Path:
    """The first file for ``name`` on the search path (full split before shipped slice)."""
    stem = DATASETS[_check_name(name)][0]
    tried = []
    for directory in data_search_path():
        for candidate in (directory / f"{stem}.jsonl", directory / f"{stem}_sample.jsonl"):
            if candidate.is_file():
                return candidate.resolve()
            tried.append(str(candidate))
    raise FileNotFoundError(
        f"no data file for {name!r}; tried: {', '.join(tried)}. Pass path=..., or set "
        "RAG_GATES_DATA to a directory holding it."
    )


def resolve_dataset_file(name: str, path: str | Path | None = None) -> Path:
    """``path`` as a file, or the dataset's file inside ``path``, or found on the search path."""
    if is_testbed(name):  # testbed:DIR names its own directory; its manifest is the file
        return (testbed_dir(name) / "manifest.jsonl").resolve()
    if path is None:
        return find_dataset_file(name)
    file = Path(path)
    if file.is_dir():
        stem = DATASETS[_check_name(name)][0]
        file = next((c for c in (file / f"{stem}.jsonl", file / f"{stem}_sample.jsonl")
                     if c.is_file()), file / f"{stem}.jsonl")
    if not file.is_file():
        raise FileNotFoundError(f"dataset file {file} does not exist")
    return file.resolve()


def load_dataset(name: str, path: str | Path | None = None, *, n: int | None = None,
                 offset: int = 0) -> DatasetLoad:
    """Load up to ``n`` questions (after skipping ``offset`` valid ones) of a dataset.

    ``path`` may be a file or a directory holding ``<stem>.jsonl``; by default the search
    path is ``$RAG_GATES_DATA``, ``../shared/data``, then the slices shipped in
    ``examples/data``. Malformed lines (and a question with a lone surrogate) are skipped,
    logged and listed in ``skipped``, as is a row whose id an earlier row already has (the
    first is kept; ``n`` counts distinct questions).
    ``testbed:DIR`` (and its variants) load a built testbed's questions
    (:mod:`rag_gates_lab.testbed.dataset`).
    """
    if is_testbed(name):
        return load_testbed_dataset(name, n=n, offset=offset)
    parse = DATASETS[_check_name(name)][1]
    file = resolve_dataset_file(name, path)
    if n is not None and n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    examples: list[QAExample] = []
    skipped: list[tuple[int, str]] = []
    first_line: dict[str, int] = {}  # question id -> line it was first read from
    valid = 0
    with file.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if n is not None and len(examples) >= n:
                break
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
                if not isinstance(row, dict):
                    raise ValueError("line is not a JSON object")
                if isinstance(row.get("question"), str):  # named by position, before parsing
                    check_encodable(row["question"], "question")
                example = parse(row, number)
            except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
                reason = f"{type(exc).__name__}: {exc}"
                logger.warning("%s:%d: skipped malformed %s row (%s)", file, number, name,
                               reason)
                skipped.append((number, reason[:300]))
                continue
            if example.id in first_line:
                # A run keys answers by id: a second row with the same id would be answered
                # once but counted twice.
                reason = (f"duplicate id {example.id!r} (first on line {first_line[example.id]})"
                          "; the first row is kept")
                logger.warning("%s:%d: skipped %s", file, number, reason)
                skipped.append((number, reason))
                continue
            first_line[example.id] = number
            valid += 1
            if valid > offset:
                examples.append(example)
    return DatasetLoad(name=name, path=str(file), examples=examples, skipped=skipped)
