"""DeepRAG as a LangChain runnable: the real loop (rag_gates.deeprag) behind the real
adapters (as_text_lm, LangChainRetrieverAdapter), on a scripted chat model and a keyword
retriever (test doubles of the model and the store), and on ChatRagGates over the tiny
random-weight Llama for the assistant-prefill path."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import BaseCallbackHandler, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.retrievers import BaseRetriever

from langchain_rag_gates import ChatRagGates, DeepRAGRunnable, as_text_lm
from langchain_rag_gates.deeprag import STEP_EVENT
from rag_gates.deeprag import ConstantGate

QUESTION = "Who was the father of the director of Jaws?"
DOCS = [
    Document(page_content="Arnold Meyer Spielberg was an electrical engineer and the father "
             "of the film director Steven Spielberg.", metadata={"title": "Arnold Spielberg"}),
    Document(page_content="Jaws is a 1975 thriller film directed by Steven Spielberg.",
             metadata={"title": "Jaws (film)"}),
    Document(page_content="The Eiffel Tower is a lattice tower in Paris.",
             metadata={"title": "Eiffel Tower"}),
]


class KeywordRetriever(BaseRetriever):
    """Documents ranked by words shared with the query."""

    k: int = 2

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun
                                ) -> list[Document]:
        words = set(query.lower().strip("?").split())
        ranked = sorted(DOCS, key=lambda d: -len(words & set(d.page_content.lower().split())))
        return ranked[: self.k]


def world(so_far: str) -> str:
    """Knows who directed Jaws; learns Spielberg's father only from a passage."""
    if so_far.endswith("Intermediate answer:"):
        if so_far.rpartition("Follow up:")[2].startswith(" Who directed"):
            return " Steven Spielberg"
        return " Arnold Spielberg" if "Arnold Meyer" in so_far.rpartition("Follow up:")[2] \
            else " Leah Adler"
    if so_far.endswith("So the final answer is:"):
        return " " + so_far.rpartition("Intermediate answer:")[2].split("\n")[0].strip()
    done = so_far.count("Follow up:")
    if done == 0:
        return "Follow up: Who directed Jaws?\nIntermediate answer: Steven Spielberg\n"
    if done == 1:
        return ("Follow up: Who was the father of Steven Spielberg?\n"
                "Let's search the question in Wikipedia.\nContext:")
    last = so_far.rpartition("Intermediate answer:")[2].split("\n")[0].strip()
    return f"So the final answer is: {last}\n"


class ScriptedChat(BaseChatModel):
    """Continues the final AI message (assistant prefill) as ``world`` says."""

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        so_far = str(messages[-1].content) if isinstance(messages[-1], AIMessage) else ""
        assert isinstance(messages[0], HumanMessage)
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=world(so_far)))])

    @property
    def _llm_type(self) -> str:
        return "scripted"


class Events(BaseCallbackHandler):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.chain: list[str] = []  # the runnable's own start/end, as a tracer sees them

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.events.append((name, data))

    def on_chain_start(self, serialized: Any, inputs: Any, **kwargs: Any) -> None:
        self.chain.append("start")

    def on_chain_end(self, outputs: Any, **kwargs: Any) -> None:
        self.chain.append("end" if "answer" in outputs else "end without answer")


def runnable(**kwargs: Any) -> DeepRAGRunnable:
    return DeepRAGRunnable(llm=ScriptedChat(), retriever=KeywordRetriever(), **kwargs)


def test_invoke_returns_the_trajectory_and_sends_each_step() -> None:
    events = Events()
    out = runnable(k=2).invoke({"question": QUESTION}, config={"callbacks": [events]})
    assert out["answer"] == "Arnold Spielberg" and out["stop_reason"] == "answered"
    steps = out["steps"]
    assert [s["subquery"] for s in steps] == ["Who directed Jaws?",
                                              "Who was the father of Steven Spielberg?"]
    assert [s["decision"]["retrieve"] for s in steps] == [False, True]
    assert steps[0]["documents"] is None
    assert steps[1]["documents"][0].metadata["title"] == "Arnold Spielberg"
    assert out["documents"][0].page_content.startswith("Arnold Meyer")
    assert out["trajectory"].startswith(f"Question: {QUESTION}\nFollow up: Who directed Jaws?")
    assert out["trajectory"].endswith("So the final answer is: Arnold Spielberg")
    assert [name for name, _ in events.events] == [STEP_EVENT, STEP_EVENT]
    assert events.events[1][1]["subquery"] == steps[1]["subquery"]
    retrievals = [e for e in out["trace"]["events"] if e["kind"] == "retrieval"]
    assert [r["data"]["query"] for r in retrievals] == [steps[1]["subquery"]]


def test_stream_chunks_add_up_to_invoke() -> None:
    deeprag = runnable()
    events = Events()
    chunks = list(deeprag.stream(QUESTION, config={"callbacks": [events]}))
    # A streamed run is traced as invoke's is: each step as an event, the merged output.
    assert [name for name, _ in events.events] == [STEP_EVENT, STEP_EVENT]
    assert events.chain == ["start", "end"]
    assert [sorted(c) for c in chunks[:2]] == [["steps"], ["steps"]]
    total = chunks[0]
    for chunk in chunks[1:]:
        total = total + chunk
    out = deeprag.invoke(QUESTION)
    for key in ("answer", "trajectory", "stop_reason"):
        assert total[key] == out[key]
    assert [s["text"] for s in total["steps"]] == [s["text"] for s in out["steps"]]


def test_async_forms() -> None:
    deeprag = runnable()

    events = Events()

    async def both() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        return await deeprag.ainvoke(QUESTION), [
            c async for c in deeprag.astream(QUESTION, config={"callbacks": [events]})]

    out, chunks = asyncio.run(both())
    assert [name for name, _ in events.events] == [STEP_EVENT, STEP_EVENT]
    assert events.chain == ["start", "end"]
    assert out["answer"] == "Arnold Spielberg" and len(chunks) == 3
    assert chunks[-1]["answer"] == "Arnold Spielberg"


def test_gate_and_settings() -> None:
    always = runnable(gate=ConstantGate(True))
    assert always.agent.config.mode == "gate"
    assert [s["decision"]["retrieve"] for s in always.invoke(QUESTION)["steps"]] == [True, True]
    never = DeepRAGRunnable(llm=ScriptedChat(), mode="never")
    assert never.invoke(QUESTION)["answer"] == "Leah Adler"
    with pytest.raises(ValueError, match="retriever"):
        DeepRAGRunnable(llm=ScriptedChat(), mode="always")
    with pytest.raises(ValueError):
        runnable(max_steps=-1)
    with pytest.raises(TypeError, match="str or a dict"):
        runnable().invoke(3)
    with pytest.raises(KeyError, match="query_key"):
        runnable().invoke({"query": QUESTION})


def test_chat_rag_gates_continues_the_assistant_message(tiny: Any) -> None:
    lm = as_text_lm(ChatRagGates(lm=tiny, max_tokens=8))
    prompt = [{"role": "user", "content": "Question: who?"},
              {"role": "assistant", "content": "Follow up:"}]
    assert lm.generate(prompt, max_new_tokens=6).text == \
        tiny.generate(prompt, max_new_tokens=6).text
    assert tiny.render(prompt).endswith("<|im_start|>assistant\nFollow up:")
