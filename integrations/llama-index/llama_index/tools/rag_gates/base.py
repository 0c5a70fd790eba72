"""QuCo-RAG's claim verifier as a LlamaIndex agent tool (self-verification)."""

from __future__ import annotations

import json

from llama_index.core.tools import FunctionTool
from pydantic import BaseModel, Field

from rag_gates.quco import ClaimVerifier

__all__ = ["DEFAULT_DESCRIPTION", "DEFAULT_NAME", "VerifyClaimsInput", "claim_verifier_tool"]

DEFAULT_NAME = "verify_claims"
"""The tool's default name."""

DEFAULT_DESCRIPTION = (
    "Verify these claims against corpus statistics; return the flagged ones with counts and "
    "the queries to run. Input: the draft text (one or more sentences). Output: JSON with "
    "'flagged' (claims whose entities never co-occur in the corpus: head, relation, tail, "
    "cooccurrence count, reason, query), 'queries' (search queries that would fix them), "
    "'claims_checked' and 'sentences'. An unflagged claim is not contradicted by the "
    "corpus; it is not proven true."
)
"""The tool's default description (what an agent reads)."""


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
        pip install -U llama-index-rag-gates "rag-gates[corpus]"
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

