"""TokRAGLLM and TokRAGSynthesizer on the tiny random-weight model: the adapters must give
the core decoder's text and choices, take nodes separately from the question, stream and run
async, and leave the caller's nodes untouched."""

from __future__ import annotations

import asyncio
import copy
import threading
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.response.schema import AsyncStreamingResponse, StreamingResponse
from llama_index.core.callbacks import CallbackManager, CBEventType, LlamaDebugHandler
from llama_index.core.instrumentation.events.synthesis import (
    SynthesizeEndEvent,
    SynthesizeStartEvent,
)
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.response_synthesizers.rag_gates import (
    CHOICES_KEY,
    TokRAGLLM,
    TokRAGSynthesizer,
    to_passages,
)

from rag_gates.errors import WhiteBoxRequiredError
from rag_gates.lm.base import BaseTextLM
from rag_gates.testing import model_load_threads, save_tiny_lm
from rag_gates.tokrag import CADDecoder, TokRAGDecoder
from rag_gates.types import Generation

Q = "What is the capital of France?"
NODES = [NodeWithScore(node=TextNode(text="The capital of France is Paris.", id_="n1",
                                     metadata={"title": "France"}), score=0.9),
         NodeWithScore(node=TextNode(text="William Shakespeare wrote Hamlet in London.",
                                     id_="n2"), score=0.5)]


class FixedRetriever(BaseRetriever):
    """Returns the same nodes for every query (a stand-in for a vector index)."""

    def __init__(self, nodes: list[NodeWithScore]) -> None:
        super().__init__()
        self.nodes = nodes

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return list(self.nodes)


class TextOnly(BaseTextLM):
    model_id = "text-only"

    def generate(self, prompt: Any, **kwargs: Any) -> Generation:
        return Generation(text="x", finish_reason="eos")


def test_complete_matches_the_core_decoder(tiny_li: Any) -> None:
    llm = TokRAGLLM(lm=tiny_li, max_new_tokens=8)
    before = copy.deepcopy(NODES)
    r = llm.complete(Q, passages=NODES, top_logprobs=2)
    core = TokRAGDecoder(tiny_li).generate(Q, passages=to_passages(NODES), max_new_tokens=8)
    assert r.text == core.text
    record = r.additional_kwargs[CHOICES_KEY]
    assert record["choices"] == [c.model_dump(mode="json") for c in core.choices]
    assert record["disagreements"] == len(core.disagreements)
    assert r.logprobs is not None and len(r.logprobs) == core.completion_tokens
    assert len(r.logprobs[0]) == 3  # the kept token, then 2 alternatives
    assert before == NODES  # nodes read, never changed
    assert to_passages(NODES)[0].title == "France"


def test_stream_and_async(tiny_li: Any) -> None:
    llm = TokRAGLLM(lm=tiny_li, max_new_tokens=8)
    whole = llm.complete(Q, passages=NODES)
    responses = list(llm.stream_complete(Q, passages=NODES))
    assert "".join(r.delta or "" for r in responses) == whole.text
    assert responses[-1].additional_kwargs[CHOICES_KEY]["choices"] == \
        whole.additional_kwargs[CHOICES_KEY]["choices"]
    assert asyncio.run(llm.acomplete(Q, passages=NODES)).text == whole.text

    async def collect() -> str:
        return "".join([r.delta or "" async for r in await llm.astream_complete(
            Q, passages=NODES)])

    assert asyncio.run(collect()) == whole.text
    # With top_logprobs, the last streamed response carries them, as complete() does.
    scored = llm.complete(Q, passages=NODES, top_logprobs=2)
    last = list(llm.stream_complete(Q, passages=NODES, top_logprobs=2))[-1]
    assert last.logprobs == scored.logprobs and last.logprobs is not None
    assert len(last.logprobs) == len(scored.additional_kwargs[CHOICES_KEY]["choices"])

    async def last_async() -> Any:
        return [r async for r in await llm.astream_complete(Q, passages=NODES,
                                                            top_logprobs=2)][-1]

    assert asyncio.run(last_async()).logprobs == scored.logprobs


def test_cad_method_and_bad_input(tiny_li: Any) -> None:
    cad = TokRAGLLM(lm=tiny_li, method="cad", cad_alpha=0.0, max_new_tokens=6)
    assert isinstance(cad.decoder, CADDecoder)
    assert cad.complete(Q, passages=NODES).text == CADDecoder(tiny_li, 0.0).generate(
        Q, passages=to_passages(NODES), max_new_tokens=6).text
    with pytest.raises(WhiteBoxRequiredError):
        TokRAGLLM(lm=TextOnly())
    with pytest.raises(TypeError, match="unexpected keyword"):
        cad.complete(Q, passages=NODES, temperature=0.5)
    with pytest.raises(ValueError, match="question is empty"):
        cad.complete(" ", passages=NODES)
    no_nodes = cad.complete(Q, passages=[])
    assert no_nodes.additional_kwargs[CHOICES_KEY]["warnings"]
    with pytest.raises(TypeError, match=r"a model goes in as lm= \(TokRAGSynthesizer\(lm="):
        TokRAGSynthesizer(tiny_li)  # the model positionally, where the README says lm=


def test_query_engine_switches_with_one_argument(tiny_li: Any, collector: Any) -> None:
    debug = LlamaDebugHandler()
    synth = TokRAGSynthesizer(lm=tiny_li, max_new_tokens=8,
                              callback_manager=CallbackManager([debug]))
    # llm= only because no Settings.llm is configured offline (from_args reads it eagerly).
    engine = RetrieverQueryEngine.from_args(FixedRetriever(NODES), llm=synth.llm,
                                            response_synthesizer=synth)
    response = engine.query(Q)
    core = TokRAGDecoder(tiny_li).generate(Q, passages=to_passages(NODES), max_new_tokens=8)
    assert str(response) == core.text
    assert [n.node.node_id for n in response.source_nodes] == ["n1", "n2"]
    assert response.metadata is not None
    assert response.metadata[CHOICES_KEY]["disagreements"] == len(core.disagreements)
    # The synthesis is visible as LlamaIndex's own is: start/end events, a callback event.
    (end,) = collector.of(SynthesizeEndEvent)
    assert len(collector.of(SynthesizeStartEvent)) == 1 and end.response is response
    assert len(debug.get_event_pairs(CBEventType.SYNTHESIZE)) == 1
    assert str(asyncio.run(engine.aquery(Q))) == core.text
    assert len(collector.of(SynthesizeEndEvent)) == 2
    assert len(debug.get_event_pairs(CBEventType.SYNTHESIZE)) == 2


def test_streaming_query_engine(tiny_li: Any, collector: Any) -> None:
    from llama_index.core.instrumentation.events.llm import (
        LLMCompletionEndEvent,
        LLMCompletionStartEvent,
    )

    synth = TokRAGSynthesizer(lm=tiny_li, max_new_tokens=8, streaming=True)
    engine = RetrieverQueryEngine(FixedRetriever(NODES), response_synthesizer=synth)
    response = engine.query(Q)
    assert isinstance(response, StreamingResponse)
    text = "".join(response.response_gen)
    core = TokRAGDecoder(tiny_li).generate(Q, passages=to_passages(NODES), max_new_tokens=8)
    assert text == core.text
    assert response.metadata is not None and CHOICES_KEY in response.metadata
    assert response.metadata[CHOICES_KEY]["choices"] == core.summary()["choices"]
    # A streamed answer is an LLM completion too, as the whole one is.
    assert len(collector.of(LLMCompletionStartEvent)) == 1
    assert len(collector.of(LLMCompletionEndEvent)) >= 1
    # get_response and aget_response honour streaming alike.
    assert "".join(synth.get_response(Q, [n.node.get_content() for n in NODES])) == \
        TokRAGDecoder(tiny_li).generate(Q, passages=to_passages(
            [n.node.get_content() for n in NODES]), max_new_tokens=8).text

    async def aget() -> str:
        gen = await synth.aget_response(Q, [n.node.get_content() for n in NODES])
        return "".join([piece async for piece in gen])

    assert asyncio.run(aget()) == "".join(synth.get_response(
        Q, [n.node.get_content() for n in NODES]))

    async def astream() -> str:
        r = await synth.asynthesize(Q, NODES)
        assert isinstance(r, AsyncStreamingResponse)
        return "".join([piece async for piece in r.async_response_gen()])

    assert asyncio.run(astream()) == core.text


def test_an_existing_index_switches_with_the_synthesizer_alone(
        tiny_li: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user whose app already has an LLM and an index changes one argument of
    ``index.as_query_engine``: the answer is then the decoder's, over the index's nodes."""
    from llama_index.core import Settings, VectorStoreIndex
    from llama_index.core.embeddings import MockEmbedding
    from llama_index.core.llms import MockLLM

    # The app's own settings (restored after the test): an LLM that is not ours.
    monkeypatch.setattr(Settings, "_llm", MockLLM(max_tokens=4))
    monkeypatch.setattr(Settings, "_embed_model", MockEmbedding(embed_dim=8))
    index = VectorStoreIndex([n.node for n in NODES])
    plain = index.as_query_engine(similarity_top_k=2)
    switched = index.as_query_engine(
        similarity_top_k=2, response_synthesizer=TokRAGSynthesizer(lm=tiny_li,
                                                                   max_new_tokens=8))
    response = switched.query(Q)
    nodes = [n.node for n in response.source_nodes]
    core = TokRAGDecoder(tiny_li).generate(Q, passages=to_passages(response.source_nodes),
                                           max_new_tokens=8)
    assert {n.node_id for n in nodes} == {"n1", "n2"}
    assert str(response) == core.text and str(response) != str(plain.query(Q))
    assert response.metadata is not None and CHOICES_KEY in response.metadata


async def test_first_async_call_loads_the_model_off_the_event_loop(tmp_path: Path,
                                                                    tiny_li: Any) -> None:
    path = save_tiny_lm(tmp_path / "tiny")
    expected = TokRAGLLM(lm=tiny_li, max_new_tokens=6).complete(Q, passages=NODES).text
    llm = TokRAGLLM(model=str(path), max_new_tokens=6)
    with model_load_threads() as threads:
        assert (await llm.acomplete(Q, passages=NODES)).text == expected
    assert len(threads) == 1 and threads[0] is not threading.current_thread()
    streamed = TokRAGLLM(model=str(path), max_new_tokens=6)
    with model_load_threads() as threads:
        pieces = [r.delta async for r in await streamed.astream_complete(Q, passages=NODES)]
    assert "".join(p or "" for p in pieces) == expected
    assert len(threads) == 1 and threads[0] is not threading.current_thread()
