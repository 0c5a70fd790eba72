"""GatedRetriever over a real VectorStoreIndex (embedded MiniLM over HotpotQA paragraphs),
with a real gate, LlamaIndex instrumentation, and a RetrieverQueryEngine on the tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.instrumentation.events.llm import LLMChatStartEvent
from llama_index.core.instrumentation.events.retrieval import RetrievalStartEvent
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import QueryBundle
from llama_index.retrievers.rag_gates import (
    ANNOTATION_KEY,
    GateDecisionEvent,
    GatedRetriever,
    passages_to_nodes,
)
from pydantic import JsonValue

from rag_gates.gate import BaseGate
from rag_gates.types import GateDecision
from rag_gates_lab.corpus import corpus_passages

SLICES = Path(__file__).resolve().parents[3] / "examples" / "data"
ASK = "Were Scott Derrickson and Ed Wood of the same nationality?"  # 5 capitalised words
SKIP = "what is two plus two?"  # none
TOP_K = 3


class CapitalisedWordsGate(BaseGate):
    """Retrieve when the question names things: score = number of capitalised words."""

    name = "capitalised-words"

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        words = [w for w in query.split() if w[:1].isupper()]
        return float(len(words)), {"capitalised": list(words)}



@pytest.fixture(scope="module")
def index() -> VectorStoreIndex:
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    from rag_gates.lm.defaults import default_embedder_path


    # The first four questions' paragraphs: Scott Derrickson, Ed Wood and their distractors.
    nodes = [n.node for n in passages_to_nodes(corpus_passages("hotpotqa", SLICES)[:40])]
    return VectorStoreIndex(nodes, embed_model=HuggingFaceEmbedding(
        model_name=str(default_embedder_path()), device="cpu"))



@pytest.fixture
def gate() -> CapitalisedWordsGate:
    return CapitalisedWordsGate(threshold=2)


def test_yes_returns_annotated_copies_of_the_inner_nodes(
    index: VectorStoreIndex, gate: CapitalisedWordsGate
) -> None:
    inner = index.as_retriever(similarity_top_k=TOP_K)
    gated = GatedRetriever(inner, gate=gate)
    plain = inner.retrieve(ASK)
    nodes = gated.retrieve(ASK)
    assert [n.node.node_id for n in nodes] == [n.node.node_id for n in plain]
    assert [n.score for n in nodes] == pytest.approx([n.score for n in plain])
    assert nodes[0].node.metadata["title"] == "Ed Wood"  # MiniLM's nearest paragraph
    decision = gated.last_decision
    assert isinstance(decision, GateDecision) and decision.retrieve
    assert decision.score == 5.0 and decision.threshold == 2.0
    for n in nodes:
        assert n.node.metadata[ANNOTATION_KEY] == decision.model_dump(mode="json")
        # The annotation never reaches a prompt or an embedding.
        assert ANNOTATION_KEY in n.node.excluded_llm_metadata_keys
        assert ANNOTATION_KEY in n.node.excluded_embed_metadata_keys
    # Neither the index's stored nodes nor what the inner retriever returns were touched.
    for n in [*plain, *inner.retrieve(ASK)]:
        assert ANNOTATION_KEY not in n.node.metadata
        stored = index.docstore.get_node(n.node.node_id)
        assert ANNOTATION_KEY not in stored.metadata
        assert ANNOTATION_KEY not in stored.excluded_llm_metadata_keys


def test_no_skips_the_inner_retriever(
    index: VectorStoreIndex, gate: CapitalisedWordsGate, collector: Any
) -> None:
    gated = GatedRetriever(index.as_retriever(similarity_top_k=TOP_K), gate=gate)
    assert gated.retrieve(SKIP) == []
    assert gated.last_decision is not None and not gated.last_decision.retrieve
    # Only the gated retriever started a retrieval: the inner one was never called.
    assert len(collector.of(RetrievalStartEvent)) == 1
    collector.events.clear()
    gated.retrieve(ASK)
    assert len(collector.of(RetrievalStartEvent)) == 2


def test_each_decision_is_an_instrumentation_event(
    index: VectorStoreIndex, gate: CapitalisedWordsGate, collector: Any
) -> None:
    gated = GatedRetriever(index.as_retriever(similarity_top_k=TOP_K), gate=gate)
    gated.retrieve(ASK)
    gated.retrieve(QueryBundle(SKIP))
    events = collector.of(GateDecisionEvent)
    assert [(e.query_str, e.retrieve) for e in events] == [(ASK, True), (SKIP, False)]
    assert events[1].gate_decision() == gated.last_decision
    assert events[0].decision["evidence"] == {
        "capitalised": ["Were", "Scott", "Derrickson", "Ed", "Wood"]
    }
    assert events[0].decision["reason"].startswith("capitalised-words score 5")
    # Dispatched inside the retriever's span, so tracing tools attach it to the retrieval.
    assert all(e.span_id and e.span_id.startswith("GatedRetriever.") for e in events)
    assert events[0].model_dump()["class_name"] == "GateDecisionEvent"


async def test_async_path_uses_adecide_and_aretrieve(
    index: VectorStoreIndex, collector: Any
) -> None:
    class AsyncOnlyGate(CapitalisedWordsGate):
        # Proves the async path goes through adecide, not decide.
        def decide(self, query: str, **signals: Any) -> GateDecision:
            raise AssertionError("the async path must call adecide")

        async def adecide(self, query: str, **signals: Any) -> GateDecision:
            return BaseGate.decide(self, query, **signals)

    inner = index.as_retriever(similarity_top_k=2)
    gated = GatedRetriever(inner, gate=AsyncOnlyGate(threshold=2))
    nodes = await gated.aretrieve(ASK)
    assert [n.node.node_id for n in nodes] == [n.node.node_id for n in await inner.aretrieve(ASK)]
    assert all(n.node.metadata[ANNOTATION_KEY]["retrieve"] is True for n in nodes)
    assert await gated.aretrieve(SKIP) == []
    assert [e.retrieve for e in collector.of(GateDecisionEvent)] == [True, False]


def test_bad_arguments_are_rejected(index: VectorStoreIndex, gate: CapitalisedWordsGate) -> None:
    with pytest.raises(TypeError, match="BaseRetriever"):
        GatedRetriever(object(), gate=gate)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Gate protocol"):
        GatedRetriever(index.as_retriever(), gate=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="annotation_key"):
        GatedRetriever(index.as_retriever(), gate=gate, annotation_key="")
    for option in ("similarity_top_k", "top_k"):  # the wrapped retriever's setting
        with pytest.raises(TypeError, match=rf"argument\(s\) {option}; .*similarity_top_k=5"):
            GatedRetriever(index.as_retriever(), gate=gate, **{option: 2})
    assert GatedRetriever(index.as_retriever(), gate=gate, verbose=True)._verbose  # the base's


def test_custom_annotation_key(index: VectorStoreIndex, gate: CapitalisedWordsGate) -> None:
    gated = GatedRetriever(index.as_retriever(similarity_top_k=1), gate=gate,
                           annotation_key="gate")
    (node,) = gated.retrieve(ASK)
    assert node.node.metadata["gate"]["gate"] == "capitalised-words"
    assert ANNOTATION_KEY not in node.node.metadata


def test_drops_into_a_retriever_query_engine(
    index: VectorStoreIndex, gate: CapitalisedWordsGate, collector: Any
) -> None:
    from llama_index.llms.rag_gates import RagGatesLLM

    from rag_gates.testing import tiny_lm

    llm = RagGatesLLM(lm=tiny_lm(seed=0, max_context=4096), max_new_tokens=4)
    gated = GatedRetriever(index.as_retriever(similarity_top_k=TOP_K), gate=gate)
    engine = RetrieverQueryEngine.from_args(retriever=gated, llm=llm)

    response = engine.query(ASK)
    assert len(response.source_nodes) == TOP_K
    assert all(n.node.metadata[ANNOTATION_KEY]["retrieve"] for n in response.source_nodes)
    # The LLM saw the retrieved paragraphs, and the annotation stayed out of its prompt.
    prompts = ["\n".join(str(m.content) for m in e.messages)
               for e in collector.of(LLMChatStartEvent)]
    assert len(prompts) == 1
    assert "title: Ed Wood\n" in prompts[0]
    assert "capitalised" not in prompts[0] and ANNOTATION_KEY not in prompts[0]

    # A "no": nothing retrieved. LlamaIndex's synthesizers do not call the LLM without
    # nodes; RetrieverQueryEngine answers with its empty response.
    collector.events.clear()
    response = engine.query(SKIP)
    assert response.source_nodes == []
    assert str(response) == "Empty Response"
    assert collector.of(LLMChatStartEvent) == []
    assert [e.retrieve for e in collector.of(GateDecisionEvent)] == [False]


# ---------------------------------------------------------------- composed gates
class QuestionLengthGate(BaseGate):
    name = "question-length"

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        return float(len(query.split())), {}


def test_a_composed_gate_drops_in_and_its_sub_decisions_reach_the_metadata(
    index: VectorStoreIndex, gate: CapitalisedWordsGate
) -> None:
    from rag_gates.gate import AnyOf, Cascade

    either = GatedRetriever(index.as_retriever(similarity_top_k=TOP_K),
                            gate=AnyOf(gate, QuestionLengthGate(20)))
    nodes = either.retrieve(ASK)  # capitalised words settle it: length is never asked
    evidence = nodes[0].node.metadata[ANNOTATION_KEY]["evidence"]
    assert [d["gate"] for d in evidence["decisions"]] == ["capitalised-words"]
    assert evidence["skipped"] == ["question-length"]
    assert either.retrieve(SKIP) == []
    cascade = GatedRetriever(index.as_retriever(similarity_top_k=TOP_K),
                             gate=Cascade(gate, QuestionLengthGate(6), band=(0, 1)))
    assert cascade.retrieve(SKIP) == []  # 0 capitalised: in the band; 5 words < 6
    assert cascade.last_decision is not None
    assert cascade.last_decision.evidence["expensive_called"] is True


async def test_a_skip_on_a_score_that_is_no_number_retrieves() -> None:
    """A decision the wrapper did not make itself still fails closed (audit s15 #4): the
    nodes come back and the decision says why, as AllOf over the same gate does."""
    from llama_index.retrievers.rag_gates import PassageRetriever

    from rag_gates.retrieval.bm25 import BM25Retriever
    from rag_gates.testing import NaNSkippingGate
    from rag_gates.types import Passage

    bm25 = PassageRetriever(BM25Retriever.from_passages(
        [Passage(id="p1", text="William Shakespeare wrote Hamlet."),
         Passage(id="p2", text="The capital of France is Paris.")]), similarity_top_k=1)
    gated = GatedRetriever(bm25, gate=NaNSkippingGate())
    for nodes in (gated.retrieve("Who wrote Hamlet?"),
                  await gated.aretrieve(QueryBundle("Who wrote Hamlet?"))):
        assert [n.node.node_id for n in nodes] == ["p1"]
        said = nodes[0].node.metadata["rag_gates"]
        assert said["retrieve"] is True and "remote could not decide" in said["reason"]
        assert said["evidence"]["raw_score"] == "nan"
        assert gated.last_decision is not None and gated.last_decision.retrieve
