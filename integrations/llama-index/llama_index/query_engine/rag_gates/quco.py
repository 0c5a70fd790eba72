"""``QuCoQueryEngine``: QuCo-RAG's dynamic generation loop as a LlamaIndex query engine, on
any LlamaIndex LLM and any LlamaIndex retriever."""

from __future__ import annotations

from typing import Any

import llama_index.core.instrumentation as instrument
from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.base_retriever import BaseRetriever as LlamaIndexBaseRetriever
from llama_index.core.base.response.schema import RESPONSE_TYPE, Response
from llama_index.core.callbacks import CallbackManager
from llama_index.core.llms import LLM
from llama_index.core.prompts.mixin import PromptMixinType
from llama_index.core.schema import QueryBundle
from llama_index.query_engine.rag_gates._inputs import rag_gates_retriever, rag_gates_text_lm
from llama_index.retrievers.rag_gates.convert import ANNOTATION_KEY, passages_to_nodes
from llama_index.retrievers.rag_gates.gated import GateDecisionEvent

from rag_gates.corpus.base import CorpusStats
from rag_gates.extract.base import Extractor
from rag_gates.lm.base import TextLM
from rag_gates.quco import QuCoConfig, QuCoPipeline, QuCoResult
from rag_gates.retrieval.base import Retriever

__all__ = ["QuCoQueryEngine", "quco_metadata"]

dispatcher = instrument.get_dispatcher(__name__)


def quco_metadata(result: QuCoResult, annotation_key: str = ANNOTATION_KEY) -> dict[str, Any]:
    """The JSON-ready response metadata of a QuCo run (see :class:`QuCoQueryEngine`)."""
    return {
        annotation_key: None if result.decision is None
        else result.decision.model_dump(mode="json"),
        "verifications": [v.summary() for v in result.verifications],
        "rounds": result.rounds,
        "stop_reason": result.stop_reason,
        "trace": result.trace.model_dump(mode="json"),
    }


class QuCoQueryEngine(BaseQueryEngine):
    """QuCo-RAG (:class:`rag_gates.quco.QuCoPipeline`) with a LlamaIndex LLM and retriever.

    Each query runs QuCo's loop: the pre-generation gate (rare question entities ->
    retrieve), chunked generation, claim verification against corpus co-occurrence, and
    re-retrieval for flagged claims (at most ``max_rounds`` times). The retriever goes through
    :class:`~llama_index.retrievers.rag_gates.LlamaIndexRetrieverAdapter` and the LLM through
    :func:`~llama_index.llms.rag_gates.as_text_lm` (``complete``/``acomplete``, so chat-only
    LLMs work through LlamaIndex's own completion-to-chat bridge).

    The response:

    * ``response.response``: the answer;
    * ``response.source_nodes``: every passage the loop used, as nodes (the wrapped
      retriever's node ids, texts, scores and metadata);
    * ``response.metadata``: JSON-ready: ``"rag_gates"`` the pre-check decision
      (``GateDecision.model_dump(mode="json")``, None with ``pre_check=False``),
      ``"verifications"`` one ``Verification.summary()`` per verified chunk (flagged claims,
      their counts, the queries run), ``"rounds"``, ``"stop_reason"`` and ``"trace"`` (every
      decision, retrieval, model call and verification, ``Trace.model_dump(mode="json")``).

    The pre-check decision is also dispatched as a
    :class:`~llama_index.retrievers.rag_gates.GateDecisionEvent`.

    Setup:
        ```bash
        pip install -c constraints.txt -e ".[hf,qdrant,corpus]" -e integrations/llama-index
        ```

    Args:
        llm (LLM | TextLM): a LlamaIndex LLM, or a rag-gates ``TextLM`` (e.g.
            ``as_text_lm(llm, call_kwargs=...)`` to pass token limits to an API model).
        retriever (BaseRetriever | Retriever): a LlamaIndex retriever (build it with
            ``similarity_top_k`` >= ``k``: its own top-k bounds what comes back) or a
            rag-gates ``Retriever``.
        stats (CorpusStats): corpus statistics for the gate and the verifier: a
            ``LocalInfiniGram`` over an index of your documents (``rag-gates index build
            docs/ --out indexes/docs``), or the hosted infini-gram API.
        extractor (Extractor | None): entity/claim extractor; default
            ``rag_gates.extract.default_extractor()``.
        config (QuCoConfig | None): QuCo settings; keyword ``overrides`` (``tau_entity=82``,
            ``k=3``, ``max_new_tokens=48``) also work and are validated.
        annotation_key (str): metadata key of the decision. Defaults to ``"rag_gates"``.
        callback_manager (CallbackManager | None): LlamaIndex callback manager.

    Instantiate:
        ```python
        from llama_index.core import VectorStoreIndex
        from llama_index.llms.rag_gates import RagGatesLLM
        from llama_index.query_engine.rag_gates import QuCoQueryEngine
        from rag_gates.corpus import LocalInfiniGram

        index = VectorStoreIndex.from_documents(documents, embed_model=embed_model)
        engine = QuCoQueryEngine(
            RagGatesLLM(),                                    # any LlamaIndex LLM
            index.as_retriever(similarity_top_k=3),
            LocalInfiniGram("indexes/docs"),  # rag-gates index build docs/ --out indexes/docs
            tau_entity=82,  # calibrate on your own labelled questions: rag-gates eval-gate
            k=3, max_new_tokens=48,
        )
        ```

    Invoke:
        ```python
        response = engine.query("Were Scott Derrickson and Ed Wood of the same nationality?")
        str(response)
        response.metadata["rag_gates"]["reason"]      # why the gate retrieved (or not)
        response.metadata["verifications"][0]["flagged"]
        [n.node.metadata["title"] for n in response.source_nodes]
        ```

    Async:
        ```python
        response = await engine.aquery(question)
        ```
    """

    def __init__(
        self,
        llm: LLM | TextLM,
        retriever: LlamaIndexBaseRetriever | Retriever,
        stats: CorpusStats,
        extractor: Extractor | None = None,
        config: QuCoConfig | None = None,
        annotation_key: str = ANNOTATION_KEY,
        callback_manager: CallbackManager | None = None,
        **overrides: Any,
    ) -> None:
        lm = rag_gates_text_lm(llm)
        passages = rag_gates_retriever(retriever)
        if not isinstance(annotation_key, str) or not annotation_key:
            raise ValueError(f"annotation_key must be a non-empty string, got {annotation_key!r}")
        super().__init__(callback_manager=callback_manager)
        self.llm = llm
        self.retriever = retriever
        self.pipeline = QuCoPipeline(lm, passages, stats, extractor, config, **overrides)
        self.annotation_key = annotation_key

    @property
    def config(self) -> QuCoConfig:
        """The pipeline's settings."""
        return self.pipeline.config

    def _get_prompt_modules(self) -> PromptMixinType:
        return {}

    def _response(self, query_bundle: QueryBundle, result: QuCoResult) -> Response:
        if result.decision is not None:
            dispatcher.event(
                GateDecisionEvent(
                    query_str=query_bundle.query_str,
                    retrieve=result.decision.retrieve,
                    decision=result.decision.model_dump(mode="json"),
                )
            )
        return Response(
            response=result.answer,
            source_nodes=passages_to_nodes(result.passages),
            metadata=quco_metadata(result, self.annotation_key),
        )

    def _query(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        return self._response(query_bundle, self.pipeline.run(query_bundle.query_str))

    async def _aquery(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        return self._response(query_bundle, await self.pipeline.arun(query_bundle.query_str))
