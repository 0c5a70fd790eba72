"""Shared SR-RAG fixtures: real PopQA slice questions and a BM25 index over their paragraphs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

SLICE = Path(__file__).resolve().parents[2] / "examples" / "data"


@pytest.fixture(scope="session")
def popqa() -> list[Any]:
    from rag_gates_lab.datasets import load_dataset

    return load_dataset("popqa", SLICE / "popqa_dev_sample.jsonl", n=12).examples


@pytest.fixture(scope="session")
def bm25(popqa: list[Any]) -> Any:
    from rag_gates.retrieval.bm25 import BM25Retriever

    passages = [p.model_copy(update={"id": f"p{i}-{j}"})
                for i, e in enumerate(popqa) for j, p in enumerate(e.context)]
    return BM25Retriever.from_passages(passages)
