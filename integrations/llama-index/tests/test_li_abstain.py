"""GatedQueryEngine with a three-way spec (``rag-gates calibrate --abstain``): after
retrieval it replies with the answer the spec covers, or abstains, on the tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.llms.rag_gates import RagGatesLLM
from llama_index.query_engine.rag_gates import DEFAULT_ABSTAIN_MESSAGE, GatedQueryEngine
from llama_index.retrievers.rag_gates.base import PassageRetriever

from rag_gates.calibration import load_gate
from rag_gates.confidence import answer_with_passages
from rag_gates.retrieval.bm25 import BM25Retriever
from rag_gates.testing import tiny_three_way_spec
from rag_gates.types import Passage

QUESTION = "Who wrote the play Hamlet?"


@pytest.fixture(scope="module")
def bm25() -> BM25Retriever:
    return BM25Retriever.from_passages([
        Passage(id="a", title="Hamlet", text="Hamlet is a tragedy by William Shakespeare."),
        Passage(id="b", title="Paris", text="Paris is the capital of France."),
    ])


def _engine(tiny: Any, bm25: BM25Retriever, spec: Path, **kwargs: Any) -> GatedQueryEngine:
    llm = RagGatesLLM(lm=tiny, max_new_tokens=12)
    inner = RetrieverQueryEngine.from_args(PassageRetriever(bm25, similarity_top_k=1), llm=llm)
    return GatedQueryEngine(inner, gate=load_gate(spec, lm=tiny), llm=llm, **kwargs)


def test_answers_with_the_certified_answer_below_the_threshold(
        tiny_li: Any, bm25: BM25Retriever, tmp_path: Path) -> None:
    spec = tiny_three_way_spec(tiny_li, tmp_path / "gate.json", abstain_threshold=1e6)
    response = _engine(tiny_li, bm25, spec).query(QUESTION)
    expected = answer_with_passages(tiny_li, QUESTION, bm25.retrieve(QUESTION, 1),
                                    max_new_tokens=12)
    assert response.response == expected.answer
    meta = response.metadata["rag_gates"]
    assert meta["retrieve"] is True and meta["abstain"]["abstain"] is False
    assert meta["abstain"]["score"] == pytest.approx(expected.score)
    assert [n.node.metadata["title"] for n in response.source_nodes] == ["Hamlet"]


def test_abstains_at_or_above_the_threshold_and_keeps_the_nodes(
        tiny_li: Any, bm25: BM25Retriever, tmp_path: Path) -> None:
    spec = tiny_three_way_spec(tiny_li, tmp_path / "gate.json", abstain_threshold=0.0)
    response = _engine(tiny_li, bm25, spec).query(QUESTION)
    assert response.response == DEFAULT_ABSTAIN_MESSAGE
    verdict = response.metadata["rag_gates"]["abstain"]
    assert verdict["abstain"] is True and ">= certified abstention threshold" in verdict["reason"]
    assert response.source_nodes  # what was retrieved stays inspectable


async def test_async_and_a_custom_message(tiny_li: Any, bm25: BM25Retriever,
                                          tmp_path: Path) -> None:
    spec = tiny_three_way_spec(tiny_li, tmp_path / "gate.json", abstain_threshold=0.0)
    engine = _engine(tiny_li, bm25, spec, abstain_message="Not sure; ask a librarian.")
    response = await engine.aquery(QUESTION)
    assert response.response == "Not sure; ask a librarian."
    with pytest.raises(ValueError, match="abstain_message"):
        _engine(tiny_li, bm25, spec, abstain_message="  ")
