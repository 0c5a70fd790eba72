"""A LlamaIndex ``FunctionAgent`` that verifies its own draft.

Real parts: the agent workflow, ``claim_verifier_tool`` over a real ``ClaimVerifier`` and
corpus-statistics index (the shipped HotpotQA/2Wiki slices), ``gated_retriever_tool`` over a
``GatedRetriever`` with a real ``QuCoGate`` in front of BM25 (``PassageRetriever``) over the
slice's paragraphs. The LLM is a fixture: :class:`ScriptedFunctionCaller` takes its turns
from ``rag_gates.testing.VerifyReviseScript``, whose policy reacts to what the tools return
(draft -> verify_claims -> search_documents with the verifier's query -> revise -> verify
again), so the tool contract is checked deterministically.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.agent.workflow import AgentOutput, FunctionAgent, ToolCallResult
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    LLMMetadata,
    MessageRole,
    TextBlock,
    ToolCallBlock,
)
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.schema import NodeWithScore, QueryBundle
from llama_index.retrievers.rag_gates import GatedRetriever, PassageRetriever
from llama_index.tools.rag_gates import (
    SEARCH_DOCUMENTS_NAME,
    GatedRetrieval,
    claim_verifier_tool,
    gated_retriever_tool,
)
from pydantic import Field

from rag_gates.quco import ClaimVerifier, QuCoGate
from rag_gates.testing import VerifyReviseScript
from rag_gates.types import GateDecision
from rag_gates_lab.corpus import corpus_passages
from rag_gates_lab.plugins.quco import BENCH_TAU_ENTITY

SLICES = Path(__file__).resolve().parents[3] / "examples" / "data"
QUESTION = "Were Scott Derrickson and Ed Wood of the same nationality?"
KEPT = "Scott Derrickson is an American director."  # supported: not flagged
FLAGGED = "Ed Wood was born in Paris."  # 'Ed Wood' and 'Paris' never co-occur: flagged
DRAFT = f"{KEPT} {FLAGGED}"
# Flagged too, but its query is about a common entity ('United States' in 115 documents > 82):
# the gate declines to retrieve.
COMMON = "The United States declared war on Scott Derrickson."
TOP_K = 3


@functools.cache
def bm25() -> Any:
    pytest.importorskip("bm25s")
    from rag_gates.retrieval.bm25 import BM25Retriever

    return BM25Retriever.from_passages(corpus_passages("hotpotqa", SLICES))


class ScriptedFunctionCaller(FunctionCallingLLM):
    """A function-calling LLM whose turns come from a ``VerifyReviseScript`` (a fixture, not
    the thing under test). It reads the tool results from the conversation the agent sends
    (tool messages point back to its own calls by id), and records the tools it was given
    and every conversation it saw."""

    script: VerifyReviseScript
    seen: list[list[ChatMessage]] = Field(default_factory=list)
    tools_seen: list[list[dict[str, Any]]] = Field(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "ScriptedFunctionCaller"

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="scripted", is_chat_model=True,
                           is_function_calling_model=True)

    def _prepare_chat_with_tools(self, tools: Sequence[Any], user_msg: Any = None,
                                 chat_history: list[ChatMessage] | None = None,
                                 verbose: bool = False, allow_parallel_tool_calls: bool = False,
                                 **kwargs: Any) -> dict[str, Any]:
        messages = list(chat_history or [])
        if user_msg is not None:
            messages.append(user_msg if isinstance(user_msg, ChatMessage)
                            else ChatMessage(role=MessageRole.USER, content=user_msg))
        return {"messages": messages,
                "tools": [{"name": t.metadata.name, **t.metadata.get_parameters_dict()}
                          for t in tools]}

    def get_tool_calls_from_response(self, response: ChatResponse,
                                     error_on_no_tool_call: bool = True,
                                     **kwargs: Any) -> list[ToolSelection]:
        return [ToolSelection(tool_id=b.tool_call_id or "", tool_name=b.tool_name,
                              tool_kwargs=dict(b.tool_kwargs))  # type: ignore[arg-type]
                for b in response.message.blocks if isinstance(b, ToolCallBlock)]

    def _turn(self, messages: Sequence[ChatMessage], tools: list[dict[str, Any]]) -> ChatResponse:
        self.seen.append(list(messages))
        self.tools_seen.append(tools)
        names = {b.tool_call_id: b.tool_name for m in messages for b in m.blocks
                 if isinstance(b, ToolCallBlock)}
        results = [(names[m.additional_kwargs["tool_call_id"]], str(m.content))
                   for m in messages if m.role == MessageRole.TOOL]
        turn = self.script.next_turn(results)
        blocks: list[Any] = [TextBlock(text=turn.content)] if turn.content else []
        if turn.tool is not None:
            blocks.append(ToolCallBlock(tool_call_id=f"call-{len(results)}",
                                        tool_name=turn.tool, tool_kwargs=turn.args))
        message = ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks)
        return ChatResponse(message=message, delta=turn.content)

    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self._turn(messages, kwargs.get("tools") or [])

    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self.chat(messages, **kwargs)

    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> Any:
        yield self.chat(messages, **kwargs)

    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> Any:
        response = self.chat(messages, **kwargs)

        async def gen() -> AsyncGenerator[ChatResponse, None]:
            yield response

        return gen()

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        raise NotImplementedError("the scripted model only chats")

    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        raise NotImplementedError("the scripted model only chats")

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        raise NotImplementedError("the scripted model only chats")

    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        raise NotImplementedError("the scripted model only chats")


def gated(corpus_stats: Any) -> GatedRetriever:
    return GatedRetriever(PassageRetriever(bm25(), similarity_top_k=TOP_K),
                          gate=QuCoGate(corpus_stats, tau_entity=BENCH_TAU_ENTITY))


async def run_agent(corpus_stats: Any, draft: str, question: str = QUESTION, *,
                    streaming: bool = True
                    ) -> tuple[AgentOutput, list[ToolCallResult], ScriptedFunctionCaller]:
    llm = ScriptedFunctionCaller(script=VerifyReviseScript(draft=draft))
    agent = FunctionAgent(
        tools=[claim_verifier_tool(ClaimVerifier(corpus_stats)),
               gated_retriever_tool(gated(corpus_stats))],
        llm=llm, streaming=streaming,
        system_prompt="Answer, then check your answer with verify_claims.")
    handler = agent.run(user_msg=question)
    results = [e async for e in handler.stream_events() if isinstance(e, ToolCallResult)]
    return await handler, results, llm


# ---------------------------------------------------------------- the agent
async def test_function_agent_revises_a_flagged_claim_from_retrieved_text(
        corpus_stats: Any) -> None:
    output, results, llm = await run_agent(corpus_stats, DRAFT)

    # The model was given both tools with their schemas on every turn.
    assert [[t["name"] for t in tools] for tools in llm.tools_seen] == [
        ["verify_claims", "search_documents"]] * 4
    assert llm.tools_seen[0][0]["required"] == ["text"]
    assert llm.tools_seen[0][1]["required"] == ["query"]

    # draft -> verify(draft) -> search(the verifier's query) -> verify(revision) -> answer
    assert [r.tool_name for r in results] == ["verify_claims", "search_documents",
                                              "verify_claims"]
    first, search, second = results
    assert first.tool_kwargs == {"text": DRAFT}

    # The verifier's verdict on the draft is the real verifier's.
    expected = ClaimVerifier(corpus_stats).verify(DRAFT)
    report = json.loads(first.tool_output.content)
    assert report == expected.summary()
    assert [(f["head"], f["tail"], f["cooccurrence"]) for f in report["flagged"]] == [
        ("Ed Wood", "Paris", 0)]
    query = expected.queries[0]
    assert query == "Ed Wood born in" and search.tool_kwargs == {"query": query}

    # The search: the gate's decision for this query and the documents, in content and
    # raw output; the nodes are the wrapped retriever's, annotated.
    found = json.loads(search.tool_output.content)
    raw = search.tool_output.raw_output
    assert isinstance(raw, GatedRetrieval) and isinstance(raw.decision, GateDecision)
    assert raw.decision.gate == "quco" and raw.decision.retrieve
    assert found == {"retrieved": True, "gate": "quco", "reason": raw.decision.reason,
                     "documents": [{"title": n.node.metadata["title"],
                                    "text": n.node.get_content()} for n in raw.nodes]}
    inner = PassageRetriever(bm25(), similarity_top_k=TOP_K).retrieve(QueryBundle(query))
    assert [n.node.node_id for n in raw.nodes] == [n.node.node_id for n in inner]
    assert all(n.node.metadata["rag_gates"]["retrieve"] is True for n in raw.nodes)

    # The revision keeps the supported sentence, replaces the flagged one with retrieved
    # text, and passes the verifier; the agent answers with it.
    revised = second.tool_kwargs["text"]
    assert revised.startswith(f"{KEPT} ") and "Paris" not in revised
    replacement = revised.removeprefix(f"{KEPT} ")
    assert any(replacement in n.node.get_content() for n in raw.nodes)
    assert json.loads(second.tool_output.content) == ClaimVerifier(corpus_stats).verify(
        revised).summary()
    assert json.loads(second.tool_output.content)["flagged"] == []
    assert output.response.content == revised
    assert [c.tool_name for c in output.tool_calls] == [r.tool_name for r in results]


async def test_function_agent_keeps_a_draft_with_nothing_flagged(corpus_stats: Any) -> None:
    output, results, llm = await run_agent(corpus_stats, KEPT, streaming=False)
    assert [(r.tool_name, r.tool_kwargs) for r in results] == [
        ("verify_claims", {"text": KEPT})]
    report = json.loads(results[0].tool_output.content)
    assert report["flagged"] == [] and report["claims_checked"] >= 1
    assert output.response.content == KEPT and len(llm.seen) == 2


async def test_function_agent_answers_unrevised_when_the_gate_declines(
        corpus_stats: Any) -> None:
    output, results, _ = await run_agent(corpus_stats, COMMON, "Who fought whom?")
    assert [(r.tool_name, r.tool_kwargs) for r in results] == [
        ("verify_claims", {"text": COMMON}),
        ("search_documents", {"query": "United States declared war on"})]
    found = json.loads(results[1].tool_output.content)
    assert found["retrieved"] is False and found["documents"] == []
    assert "known to the corpus" in found["reason"]
    raw = results[1].tool_output.raw_output
    assert raw.decision.retrieve is False and raw.nodes == []
    assert output.response.content == COMMON


# ---------------------------------------------------------------- gated_retriever_tool
def test_search_tool_sync_call_and_schema(corpus_stats: Any) -> None:
    tool = gated_retriever_tool(gated(corpus_stats))
    assert tool.metadata.name == SEARCH_DOCUMENTS_NAME and "gate" in tool.metadata.description
    assert tool.metadata.get_parameters_dict()["required"] == ["query"]
    out = tool.call(query="Ed Wood born in")
    found = json.loads(out.content)
    assert found["retrieved"] is True and len(found["documents"]) == TOP_K
    assert all(isinstance(n, NodeWithScore) for n in out.raw_output.nodes)
    assert out.raw_output.decision.retrieve is True
    with pytest.raises(TypeError, match="GatedRetriever"):
        gated_retriever_tool(PassageRetriever(bm25()))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name"):
        gated_retriever_tool(gated(corpus_stats), name="")


async def test_search_tool_parallel_calls_keep_their_own_decisions(corpus_stats: Any) -> None:
    tool = gated_retriever_tool(gated(corpus_stats))
    queries = ["Ed Wood born in", "United States declared war on"] * 3
    outs = await asyncio.gather(*(tool.acall(query=q) for q in queries))
    assert [o.raw_output.decision.retrieve for o in outs] == [True, False] * 3
    assert [json.loads(o.content)["retrieved"] for o in outs] == [True, False] * 3
    assert [bool(o.raw_output.nodes) for o in outs] == [True, False] * 3


async def test_a_gate_that_raises_makes_the_search_tool_retrieve_and_say_why(
        tiny_li: Any) -> None:
    """An agent turns a tool's exception into an error message and answers without the
    documents; so the search tool fails closed: a query too long for the gate's model
    retrieves, and the decision names the error. The retriever itself still raises by
    default (a query engine's caller sees the error), and retrieves with on_gate_error."""
    from rag_gates.confidence import FirstTokenProbGate
    from rag_gates.errors import ContextLengthError
    from rag_gates.gate import UNDECIDED_SCORE

    long_query = "Ed Wood " * 400  # 800 words: over the tiny model's 256-token context
    retriever = GatedRetriever(PassageRetriever(bm25(), similarity_top_k=TOP_K),
                               gate=FirstTokenProbGate(tiny_li))
    tool = gated_retriever_tool(retriever)
    for out in (tool.call(query=long_query), await tool.acall(query=long_query)):
        assert not out.is_error
        decision = out.raw_output.decision
        assert decision.retrieve is True and decision.score == UNDECIDED_SCORE
        assert decision.evidence["error"].startswith("ContextLengthError")
        assert "could not decide" in decision.reason
        assert len(out.raw_output.nodes) == TOP_K
        assert json.loads(out.content)["retrieved"] is True
    with pytest.raises(ContextLengthError):  # the tool's policy did not leak out of its call
        retriever.retrieve(long_query)
    with pytest.raises(ContextLengthError):
        gated_retriever_tool(retriever, on_gate_error="raise").call(query=long_query)
    lenient = GatedRetriever(PassageRetriever(bm25(), similarity_top_k=TOP_K),
                             gate=FirstTokenProbGate(tiny_li), on_gate_error="retrieve")
    nodes = await lenient.aretrieve(long_query)
    assert len(nodes) == TOP_K and lenient.last_decision is not None
    assert lenient.last_decision.evidence["error"].startswith("ContextLengthError")
    with pytest.raises(ValueError, match="on_gate_error"):
        GatedRetriever(PassageRetriever(bm25()), gate=FirstTokenProbGate(tiny_li),
                       on_gate_error="skip")  # type: ignore[arg-type]
