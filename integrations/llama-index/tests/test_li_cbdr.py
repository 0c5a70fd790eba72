"""ConfidenceGainReranker (node postprocessor) on the tiny model with an untrained probe: the
adapter must give the core reranker's order and scores, keep the caller's nodes untouched,
and report like LlamaIndex's own rerankers (instrumentation and callback events)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.callbacks import CallbackManager, CBEventType, EventPayload, LlamaDebugHandler
from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle
from llama_index.postprocessor.rag_gates import (
    RERANK_KEY,
    RETRIEVAL_SCORE_KEY,
    ConfidenceGainReranker,
)
from llama_index.retrievers.rag_gates import nodes_to_passages, passages_to_nodes

from rag_gates.cbdr import ConfidenceGainReranker as CoreReranker
from rag_gates.cbdr import ConfidenceProbe, CrossEncoderReranker, ProbeConfig
from rag_gates.errors import ProbeMismatchError
from rag_gates.rerank import BaseReranker, PassageScores, RerankResult
from rag_gates.types import Passage
from rag_gates_lab.corpus import corpus_passages

SLICES = Path(__file__).resolve().parents[3] / "examples" / "data"
QUERY = "Were Scott Derrickson and Ed Wood of the same nationality?"



class AsyncOnly(BaseReranker):
    """Wraps a reranker; its sync path fails, so a test proves the async path used arerank."""

    def __init__(self, inner: CoreReranker) -> None:
        self.inner = inner
        self.name = inner.name

    def score_passages(self, query: str, passages: Sequence[Passage], **signals: Any
                       ) -> PassageScores:
        raise AssertionError("the async path must call arerank")

    async def arerank(self, query: str, passages: Sequence[Passage], top_n: int | None = None,
                      **signals: Any) -> RerankResult:
        return self.inner.rerank(query, passages, top_n, **signals)


class Counting(BaseReranker):
    """Scores by text length and counts its calls."""

    name = "length"

    def __init__(self) -> None:
        self.calls = 0

    def score_passages(self, query: str, passages: Sequence[Passage], **signals: Any
                       ) -> PassageScores:
        self.calls += 1
        return PassageScores(scores=[float(len(p.text)) for p in passages])


@pytest.fixture(scope="module")
def lm() -> Any:
    from rag_gates.testing import tiny_lm

    # The paper's RAG prompt plus a paragraph needs more than the default 256 tokens of the
    # tiny byte-level tokenizer.
    return tiny_lm(seed=0, max_context=2048)


@pytest.fixture(scope="module")
def probe(lm: Any) -> ConfidenceProbe:
    return ConfidenceProbe(ProbeConfig(model_id=lm.model_id, hidden_size=lm.hidden_size,
                                       num_layers=lm.num_layers, layer=1))


@pytest.fixture(scope="module")
def core(lm: Any, probe: ConfidenceProbe) -> CoreReranker:
    return CoreReranker(lm, probe)


@pytest.fixture
def nodes() -> list[NodeWithScore]:
    """Six HotpotQA paragraphs (Scott Derrickson, Ed Wood, ...) with retrieval scores."""
    passages = corpus_passages("hotpotqa", SLICES)[:6]
    return passages_to_nodes(
        [p.model_copy(update={"score": round(0.9 - 0.1 * i, 2)}) for i, p in enumerate(passages)]
    )



def snapshot(nodes: list[NodeWithScore]) -> list[dict[str, Any]]:
    return [n.model_dump() for n in nodes]


def test_order_and_scores_are_the_core_rerankers(
    core: CoreReranker, nodes: list[NodeWithScore]
) -> None:
    expected = core.rerank(QUERY, nodes_to_passages(nodes), top_n=3)
    assert [s.index for s in expected.ranked] != [0, 1, 2]  # the probe really reorders

    reranker = ConfidenceGainReranker(reranker=core, top_n=3)
    assert issubclass(ConfidenceGainReranker, BaseNodePostprocessor)
    out = reranker.postprocess_nodes(nodes, query_str=QUERY)

    assert [n.node.node_id for n in out] == [nodes[s.index].node.node_id for s in expected.ranked]
    assert [n.score for n in out] == pytest.approx([s.score for s in expected.ranked])
    for rank, (n, s) in enumerate(zip(out, expected.ranked, strict=True), start=1):
        annotation = n.node.metadata[RERANK_KEY]
        assert annotation == {"reranker": "confidence-gain", "rank": rank,
                              "score": pytest.approx(s.score), "candidates": 6,
                              "evidence": {"confidence": pytest.approx(s.evidence["confidence"]),
                                           "truncated_tokens": s.evidence["truncated_tokens"]}}
        # Inc = Conf(q + c) - Conf(q)
        question = expected.evidence["question_confidence"]
        assert isinstance(question, float)
        assert n.score == pytest.approx(annotation["evidence"]["confidence"] - question)
        assert n.node.metadata["title"] == nodes[s.index].node.metadata["title"]
        assert RETRIEVAL_SCORE_KEY not in n.node.metadata
        assert "retrieval_score" not in annotation
    assert reranker.last_result is not None
    assert reranker.last_result.evidence == pytest.approx(expected.evidence)
    # Same result through a QueryBundle.
    again = reranker.postprocess_nodes(nodes, query_bundle=QueryBundle(QUERY))
    assert [n.node.node_id for n in again] == [n.node.node_id for n in out]


def test_from_probe_and_top_n(
    lm: Any, probe: ConfidenceProbe, core: CoreReranker, nodes: list[NodeWithScore]
) -> None:
    full = core.rerank(QUERY, nodes_to_passages(nodes))
    keep_all = ConfidenceGainReranker.from_probe(lm, probe, top_n=None, batch_size=2)
    assert isinstance(keep_all.reranker, CoreReranker) and keep_all.reranker.batch_size == 2
    out = keep_all.postprocess_nodes(nodes, query_str=QUERY)
    assert [n.node.node_id for n in out] == [nodes[s.index].node.node_id for s in full.ranked]
    scores = [n.score for n in out]
    assert scores == sorted(scores, reverse=True) and len(out) == len(nodes)

    (best,) = ConfidenceGainReranker.from_probe(lm, probe, top_n=1).postprocess_nodes(
        nodes, query_str=QUERY)
    assert best.node.node_id == out[0].node.node_id
    # The default keeps 3, like the paper's top-3.
    assert len(ConfidenceGainReranker(reranker=core).postprocess_nodes(nodes, query_str=QUERY)) == 3
    assert ConfidenceGainReranker(reranker=core, top_n=10).postprocess_nodes(
        nodes, query_str=QUERY)[-1].node.node_id == out[-1].node.node_id
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="top_n"):
            ConfidenceGainReranker(reranker=core, top_n=bad)


def test_returns_copies_and_never_touches_the_input(
    core: CoreReranker, nodes: list[NodeWithScore]
) -> None:
    before = snapshot(nodes)
    reranker = ConfidenceGainReranker(reranker=core, top_n=None, keep_retrieval_score=True)
    out = reranker.postprocess_nodes(nodes, query_str=QUERY)
    assert snapshot(nodes) == before
    inputs = {id(n) for n in nodes} | {id(n.node) for n in nodes}
    inputs |= {id(n.node.metadata) for n in nodes}
    for n in out:
        assert id(n) not in inputs and id(n.node) not in inputs
        assert id(n.node.metadata) not in inputs
        # The annotations stay out of prompts and embeddings.
        for key in (RERANK_KEY, RETRIEVAL_SCORE_KEY):
            assert key in n.node.excluded_llm_metadata_keys
            assert key in n.node.excluded_embed_metadata_keys
        assert "confidence-gain" not in n.node.get_content(metadata_mode=MetadataMode.LLM)
        assert n.node.metadata["title"] in n.node.get_content(metadata_mode=MetadataMode.LLM)
    # Changing the output does not reach the input either.
    out[0].node.metadata["title"] = "changed"
    assert snapshot(nodes) == before


def test_keep_retrieval_score(core: CoreReranker, nodes: list[NodeWithScore]) -> None:
    retrieval = {n.node.node_id: n.score for n in nodes}
    reranker = ConfidenceGainReranker(reranker=core, top_n=None, keep_retrieval_score=True)
    out = reranker.postprocess_nodes(nodes, query_str=QUERY)
    for n in out:
        assert n.node.metadata[RETRIEVAL_SCORE_KEY] == retrieval[n.node.node_id]
        assert n.node.metadata[RERANK_KEY][RETRIEVAL_SCORE_KEY] == retrieval[n.node.node_id]
        assert n.score != retrieval[n.node.node_id]
    # A node without a retrieval score keeps None.
    bare = [NodeWithScore(node=nodes[0].node)]
    (only,) = ConfidenceGainReranker(reranker=core, keep_retrieval_score=True).postprocess_nodes(
        bare, query_str=QUERY)
    assert only.node.metadata[RETRIEVAL_SCORE_KEY] is None


def test_zero_nodes_and_missing_query(core: CoreReranker, nodes: list[NodeWithScore],
                                      collector: Any) -> None:
    counting = Counting()
    reranker = ConfidenceGainReranker(reranker=counting)
    assert reranker.postprocess_nodes([], query_str=QUERY) == []
    assert counting.calls == 0 and collector.of(ReRankStartEvent) == []
    with pytest.raises(ValueError, match="needs the query"):
        reranker.postprocess_nodes(nodes)
    with pytest.raises(ValueError, match="needs the query"):
        reranker.postprocess_nodes([])
    assert counting.calls == 0


async def test_async_path_uses_arerank(core: CoreReranker, nodes: list[NodeWithScore],
                                       collector: Any) -> None:
    before = snapshot(nodes)
    sync = ConfidenceGainReranker(reranker=core).postprocess_nodes(nodes, query_str=QUERY)
    collector.events.clear()
    reranker = ConfidenceGainReranker(reranker=AsyncOnly(core))
    out = await reranker.apostprocess_nodes(nodes, query_str=QUERY)
    assert [n.node.node_id for n in out] == [n.node.node_id for n in sync]
    assert [n.score for n in out] == pytest.approx([n.score for n in sync])
    assert snapshot(nodes) == before
    assert [type(e) for e in collector.events] == [ReRankStartEvent, ReRankEndEvent]
    assert await reranker.apostprocess_nodes([], query_str=QUERY) == []
    with pytest.raises(ValueError, match="needs the query"):
        await reranker.apostprocess_nodes(nodes)


def test_rerank_events(core: CoreReranker, nodes: list[NodeWithScore],
                       collector: Any) -> None:
    debug = LlamaDebugHandler()
    reranker = ConfidenceGainReranker(reranker=core, top_n=2,
                                      callback_manager=CallbackManager([debug]))
    out = reranker.postprocess_nodes(nodes, query_str=QUERY)

    (start,) = collector.of(ReRankStartEvent)
    (end,) = collector.of(ReRankEndEvent)
    assert start.model_name == "confidence-gain" and start.top_n == 2
    assert isinstance(start.query, QueryBundle) and start.query.query_str == QUERY
    assert [n.node.node_id for n in start.nodes] == [n.node.node_id for n in nodes]
    assert [n.node.node_id for n in end.nodes] == [n.node.node_id for n in out]
    # Both inside the postprocessor's span, as LlamaIndex's rerankers emit them.
    assert start.span_id == end.span_id
    assert start.span_id and start.span_id.startswith("ConfidenceGainReranker._postprocess_nodes")

    ((cb_start, cb_end),) = debug.get_event_pairs(CBEventType.RERANKING)
    assert cb_start.payload is not None and cb_end.payload is not None
    assert cb_start.payload[EventPayload.MODEL_NAME] == "confidence-gain"
    assert cb_start.payload[EventPayload.QUERY_STR] == QUERY
    assert cb_start.payload[EventPayload.TOP_K] == 2
    assert cb_end.payload[EventPayload.NODES] == out

    # top_n=None reports the number of nodes as the event's top_n (an int there).
    collector.events.clear()
    ConfidenceGainReranker(reranker=core, top_n=None).postprocess_nodes(nodes, query_str=QUERY)
    assert collector.of(ReRankStartEvent)[0].top_n == len(nodes)


def test_in_a_retriever_query_engine(lm: Any, core: CoreReranker,
                                     nodes: list[NodeWithScore]) -> None:
    from llama_index.llms.rag_gates import RagGatesLLM
    from llama_index.retrievers.rag_gates import PassageRetriever

    from rag_gates.retrieval import BM25Retriever

    debug = LlamaDebugHandler()
    passages = nodes_to_passages(nodes)
    retriever = PassageRetriever(BM25Retriever.from_passages(passages), similarity_top_k=6)
    reranker = ConfidenceGainReranker(reranker=core, top_n=2)
    engine = RetrieverQueryEngine.from_args(
        retriever=retriever, llm=RagGatesLLM(lm=lm, max_new_tokens=2),
        node_postprocessors=[reranker], callback_manager=CallbackManager([debug]))
    response = engine.query(QUERY)

    retrieved = retriever.retrieve(QUERY)
    expected = core.rerank(QUERY, nodes_to_passages(retrieved), top_n=2)
    assert [n.node.node_id for n in response.source_nodes] == [
        retrieved[s.index].node.node_id for s in expected.ranked]
    assert all(n.node.metadata[RERANK_KEY]["reranker"] == "confidence-gain"
               for n in response.source_nodes)
    # The engine handed its callback manager to the postprocessor.
    assert len(debug.get_event_pairs(CBEventType.RERANKING)) == 1


def test_any_rag_gates_reranker(nodes: list[NodeWithScore]) -> None:
    out = ConfidenceGainReranker(reranker=Counting(), top_n=2).postprocess_nodes(
        nodes, query_str=QUERY)
    lengths = sorted((len(n.node.get_content()) for n in nodes), reverse=True)[:2]
    assert [n.score for n in out] == [float(x) for x in lengths]
    assert out[0].node.metadata[RERANK_KEY]["reranker"] == "length"
    assert out[0].node.metadata[RERANK_KEY]["evidence"] == {}


def test_bad_arguments(lm: Any, core: CoreReranker, nodes: list[NodeWithScore]) -> None:
    with pytest.raises(TypeError, match="PassageReranker protocol"):
        ConfidenceGainReranker(reranker=object())
    # A misspelt option is refused (it was dropped: top_k=2 gave top_n=3 in silence).
    with pytest.raises(ValueError, match=r"top_k\n  Extra inputs are not permitted"):
        ConfidenceGainReranker(reranker=core, top_k=2)
    other = ConfidenceProbe(ProbeConfig(model_id="another-model", hidden_size=lm.hidden_size,
                                        num_layers=lm.num_layers, layer=1))
    with pytest.raises(ProbeMismatchError, match="another-model"):
        ConfidenceGainReranker.from_probe(lm, other)

    class Broken(Counting):
        def rerank(self, query: str, passages: Sequence[Passage], top_n: int | None = None,
                   **signals: Any) -> Any:
            return [p.text for p in passages]

    with pytest.raises(TypeError, match="RerankResult"):
        ConfidenceGainReranker(reranker=Broken()).postprocess_nodes(nodes, query_str=QUERY)


def test_serialises_without_the_model(core: CoreReranker) -> None:
    data = ConfidenceGainReranker(reranker=core, top_n=2, keep_retrieval_score=True).to_dict()
    assert data == {"top_n": 2, "keep_retrieval_score": True,
                    "class_name": "RagGatesConfidenceGainReranker"}


def test_cross_encoder_from_the_embedded_minilm(nodes: list[NodeWithScore],
                                                tmp_path: Path) -> None:
    """Plumbing only: MiniLM with a fresh (random) one-label head, loaded as a CrossEncoder
    both in memory and from a saved directory."""
    from sentence_transformers import CrossEncoder

    from rag_gates.lm.defaults import default_embedder_path

    model = CrossEncoder(str(default_embedder_path()), num_labels=1, local_files_only=True)
    expected = CrossEncoderReranker(model).rerank(QUERY, nodes_to_passages(nodes), top_n=3)

    reranker = ConfidenceGainReranker.from_cross_encoder(model, top_n=3)
    out = reranker.postprocess_nodes(nodes, query_str=QUERY)
    assert [n.node.node_id for n in out] == [nodes[s.index].node.node_id for s in expected.ranked]
    assert [n.score for n in out] == pytest.approx([s.score for s in expected.ranked])
    assert out[0].node.metadata[RERANK_KEY]["reranker"] == "cross-encoder"

    model.save(str(tmp_path / "ce"))
    from_path = ConfidenceGainReranker.from_cross_encoder(tmp_path / "ce", top_n=3)
    again = from_path.postprocess_nodes(nodes, query_str=QUERY)
    assert [n.node.node_id for n in again] == [n.node.node_id for n in out]
    assert [n.score for n in again] == pytest.approx([n.score for n in out], abs=1e-5)


def test_import_does_not_load_torch(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = ("import sys\nimport llama_index.core.llms\n"
            "if 'torch' in sys.modules:\n    sys.exit(0)  # llama-index-core loaded it itself\n"
            "import llama_index.postprocessor.rag_gates\n"
            "assert 'torch' not in sys.modules, 'importing the postprocessor imported torch'\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("query", ["", "  ", "Who wrote\ud800 Hamlet?"])
async def test_bad_query_is_refused_even_with_no_nodes(query: str,
                                                       collector: Any) -> None:
    counting = Counting()
    reranker = ConfidenceGainReranker(reranker=counting)
    with pytest.raises(ValueError, match=r"^query"):
        reranker.postprocess_nodes([], query_str=query)
    with pytest.raises(ValueError, match=r"^query"):
        await reranker.apostprocess_nodes([], query_str=query)
    assert counting.calls == 0 and collector.of(ReRankStartEvent) == []
