"""Agent self-verification tools: ``ClaimVerifierTool`` (QuCo-RAG's claim verifier) and
``GatedRetrieverTool`` (a :class:`~langchain_rag_gates.GatedRetriever` that says what its gate
decided)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal
from uuid import UUID

from langchain_core.callbacks import (
    AsyncCallbackManagerForToolRun,
    BaseCallbackHandler,
    CallbackManager,
    CallbackManagerForToolRun,
)
from langchain_core.documents import Document
from langchain_core.tools import BaseTool
from pydantic import BaseModel, ConfigDict, Field, field_validator

from langchain_rag_gates.documents import documents_to_passages
from langchain_rag_gates.retrievers import DECISION_EVENT, GatedRetriever
from rag_gates.quco import ClaimVerifier, Verification
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
    "ClaimVerifierInput",
    "ClaimVerifierTool",
    "GatedRetrieval",
    "GatedRetrieverInput",
    "GatedRetrieverTool",
]

DESCRIPTION = VERIFY_CLAIMS_DESCRIPTION


class ClaimVerifierInput(BaseModel):
    """Input of :class:`ClaimVerifierTool`."""

    text: str = Field(..., description="The draft text whose claims to verify.")


class ClaimVerifierTool(BaseTool):
    """Check a draft's claims with QuCo-RAG's :class:`~rag_gates.quco.ClaimVerifier`.

    The verifier splits the text into sentences, extracts ``(head, relation, tail)`` claims
    and counts the corpus documents in which head and tail co-occur; a claim with no
    co-occurrence is flagged, with the retrieval query that would fix it. The tool's
    content is ``json.dumps(Verification.summary())`` (flagged claims with their counts,
    the queries, how many claims and sentences were checked); called with a ``ToolCall``
    the ``ToolMessage.artifact`` is the full :class:`~rag_gates.quco.Verification` (every
    sentence and claim check), since ``response_format="content_and_artifact"``.

    Setup:
        ```bash
        pip install -c constraints.txt -e ".[hf,qdrant,corpus]" -e integrations/langchain
        ```

    Key init args:
        verifier: rag_gates.quco.ClaimVerifier
            The verifier (its corpus statistics, extractor and thresholds).
        name: str
            Tool name the model sees (default ``"verify_claims"``).

    Instantiate:
        ```python
        from langchain_rag_gates import ClaimVerifierTool
        from rag_gates.corpus import LocalInfiniGram
        from rag_gates.quco import ClaimVerifier

        # indexes/docs: rag-gates index build docs/ --out indexes/docs
        tool = ClaimVerifierTool(verifier=ClaimVerifier(LocalInfiniGram("indexes/docs")))
        ```

    Invoke:
        ```python
        content = tool.invoke({"text": "Ed Wood was born in Paris."})
        json.loads(content)["queries"]  # ['Ed Wood born in']

        message = tool.invoke(
            {"type": "tool_call", "id": "1", "name": "verify_claims",
             "args": {"text": "Ed Wood was born in Paris."}}
        )
        message.artifact.flagged[0].cooccurrence  # 0
        ```

    Async:
        ```python
        content = await tool.ainvoke({"text": draft})
        ```

    Use with an agent or after a chain:
        ```python
        llm_with_tools = chat_model.bind_tools([tool])
        answer = chain.invoke(question)
        report = json.loads(tool.invoke({"text": answer}))
        ```
    """

    name: str = VERIFY_CLAIMS_NAME
    description: str = DESCRIPTION
    args_schema: type[BaseModel] = ClaimVerifierInput
    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"
    verifier: Any = Field(
        ..., exclude=True, description="The rag_gates.quco.ClaimVerifier that checks claims."
    )

    model_config = ConfigDict(arbitrary_types_allowed=True)

    @field_validator("verifier")
    @classmethod
    def _check_verifier(cls, value: Any) -> Any:
        if not isinstance(value, ClaimVerifier):
            raise TypeError(
                f"verifier must be a rag_gates.quco.ClaimVerifier, got {type(value).__name__}"
            )
        return value

    @staticmethod
    def _output(verification: Verification) -> tuple[str, Verification]:
        return json.dumps(verification.summary(), ensure_ascii=False), verification

    def _run(
        self, text: str, run_manager: CallbackManagerForToolRun | None = None
    ) -> tuple[str, Verification]:
        return self._output(self.verifier.verify(text))

    async def _arun(
        self, text: str, run_manager: AsyncCallbackManagerForToolRun | None = None
    ) -> tuple[str, Verification]:
        return self._output(await self.verifier.averify(text))


@dataclass(frozen=True)
class GatedRetrieval:
    """The artifact of :class:`GatedRetrieverTool`: the gate's decision for this call and the
    documents (annotated copies; ``[]`` when the gate decided not to retrieve)."""

    decision: GateDecision
    documents: list[Document]


class GatedRetrieverInput(BaseModel):
    """Input of :class:`GatedRetrieverTool`."""

    query: str = Field(
        ..., description="What to search for: a question, or a query verify_claims returned.")


class _DecisionCatcher(BaseCallbackHandler):
    """Keeps the gate decisions reported during one tool call, each with the run that
    reported it."""

    run_inline = True

    def __init__(self) -> None:
        self.decisions: list[tuple[UUID, Any]] = []

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kwargs: Any) -> None:
        if name == DECISION_EVENT:
            self.decisions.append((run_id, data))


class GatedRetrieverTool(BaseTool):
    """A :class:`~langchain_rag_gates.GatedRetriever` as an agent tool that says what its
    gate decided.

    LangChain's ``create_retriever_tool`` returns an empty string when the gate declines;
    this tool returns the decision too, so the agent reads *why* nothing was retrieved. Its
    content is ``json.dumps(rag_gates.tools.gated_retrieval_summary(...))``: ``retrieved``,
    ``gate``, ``reason`` and ``documents`` (title and text). Called with a ``ToolCall``, the
    ``ToolMessage.artifact`` is a :class:`GatedRetrieval` (the ``GateDecision`` and the
    annotated documents). The decision is this call's own (read from the retriever's
    ``rag_gates_decision`` event), so parallel tool calls on one retriever do not mix up.

    Setup:
        ```bash
        pip install -c constraints.txt -e ".[hf,qdrant]" -e integrations/langchain
        ```

    Key init args:
        retriever: GatedRetriever
            The gated retriever (any LangChain retriever behind any rag-gates gate).
        name: str
            Tool name the model sees (default ``"search_documents"``).

    Instantiate:
        ```python
        from langchain_rag_gates import GatedRetriever, GatedRetrieverTool
        from rag_gates.quco import QuCoGate

        search = GatedRetrieverTool(retriever=GatedRetriever(
            retriever=store.as_retriever(), gate=QuCoGate(stats, tau_entity=10), k=3))
        ```

    Invoke:
        ```python
        content = search.invoke({"query": "Ed Wood born in"})
        json.loads(content)["documents"][0]["title"]  # 'Ed Wood'

        message = search.invoke({"type": "tool_call", "id": "1", "name": "search_documents",
                                 "args": {"query": "Ed Wood born in"}})
        message.artifact.decision.reason  # 'mean entity count 6 <= tau_entity 10: ...'
        ```

    Use with an agent (and the claim verifier):
        ```python
        from langchain.agents import create_agent

        agent = create_agent(chat_model, [ClaimVerifierTool(verifier=verifier), search])
        ```
    """

    name: str = SEARCH_DOCUMENTS_NAME
    description: str = SEARCH_DOCUMENTS_DESCRIPTION
    args_schema: type[BaseModel] = GatedRetrieverInput
    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"
    retriever: Any = Field(
        ..., exclude=True, description="The langchain_rag_gates.GatedRetriever to search with.")

    model_config = ConfigDict(arbitrary_types_allowed=True)

    @field_validator("retriever")
    @classmethod
    def _check_retriever(cls, value: Any) -> Any:
        if not isinstance(value, GatedRetriever):
            raise TypeError(
                f"retriever must be a langchain_rag_gates.GatedRetriever, got "
                f"{type(value).__name__}; wrap it: GatedRetriever(retriever=..., gate=...), "
                "or use langchain_core.tools.create_retriever_tool for an ungated retriever"
            )
        return value

    @staticmethod
    def _catching(
        run_manager: CallbackManagerForToolRun | AsyncCallbackManagerForToolRun | None,
    ) -> tuple[Any, _DecisionCatcher]:
        catcher = _DecisionCatcher()
        callbacks: Any = (run_manager.get_child() if run_manager is not None
                          else CallbackManager(handlers=[]))
        callbacks.add_handler(catcher)
        return callbacks, catcher

    def _output(self, catcher: _DecisionCatcher,
                docs: list[Document]) -> tuple[str, GatedRetrieval]:
        decision = GateDecision.model_validate(the_call_decision(
            catcher.decisions, "GatedRetrieverTool needs a langchain_rag_gates.GatedRetriever "
            f"(it reports each decision as a {DECISION_EVENT!r} event)"))
        summary = gated_retrieval_summary(decision, documents_to_passages(docs))
        return json.dumps(summary, ensure_ascii=False), GatedRetrieval(decision, list(docs))

    def _run(
        self, query: str, run_manager: CallbackManagerForToolRun | None = None
    ) -> tuple[str, GatedRetrieval]:
        callbacks, catcher = self._catching(run_manager)
        docs = self.retriever.invoke(query, config={"callbacks": callbacks})
        return self._output(catcher, docs)

    async def _arun(
        self, query: str, run_manager: AsyncCallbackManagerForToolRun | None = None
    ) -> tuple[str, GatedRetrieval]:
        callbacks, catcher = self._catching(run_manager)
        docs = await self.retriever.ainvoke(query, config={"callbacks": callbacks})
        return self._output(catcher, docs)
