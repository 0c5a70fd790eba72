"""rag-gates' agent tools for LlamaIndex (self-verification): QuCo-RAG's claim verifier
and a gated retriever that says what its gate decided."""

from __future__ import annotations

import json
import threading
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.base import BaseEvent
from llama_index.core.schema import NodeWithScore
from llama_index.core.tools import FunctionTool
from llama_index.retrievers.rag_gates import gated
from llama_index.retrievers.rag_gates.convert import nodes_to_passages
from llama_index.retrievers.rag_gates.gated import GateDecisionEvent, GatedRetriever
from pydantic import BaseModel, Field

from rag_gates.gated import GateErrorPolicy, check_gate_error_policy, gate_error_policy
from rag_gates.quco import ClaimVerifier
from rag_gates.tools import (
    SEARCH_DOCUMENTS_DESCRIPTION,
    SEARCH_DOCUMENTS_NAME,
    VERIFY_CLAIMS_DESCRIPTION,
    VERIFY_CLAIMS_NAME,
    gated_retrieval_summary,
    the_call_decision,
)
from rag_gates.types import GateDecision

__all__ = [
    "DEFAULT_DESCRIPTION",
    "DEFAULT_NAME",
    "SEARCH_DOCUMENTS_DESCRIPTION",
    "SEARCH_DOCUMENTS_NAME",
    "GatedRetrieval",
    "SearchDocumentsInput",
    "VerifyClaimsInput",
    "claim_verifier_tool",
    "gated_retriever_tool",
]

DEFAULT_NAME = VERIFY_CLAIMS_NAME
"""The claim verifier tool's default name."""

DEFAULT_DESCRIPTION = VERIFY_CLAIMS_DESCRIPTION
"""The claim verifier tool's default description (what an agent reads)."""


class VerifyClaimsInput(BaseModel):
    """The tool's input schema: one ``text`` field."""

    text: str = Field(..., description="The draft text whose claims to verify.")


def claim_verifier_tool(
    verifier: ClaimVerifier,
    *,
    name: str = DEFAULT_NAME,
    description: str = DEFAULT_DESCRIPTION,
    return_direct: bool = False,
) -> FunctionTool:
    """A LlamaIndex ``FunctionTool`` that checks a draft with QuCo's :class:`ClaimVerifier`.

    The tool takes ``text`` (the draft) and returns ``json.dumps(Verification.summary())``:
    the flagged claims with their corpus counts and the retrieval queries that would fix
    them (``ToolOutput.content`` and ``ToolOutput.raw_output`` both hold that JSON string).
    Its sync path calls ``verifier.verify``, its async path ``verifier.averify``.

    Setup:
        ```bash
        pip install -c constraints.txt -e ".[hf,qdrant,corpus]" -e integrations/llama-index
        ```

    Args:
        verifier: a ``rag_gates.quco.ClaimVerifier`` (its corpus statistics and extractor).
        name: the tool name the agent sees.
        description: the tool description the agent sees.
        return_direct: end the agent loop with the tool's output.

    Instantiate:
        ```python
        from llama_index.tools.rag_gates import claim_verifier_tool
        from rag_gates.corpus import LocalInfiniGram
        from rag_gates.gated import GateErrorPolicy, check_gate_error_policy, gate_error_policy
from rag_gates.quco import ClaimVerifier

        # indexes/docs: rag-gates index build docs/ --out indexes/docs
        tool = claim_verifier_tool(ClaimVerifier(LocalInfiniGram("indexes/docs")))
        # agent = ReActAgent(tools=[tool, ...], llm=llm)
        ```

    Invoke:
        ```python
        out = tool.call(text="Ed Wood was born in Paris.")
        json.loads(out.content)["flagged"][0]["query"]   # 'Ed Wood born in'
        json.loads(out.content)["queries"]               # ['Ed Wood born in']
        ```

    Async:
        ```python
        out = await tool.acall(text="Ed Wood was born in Paris.")
        ```
    """
    if not isinstance(verifier, ClaimVerifier):
        raise TypeError(
            f"verifier must be a rag_gates.quco.ClaimVerifier, got {type(verifier).__name__}"
        )
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")

    def verify_claims(text: str) -> str:
        """Verify the claims of a draft text against corpus co-occurrence."""
        return json.dumps(verifier.verify(text).summary(), ensure_ascii=False)

    async def averify_claims(text: str) -> str:
        """Verify the claims of a draft text against corpus co-occurrence."""
        return json.dumps((await verifier.averify(text)).summary(), ensure_ascii=False)

    return FunctionTool.from_defaults(
        fn=verify_claims,
        async_fn=averify_claims,
        name=name,
        description=description,
        fn_schema=VerifyClaimsInput,
        return_direct=return_direct,
    )



class SearchDocumentsInput(BaseModel):
    """The gated retriever tool's input schema: one ``query`` field."""

    query: str = Field(
        ..., description="What to search for: a question, or a query verify_claims returned.")


@dataclass(frozen=True)
class GatedRetrieval:
    """The ``raw_output`` of :func:`gated_retriever_tool`: the gate's decision for this call
    and the nodes (annotated copies; ``[]`` when the gate decided not to retrieve)."""

    decision: GateDecision
    nodes: list[NodeWithScore]


# The decisions of the tool call running in this context (None outside a call): the
# GatedRetriever reports its decision only as an instrumentation event, and a context
# variable keeps concurrent tool calls (parallel agent tool calls) apart.
_CALL_DECISIONS: ContextVar[list[tuple[str | None, GateDecision]] | None] = ContextVar(
    "rag_gates_tool_decisions", default=None)
_INSTALL_LOCK = threading.Lock()


class _DecisionCatcher(BaseEventHandler):
    """Hands each GateDecisionEvent to the tool call running in the current context."""

    @classmethod
    def class_name(cls) -> str:
        return "RagGatesToolDecisionCatcher"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        sink = _CALL_DECISIONS.get()
        if sink is not None and isinstance(event, GateDecisionEvent):
            sink.append((event.span_id, event.gate_decision()))


def _install_catcher() -> None:
    """Add the catcher to the gated retriever's dispatcher once (not at import)."""
    with _INSTALL_LOCK:
        if not any(isinstance(h, _DecisionCatcher) for h in gated.dispatcher.event_handlers):
            gated.dispatcher.add_event_handler(_DecisionCatcher())


def _gated_retrieval(decisions: list[tuple[str | None, GateDecision]],
                     nodes: list[NodeWithScore]) -> GatedRetrieval:
    needs = ("gated_retriever_tool needs a llama_index.retrievers.rag_gates.GatedRetriever "
             "(it dispatches each decision as a GateDecisionEvent)")
    return GatedRetrieval(decision=the_call_decision(decisions, needs), nodes=list(nodes))


def _content(result: Any) -> str:
    retrieval: GatedRetrieval = result
    return json.dumps(gated_retrieval_summary(retrieval.decision,
                                              nodes_to_passages(retrieval.nodes)),
                      ensure_ascii=False)


async def _acontent(result: Any) -> str:
    return _content(result)


def gated_retriever_tool(
    retriever: GatedRetriever,
    *,
    name: str = SEARCH_DOCUMENTS_NAME,
    description: str = SEARCH_DOCUMENTS_DESCRIPTION,
    return_direct: bool = False,
    on_gate_error: GateErrorPolicy = "retrieve",
) -> FunctionTool:
    """A :class:`~llama_index.retrievers.rag_gates.GatedRetriever` as a ``FunctionTool`` that
    says what its gate decided.

    LlamaIndex's ``RetrieverTool`` returns an empty string when the gate declines (and hands
    the retriever ``"input is <query>"``); this tool passes the query as is and returns the
    decision too, so an agent reads *why* nothing was retrieved. ``ToolOutput.content`` is
    ``json.dumps(rag_gates.tools.gated_retrieval_summary(...))``: ``retrieved``, ``gate``,
    ``reason`` and ``documents`` (title and text); ``ToolOutput.raw_output`` is a
    :class:`GatedRetrieval` (the ``GateDecision`` and the annotated nodes). The decision is
    this call's own, so parallel tool calls on one retriever do not mix up. Sync calls go
    through ``retriever.retrieve``, async ones through ``retriever.aretrieve``.

    Args:
        retriever: the gated retriever (any LlamaIndex retriever behind any rag-gates gate).
        name: the tool name the agent sees.
        description: the tool description the agent sees.
        return_direct: end the agent loop with the tool's output.
        on_gate_error: when the gate raises during a call: ``"retrieve"`` (default: fail
            closed, the returned decision names the error; an agent turns a tool's exception
            into a message and answers without the documents) or ``"raise"``. Applies to
            this tool's calls (its retriever and any ``GatedRetriever`` inside it) only.

    Example:
        ```python
        from llama_index.core.agent.workflow import FunctionAgent
        from llama_index.retrievers.rag_gates import GatedRetriever
        from llama_index.tools.rag_gates import claim_verifier_tool, gated_retriever_tool
        from rag_gates.quco import ClaimVerifier, QuCoGate

        search = gated_retriever_tool(GatedRetriever(index.as_retriever(similarity_top_k=3),
                                                     gate=QuCoGate(stats, tau_entity=10)))
        out = search.call(query="Ed Wood born in")
        json.loads(out.content)["reason"]      # 'mean entity count 6 <= tau_entity 10: ...'
        out.raw_output.nodes[0].metadata["rag_gates"]["retrieve"]  # True
        agent = FunctionAgent(tools=[claim_verifier_tool(ClaimVerifier(stats)), search],
                              llm=llm)
        ```
    """
    if not isinstance(retriever, GatedRetriever):
        raise TypeError(
            f"retriever must be a llama_index.retrievers.rag_gates.GatedRetriever, got "
            f"{type(retriever).__name__}; wrap it: GatedRetriever(retriever, gate=...), or use "
            "llama_index.core.tools.RetrieverTool for an ungated retriever"
        )
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    check_gate_error_policy(on_gate_error)
    _install_catcher()

    def search_documents(query: str) -> GatedRetrieval:
        """Search the documents behind a retrieval gate."""
        decisions: list[tuple[str | None, GateDecision]] = []
        token = _CALL_DECISIONS.set(decisions)
        try:
            with gate_error_policy(on_gate_error):
                nodes = retriever.retrieve(query)
        finally:
            _CALL_DECISIONS.reset(token)
        return _gated_retrieval(decisions, nodes)

    async def asearch_documents(query: str) -> GatedRetrieval:
        """Search the documents behind a retrieval gate."""
        decisions: list[tuple[str | None, GateDecision]] = []
        token = _CALL_DECISIONS.set(decisions)
        try:
            with gate_error_policy(on_gate_error):
                nodes = await retriever.aretrieve(query)
        finally:
            _CALL_DECISIONS.reset(token)
        return _gated_retrieval(decisions, nodes)

    return FunctionTool.from_defaults(
        fn=search_documents,
        async_fn=asearch_documents,
        name=name,
        description=description,
        fn_schema=SearchDocumentsInput,
        return_direct=return_direct,
        callback=_content,
        async_callback=_acontent,
    )
