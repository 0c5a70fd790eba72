"""SelfRoutingRetriever: SR-RAG routing over a real in-memory vector store, with a tiny
random-weight model (plumbing), callbacks, and LangChain's standard retriever suite."""

from __future__ import annotations

import functools
from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_tests.integration_tests import RetrieversIntegrationTests

from langchain_rag_gates import SelfRoutingRetriever
from langchain_rag_gates.retrievers import DECISION_EVENT
from rag_gates.srrag import (
    HiddenStateKeys,
    PolicyEntry,
    SelfRoutingGate,
    SourcePolicy,
    Verbalizer,
)
from rag_gates.testing import tiny_lm

Q = "Who wrote Hamlet?"
TEXTS = ["William Shakespeare wrote Hamlet in London.", "The capital of France is Paris.",
         "The quick brown fox jumps over the lazy dog.", "Hamlet is a tragedy.",
         "London is on the Thames."]


@functools.cache
def lm() -> Any:
    return tiny_lm(seed=0)


@functools.cache
def store() -> InMemoryVectorStore:
    return InMemoryVectorStore.from_texts(TEXTS, embedding=DeterministicFakeEmbedding(size=16),
                                          metadatas=[{"n": i} for i in range(len(TEXTS))])


def routed(tau: float, **kwargs: Any) -> SelfRoutingRetriever:
    gate = SelfRoutingGate(lm(), mode="model", tau=tau, layer=2)
    return SelfRoutingRetriever(retriever=store().as_retriever(), gate=gate,
                                verbalizer=Verbalizer(lm(), max_new_tokens=6), **kwargs)


class Starts(BaseCallbackHandler):
    def __init__(self) -> None:
        self.names: list[str] = []
        self.events: list[tuple[str, Any]] = []

    def on_retriever_start(self, serialized: dict[str, Any], query: str, *, run_id: UUID,
                           **kwargs: Any) -> None:
        self.names.append(kwargs.get("name", ""))

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.events.append((name, data))


class TestSelfRoutingRetrieverStandard(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> type[SelfRoutingRetriever]:
        return SelfRoutingRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        # tau 0: every question routes to retrieval, which the suite's k checks count.
        return {"retriever": store().as_retriever(),
                "gate": SelfRoutingGate(lm(), mode="model", tau=0.0, layer=2),
                "verbalizer": Verbalizer(lm(), max_new_tokens=6)}

    @property
    def retriever_query_example(self) -> str:
        return Q


@functools.cache
def policy() -> SourcePolicy:
    """A small datastore of labelled questions (both sources), for the product gate."""
    store = SourcePolicy.open(HiddenStateKeys(lm(), layer=2), path=":memory:", k=3)
    store.add_questions([
        PolicyEntry(id="1", question="Who wrote Macbeth?", source="retrieval"),
        PolicyEntry(id="2", question="What is the capital of Italy?", source="retrieval"),
        PolicyEntry(id="3", question="What colour is the sky?", source="parametric")])
    return store


class TestSelfRoutingRetrieverWithPolicyStandard(TestSelfRoutingRetrieverStandard):
    """The same suite through SR-RAG's own router: p_M * p_D with a kNN lookup per query."""

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        # tau 0: p_M * p_D >= 0 always, so the suite's k checks see the retrieval route.
        return {**super().retriever_constructor_params,
                "gate": SelfRoutingGate(lm(), policy(), tau=0.0, layer=2)}


def test_product_route_reads_the_datastore_votes() -> None:
    retriever = SelfRoutingRetriever(retriever=store().as_retriever(),
                                     gate=SelfRoutingGate(lm(), policy(), tau=0.0, layer=2),
                                     k=2)
    docs = retriever.invoke(Q)
    decision = retriever.last_decision
    assert decision is not None and decision.gate == "srrag" and decision.retrieve
    # all 3 entries vote (k = 3), 2 of them for retrieval
    assert decision.evidence["p_datastore"] == pytest.approx(2 / 3)
    assert decision.score == pytest.approx(decision.evidence["p_model"] * 2 / 3)
    assert len(docs) == 2
    assert docs[0].metadata["rag_gates"]["evidence"]["p_datastore"] == pytest.approx(2 / 3)


def test_retrieval_route_returns_annotated_copies() -> None:
    retriever = routed(0.0, k=2)
    plain = store().as_retriever().invoke(Q, k=2)
    docs = retriever.invoke(Q)
    assert [d.page_content for d in docs] == [d.page_content for d in plain]
    decision = retriever.last_decision
    assert decision is not None and decision.retrieve and decision.gate == "srrag-no-knn"
    assert docs[0].metadata["rag_gates"] == decision.model_dump(mode="json")
    assert all("rag_gates" not in d.metadata for d in store().as_retriever().invoke(Q))


async def test_parametric_route_returns_the_verbalization() -> None:
    retriever = routed(1.0)  # p_M stays below 1 (the top of its scale): always verbalize
    rec = Starts()
    (doc,) = retriever.invoke(Q, config={"callbacks": [rec]})
    expected = Verbalizer(lm(), max_new_tokens=6).verbalize(Q)
    assert doc.page_content == expected.text and doc.id == expected.id
    assert doc.metadata["source"] == "parametric"
    assert doc.metadata["hit_token_cap"] == expected.metadata["hit_token_cap"]
    assert doc.metadata["rag_gates"]["retrieve"] is False
    assert rec.names == ["SelfRoutingRetriever"]  # the vector store was not asked
    assert [name for name, _ in rec.events] == [DECISION_EVENT]
    (adoc,) = await retriever.ainvoke(Q)
    assert adoc.page_content == doc.page_content


def test_product_gate_evidence_reaches_the_documents() -> None:
    policy = SourcePolicy.open(HiddenStateKeys(lm(), layer=2), path=":memory:")
    policy.add_questions([PolicyEntry(id="1", question="Who wrote Macbeth?",
                                      source="retrieval")])
    retriever = SelfRoutingRetriever(retriever=store().as_retriever(),
                                     gate=SelfRoutingGate(lm(), policy, tau=0.0), k=1)
    (doc,) = retriever.invoke(Q)
    evidence = doc.metadata["rag_gates"]["evidence"]
    assert evidence["p_datastore"] == 1.0 and evidence["found"] == 1
    assert "fewer than k=30" in evidence["datastore_note"]
    assert isinstance(retriever.verbalizer, Verbalizer)  # the default, on the gate's model
    policy.close()


def test_a_gate_without_a_model_needs_a_verbalizer() -> None:
    from rag_gates.testing import ConstantGate

    with pytest.raises(ValueError, match="pass verbalizer=Verbalizer"):
        SelfRoutingRetriever(retriever=store().as_retriever(), gate=ConstantGate(1.0))
    with pytest.raises(TypeError, match="Verbalizer"):
        SelfRoutingRetriever(retriever=store().as_retriever(), gate=ConstantGate(1.0),
                             verbalizer=object())


async def test_an_empty_verbalization_retrieves_instead() -> None:
    """A chat model whose reply is blank (LangChain's own fake chat model) verbalizes
    nothing: the wrapped retriever's documents come back, under the overturned decision,
    reported as a second decision event (review s12 #7)."""
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    from langchain_rag_gates import as_text_lm

    blank = as_text_lm(FakeListChatModel(responses=[" \n"]))
    retriever = SelfRoutingRetriever(
        retriever=store().as_retriever(), k=2, verbalizer=Verbalizer(blank, max_new_tokens=6),
        gate=SelfRoutingGate(lm(), mode="model", tau=1.0, layer=2))  # p_M < 1: verbalize
    plain = store().as_retriever().invoke(Q, k=2)
    sync, async_ = Starts(), Starts()
    runs = [(retriever.invoke(Q, config={"callbacks": [sync]}), sync),
            (await retriever.ainvoke(Q, config={"callbacks": [async_]}), async_)]
    for docs, rec in runs:
        assert [d.page_content for d in docs] == [d.page_content for d in plain]
        (_, said), (_, overturned) = rec.events
        assert said["retrieve"] is False and overturned["retrieve"] is True
        assert overturned["evidence"] == {**said["evidence"], "verbalization": "empty"}
        assert docs[0].metadata["rag_gates"] == overturned
        assert rec.names[0] == "SelfRoutingRetriever" and len(rec.names) == 2  # the store ran
    decision = retriever.last_decision  # the overturned one, not the first
    assert decision is not None and decision.model_dump(mode="json") == async_.events[-1][1]


async def test_the_search_tool_reports_the_overturned_decision() -> None:
    """The agent's tool says what the retriever did: it retrieved after an empty
    verbalization, so the tool's decision is the overturned one (audit s15 #2), while a
    retriever nested inside the tool's keeps its own decision out of the tool's."""
    import json

    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    from langchain_rag_gates import GatedRetriever, GatedRetrieverTool, as_text_lm
    from rag_gates.testing import ConstantGate

    blank = as_text_lm(FakeListChatModel(responses=[" \n"]))
    nested = GatedRetriever(retriever=store().as_retriever(), gate=ConstantGate(1.0))
    tool = GatedRetrieverTool(retriever=SelfRoutingRetriever(
        retriever=nested, k=2, verbalizer=Verbalizer(blank, max_new_tokens=6),
        gate=SelfRoutingGate(lm(), mode="model", tau=1.0, layer=2)))
    call = {"type": "tool_call", "id": "1", "name": tool.name, "args": {"query": Q}}
    for message in (tool.invoke(call), await tool.ainvoke(call)):
        decision = message.artifact.decision
        assert decision.retrieve is True and decision.evidence["verbalization"] == "empty"
        assert decision.gate != "constant"
        assert json.loads(message.content)["retrieved"] is True
