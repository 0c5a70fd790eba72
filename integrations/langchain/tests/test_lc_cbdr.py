"""ConfidenceGainReranker (document compressor) on the tiny model with an untrained probe: the
adapter must give the core reranker's order and scores, return new documents, and work
inside LangChain's ContextualCompressionRetriever with its callbacks."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.runnables import RunnableLambda

from langchain_rag_gates import ConfidenceGainReranker, documents_to_passages, passages_to_documents
from langchain_rag_gates.document_compressors import RERANK_EVENT, RERANK_KEY, SCORE_KEY
from rag_gates.cbdr import ConfidenceGainReranker as CoreReranker
from rag_gates.cbdr import ConfidenceProbe, ProbeConfig
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


class Recorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any, UUID]] = []

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.events.append((name, data, run_id))


class AsyncRecorder(AsyncCallbackHandler):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any, UUID]] = []

    async def on_custom_event(self, name: str, data: Any, *, run_id: UUID,
                              **kwargs: Any) -> None:
        self.events.append((name, data, run_id))


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
def docs() -> list[Document]:
    """Six HotpotQA paragraphs (Scott Derrickson, Ed Wood, ...) with retrieval scores."""
    passages = corpus_passages("hotpotqa", SLICES)[:6]
    return passages_to_documents(
        [p.model_copy(update={"score": round(0.9 - 0.1 * i, 2)}) for i, p in enumerate(passages)]
    )


def test_order_and_scores_are_the_core_rerankers(core: CoreReranker,
                                                 docs: list[Document]) -> None:
    expected = core.rerank(QUERY, documents_to_passages(docs), top_n=3)
    assert [s.index for s in expected.ranked] != [0, 1, 2]  # the probe really reorders

    compressor = ConfidenceGainReranker(reranker=core)
    assert issubclass(ConfidenceGainReranker, BaseDocumentCompressor)
    assert compressor.top_n == 3
    out = compressor.compress_documents(docs, QUERY)

    assert [d.id for d in out] == [docs[s.index].id for s in expected.ranked]
    question = expected.evidence["question_confidence"]
    assert isinstance(question, float)
    for rank, (d, s) in enumerate(zip(out, expected.ranked, strict=True), start=1):
        assert d.metadata[SCORE_KEY] == pytest.approx(s.score)
        assert d.metadata[RERANK_KEY] == {
            "reranker": "confidence-gain", "rank": rank, "score": pytest.approx(s.score),
            "candidates": 6,
            "evidence": {"confidence": pytest.approx(s.evidence["confidence"]),
                         "truncated_tokens": s.evidence["truncated_tokens"]}}
        # Inc = Conf(q + c) - Conf(q)
        assert s.score == pytest.approx(d.metadata[RERANK_KEY]["evidence"]["confidence"]
                                        - question)
        # Everything else of the document is kept: text, id, title, retrieval score.
        original = docs[s.index]
        assert d.page_content == original.page_content
        assert {k: v for k, v in d.metadata.items() if k not in (SCORE_KEY, RERANK_KEY)} == (
            original.metadata)
    assert compressor.last_result is not None
    assert compressor.last_result.evidence == pytest.approx(expected.evidence)


def test_from_probe_and_top_n(lm: Any, probe: ConfidenceProbe, core: CoreReranker,
                              docs: list[Document]) -> None:
    full = core.rerank(QUERY, documents_to_passages(docs))
    keep_all = ConfidenceGainReranker.from_probe(lm, probe, top_n=None, batch_size=2)
    assert isinstance(keep_all.reranker, CoreReranker) and keep_all.reranker.batch_size == 2
    out = keep_all.compress_documents(docs, QUERY)
    assert [d.id for d in out] == [docs[s.index].id for s in full.ranked]
    scores = [d.metadata[SCORE_KEY] for d in out]
    assert scores == sorted(scores, reverse=True) and len(out) == len(docs)
    (best,) = ConfidenceGainReranker.from_probe(lm, probe, top_n=1).compress_documents(
        docs, QUERY)
    assert best.id == out[0].id
    for bad in (0, -2, True, "3"):
        with pytest.raises(ValueError, match="top_n"):
            ConfidenceGainReranker(reranker=core, top_n=bad)


def test_returns_new_documents(core: CoreReranker, docs: list[Document]) -> None:
    before = copy.deepcopy(docs)
    out = ConfidenceGainReranker(reranker=core, top_n=None).compress_documents(docs, QUERY)
    assert docs == before
    assert all(RERANK_KEY not in d.metadata for d in docs)
    inputs = {id(d) for d in docs} | {id(d.metadata) for d in docs}
    assert all(id(d) not in inputs and id(d.metadata) not in inputs for d in out)
    out[0].metadata["title"] = "changed"
    out[0].metadata[RERANK_KEY]["evidence"]["confidence"] = -1.0
    assert docs == before


def test_zero_documents(docs: list[Document]) -> None:
    counting = Counting()
    compressor = ConfidenceGainReranker(reranker=counting)
    assert compressor.compress_documents([], QUERY) == []
    assert counting.calls == 0
    with pytest.raises(ValueError, match="query is empty"):
        compressor.compress_documents(docs, "  ")


async def test_async_path_uses_arerank(core: CoreReranker, docs: list[Document]) -> None:
    before = copy.deepcopy(docs)
    sync = ConfidenceGainReranker(reranker=core).compress_documents(docs, QUERY)
    compressor = ConfidenceGainReranker(reranker=AsyncOnly(core))
    out = await compressor.acompress_documents(docs, QUERY)
    assert [d.id for d in out] == [d.id for d in sync]
    assert [d.metadata[SCORE_KEY] for d in out] == pytest.approx(
        [d.metadata[SCORE_KEY] for d in sync])
    assert docs == before
    assert await compressor.acompress_documents([], QUERY) == []


def test_in_a_contextual_compression_retriever(core: CoreReranker,
                                               docs: list[Document]) -> None:
    retrievers = pytest.importorskip("langchain_classic.retrievers")
    base: RunnableLambda[str, list[Document]] = RunnableLambda(lambda query: docs,
                                                                name="six-paragraphs")
    retriever = retrievers.ContextualCompressionRetriever(
        base_compressor=ConfidenceGainReranker(reranker=core, top_n=2), base_retriever=base)
    recorder = Recorder()
    out = retriever.invoke(QUERY, config={"callbacks": [recorder]})

    expected = core.rerank(QUERY, documents_to_passages(docs), top_n=2)
    assert [d.id for d in out] == [docs[s.index].id for s in expected.ranked]
    ((name, data, _run_id),) = recorder.events
    assert name == RERANK_EVENT
    assert data["reranker"] == "confidence-gain" and data["query"] == QUERY
    assert data["candidates"] == 6
    assert [r["id"] for r in data["ranked"]] == [d.id for d in out]
    assert data["evidence"]["question_confidence"] == pytest.approx(
        expected.evidence["question_confidence"])
    # Without a run (a plain call) there is nothing to attach an event to, and no error.
    ConfidenceGainReranker(reranker=core).compress_documents(docs, QUERY,
                                                             callbacks=[recorder])
    assert len(recorder.events) == 1


async def test_async_contextual_compression_retriever(core: CoreReranker,
                                                      docs: list[Document]) -> None:
    retrievers = pytest.importorskip("langchain_classic.retrievers")
    base: RunnableLambda[str, list[Document]] = RunnableLambda(lambda query: docs,
                                                                name="six-paragraphs")
    retriever = retrievers.ContextualCompressionRetriever(
        base_compressor=ConfidenceGainReranker(reranker=AsyncOnly(core), top_n=2),
        base_retriever=base)
    recorder = AsyncRecorder()
    out = await retriever.ainvoke(QUERY, config={"callbacks": [recorder]})
    assert len(out) == 2 and all(RERANK_KEY in d.metadata for d in out)
    assert [name for name, _, _ in recorder.events] == [RERANK_EVENT]


def test_any_rag_gates_reranker(docs: list[Document]) -> None:
    out = ConfidenceGainReranker(reranker=Counting(), top_n=2).compress_documents(docs, QUERY)
    lengths = sorted((len(d.page_content) for d in docs), reverse=True)[:2]
    assert [d.metadata[SCORE_KEY] for d in out] == [float(x) for x in lengths]
    assert out[0].metadata[RERANK_KEY]["reranker"] == "length"


def test_bad_arguments_and_serialisation(lm: Any, core: CoreReranker,
                                         docs: list[Document]) -> None:
    with pytest.raises(TypeError, match="PassageReranker protocol"):
        ConfidenceGainReranker(reranker=object())
    other = ConfidenceProbe(ProbeConfig(model_id="another-model", hidden_size=lm.hidden_size,
                                        num_layers=lm.num_layers, layer=1))
    with pytest.raises(ProbeMismatchError, match="another-model"):
        ConfidenceGainReranker.from_probe(lm, other)
    with pytest.raises(ValueError, match="extra"):
        ConfidenceGainReranker(reranker=core, topn=2)

    class Broken(Counting):
        def rerank(self, query: str, passages: Sequence[Passage], top_n: int | None = None,
                   **signals: Any) -> Any:
            return [p.text for p in passages]

    with pytest.raises(TypeError, match="RerankResult"):
        ConfidenceGainReranker(reranker=Broken()).compress_documents(docs, QUERY)
    # The model stays out of serialisation.
    assert ConfidenceGainReranker(reranker=core, top_n=2).model_dump() == {"top_n": 2}


@pytest.mark.parametrize("query", ["", "  ", "Who wrote\ud800 Hamlet?"])
async def test_bad_query_is_refused_even_with_no_documents(query: str) -> None:
    counting = Counting()
    compressor = ConfidenceGainReranker(reranker=counting)
    with pytest.raises(ValueError, match=r"^query"):
        compressor.compress_documents([], query)
    with pytest.raises(ValueError, match=r"^query"):
        await compressor.acompress_documents([], query)
    assert counting.calls == 0
