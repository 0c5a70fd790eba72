"""GatedQueryEngine answers once: when a gate that generated the closed-book answer skips
retrieval, that answer is the reply. LM calls are counted through rag-gates' recording
wrapper around the tiny model."""

from __future__ import annotations

from typing import Any

import pytest
from llama_index.core.prompts import PromptTemplate
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.llms.rag_gates import RagGatesLLM
from llama_index.query_engine.rag_gates import DEFAULT_DIRECT_PROMPT, GatedQueryEngine
from llama_index.retrievers.rag_gates.base import PassageRetriever

from rag_gates.confidence import AnswerLogprobGate
from rag_gates.lm.recorded import RecordedLM
from rag_gates.prompts import qa_prompt
from rag_gates.retrieval.bm25 import BM25Retriever
from rag_gates.types import Passage, TraceRecorder

QUESTION = "Who wrote the play Hamlet?"


@pytest.fixture(scope="module")
def bm25() -> BM25Retriever:
    return BM25Retriever.from_passages([
        Passage(id="a", title="Hamlet", text="Hamlet is a tragedy by William Shakespeare."),
        Passage(id="b", title="Paris", text="Paris is the capital of France."),
    ])


def _engine(tiny: Any, bm25: BM25Retriever, rec: TraceRecorder, threshold: float,
            **kwargs: Any) -> GatedQueryEngine:
    lm = RecordedLM(tiny, rec)
    llm = RagGatesLLM(lm=lm, max_new_tokens=12)
    inner = RetrieverQueryEngine.from_args(PassageRetriever(bm25, similarity_top_k=1), llm=llm)
    gate = AnswerLogprobGate(lm, threshold=threshold, max_new_tokens=12)
    return GatedQueryEngine(inner, gate=gate, llm=llm, **kwargs)


def test_a_skip_replies_with_the_gates_answer_in_one_generation(tiny_li: Any, bm25: Any) -> None:
    direct = RagGatesLLM(lm=tiny_li, max_new_tokens=12).predict(
        PromptTemplate("{query_str}"), query_str=qa_prompt(QUESTION))
    rec = TraceRecorder()
    response = _engine(tiny_li, bm25, rec, threshold=100.0).query(QUESTION)
    assert rec.trace().llm_calls == 1
    assert response.response == direct
    assert response.metadata["rag_gates"]["answer_once"]["answer_reused"] is True
    assert response.source_nodes == []


async def test_async_skip_also_answers_once(tiny_li: Any, bm25: Any) -> None:
    rec = TraceRecorder()
    response = await _engine(tiny_li, bm25, rec, threshold=100.0).aquery(QUESTION)
    assert rec.trace().llm_calls == 1
    assert response.metadata["rag_gates"]["answer_once"]["answer_reused"] is True


async def test_async_skip_loads_a_lazy_llm_off_the_event_loop(tiny_li: Any, bm25: Any,
                                                            tmp_path: Any) -> None:
    """The answer-once check reads the direct model: a lazy RagGatesLLM loads it in a worker
    thread on the async path (before, the coroutine loaded it, stalling the loop)."""
    import threading

    from rag_gates.testing import model_load_threads, save_tiny_lm

    path = save_tiny_lm(tmp_path / "tiny")
    inner = RetrieverQueryEngine.from_args(PassageRetriever(bm25, similarity_top_k=1),
                                           llm=RagGatesLLM(lm=tiny_li, max_new_tokens=12))
    gate = AnswerLogprobGate(tiny_li, threshold=100.0, max_new_tokens=12)
    engine = GatedQueryEngine(inner, gate=gate, llm=RagGatesLLM(model=str(path),
                                                                max_new_tokens=12))
    with model_load_threads() as threads:
        response = await engine.aquery(QUESTION)
    assert len(threads) == 1 and threads[0] is not threading.current_thread()
    assert "answer_once" in response.metadata["rag_gates"]


def test_another_direct_prompt_generates_again_and_says_why(tiny_li: Any, bm25: Any) -> None:
    rec = TraceRecorder()
    engine = _engine(tiny_li, bm25, rec, threshold=100.0, direct_prompt=DEFAULT_DIRECT_PROMPT)
    response = engine.query(QUESTION)
    assert rec.trace().llm_calls == 2
    note = response.metadata["rag_gates"]["answer_once"]
    assert note["answer_reused"] is False and "prompt differs" in note["why"]


def test_a_loaded_spec_serves_in_the_engine_and_retriever(tiny_li: Any, bm25: Any,
                                                          tmp_path: Any) -> None:
    """A spec from rag_gates.calibration goes wherever a gate goes: the engine decides with
    its certified threshold, names the spec, and still answers once."""
    from llama_index.retrievers.rag_gates import GatedRetriever

    from rag_gates.calibration import load_gate
    from rag_gates.testing import tiny_gate_spec

    rec = TraceRecorder()
    lm = RecordedLM(tiny_li, rec)
    spec = tiny_gate_spec(tiny_li, tmp_path / "gate.json")
    gate = load_gate(spec, lm=lm)
    llm = RagGatesLLM(lm=lm, max_new_tokens=12)
    inner = RetrieverQueryEngine.from_args(PassageRetriever(bm25, similarity_top_k=1), llm=llm)
    engine = GatedQueryEngine(inner, gate=gate, llm=llm)
    question = "Who founded the company number 3?"  # scored below the certified threshold
    before = rec.trace().llm_calls
    response = engine.query(question)
    decision = response.metadata["rag_gates"]
    assert decision["retrieve"] is False and decision["evidence"]["spec"]["name"] == str(spec)
    assert "certified threshold" in decision["reason"]
    assert rec.trace().llm_calls - before == 1  # the spec's gate generated; reused
    nodes = GatedRetriever(PassageRetriever(bm25, similarity_top_k=1), gate=gate).retrieve(
        question)
    assert nodes == []  # the same decision keeps the retriever from running


async def test_a_streaming_engine_streams_a_skip_too(tiny_li: Any, bm25: Any) -> None:
    """index.as_query_engine(streaming=True) behind the gate: a skip is a StreamingResponse
    (AsyncStreamingResponse from aquery) like a retrieval, so response_gen is always there."""
    from llama_index.core.base.response.schema import (
        AsyncStreamingResponse,
        StreamingResponse,
    )

    def engine(threshold: float, **kwargs: Any) -> GatedQueryEngine:
        llm = RagGatesLLM(lm=tiny_li, max_new_tokens=12)
        inner = RetrieverQueryEngine.from_args(PassageRetriever(bm25, similarity_top_k=1),
                                               llm=llm, streaming=True)
        gate = AnswerLogprobGate(tiny_li, threshold=threshold, max_new_tokens=12)
        return GatedQueryEngine(inner, gate=gate, llm=llm, **kwargs)

    plain = engine(100.0, streaming=False).query(QUESTION)  # skips: the gate's answer
    assert engine(100.0).streaming and not engine(100.0, streaming=False).streaming
    skipped = engine(100.0).query(QUESTION)
    assert isinstance(skipped, StreamingResponse) and skipped.source_nodes == []
    assert "".join(skipped.response_gen) == plain.response
    assert skipped.metadata["rag_gates"]["answer_once"]["answer_reused"] is True
    regenerated = engine(100.0, direct_prompt=DEFAULT_DIRECT_PROMPT).query(QUESTION)
    assert isinstance(regenerated, StreamingResponse)
    assert "".join(regenerated.response_gen) == engine(
        100.0, direct_prompt=DEFAULT_DIRECT_PROMPT, streaming=False).query(QUESTION).response
    skipped_async = await engine(100.0).aquery(QUESTION)
    assert isinstance(skipped_async, AsyncStreamingResponse)
    assert "".join([t async for t in skipped_async.async_response_gen()]) == plain.response
