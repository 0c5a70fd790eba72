"""The testbed as benchmark datasets: ``rag-gates bench --dataset testbed:DIR``.

Dataset names (DIR is a directory written by ``rag-gates testbed build``):

- ``testbed:DIR``: the PopQA-form questions of the evaluation facts;
- ``testbed-calibration:DIR``, ``testbed-probe:DIR``: the other splits' facts;
- ``testbed-all:DIR``: every fact;
- ``testbed-twohop:DIR``: two-hop questions whose first hop is an evaluation fact ("In
  what city was the director of X born?": the fact, then its purpose-written bridge);
  ``testbed-twohop-calibration:DIR``: those over calibration facts (to calibrate on).

Every question's ``meta`` carries its fact's repetition count (``repetitions``; a list of two
for two-hop questions, with each hop's own question and answers in ``subqueries``), split,
relation, subject popularity and the counterfactual passage (a
passage of the same form with a wrong object of the same relation). The retrieval corpus
(``load_retriever("testbed:DIR")``) holds one passage per fact plus the Wikipedia paragraphs.

Example:
    >>> from rag_gates.eval.datasets import load_dataset
    >>> data = load_dataset("testbed:~/.cache/rag-gates/testbeds/tb1", n=300)  # doctest: +SKIP
    >>> data.examples[0].meta["repetitions"]                                     # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rag_gates.eval.datasets import DatasetLoad, QAExample
from rag_gates.types import Passage

__all__ = ["TESTBED_SPLITS", "is_testbed", "load_testbed_dataset", "testbed_dir",
           "testbed_passages"]

#: dataset-name prefix -> which questions it holds
TESTBED_SPLITS = {"testbed": "evaluation", "testbed-calibration": "calibration",
                  "testbed-probe": "probe", "testbed-all": "all", "testbed-twohop": "twohop",
                  "testbed-twohop-calibration": "twohop-calibration"}


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
    if split.startswith("twohop"):
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
