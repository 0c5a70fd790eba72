"""The testbed as benchmark datasets: ``rag-gates bench --dataset testbed:DIR``.

Dataset names (DIR is a directory written by ``rag-gates testbed build``):

- ``testbed:DIR``: the PopQA-form questions of the evaluation facts;
- ``testbed-calibration:DIR``, ``testbed-probe:DIR``: the other splits' facts;
- ``testbed-all:DIR``: every fact;
- ``testbed-twohop:DIR``: two-hop questions whose first hop is an evaluation fact ("In
  what city was the director of X born?": the fact, then its purpose-written bridge);
  ``testbed-twohop-calibration:DIR``: those over calibration facts (to calibrate on);
- ``testbed-hops:DIR``: each hop of the two-hop questions asked alone (the facts and the
  bridges, once each): its closed-book answers say which subqueries the model could answer
  without retrieval (:func:`rag_gates_lab.boundary.subquery_boundary`).

Every question's ``meta`` carries its fact's repetition count (``repetitions``; a list of two
for two-hop questions, with each hop's own question and answers in ``subqueries``), split,
relation, subject popularity and the counterfactual passage (a
passage of the same form with a wrong object of the same relation). The retrieval corpus
(``load_retriever("testbed:DIR")``) holds one passage per fact plus the Wikipedia paragraphs.

Example:
    >>> from rag_gates_lab.datasets import load_dataset
    >>> data = load_dataset("testbed:~/.cache/rag-gates/testbeds/tb1", n=300)  # doctest: +SKIP
    >>> data.examples[0].meta["repetitions"]                                     # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rag_gates.types import Passage, QAExample
from rag_gates_lab.dataset_load import DatasetLoad

__all__ = ["TESTBED_SPLITS", "is_testbed", "load_testbed_dataset", "testbed_dir",
           "testbed_passages", "twohop_hops"]

#: dataset-name prefix -> which questions it holds
TESTBED_SPLITS = {"testbed": "evaluation", "testbed-calibration": "calibration",
                  "testbed-probe": "probe", "testbed-all": "all", "testbed-twohop": "twohop",
                  "testbed-twohop-calibration": "twohop-calibration",
                  "testbed-hops": "hops"}


def is_testbed(name: str) -> bool:
    """Whether ``name`` is a testbed dataset name (``testbed:DIR`` and its variants)."""
    prefix, sep, _ = name.partition(":")
    return bool(sep) and prefix in TESTBED_SPLITS


def _parse(name: str) -> tuple[str, Path]:
    prefix, sep, rest = name.partition(":")
    if not sep or prefix not in TESTBED_SPLITS or not rest:
        raise ValueError(f"not a testbed dataset name: {name!r}; use testbed:DIR (or "
                         f"{', '.join(p + ':DIR' for p in TESTBED_SPLITS if p != 'testbed')})")
    directory = Path(rest).expanduser()
    if not (directory / "manifest.jsonl").is_file():
        raise FileNotFoundError(f"{directory} holds no testbed (no manifest.jsonl); build it "
                                f"with: rag-gates testbed build --out {directory}")
    return TESTBED_SPLITS[prefix], directory


def testbed_dir(name: str) -> Path:
    """The testbed directory a dataset name points to."""
    return _parse(name)[1]


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.open(encoding="utf-8") if line.strip()]


def load_testbed_dataset(name: str, *, n: int | None = None, offset: int = 0) -> DatasetLoad:
    """The questions of a testbed split (see the module docs for the names)."""
    split, directory = _parse(name)
    if n is not None and n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    examples: list[QAExample] = []
    if split == "hops":
        path = directory / "twohop.jsonl"
        seen: set[str] = set()
        for row in _rows(path):
            for hop, sub, r in zip(row["hops"], row.get("subqueries") or [],
                                   row["repetitions"], strict=False):
                if hop in seen:
                    continue
                seen.add(hop)
                examples.append(QAExample(id=hop, dataset="testbed", question=sub["question"],
                                          answers=sub["answers"], meta={"repetitions": r}))
    elif split.startswith("twohop"):
        path = directory / "twohop.jsonl"
        wanted = "calibration" if split == "twohop-calibration" else "evaluation"
        for row in _rows(path):
            if row["splits"][0] != wanted:
                continue
            examples.append(QAExample(
                id=row["id"], dataset="testbed", question=row["question"],
                answers=row["answers"],
                meta={"repetitions": row["repetitions"], "hops": row["hops"],
                      "splits": row["splits"], "subqueries": row.get("subqueries")}))
    else:
        path = directory / "manifest.jsonl"
        counterfactual = {r["fact"]: r for r in _rows(directory / "counterfactual.jsonl")}
        for row in _rows(path):
            if split != "all" and row["split"] != split:
                continue
            cf = counterfactual.get(row["id"], {})
            examples.append(QAExample(
                id=row["id"], dataset="testbed", question=row["question"],
                answers=row["answers"],
                meta={"repetitions": row["repetitions"], "split": row["split"],
                      "prop": row["prop"], "subj": row["subj"], "s_pop": row["s_pop"],
                      "popularity_bin": row["popularity_bin"],
                      "counterfactual": cf.get("text"),
                      "counterfactual_object": cf.get("object")}))
    examples = examples[offset:]
    if n is not None:
        examples = examples[:n]
    return DatasetLoad(name=name, path=str(path), examples=examples)


def testbed_passages(name: str) -> list[Passage]:
    """The retrieval corpus: one passage per fact, then the Wikipedia paragraphs."""
    _, directory = _parse(name)
    return [Passage(id=r["id"], title=r.get("title"), text=r["text"])
            for r in _rows(directory / "passages.jsonl")]


def twohop_hops(directory: str | Path) -> dict[str, list[tuple[str, str]]]:
    """Two-hop question id -> its hops as ``(hop id, subject)`` in order (the fact's subject,
    then the bridge's person), for per-subquery analyses."""
    root = Path(directory).expanduser()
    subjects = {r["id"]: r["subj"] for r in _rows(root / "manifest.jsonl")}
    bridges = root / "bridges.jsonl"
    if bridges.is_file():
        subjects |= {r["id"]: r["subj"] for r in _rows(bridges)}
    return {row["id"]: [(hop, subjects.get(hop, "")) for hop in row["hops"]]
            for row in _rows(root / "twohop.jsonl")}
