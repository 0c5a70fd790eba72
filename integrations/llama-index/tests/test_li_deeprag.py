"""DeepRAG as a LlamaIndex query engine: the real loop (rag_gates.deeprag) behind the real
adapters (as_text_lm over LLM.chat, LlamaIndexRetrieverAdapter), on a scripted chat LLM and a
keyword retriever (test doubles of the model and the index), and on RagGatesLLM over the
tiny random-weight Llama."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.llms import CustomLLM
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.llms.rag_gates import RagGatesLLM
from llama_index.query_engine.rag_gates import DeepRAGQueryEngine, DeepRAGStepEvent

from rag_gates.deeprag import ConstantGate

QUESTION = "Who was the father of the director of Jaws?"
NODES = [
    TextNode(id_="arnold", text="Arnold Meyer Spielberg was an electrical engineer and the "
             "father of the film director Steven Spielberg."),
    TextNode(id_="jaws", text="Jaws is a 1975 thriller film directed by Steven Spielberg."),
    TextNode(id_="tower", text="The Eiffel Tower is a lattice tower in Paris."),
]


class KeywordRetriever(BaseRetriever):
    """Nodes ranked by words shared with the query, top 2."""

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        words = set(query_bundle.query_str.lower().strip("?").split())
        scored = [(len(words & set(n.text.lower().split())), n) for n in NODES]
        scored.sort(key=lambda pair: -pair[0])
        return [NodeWithScore(node=n, score=float(s)) for s, n in scored[:2]]


def world(so_far: str) -> str:
    """Knows who directed Jaws; learns Spielberg's father only from a passage."""
    block = so_far.rpartition("Follow up:")[2]
    if so_far.endswith("Intermediate answer:"):
        if block.startswith(" Who directed"):
            return " Steven Spielberg"
        return " Arnold Spielberg" if "Arnold Meyer" in block else " Leah Adler"
    last = so_far.rpartition("Intermediate answer:")[2].split("\n")[0].strip()
    if so_far.endswith("So the final answer is:"):
        return f" {last}"
    done = so_far.count("Follow up:")
    if done == 0:
        return "Follow up: Who directed Jaws?\nIntermediate answer: Steven Spielberg\n"
    if done == 1:
        return ("Follow up: Who was the father of Steven Spielberg?\n"
                "Let's search the question in Wikipedia.\nContext:")
    return f"So the final answer is: {last}\n"


class ScriptedChatLLM(CustomLLM):
    """Continues the final assistant message (assistant prefill) as ``world`` says."""

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="scripted", is_chat_model=True)

    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        last = messages[-1]
        so_far = str(last.content) if last.role == MessageRole.ASSISTANT else ""
        return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT,
                                                content=world(so_far)))

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any
                 ) -> CompletionResponse:
        raise AssertionError("DeepRAG's chat prompts go through chat()")

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        raise AssertionError("not streamed")




def test_query_answers_with_the_trajectory_and_step_events(collector: Any) -> None:
    engine = DeepRAGQueryEngine(ScriptedChatLLM(), KeywordRetriever(), k=2)
    response = engine.query(QUESTION)
    assert str(response) == "Arnold Spielberg"
    meta = response.metadata
    assert meta is not None and meta["stop_reason"] == "answered"
    assert [s["subquery"] for s in meta["steps"]] == ["Who directed Jaws?",
                                                      "Who was the father of Steven Spielberg?"]
    assert [s["decision"]["retrieve"] for s in meta["steps"]] == [False, True]
    assert meta["steps"][0]["passage_ids"] is None
    assert meta["steps"][1]["passage_ids"][0] == "arnold"
    assert response.source_nodes[0].node.node_id == "arnold"
    assert meta["trajectory"].endswith("So the final answer is: Arnold Spielberg")
    steps = [e for e in collector.events if isinstance(e, DeepRAGStepEvent)]
    assert [e.step["index"] for e in steps] == [0, 1]
    assert steps[1].query_str == QUESTION and steps[1].step["subquery"] == \
        meta["steps"][1]["subquery"]


def test_aquery_and_settings(collector: Any) -> None:
    engine = DeepRAGQueryEngine(ScriptedChatLLM(), KeywordRetriever(), gate=ConstantGate(True))
    response = asyncio.run(engine.aquery(QUESTION))
    assert engine.config.mode == "gate"
    assert response.metadata is not None
    assert [s["decision"]["retrieve"] for s in response.metadata["steps"]] == [True, True]
    assert len([e for e in collector.events if isinstance(e, DeepRAGStepEvent)]) == 2
    never = DeepRAGQueryEngine(ScriptedChatLLM(), None, mode="never")
    assert str(never.query(QUESTION)) == "Leah Adler"
    with pytest.raises(TypeError, match="retriever"):
        DeepRAGQueryEngine(ScriptedChatLLM(), object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="retriever"):
        DeepRAGQueryEngine(ScriptedChatLLM(), None)


def test_runs_on_rag_gates_llm(tiny_li: Any) -> None:
    # The tiny model's 256-token context: a short instruction; random weights write no
    # markers, so the loop nudges, then steps on whatever text comes.
    from rag_gates.deeprag import DeepRAGPrompt

    engine = DeepRAGQueryEngine(RagGatesLLM(lm=tiny_li, max_new_tokens=4), KeywordRetriever(),
                                mode="never", max_steps=1, max_step_tokens=4,
                                max_answer_tokens=3, prompt=DeepRAGPrompt(instruction="Go."))
    response = engine.query("Who?")
    meta = response.metadata
    assert meta is not None and meta["malformed"][0]["action"] == "nudged"
    calls = [e["name"] for e in meta["trace"]["events"] if e["kind"] == "llm_call"]
    assert calls[:2] == ["step", "step-nudged"] and calls[-1].startswith("final")
