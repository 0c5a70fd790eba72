"""Document <-> Passage conversion: faithful, JSON-safe, and never touching the input."""

from __future__ import annotations

import copy
import datetime as dt
import math
from pathlib import Path
from typing import Any, cast

import pytest
from langchain_core.documents import Document

from langchain_rag_gates import (
    document_to_passage,
    documents_to_passages,
    passage_to_document,
    passages_to_documents,
)
from rag_gates.types import Passage


def sample() -> Document:
    return Document(
        id="doc-1",
        page_content="Paris is the capital of France.",
        metadata={"title": "France", "source": "wiki", "tags": ["geo"], "nested": {"a": [1]}},
    )


def test_round_trip_is_faithful_and_does_not_touch_the_input() -> None:
    doc = sample()
    before = copy.deepcopy(doc)
    passage = document_to_passage(doc)
    assert passage == Passage(
        text="Paris is the capital of France.",
        id="doc-1",
        title="France",
        score=None,
        metadata={"title": "France", "source": "wiki", "tags": ["geo"], "nested": {"a": [1]}},
    )
    back = passage_to_document(passage)
    assert back == doc
    assert doc == before
    # Nothing is shared: changing one side's nested metadata leaves the others alone.
    nested = passage.metadata["nested"]
    assert isinstance(nested, dict) and isinstance(nested["a"], list)
    nested["a"].append(2)
    back.metadata["tags"].append("x")
    assert doc == before
    assert passage_to_document(passage).metadata["tags"] == ["geo"]
    assert Passage.model_validate_json(passage.model_dump_json()) == passage


def test_id_title_and_score_sources() -> None:
    p = document_to_passage(Document(page_content="t", metadata={"id": 7, "title": 3}))
    assert (p.id, p.title, p.score) == ("7", "3", None)
    assert document_to_passage(Document(id="a", page_content="t", metadata={"id": "b"})).id == "a"
    assert document_to_passage(Document(page_content="t", metadata={"score": 0.5})).score == 0.5
    reranked = Document(page_content="t", metadata={"relevance_score": 0.9})
    assert document_to_passage(reranked).score == 0.9
    assert document_to_passage(reranked, score=0.1).score == 0.1
    assert document_to_passage(Document(page_content="t", metadata={"score": "high"})).score is None


def test_passage_fields_reach_document_metadata_without_overwriting() -> None:
    doc = passage_to_document(Passage(text="t", id="p1", title="T", score=0.25))
    assert (doc.id, doc.page_content, doc.metadata) == ("p1", "t", {"title": "T", "score": 0.25})
    kept = passage_to_document(
        Passage(text="t", title="T", score=0.25, metadata={"title": "Orig", "relevance_score": 1})
    )
    assert kept.metadata == {"title": "Orig", "relevance_score": 1}


def test_non_json_metadata_is_converted_with_str() -> None:
    when = dt.datetime(2024, 1, 2, 3, 4, 5)
    doc = Document(
        page_content="t",
        metadata={
            "when": when,
            "path": Path("/data/a.txt"),
            "nan": math.nan,
            "inf": math.inf,
            "pair": (1, 2),
            "set": {3},
            1: "int key",
            "obj": object,
            "ok": [True, None, 1.5, "s"],
        },
    )
    original = dict(doc.metadata)
    meta = document_to_passage(doc).metadata
    assert meta == {
        "when": str(when),
        "path": "/data/a.txt",
        "nan": "nan",
        "inf": "inf",
        "pair": [1, 2],
        "set": [3],
        "1": "int key",
        "obj": str(object),
        "ok": [True, None, 1.5, "s"],
    }
    assert doc.metadata == original  # input untouched (dict equality checks identity first)
    assert doc.metadata["when"] is when


def test_numpy_numbers_become_plain_numbers() -> None:
    np = pytest.importorskip("numpy")
    passage = document_to_passage(
        Document(page_content="t", metadata={"score": np.float32(0.5), "n": np.int64(3)})
    )
    assert passage.score == 0.5
    assert passage.metadata == {"score": 0.5, "n": 3}
    assert type(passage.metadata["n"]) is int


def test_list_forms_and_scored_pairs() -> None:
    docs = [sample(), Document(page_content="other")]
    passages = documents_to_passages([docs[0], (docs[1], 0.3)])
    assert [p.text for p in passages] == [d.page_content for d in docs]
    assert passages[1].score == 0.3
    back = passages_to_documents(passages)
    assert back[0] == docs[0]
    assert back[1].metadata == {"score": 0.3}
    assert documents_to_passages([]) == [] and passages_to_documents([]) == []


def test_wrong_types_are_rejected() -> None:
    with pytest.raises(TypeError, match="Document"):
        document_to_passage(cast(Any, "text"))
    with pytest.raises(TypeError, match="Passage"):
        passage_to_document(cast(Any, sample()))
