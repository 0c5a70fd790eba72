"""GatedRetriever over a real InMemoryVectorStore (embedded MiniLM over HotpotQA paragraphs)
with real gates, LangChain callbacks, and LangChain's standard retriever suite."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_tests.integration_tests import RetrieversIntegrationTests
from pydantic import Field, JsonValue

from langchain_rag_gates import (
    GatedRetriever,
    LangChainRetrieverAdapter,
    annotate_document,
    passages_to_documents,
)
from langchain_rag_gates.retrievers import DECISION_EVENT
from rag_gates.gate import BaseGate
from rag_gates.types import GateDecision
from rag_gates_lab.corpus import corpus_passages

SLICES = Path(__file__).resolve().parents[3] / "examples" / "data"
ASK = "Were Scott Derrickson and Ed Wood of the same nationality?"  # 5 capitalised words
SKIP = "what is two plus two?"  # none
KEY = "rag_gates"


class CapitalisedWordsGate(BaseGate):
    """Retrieve when the question names things: score = number of capitalised words."""

    name = "capitalised-words"

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        words = [w for w in query.split() if w[:1].isupper()]
        return float(len(words)), {"capitalised": list(words)}


@functools.cache
def store() -> InMemoryVectorStore:
    """The first four questions' paragraphs (Scott Derrickson, Ed Wood, distractors)."""
    from langchain_huggingface import HuggingFaceEmbeddings

    from rag_gates.lm.defaults import default_embedder_path

    embeddings = HuggingFaceEmbeddings(model_name=str(default_embedder_path()),
                                       model_kwargs={"device": "cpu"},
                                       encode_kwargs={"normalize_embeddings": True})

    docs = passages_to_documents(corpus_passages("hotpotqa", SLICES)[:40])
    vs = InMemoryVectorStore(embeddings)
    vs.add_documents(docs)
    return vs


class Recorder(BaseCallbackHandler):
    """Records retriever starts and custom events (sync callbacks)."""

    def __init__(self) -> None:
        self.starts: list[tuple[str, UUID, UUID | None]] = []
        self.events: list[tuple[str, Any, UUID]] = []

    def on_retriever_start(
        self, serialized: dict[str, Any], query: str, *, run_id: UUID,
        parent_run_id: UUID | None = None, **kwargs: Any,
    ) -> None:
        self.starts.append((kwargs.get("name", ""), run_id, parent_run_id))

    def on_custom_event(
        self, name: str, data: Any, *, run_id: UUID, **kwargs: Any
    ) -> None:
        self.events.append((name, data, run_id))


class AsyncRecorder(AsyncCallbackHandler):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any, UUID]] = []

    async def on_custom_event(
        self, name: str, data: Any, *, run_id: UUID, **kwargs: Any
    ) -> None:
        self.events.append((name, data, run_id))


@pytest.fixture
def gated() -> GatedRetriever:
    return GatedRetriever(retriever=store().as_retriever(), gate=CapitalisedWordsGate(2))


# ---------------------------------------------------------------- standard suite
class TestGatedRetrieverStandard(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> type[GatedRetriever]:
        return GatedRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"retriever": store().as_retriever(), "gate": CapitalisedWordsGate(2)}

    @property
    def retriever_query_example(self) -> str:
        return ASK


# ---------------------------------------------------------------- semantics
def test_yes_returns_annotated_copies_of_the_inner_documents(gated: GatedRetriever) -> None:
    inner = gated.retriever
    plain = inner.invoke(ASK)
    docs = gated.invoke(ASK)
    assert [(d.id, d.page_content) for d in docs] == [(d.id, d.page_content) for d in plain]
    assert docs[0].metadata["title"].startswith("Ed Wood")  # MiniLM's nearest paragraph
    decision = gated.last_decision
    assert isinstance(decision, GateDecision) and decision.retrieve
    assert decision.score == 5.0 and decision.threshold == 2.0
    for doc, original in zip(docs, plain, strict=True):
        assert doc.metadata == {**original.metadata, KEY: decision.model_dump(mode="json")}
    # Neither the store's records nor the inner retriever's documents were touched.
    for d in [*plain, *inner.invoke(ASK)]:
        assert KEY not in d.metadata
    assert all(KEY not in record["metadata"] for record in store().store.values())


def test_no_returns_nothing_and_skips_the_inner_retriever(gated: GatedRetriever) -> None:
    rec = Recorder()
    assert gated.invoke(SKIP, config={"callbacks": [rec]}) == []
    assert gated.last_decision is not None and not gated.last_decision.retrieve
    assert [name for name, _, _ in rec.starts] == ["GatedRetriever"]

    rec = Recorder()
    gated.invoke(ASK, config={"callbacks": [rec]})
    (outer, outer_id, _), (inner, _, parent) = rec.starts
    assert (outer, inner) == ("GatedRetriever", "VectorStoreRetriever")
    assert parent == outer_id  # the wrapped retriever runs as a child run


def test_decision_reaches_callback_handlers_as_a_custom_event(gated: GatedRetriever) -> None:
    rec = Recorder()
    gated.invoke(ASK, config={"callbacks": [rec]})
    gated.invoke(SKIP, config={"callbacks": [rec]})
    assert [(name, data["retrieve"]) for name, data, _ in rec.events] == [
        (DECISION_EVENT, True), (DECISION_EVENT, False)
    ]
    assert GateDecision.model_validate(rec.events[1][1]) == gated.last_decision
    assert rec.events[0][1]["evidence"] == {
        "capitalised": ["Were", "Scott", "Derrickson", "Ed", "Wood"]
    }
    # Each event belongs to its retriever run.
    retriever_runs = [run for name, run, _ in rec.starts if name == "GatedRetriever"]
    assert [run for _, _, run in rec.events] == retriever_runs


async def test_async_path_uses_adecide_and_async_callbacks() -> None:
    class AsyncOnlyGate(CapitalisedWordsGate):
        def decide(self, query: str, **signals: Any) -> GateDecision:
            raise AssertionError("the async path must call adecide")

        async def adecide(self, query: str, **signals: Any) -> GateDecision:
            return BaseGate.decide(self, query, **signals)

    inner = store().as_retriever()
    gated = GatedRetriever(retriever=inner, gate=AsyncOnlyGate(2), k=2)
    rec = AsyncRecorder()
    docs = await gated.ainvoke(ASK, config={"callbacks": [rec]})
    assert [d.id for d in docs] == [d.id for d in (await inner.ainvoke(ASK))[:2]]
    assert all(d.metadata[KEY]["retrieve"] is True for d in docs)
    assert await gated.ainvoke(SKIP, config={"callbacks": [rec]}) == []
    assert [(n, d["retrieve"]) for n, d, _ in rec.events] == [
        (DECISION_EVENT, True), (DECISION_EVENT, False)
    ]


async def test_astream_events_shows_the_decision(gated: GatedRetriever) -> None:
    events = [e async for e in gated.astream_events(ASK, version="v2")]
    custom = [e for e in events if e["event"] == "on_custom_event"]
    assert [e["name"] for e in custom] == [DECISION_EVENT]
    assert custom[0]["data"]["gate"] == "capitalised-words"


def test_k_is_forwarded_to_the_inner_retriever_and_cut(gated: GatedRetriever) -> None:
    # The inner retriever returns 4 by default; k asks it for more, or keeps fewer.
    assert len(gated.invoke(ASK)) == 4
    assert len(gated.invoke(ASK, k=7)) == 7
    assert len(GatedRetriever(retriever=gated.retriever, gate=gated.gate, k=6).invoke(ASK)) == 6
    with pytest.raises(ValueError, match="k must be a positive int"):
        gated.invoke(ASK, k=0)


def test_a_white_box_gate_on_the_tiny_model(tiny: Any) -> None:
    from rag_gates.confidence import FirstTokenProbGate

    inner = store().as_retriever()
    unsure = GatedRetriever(retriever=inner, gate=FirstTokenProbGate(tiny, threshold=0.0), k=1)
    (doc,) = unsure.invoke(ASK)
    evidence = doc.metadata[KEY]["evidence"]
    assert 0.0 < evidence["first_token_max_prob"] <= 1.0
    assert doc.metadata[KEY]["score"] == pytest.approx(1.0 - evidence["first_token_max_prob"])
    # 1 - max p is below 1 (max p > 0), so the top of the scale, 1, never retrieves.
    sure = GatedRetriever(retriever=inner, gate=FirstTokenProbGate(tiny, threshold=1.0))
    assert sure.invoke(ASK) == []


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(TypeError, match="Gate protocol"):
        GatedRetriever(retriever=store().as_retriever(), gate=object())
    wanted = r"LangChain retriever \(e.g. vectorstore.as_retriever\(\)\), got object \["
    with pytest.raises(ValueError, match=wanted):
        GatedRetriever(retriever=object(), gate=CapitalisedWordsGate(1))  # type: ignore[arg-type]
    from llama_index.core.retrievers import BaseRetriever as LlamaIndexRetriever

    class Nodes(LlamaIndexRetriever):
        def _retrieve(self, query_bundle: Any) -> list[Any]:
            return []

    with pytest.raises(ValueError, match=r"got Nodes; for a LlamaIndex retriever use llama_index"):
        GatedRetriever(retriever=Nodes(), gate=CapitalisedWordsGate(1))  # type: ignore[arg-type]
    for k in (0, "3", True):  # k="3" was taken as 3, though invoke(k="3") is refused
        with pytest.raises(ValueError):
            GatedRetriever(retriever=store().as_retriever(), gate=CapitalisedWordsGate(1), k=k)


def test_annotate_document_copies() -> None:
    doc = Document(page_content="x", id="d1", metadata={"nested": {"a": 1}})
    value = {"retrieve": True, "evidence": {"n": [1]}}
    out = annotate_document(doc, value)
    assert out.metadata == {"nested": {"a": 1}, KEY: value} and out.id == "d1"
    out.metadata["nested"]["a"] = 2
    out.metadata[KEY]["evidence"]["n"].append(2)
    assert doc.metadata == {"nested": {"a": 1}} and value["evidence"] == {"n": [1]}
    assert annotate_document(doc, {}, key="gate").metadata["gate"] == {}
    with pytest.raises(ValueError):
        annotate_document(doc, {}, key="")
    with pytest.raises(TypeError):
        annotate_document("x", {})  # type: ignore[arg-type]


# ---------------------------------------------------------------- composed gates
class QuestionLengthGate(BaseGate):
    name = "question-length"

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        return float(len(query.split())), {}


def test_a_composed_gate_drops_in_and_its_sub_decisions_reach_the_metadata() -> None:
    from rag_gates.gate import AllOf, Cascade

    words, length = CapitalisedWordsGate(2), QuestionLengthGate(5)
    both = GatedRetriever(retriever=store().as_retriever(), gate=AllOf(words, length))
    docs = both.invoke(ASK)  # 5 capitalised words and 11 words: both retrieve
    subs = docs[0].metadata[KEY]["evidence"]["decisions"]
    assert [s["gate"] for s in subs] == ["capitalised-words", "question-length"]
    assert both.invoke(SKIP) == []
    assert both.last_decision is not None
    assert both.last_decision.evidence["skipped"] == ["question-length"]  # short-circuited
    # Few capitalised words (the band 0..1) leave it to the question's length.
    cascade = GatedRetriever(retriever=store().as_retriever(),
                             gate=Cascade(words, QuestionLengthGate(6), band=(0, 1)))
    assert cascade.invoke(SKIP) == []  # 0 capitalised, 5 words < 6
    assert cascade.last_decision is not None
    assert cascade.last_decision.evidence["expensive_called"] is True
    assert len(cascade.invoke(ASK)) == 4  # 5 capitalised: outside the band, cheap decides
    assert cascade.last_decision.evidence["expensive_called"] is False


class ChatStarts(BaseCallbackHandler):
    """Records retriever and chain runs, and the parent of every chat model run."""

    def __init__(self) -> None:
        self.runs: dict[str, UUID] = {}
        self.chat_parents: list[UUID | None] = []

    def on_retriever_start(self, serialized: Any, query: str, *, run_id: UUID,
                           **kwargs: Any) -> None:
        self.runs.setdefault("retriever", run_id)

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID,
                       parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        if parent_run_id is None:
            self.runs.setdefault("router", run_id)

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: UUID,
                            parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self.chat_parents.append(parent_run_id)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_langchain_model_inside_the_gate_is_traced_under_the_retrievers_run(
        tiny: Any, mode: str) -> None:
    """answer-logprob over a LangChain chat model: the model's run is a child of the
    retriever's run (and of the router's), not a run of its own outside the trace."""
    import asyncio

    from langchain_core.runnables import RunnableLambda

    from langchain_rag_gates import ChatRagGates, as_text_lm, route_by_gate
    from rag_gates.confidence import AnswerLogprobGate

    gate = AnswerLogprobGate(as_text_lm(ChatRagGates(lm=tiny, max_tokens=4, logprobs=True)),
                             threshold=0.0, max_new_tokens=4)  # always retrieves
    retriever = GatedRetriever(retriever=store().as_retriever(), gate=gate)
    router = route_by_gate(gate, retrieve=RunnableLambda(lambda x: "retrieved"),
                           direct=RunnableLambda(lambda x: "direct"))
    for runnable, run in ((retriever, "retriever"), (router, "router")):
        seen = ChatStarts()
        config: Any = {"callbacks": [seen]}
        if mode == "sync":
            runnable.invoke("Who directed Ed Wood?", config=config)
        else:
            asyncio.run(runnable.ainvoke("Who directed Ed Wood?", config=config))
        assert seen.chat_parents == [seen.runs[run]], (run, seen.chat_parents, seen.runs)


class SyncOnlyRetriever(BaseRetriever):
    """A custom retriever that takes ``k`` in its sync method only (LangChain's default
    async method accepts no keyword arguments)."""

    seen: list[int] = Field(default_factory=list)

    def _get_relevant_documents(self, query: str, *, run_manager: Any, k: int = 4,
                                **kwargs: Any) -> list[Document]:
        self.seen.append(k)
        return [Document(page_content=f"passage {i} about {query}") for i in range(k)]


async def test_async_with_k_on_a_retriever_whose_keywords_are_sync_only() -> None:
    """`ainvoke` with k used to fail deep in LangChain (TypeError: unexpected keyword 'k');
    it answers as `invoke` does, with the retriever given the same k."""
    inner = SyncOnlyRetriever()
    gated = GatedRetriever(retriever=inner, gate=CapitalisedWordsGate(threshold=1), k=2)
    docs = await gated.ainvoke(ASK)
    assert [d.page_content for d in docs] == [d.page_content for d in gated.invoke(ASK)]
    assert len(docs) == 2 and inner.seen == [2, 2]
    assert [len(p.text) > 0 for p in await LangChainRetrieverAdapter(inner).aretrieve(ASK, k=1)
            ] == [True] and inner.seen[-1] == 1


async def test_a_skip_on_a_score_that_is_no_number_retrieves() -> None:
    """A decision the wrapper did not make itself still fails closed (audit s15 #4): the
    documents come back and the decision says why, as AllOf over the same gate does."""
    from rag_gates.testing import NaNSkippingGate

    gated = GatedRetriever(retriever=store().as_retriever(), gate=NaNSkippingGate())
    plain = store().as_retriever().invoke(ASK)
    for docs in (gated.invoke(ASK), await gated.ainvoke(ASK)):
        assert [d.page_content for d in docs] == [d.page_content for d in plain]
        said = docs[0].metadata["rag_gates"]
        assert said["retrieve"] is True and "remote could not decide" in said["reason"]
        assert said["evidence"]["raw_score"] == "nan"
        assert said["evidence"]["gate_said"] == NaNSkippingGate.said


class _TimedOutGate(BaseGate):
    """A gate whose model call fails (a served model's timeout): decide raises."""

    name = "timed-out"

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        raise TimeoutError("the served model did not answer in 30 s")


async def test_on_gate_error_retrieve_fails_closed_and_raise_is_the_default() -> None:
    plain = store().as_retriever().invoke(ASK)
    with pytest.raises(TimeoutError, match="did not answer"):
        GatedRetriever(retriever=store().as_retriever(), gate=_TimedOutGate(0.5)).invoke(ASK)
    gated = GatedRetriever(retriever=store().as_retriever(), gate=_TimedOutGate(0.5),
                           on_gate_error="retrieve")
    for docs in (gated.invoke(ASK), await gated.ainvoke(ASK)):
        assert [d.page_content for d in docs] == [d.page_content for d in plain]
        said = docs[0].metadata["rag_gates"]
        assert said["retrieve"] is True and said["gate"] == "timed-out"
        assert "did not answer" in str(said["evidence"]["error"]), said
    with pytest.raises(ValueError, match="on_gate_error"):
        GatedRetriever(retriever=store().as_retriever(), gate=_TimedOutGate(0.5),
                       on_gate_error="skip")  # type: ignore[arg-type]
