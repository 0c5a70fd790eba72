"""``GatedQueryEngine``: any LlamaIndex query engine behind any rag-gates gate, with the LLM
answering directly when the gate says retrieval is not worth it.

Why not ``RetrieverQueryEngine(GatedRetriever(...))``: when the gate says no, that retriever
returns no nodes, and LlamaIndex's response synthesizers never call the LLM without nodes:
the engine answers "Empty Response". This engine asks the gate first and, on a no, has the
LLM answer the question itself.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.response.schema import RESPONSE_TYPE, Response
from llama_index.core.callbacks import CallbackManager
from llama_index.core.llms import LLM
from llama_index.core.prompts import BasePromptTemplate, PromptTemplate
from llama_index.core.prompts.mixin import PromptDictType, PromptMixinType
from llama_index.core.schema import QueryBundle
from llama_index.core.settings import Settings
from llama_index.retrievers.rag_gates.convert import ANNOTATION_KEY, annotate_node
from llama_index.retrievers.rag_gates.gated import emit_decision
from pydantic import JsonValue

from rag_gates.gate import Gate
from rag_gates.types import GateDecision

__all__ = ["DEFAULT_DIRECT_PROMPT", "GatedQueryEngine"]


DEFAULT_DIRECT_PROMPT = PromptTemplate(
    "Answer the question from your own knowledge, briefly.\n"
    "Question: {query_str}\n"
    "Answer: "
)
"""The prompt of the direct (no-retrieval) answer; it has one variable, ``query_str``."""


class GatedQueryEngine(BaseQueryEngine):
    """Ask a rag-gates gate first; retrieve through ``query_engine`` only when it says so.

    For each query the gate decides on ``query_str`` (``gate.decide``; ``gate.adecide`` on
    the async path):

    * retrieval: the wrapped ``query_engine`` answers (from its retrieved nodes); its
      source nodes come back as annotated copies carrying the decision in
      ``metadata[annotation_key]`` (excluded from prompts and embeddings);
    * no retrieval: ``llm`` answers the question directly with ``direct_prompt`` (default
      :data:`DEFAULT_DIRECT_PROMPT`); the wrapped engine, its retriever and its synthesizer
      are not called and ``response.source_nodes`` is ``[]``.

    Either way the decision (``GateDecision.model_dump(mode="json")``) is in
    ``response.metadata[annotation_key]``, dispatched as a
    :class:`~llama_index.retrievers.rag_gates.GateDecisionEvent` inside the query's
    instrumentation span, and kept in :attr:`last_decision`.

    Setup:
        ```bash
        pip install -c constraints.txt -e ".[hf,qdrant]" -e integrations/llama-index
        ```

    Args:
        query_engine (BaseQueryEngine): the engine that answers with retrieval (a
            ``VectorStoreIndex.as_query_engine()``, a ``RetrieverQueryEngine``, a router, ...).
        gate (Gate): any rag-gates gate (``QuCoGate``, a confidence gate, your own).
        llm (LLM | None): the LLM for direct answers; default ``Settings.llm``. Usually the
            LLM the wrapped engine's synthesizer uses.
        direct_prompt (BasePromptTemplate | None): prompt of the direct answer, with a
            ``{query_str}`` variable.
        annotation_key (str): metadata key of the decision. Defaults to ``"rag_gates"``.
        callback_manager (CallbackManager | None): LlamaIndex callback manager.

    Instantiate:
        ```python
        from llama_index.core import VectorStoreIndex
        from llama_index.llms.rag_gates import RagGatesLLM
        from llama_index.query_engine.rag_gates import GatedQueryEngine
        from rag_gates.corpus import LocalInfiniGram
        from rag_gates.quco import QuCoGate

        llm = RagGatesLLM(max_new_tokens=48)  # the embedded SmolLM2; any LlamaIndex LLM works
        index = VectorStoreIndex.from_documents(documents, embed_model=embed_model)
        engine = GatedQueryEngine(
            index.as_query_engine(llm=llm, similarity_top_k=3),
            gate=QuCoGate(LocalInfiniGram("indexes/docs"), tau_entity=82),  # see QuCoGate
            llm=llm,
        )
        ```

    Invoke:
        ```python
        response = engine.query("Were Scott Derrickson and Ed Wood of the same nationality?")
        response.metadata["rag_gates"]["retrieve"]   # True: rare entities, retrieved
        response.metadata["rag_gates"]["evidence"]   # {'entities': [...], 'counts': {...}}
        engine.query("What is the capital of the United States?").source_nodes  # []
        ```

    Async:
        ```python
        response = await engine.aquery(question)
        ```
    """

    def __init__(
        self,
        query_engine: BaseQueryEngine,
        gate: Gate,
        llm: LLM | None = None,
        direct_prompt: BasePromptTemplate | None = None,
        annotation_key: str = ANNOTATION_KEY,
        callback_manager: CallbackManager | None = None,
    ) -> None:
        if not isinstance(query_engine, BaseQueryEngine):
            raise TypeError(
                f"query_engine must be a LlamaIndex BaseQueryEngine (e.g. "
                f"index.as_query_engine()), got {type(query_engine).__name__}"
            )
        if not isinstance(gate, Gate):
            raise TypeError(
                f"gate must follow rag_gates' Gate protocol (name, threshold, decide, "
                f"adecide, decide_batch), got {type(gate).__name__}"
            )
        if llm is not None and not isinstance(llm, LLM):
            raise TypeError(f"llm must be a LlamaIndex LLM, got {type(llm).__name__}")
        if direct_prompt is not None and not isinstance(direct_prompt, BasePromptTemplate):
            raise TypeError(
                f"direct_prompt must be a LlamaIndex prompt template (PromptTemplate), got "
                f"{type(direct_prompt).__name__}"
            )
        if not isinstance(annotation_key, str) or not annotation_key:
            raise ValueError(f"annotation_key must be a non-empty string, got {annotation_key!r}")
        super().__init__(callback_manager=callback_manager)
        self.query_engine = query_engine
        self.gate = gate
        self.llm: LLM = llm or Settings.llm
        self.direct_prompt: BasePromptTemplate = direct_prompt or DEFAULT_DIRECT_PROMPT
        self.annotation_key = annotation_key
        self.last_decision: GateDecision | None = None
        """The most recent decision (per instance; read events when queries run concurrently)."""

    # ------------------------------------------------------------------ prompts
    def _get_prompts(self) -> dict[str, Any]:
        return {"direct_prompt": self.direct_prompt}

    def _update_prompts(self, prompts: PromptDictType) -> None:
        if "direct_prompt" in prompts:
            self.direct_prompt = prompts["direct_prompt"]

    def _get_prompt_modules(self) -> PromptMixinType:
        return {"query_engine": self.query_engine}

    # ------------------------------------------------------------------ helpers
    def _record(self, query_bundle: QueryBundle, decision: Any) -> dict[str, JsonValue]:
        data = emit_decision(self.gate, query_bundle.query_str, decision)
        self.last_decision = decision
        return data

    def _annotated(self, response: RESPONSE_TYPE, data: dict[str, JsonValue]) -> RESPONSE_TYPE:
        response.source_nodes = [
            annotate_node(n, key=self.annotation_key, value=data) for n in response.source_nodes
        ]
        response.metadata = {**(response.metadata or {}), self.annotation_key: data}
        return response

    def _direct(self, text: str, data: dict[str, JsonValue]) -> Response:
        return Response(response=text, source_nodes=[], metadata={self.annotation_key: data})

    # ------------------------------------------------------------------ query
    def _query(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        data = self._record(query_bundle, self.gate.decide(query_bundle.query_str))
        if data["retrieve"]:
            return self._annotated(self.query_engine.query(query_bundle), data)
        text = self.llm.predict(self.direct_prompt, query_str=query_bundle.query_str)
        return self._direct(text, data)

    async def _aquery(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        decision = await self.gate.adecide(query_bundle.query_str)
        data = self._record(query_bundle, decision)
        if data["retrieve"]:
            return self._annotated(await self.query_engine.aquery(query_bundle), data)
        text = await self.llm.apredict(self.direct_prompt, query_str=query_bundle.query_str)
        return self._direct(text, data)
