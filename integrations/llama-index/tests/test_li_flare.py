"""PassageRetriever and the FLARE peer method, on real BM25 over the shipped HotpotQA slice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import QueryBundle
from llama_index.query_engine.rag_gates import FlareMethod
from llama_index.retrievers.rag_gates.base import PassageRetriever

from rag_gates.methods import MethodContext, available_methods, make_method
from rag_gates.retrieval.bm25 import BM25Retriever
from rag_gates.testing import tiny_lm
from rag_gates_lab.corpus import corpus_passages

SLICES = Path(__file__).resolve().parents[3] / "examples" / "data"
QUESTION = "Were Scott Derrickson and Ed Wood of the same nationality?"


@pytest.fixture(scope="module")
def bm25() -> BM25Retriever:
    return BM25Retriever.from_passages(corpus_passages("hotpotqa", SLICES))


def test_passage_retriever_returns_the_same_passages_as_nodes(bm25: BM25Retriever) -> None:
    retriever = PassageRetriever(bm25, similarity_top_k=4)
    nodes = retriever.retrieve(QueryBundle(QUESTION))
    passages = bm25.retrieve(QUESTION, 4)
    assert [n.node.node_id for n in nodes] == [p.id for p in passages]
    assert [n.score for n in nodes] == pytest.approx([p.score for p in passages])
    with pytest.raises(TypeError):
        PassageRetriever(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        PassageRetriever(bm25, similarity_top_k=0)


async def test_passage_retriever_async(bm25: BM25Retriever) -> None:
    retriever = PassageRetriever(bm25, similarity_top_k=2)
    nodes = await retriever.aretrieve(QUESTION)
    assert [n.node.node_id for n in nodes] == [p.id for p in bm25.retrieve(QUESTION, 2)]


def test_passage_retriever_drops_into_a_query_engine(bm25: BM25Retriever) -> None:
    from llama_index.llms.rag_gates import RagGatesLLM

    llm = RagGatesLLM(lm=tiny_lm(seed=0, max_context=4096), max_new_tokens=4)
    engine = RetrieverQueryEngine.from_args(PassageRetriever(bm25, similarity_top_k=2),
                                            llm=llm)
    response = engine.query(QUESTION)
    assert len(response.source_nodes) == 2


def test_flare_is_a_registered_bench_method_and_records_its_work(bm25: BM25Retriever) -> None:
    assert available_methods()["flare"] is FlareMethod
    ctx = MethodContext(lm=tiny_lm(seed=0, max_context=4096), retriever=bm25,
                        dataset="hotpotqa", max_new_tokens=6)
    method = make_method("flare", ctx)
    result = method.answer(QUESTION)
    trace = result.trace
    # Each look-ahead round calls the model at least once; FLARE's own loop is bounded.
    assert trace.llm_calls >= 1
    assert trace.generated_tokens > 0
    assert any(e.kind == "note" and e.data.get("max_iterations") == 3 for e in trace.events)
    with pytest.raises(ValueError, match="retriever"):
        FlareMethod(MethodContext(lm=ctx.lm))


def test_flare_retrieves_when_the_model_writes_a_search_tag(bm25: BM25Retriever) -> None:
    """A model that follows FLARE's format triggers retrieval through our retriever."""
    from rag_gates.lm.base import BaseTextLM
    from rag_gates.types import Generation

    class SearchingLM(BaseTextLM):
        # A scripted text model: what FLARE's look-ahead prompt asks for, then 'done'.
        def __init__(self) -> None:
            self.calls = 0

        @property
        def model_id(self) -> str:
            return "scripted"

        def generate(self, prompt: Any, **kwargs: Any) -> Generation:
            self.calls += 1
            text = ("Both are [Search(Scott Derrickson nationality)]." if self.calls == 1
                    else "American. done")
            return Generation(text=text, finish_reason="eos", completion_tokens=5)

    ctx = MethodContext(lm=tiny_lm(seed=0, max_context=4096), retriever=bm25,
                        dataset="hotpotqa")
    method = FlareMethod(ctx, max_iterations=2)
    method.ctx = ctx.model_copy(update={"lm": _WhiteBoxScript(SearchingLM(), ctx.lm)})
    result = method.answer(QUESTION)
    assert result.trace.retrievals >= 1
    queries = [e.data["query"] for e in result.trace.events if e.kind == "retrieval"]
    assert "Scott Derrickson nationality" in queries


def test_a_malformed_search_tag_is_recorded_not_fatal(bm25: BM25Retriever) -> None:
    """LlamaIndex's FLARE parser raises IndexError on '[Search' without '(...)' (seen with
    SmolLM2 in the benchmark); the method records it and gives an empty answer."""
    from rag_gates.lm.base import BaseTextLM
    from rag_gates.types import Generation

    class MalformedLM(BaseTextLM):
        @property
        def model_id(self) -> str:
            return "scripted"

        def generate(self, prompt: Any, **kwargs: Any) -> Generation:
            return Generation(text="Both are [Search] American.", finish_reason="eos",
                              completion_tokens=5)

    ctx = MethodContext(lm=tiny_lm(seed=0, max_context=4096), retriever=bm25,
                        dataset="hotpotqa")
    method = FlareMethod(ctx, max_iterations=2)
    method.ctx = ctx.model_copy(update={"lm": _WhiteBoxScript(MalformedLM(), ctx.lm)})
    result = method.answer(QUESTION)
    errors = [e for e in result.trace.events if e.name == "flare-error"]
    assert result.answer == "" and errors and "IndexError" in str(errors[0].data["error"])


class _WhiteBoxScript:
    """Scripted generations; everything else from a real white-box model (RagGatesLLM
    requires one)."""

    def __init__(self, script: Any, lm: Any) -> None:
        self._script = script
        self._lm = lm

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._lm, attr)

    def generate(self, prompt: Any, **kwargs: Any) -> Any:
        return self._script.generate(prompt, **kwargs)
