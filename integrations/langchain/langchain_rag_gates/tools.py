"""``ClaimVerifierTool``: QuCo-RAG's claim verifier as a LangChain tool (agent
self-verification)."""

from __future__ import annotations

import json
from typing import Any, Literal

from langchain_core.callbacks import (
    AsyncCallbackManagerForToolRun,
    CallbackManagerForToolRun,
)
from langchain_core.tools import BaseTool
from pydantic import BaseModel, ConfigDict, Field, field_validator

from rag_gates.quco import ClaimVerifier, Verification

__all__ = ["ClaimVerifierInput", "ClaimVerifierTool"]

DESCRIPTION = (
    "Verify these claims against corpus statistics; return the flagged ones with counts and "
    "the queries to run. Input: the draft text (one or more sentences). Output: JSON with "
    "'flagged' (claims whose entities never co-occur in the corpus: head, relation, tail, "
    "cooccurrence count, reason, query), 'queries' (search queries that would fix them), "
    "'claims_checked' and 'sentences'. An unflagged claim is not contradicted by the "
    "corpus; it is not proven true."
)


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
        pip install -U langchain-rag-gates "rag-gates[corpus]"
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

    name: str = "verify_claims"
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
