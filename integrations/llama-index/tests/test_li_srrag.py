"""SelfRoutingRetriever: SR-RAG routing over a real BM25 retriever, a tiny random-weight model
(plumbing), LlamaIndex instrumentation, and a RetrieverQueryEngine."""

from __future__ import annotations

from typing import Any

import pytest
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import QueryBundle
from llama_index.retrievers.rag_gates import (
    GateDecisionEvent,
    PassageRetriever,
    SelfRoutingRetriever,
)

from rag_gates.lm.base import BaseTextLM
from rag_gates.retrieval.bm25 import BM25Retriever
from rag_gates.srrag import HiddenStateKeys, PolicyEntry, SelfRoutingGate, SourcePolicy, Verbalizer
from rag_gates.testing import tiny_lm
from rag_gates.types import Generation, Passage

Q = "Who wrote Hamlet?"
CORPUS = [Passage(id="p1", title="Hamlet", text="William Shakespeare wrote Hamlet."),
          Passage(id="p2", title="France", text="The capital of France is Paris."),
          Passage(id="p3", text="The quick brown fox jumps over the lazy dog.")]


@pytest.fixture(scope="module")
def lm() -> Any:
    return tiny_lm(seed=0, max_context=1024)


@pytest.fixture(scope="module")
def bm25() -> PassageRetriever:
    return PassageRetriever(BM25Retriever.from_passages(CORPUS), similarity_top_k=2)


def routed(lm: Any, bm25: PassageRetriever, tau: float) -> SelfRoutingRetriever:
    return SelfRoutingRetriever(bm25, SelfRoutingGate(lm, mode="model", tau=tau, layer=2),
                                verbalizer=Verbalizer(lm, max_new_tokens=6))


def test_retrieval_route_returns_annotated_copies(lm: Any, bm25: PassageRetriever) -> None:
    retriever = routed(lm, bm25, 0.0)
    plain = bm25.retrieve(Q)
    nodes = retriever.retrieve(Q)
    assert [n.node.node_id for n in nodes] == [n.node.node_id for n in plain]
    assert nodes[0].node.node_id == "p1"
    assert nodes[0].node.metadata["rag_gates"]["gate"] == "srrag-no-knn"
    assert "rag_gates" not in plain[0].node.metadata


async def test_parametric_route_returns_one_verbalized_node(lm: Any, bm25: PassageRetriever,
                                                            collector: Any) -> None:
    retriever = routed(lm, bm25, 1.0)  # p_M stays below 1: always verbalize
    (node,) = retriever.retrieve(Q)
    expected = Verbalizer(lm, max_new_tokens=6).verbalize(Q)
    assert node.node.get_content() == expected.text and node.node.node_id == expected.id
    assert node.node.metadata["source"] == "parametric"
    assert node.node.metadata["rag_gates"]["retrieve"] is False
    assert "rag_gates" in node.node.excluded_llm_metadata_keys
    (event,) = [e for e in collector.events if isinstance(e, GateDecisionEvent)]
    assert event.retrieve is False and retriever.last_decision == event.gate_decision()
    (anode,) = await retriever.aretrieve(QueryBundle(Q))
    assert anode.node.get_content() == expected.text


def test_the_parametric_node_reaches_the_prompt_as_its_text_alone(
        lm: Any, bm25: PassageRetriever) -> None:
    """The verbalizer's bookkeeping (model id, tokens, sampling settings) stays in the
    metadata but out of what the LLM reads and what gets embedded."""
    from llama_index.core.schema import MetadataMode

    (node,) = routed(lm, bm25, 1.0).retrieve(Q)
    assert node.node.metadata["source"] == "parametric" and "model_id" in node.node.metadata
    text = node.node.get_content()
    assert node.node.get_content(metadata_mode=MetadataMode.LLM) == text
    assert node.node.get_content(metadata_mode=MetadataMode.EMBED) == text


def test_drops_into_a_query_engine_with_the_product_gate(lm: Any,
                                                        bm25: PassageRetriever) -> None:
    from llama_index.llms.rag_gates import RagGatesLLM

    policy = SourcePolicy.open(HiddenStateKeys(lm, layer=2), path=":memory:")
    policy.add_questions([PolicyEntry(id="1", question="Who wrote Macbeth?",
                                      source="parametric")])
    # p_D = 0 (the one neighbour prefers the model's knowledge): verbalize, at any tau > 0.
    retriever = SelfRoutingRetriever(bm25, SelfRoutingGate(lm, policy, tau=0.05),
                                     verbalizer=Verbalizer(lm, max_new_tokens=6))
    engine = RetrieverQueryEngine.from_args(retriever=retriever,
                                            llm=RagGatesLLM(lm=lm, max_new_tokens=4))
    response = engine.query(Q)
    (source,) = response.source_nodes
    assert source.node.metadata["source"] == "parametric"
    assert source.node.metadata["rag_gates"]["evidence"]["p_datastore"] == 0.0
    assert isinstance(response.response, str)
    policy.close()


def test_a_gate_without_a_model_needs_a_verbalizer(bm25: PassageRetriever) -> None:
    from rag_gates.testing import ConstantGate

    with pytest.raises(ValueError, match="pass verbalizer=Verbalizer"):
        SelfRoutingRetriever(bm25, ConstantGate(1.0))
    with pytest.raises(TypeError, match="Verbalizer"):
        SelfRoutingRetriever(bm25, ConstantGate(1.0), verbalizer=object())


class SaysNothing(BaseTextLM):
    """A model whose reply is blank (a stop sequence first): nothing verbalized."""

    model_id = "says-nothing"

    def generate(self, prompt: Any, **kwargs: Any) -> Generation:
        return Generation(text=" \n", finish_reason="stop")


async def test_an_empty_verbalization_retrieves_instead(lm: Any, bm25: PassageRetriever,
                                                        collector: Any) -> None:
    """The wrapped retriever's nodes come back under the overturned decision, dispatched as
    a second decision event (review s12 #7: the blank node was the whole context)."""
    retriever = SelfRoutingRetriever(
        bm25, SelfRoutingGate(lm, mode="model", tau=1.0, layer=2),  # p_M < 1: verbalize
        verbalizer=Verbalizer(SaysNothing(), max_new_tokens=6))
    plain = [n.node.node_id for n in bm25.retrieve(Q)]
    for run in range(2):
        nodes = retriever.retrieve(Q) if run == 0 else await retriever.aretrieve(QueryBundle(Q))
        assert [n.node.node_id for n in nodes] == plain
        said, overturned = [e for e in collector.events if isinstance(e, GateDecisionEvent)]
        assert said.retrieve is False and overturned.retrieve is True
        decision = overturned.gate_decision()
        assert decision.evidence == {**said.gate_decision().evidence,
                                     "verbalization": "empty"}
        assert nodes[0].node.metadata["rag_gates"] == decision.model_dump(mode="json")
        assert retriever.last_decision == decision
        collector.events.clear()


async def test_the_search_tool_reports_the_overturned_decision(lm: Any,
                                                               bm25: PassageRetriever) -> None:
    """The agent's tool says what the retriever did: it retrieved after an empty
    verbalization, so the tool's decision is the overturned one (audit s15 #2), while a
    retriever nested inside the tool's keeps its own decision out of the tool's."""
    from llama_index.retrievers.rag_gates import GatedRetriever
    from llama_index.tools.rag_gates import gated_retriever_tool

    from rag_gates.testing import ConstantGate

    overturning = SelfRoutingRetriever(
        GatedRetriever(bm25, ConstantGate(1.0)),  # nested: its own decision comes after
        SelfRoutingGate(lm, mode="model", tau=1.0, layer=2),
        verbalizer=Verbalizer(SaysNothing(), max_new_tokens=6))
    tool = gated_retriever_tool(overturning)
    for output in (tool.call(Q), await tool.acall(Q)):
        decision = output.raw_output.decision
        assert decision.retrieve is True and decision.evidence["verbalization"] == "empty"
        assert decision.gate != "constant"
        assert '"retrieved": true' in output.content
