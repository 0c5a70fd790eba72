"""TokRAGRunnable on the tiny random-weight model: the core decoder's text and choices, in an
LCEL chain after a retriever, streamed and async, documents untouched."""

from __future__ import annotations

import asyncio
import copy
import threading
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.messages import AIMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.runnables import RunnableLambda, RunnablePassthrough

from langchain_rag_gates import TokRAGRunnable, documents_to_passages
from langchain_rag_gates.tokrag import CHOICES_KEY
from rag_gates.errors import WhiteBoxRequiredError
from rag_gates.lm.base import BaseTextLM
from rag_gates.testing import model_load_threads
from rag_gates.tokrag import CADDecoder, TokRAGDecoder
from rag_gates.types import Generation

Q = "What is the capital of France?"
DOCS = [Document(page_content="The capital of France is Paris.", id="d1",
                 metadata={"title": "France"}),
        Document(page_content="William Shakespeare wrote Hamlet in London.", id="d2")]


class TextOnly(BaseTextLM):
    model_id = "text-only"

    def generate(self, prompt: Any, **kwargs: Any) -> Generation:
        return Generation(text="x", finish_reason="eos")


def test_invoke_matches_the_core_decoder(tiny: Any) -> None:
    runnable = TokRAGRunnable(lm=tiny, max_new_tokens=8, top_logprobs=1)
    before = copy.deepcopy(DOCS)
    msg = runnable.invoke({"question": Q, "documents": DOCS})
    core = TokRAGDecoder(tiny).generate(Q, passages=documents_to_passages(DOCS),
                                        max_new_tokens=8)
    assert isinstance(msg, AIMessage) and msg.content == core.text
    record = msg.response_metadata[CHOICES_KEY]
    assert record["choices"] == [c.model_dump(mode="json") for c in core.choices]
    assert len(msg.response_metadata["logprobs"]["content"]) == core.completion_tokens
    assert msg.usage_metadata is not None
    assert msg.usage_metadata["output_tokens"] == core.completion_tokens
    assert before == DOCS


class ChainEnds(BaseCallbackHandler):
    """Each chain run's output by run name, as a tracer records it."""

    def __init__(self) -> None:
        self.names: dict[UUID, str] = {}
        self.outputs: dict[str, Any] = {}

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID, **kwargs: Any
                       ) -> None:
        self.names[run_id] = kwargs.get("name") or ""

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.outputs[self.names.get(run_id, "")] = outputs


def test_lcel_chain_after_a_retriever_streams_and_runs_async(tiny: Any) -> None:
    retriever = RunnableLambda(lambda q: list(DOCS))  # any retriever: str -> documents
    tokrag = TokRAGRunnable(lm=tiny, max_new_tokens=8)
    chain = {"question": RunnablePassthrough(), "documents": retriever} | tokrag
    msg = chain.invoke(Q)
    assert (chain | StrOutputParser()).invoke(Q) == msg.content
    ends = ChainEnds()
    chunks = list(chain.stream(Q, config={"callbacks": [ends]}))
    assert "".join(str(c.content) for c in chunks) == msg.content
    # The streamed run reaches callbacks and tracers, with the chunks merged as its output.
    assert ends.outputs["TokRAGRunnable"].content == msg.content
    assert chunks[-1].response_metadata[CHOICES_KEY]["choices"] == \
        msg.response_metadata[CHOICES_KEY]["choices"]
    merged = sum(chunks[1:], chunks[0])
    assert merged.usage_metadata == msg.usage_metadata and msg.usage_metadata is not None
    assert asyncio.run(chain.ainvoke(Q)).content == msg.content

    async def collect() -> str:
        return "".join([str(c.content) async for c in chain.astream(
            Q, config={"callbacks": [async_ends]})])

    async_ends = ChainEnds()
    assert asyncio.run(collect()) == msg.content
    assert async_ends.outputs["TokRAGRunnable"].content == msg.content
    # With top_logprobs, the last chunk carries them, as invoke's message does.
    scored = TokRAGRunnable(lm=tiny, max_new_tokens=8, top_logprobs=2)
    expected = scored.invoke({"question": Q, "documents": DOCS}).response_metadata["logprobs"]
    last = list(scored.stream({"question": Q, "documents": DOCS}))[-1]
    assert last.response_metadata["logprobs"] == expected
    assert len(expected["content"][0]["top_logprobs"]) == 2

    async def last_async() -> Any:
        return [c async for c in scored.astream({"question": Q, "documents": DOCS})][-1]

    assert asyncio.run(last_async()).response_metadata["logprobs"] == expected


def test_cad_and_bad_input(tiny: Any) -> None:
    cad = TokRAGRunnable(lm=tiny, method="cad", cad_alpha=0.0, max_new_tokens=6)
    assert cad.invoke({"question": Q, "documents": [(DOCS[0], 0.9), "a plain string"]}).content \
        == CADDecoder(tiny, 0.0).generate(
            Q, passages=[*documents_to_passages([DOCS[0]]), "a plain string"],
            max_new_tokens=6).text
    none = cad.invoke({"question": Q, "documents": []})
    assert none.response_metadata[CHOICES_KEY]["warnings"]
    with pytest.raises(WhiteBoxRequiredError):
        TokRAGRunnable(lm=TextOnly())
    with pytest.raises(TypeError, match="takes a dict"):
        cad.invoke(Q)
    with pytest.raises(KeyError, match="question"):
        cad.invoke({"documents": DOCS})
    # The usual LCEL name for the retriever's output is not this runnable's: before, every
    # answer was closed book without a word.
    chain = {"question": RunnablePassthrough(), "context": RunnableLambda(lambda q: DOCS)} | cad
    with pytest.raises(KeyError, match=r"no 'documents' key.*\['context', 'question'\]"):
        chain.invoke(Q)
    renamed = TokRAGRunnable(lm=tiny, method="cad", cad_alpha=0.0, max_new_tokens=6,
                             documents_key="context")
    assert renamed.invoke({"question": Q, "context": DOCS}).content == cad.invoke(
        {"question": Q, "documents": DOCS}).content
    with pytest.raises(ValueError, match="question is empty"):
        cad.invoke({"question": "  ", "documents": DOCS})


async def test_first_async_call_loads_the_model_off_the_event_loop(tiny_dir: Path,
                                                                    tiny: Any) -> None:
    expected = TokRAGRunnable(lm=tiny, max_new_tokens=6).invoke({"question": Q,
                                                                  "documents": DOCS})
    lazy = TokRAGRunnable(model=str(tiny_dir), max_new_tokens=6)
    with model_load_threads() as threads:
        answer = await lazy.ainvoke({"question": Q, "documents": DOCS})
    assert answer.content == expected.content
    assert len(threads) == 1 and threads[0] is not threading.current_thread()
    streamed = TokRAGRunnable(model=str(tiny_dir), max_new_tokens=6)
    with model_load_threads() as threads:
        pieces = [str(c.content) async for c in streamed.astream({"question": Q,
                                                                  "documents": DOCS})]
    assert "".join(pieces) == expected.content
    assert len(threads) == 1 and threads[0] is not threading.current_thread()
