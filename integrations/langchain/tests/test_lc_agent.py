"""A LangChain agent (``langchain.agents.create_agent``) that verifies its own draft.

Real parts: the agent loop (LangGraph), ``ClaimVerifierTool`` over a real ``ClaimVerifier``
and corpus-statistics index (the shipped HotpotQA/2Wiki slices), ``GatedRetrieverTool`` over
a ``GatedRetriever`` with a real ``QuCoGate`` in front of BM25 over the slice's
paragraphs. The chat model is a fixture: :class:`ScriptedToolCaller` takes its turns
from ``rag_gates.testing.VerifyReviseScript``, whose policy reacts to what the tools return
(draft -> verify_claims -> search_documents with the verifier's query -> revise -> verify
again), so the tool contract is checked deterministically.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForLLMRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.retrievers import BaseRetriever
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_tests.unit_tests import ToolsUnitTests
from pydantic import Field

from langchain_rag_gates import (
    ClaimVerifierTool,
    GatedRetrieval,
    GatedRetriever,
    GatedRetrieverInput,
    GatedRetrieverTool,
    passages_to_documents,
)
from rag_gates.quco import ClaimVerifier, QuCoGate, Verification
from rag_gates.testing import VerifyReviseScript
from rag_gates.types import GateDecision
from rag_gates_lab.corpus import corpus_passages
from rag_gates_lab.plugins.quco import BENCH_TAU_ENTITY

pytest.importorskip("langchain.agents", reason="needs langchain 1.x: the examples extra")
from langchain.agents import create_agent

SLICES = Path(__file__).resolve().parents[3] / "examples" / "data"
QUESTION = "Were Scott Derrickson and Ed Wood of the same nationality?"
KEPT = "Scott Derrickson is an American director."  # supported: not flagged
FLAGGED = "Ed Wood was born in Paris."  # 'Ed Wood' and 'Paris' never co-occur: flagged
DRAFT = f"{KEPT} {FLAGGED}"
# Flagged too, but its query is about a common entity ('United States' in 115 documents > 82):
# the gate declines to retrieve.
COMMON = "The United States declared war on Scott Derrickson."
TOP_K = 3


class BM25Documents(BaseRetriever):
    """rag-gates' BM25 (bm25s) over the HotpotQA slice's paragraphs as a LangChain retriever
    (the application's retriever here; a vector store's works the same)."""

    k: int = 4

    def _get_relevant_documents(self, query: str, *,
                                run_manager: CallbackManagerForRetrieverRun,
                                k: int | None = None) -> list[Document]:
        return passages_to_documents(bm25().retrieve(query, k=k or self.k))

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun,
                                       k: int | None = None) -> list[Document]:
        return passages_to_documents(await bm25().aretrieve(query, k=k or self.k))


@functools.cache
def bm25() -> Any:
    pytest.importorskip("bm25s")
    from rag_gates.retrieval.bm25 import BM25Retriever

    return BM25Retriever.from_passages(corpus_passages("hotpotqa", SLICES))


class ScriptedToolCaller(BaseChatModel):
    """A tool-calling chat model whose turns come from a ``VerifyReviseScript`` (a fixture,
    not the thing under test). It reads the tool results from the conversation the agent
    sends, and records the tools it was bound to and every conversation it saw."""

    script: VerifyReviseScript
    seen: list[list[BaseMessage]] = Field(default_factory=list)
    bound: list[list[dict[str, Any]]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted-tool-caller"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        self.seen.append(list(messages))
        self.bound.append(kwargs.get("tools") or [])
        results = [(str(m.name), str(m.content)) for m in messages if isinstance(m, ToolMessage)]
        turn = self.script.next_turn(results)
        calls = [] if turn.tool is None else [
            {"name": turn.tool, "args": turn.args, "id": f"call-{len(results)}",
             "type": "tool_call"}]
        message = AIMessage(content=turn.content, tool_calls=calls)
        return ChatResult(generations=[ChatGeneration(message=message)])


def make_agent(corpus_stats: Any, draft: str) -> tuple[Any, ScriptedToolCaller]:
    model = ScriptedToolCaller(script=VerifyReviseScript(draft=draft))
    verify = ClaimVerifierTool(verifier=ClaimVerifier(corpus_stats))
    agent = create_agent(model, [verify, search_tool(corpus_stats)],
                         system_prompt="Answer, then check your answer with verify_claims.")
    return agent, model


def tool_calls(messages: list[BaseMessage]) -> list[tuple[str, dict[str, Any]]]:
    return [(c["name"], c["args"]) for m in messages if isinstance(m, AIMessage)
            for c in m.tool_calls]


def tool_messages(messages: list[BaseMessage], name: str) -> list[ToolMessage]:
    return [m for m in messages if isinstance(m, ToolMessage) and m.name == name]


# ---------------------------------------------------------------- the agent
def test_agent_revises_a_flagged_claim_from_retrieved_text(corpus_stats: Any) -> None:
    agent, model = make_agent(corpus_stats, DRAFT)
    messages = agent.invoke({"messages": [HumanMessage(QUESTION)]})["messages"]

    # The model saw both tools with their schemas on every turn.
    assert [[t["function"]["name"] for t in tools] for tools in model.bound] == [
        ["verify_claims", "search_documents"]] * 4
    assert model.bound[0][0]["function"]["parameters"]["required"] == ["text"]
    assert model.bound[0][1]["function"]["parameters"]["required"] == ["query"]

    # draft -> verify(draft) -> search(the verifier's query) -> verify(revision) -> answer
    calls = tool_calls(messages)
    assert [name for name, _ in calls] == ["verify_claims", "search_documents", "verify_claims"]
    assert calls[0][1] == {"text": DRAFT}
    assert [type(m).__name__ for m in messages] == [
        "HumanMessage", "AIMessage", "ToolMessage", "AIMessage", "ToolMessage", "AIMessage",
        "ToolMessage", "AIMessage"]

    # The verifier's verdict on the draft is the real verifier's, as JSON and as artifact.
    first, second = tool_messages(messages, "verify_claims")
    expected = ClaimVerifier(corpus_stats).verify(DRAFT)
    assert json.loads(str(first.content)) == expected.summary()
    assert isinstance(first.artifact, Verification)
    assert [(c.claim.head, c.claim.tail, c.cooccurrence) for c in first.artifact.flagged] == [
        ("Ed Wood", "Paris", 0)]
    query = expected.queries[0]
    assert query == "Ed Wood born in" and calls[1][1] == {"query": query}

    # The search: the gate's decision for this query and the documents, in content and
    # artifact; the documents are the wrapped retriever's, annotated.
    (search,) = tool_messages(messages, "search_documents")
    found = json.loads(str(search.content))
    artifact = search.artifact
    assert isinstance(artifact, GatedRetrieval) and isinstance(artifact.decision, GateDecision)
    assert artifact.decision.gate == "quco" and artifact.decision.retrieve
    assert found == {"retrieved": True, "gate": "quco", "reason": artifact.decision.reason,
                     "documents": [{"title": d.metadata["title"], "text": d.page_content}
                                   for d in artifact.documents]}
    inner = BM25Documents(k=TOP_K).invoke(query)
    assert [d.id for d in artifact.documents] == [d.id for d in inner]
    assert all(d.metadata["rag_gates"]["retrieve"] is True for d in artifact.documents)

    # The revision keeps the supported sentence, replaces the flagged one with retrieved
    # text, and passes the verifier; the agent answers with it.
    revised = calls[2][1]["text"]
    assert revised.startswith(f"{KEPT} ") and "Paris" not in revised
    replacement = revised.removeprefix(f"{KEPT} ")
    assert any(replacement in d.page_content for d in artifact.documents)
    assert json.loads(str(second.content)) == ClaimVerifier(corpus_stats).verify(
        revised).summary()
    assert json.loads(str(second.content))["flagged"] == []
    assert messages[-1].content == revised and not messages[-1].tool_calls


async def test_agent_async_keeps_a_draft_with_nothing_flagged(corpus_stats: Any) -> None:
    agent, model = make_agent(corpus_stats, KEPT)
    messages = (await agent.ainvoke({"messages": [HumanMessage(QUESTION)]}))["messages"]
    assert tool_calls(messages) == [("verify_claims", {"text": KEPT})]
    (verdict,) = tool_messages(messages, "verify_claims")
    report = json.loads(str(verdict.content))
    assert report["flagged"] == [] and report["claims_checked"] >= 1
    assert isinstance(verdict.artifact, Verification)
    assert messages[-1].content == KEPT and len(model.seen) == 2


async def test_agent_async_answers_unrevised_when_the_gate_declines(corpus_stats: Any) -> None:
    agent, _ = make_agent(corpus_stats, COMMON)
    messages = (await agent.ainvoke({"messages": [HumanMessage("Who fought whom?")]}))[
        "messages"]
    calls = tool_calls(messages)
    assert calls == [("verify_claims", {"text": COMMON}),
                     ("search_documents", {"query": "United States declared war on"})]
    (search,) = tool_messages(messages, "search_documents")
    found = json.loads(str(search.content))
    assert found["retrieved"] is False and found["documents"] == []
    assert "known to the corpus" in found["reason"]
    assert search.artifact.decision.retrieve is False and search.artifact.documents == []
    assert messages[-1].content == COMMON


# ---------------------------------------------------------------- GatedRetrieverTool
def search_tool(corpus_stats: Any) -> GatedRetrieverTool:
    return GatedRetrieverTool(retriever=GatedRetriever(
        retriever=BM25Documents(), gate=QuCoGate(corpus_stats, tau_entity=BENCH_TAU_ENTITY),
        k=TOP_K))


class TestGatedRetrieverToolStandard(ToolsUnitTests):
    @pytest.fixture(autouse=True)
    def _stats(self, corpus_stats: Any) -> None:
        self.stats = corpus_stats

    @property
    def tool_constructor(self) -> type[GatedRetrieverTool]:
        return GatedRetrieverTool

    @property
    def tool_constructor_params(self) -> dict[str, Any]:
        return {"retriever": GatedRetriever(retriever=BM25Documents(), gate=QuCoGate(
            self.stats, tau_entity=BENCH_TAU_ENTITY))}

    @property
    def tool_invoke_params_example(self) -> dict[str, Any]:
        return {"query": "Ed Wood born in"}


def test_search_tool_schema_and_direct_invoke(corpus_stats: Any) -> None:
    tool = search_tool(corpus_stats)
    assert tool.name == "search_documents" and "gate" in tool.description
    assert tool.args == {"query": GatedRetrieverInput.model_json_schema()["properties"]["query"]}
    found = json.loads(tool.invoke({"query": "Ed Wood born in"}))
    assert found["retrieved"] is True and len(found["documents"]) == TOP_K
    message = tool.invoke({"type": "tool_call", "id": "1", "name": "search_documents",
                           "args": {"query": "Ed Wood born in"}})
    assert isinstance(message, ToolMessage) and json.loads(str(message.content)) == found
    assert all(isinstance(d, Document) for d in message.artifact.documents)
    with pytest.raises(TypeError, match="GatedRetriever"):
        GatedRetrieverTool(retriever=BM25Documents())


async def test_search_tool_parallel_calls_keep_their_own_decisions(corpus_stats: Any) -> None:
    tool = search_tool(corpus_stats)
    queries = ["Ed Wood born in", "United States declared war on"] * 3
    messages = await asyncio.gather(*(
        tool.ainvoke({"type": "tool_call", "id": str(i), "name": "search_documents",
                      "args": {"query": q}}) for i, q in enumerate(queries)))
    assert [m.artifact.decision.retrieve for m in messages] == [True, False] * 3
    assert [json.loads(m.content)["retrieved"] for m in messages] == [True, False] * 3
    assert [bool(m.artifact.documents) for m in messages] == [True, False] * 3
