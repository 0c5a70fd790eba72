"""The router's third branch: a three-way spec (``rag-gates calibrate --abstain``) answers
from the retriever's documents with the answer the spec covers, or abstains, on the tiny
model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableLambda

from langchain_rag_gates import DEFAULT_ABSTAIN_MESSAGE, passages_to_documents, route_by_gate
from rag_gates.calibration import load_gate
from rag_gates.confidence import answer_with_passages
from rag_gates.retrieval.bm25 import BM25Retriever
from rag_gates.testing import tiny_three_way_spec
from rag_gates.types import Passage

QUESTION = "Who wrote the play Hamlet?"
BM25 = BM25Retriever.from_passages([
    Passage(id="a", title="Hamlet", text="Hamlet is a tragedy by William Shakespeare."),
    Passage(id="b", title="Paris", text="Paris is the capital of France."),
])


def _retriever() -> Any:
    def search(query: str) -> list[Document]:
        return passages_to_documents(BM25.retrieve(query, 1))

    return RunnableLambda(search)


def _router(tiny: Any, spec: Path, **kwargs: Any) -> Any:
    never = RunnableLambda(lambda x: pytest.fail("the retrieve chain must not run"))
    return route_by_gate(load_gate(spec, lm=tiny), retrieve=never,
                         direct=RunnableLambda(lambda x: "direct"), retriever=_retriever(),
                         **kwargs)


def test_answers_with_the_certified_answer(tiny: Any, tmp_path: Path) -> None:
    spec = tiny_three_way_spec(tiny, tmp_path / "gate.json", abstain_threshold=1e6)
    msg = _router(tiny, spec).invoke({"question": QUESTION})
    expected = answer_with_passages(tiny, QUESTION, BM25.retrieve(QUESTION, 1),
                                    max_new_tokens=12)
    assert isinstance(msg, AIMessage) and msg.content == expected.answer
    verdict = msg.response_metadata["rag_gates"]["abstain"]
    assert verdict["abstain"] is False and verdict["score"] == pytest.approx(expected.score)


def test_abstains_through_the_third_branch(tiny: Any, tmp_path: Path) -> None:
    spec = tiny_three_way_spec(tiny, tmp_path / "gate.json", abstain_threshold=0.0)
    msg = _router(tiny, spec).invoke({"question": QUESTION})
    assert msg.content == DEFAULT_ABSTAIN_MESSAGE
    assert msg.response_metadata["rag_gates"]["abstain"]["abstain"] is True
    escalate = _router(tiny, spec, abstain=RunnableLambda(
        lambda x: AIMessage(content=f"escalated: {x['question']}")))
    assert escalate.invoke({"question": QUESTION}).content == f"escalated: {QUESTION}"
    chunks = list(escalate.stream({"question": QUESTION}))
    assert chunks[0].response_metadata["rag_gates"]["abstain"]["abstain"] is True


async def test_async_paths(tiny: Any, tmp_path: Path) -> None:
    spec = tiny_three_way_spec(tiny, tmp_path / "gate.json", abstain_threshold=0.0)
    router = _router(tiny, spec)
    assert (await router.ainvoke({"question": QUESTION})).content == DEFAULT_ABSTAIN_MESSAGE
    chunks = [c async for c in router.astream({"question": QUESTION})]
    assert chunks[0].content == DEFAULT_ABSTAIN_MESSAGE


def test_a_three_way_spec_without_a_retriever_is_refused(tiny: Any, tmp_path: Path) -> None:
    spec = tiny_three_way_spec(tiny, tmp_path / "gate.json", abstain_threshold=0.0)
    with pytest.raises(ValueError, match="pass retriever="):
        route_by_gate(load_gate(spec, lm=tiny), retrieve=RunnableLambda(lambda x: x),
                      direct=RunnableLambda(lambda x: x))
