"""``DeepRAGQueryEngine``: DeepRAG's step-by-step loop as a LlamaIndex query engine, on any
LlamaIndex LLM and any LlamaIndex retriever, each step dispatched as an event."""

from __future__ import annotations

from typing import Any

import llama_index.core.instrumentation as instrument
from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.base_retriever import BaseRetriever as LlamaIndexBaseRetriever
from llama_index.core.base.response.schema import RESPONSE_TYPE, Response
from llama_index.core.callbacks import CallbackManager
from llama_index.core.instrumentation.events.base import BaseEvent
from llama_index.core.llms import LLM
from llama_index.core.prompts.mixin import PromptMixinType
from llama_index.core.schema import QueryBundle
from llama_index.query_engine.rag_gates._inputs import rag_gates_retriever, rag_gates_text_lm
from llama_index.retrievers.rag_gates.convert import passages_to_nodes
from pydantic import Field, JsonValue

from rag_gates.deeprag import DeepRAG, DeepRAGConfig, DeepRAGResult, Step
from rag_gates.gate import Gate
from rag_gates.lm.base import TextLM
from rag_gates.retrieval.base import Retriever

__all__ = ["DeepRAGQueryEngine", "DeepRAGStepEvent", "deeprag_metadata", "step_json"]

dispatcher = instrument.get_dispatcher(__name__)


def step_json(index: int, step: Step) -> dict[str, JsonValue]:
    """One step as JSON: subquery, decision, the retrieved passages' ids (None when answered
    directly), the intermediate answer and the step's text."""
    return {
        "index": index,
        "subquery": step.subquery,
        "decision": step.decision.model_dump(mode="json"),
        "passage_ids": None if step.passages is None else [p.id for p in step.passages],
        "answer": step.answer,
        "text": step.render(),
    }


def deeprag_metadata(result: DeepRAGResult) -> dict[str, Any]:
    """The JSON-ready response metadata of a DeepRAG run (see :class:`DeepRAGQueryEngine`)."""
    t = result.trajectory
    return {
        "trajectory": t.render(),
        "steps": [step_json(i, s) for i, s in enumerate(t.steps)],
        "stop_reason": t.stop_reason,
        "malformed": [m.model_dump(mode="json") for m in t.malformed],
        "trace": result.trace.model_dump(mode="json"),
    }


class DeepRAGStepEvent(BaseEvent):
    """DeepRAG took a step: a subquery, its retrieve-or-answer decision and its answer.

    Dispatched by :class:`DeepRAGQueryEngine` as each step is taken (before the next one).
    """

    query_str: str = Field(..., description="The question being answered.")
    step: dict[str, JsonValue] = Field(..., description="The step, as :func:`step_json`.")

    @classmethod
    def class_name(cls) -> str:
        return "DeepRAGStepEvent"


class DeepRAGQueryEngine(BaseQueryEngine):
    """DeepRAG (:class:`rag_gates.deeprag.DeepRAG`) with a LlamaIndex LLM and retriever.

    Each query: the model splits the question into subqueries one at a time, decides per
    subquery whether to retrieve (with the subquery) or answer from its own knowledge, and
    writes the final answer (the step cap forces it). The LLM goes through
    :func:`~llama_index.llms.rag_gates.as_text_lm` (the loop continues an assistant message:
    :class:`~llama_index.llms.rag_gates.RagGatesLLM` does; for an API LLM that starts a new
    turn instead, use ``prompt=DeepRAGPrompt(style="completion")``), the retriever through
    :class:`~llama_index.retrievers.rag_gates.LlamaIndexRetrieverAdapter`.

    The response:

    * ``response.response``: the final answer;
    * ``response.source_nodes``: every passage retrieved, as nodes;
    * ``response.metadata``: JSON-ready: ``"trajectory"`` (the run in DeepRAG's text
      format), ``"steps"`` (per step: subquery, decision as ``GateDecision`` JSON, the
      retrieved passages' ids or None, answer, text), ``"stop_reason"``, ``"malformed"`` and
      ``"trace"`` (every decision, retrieval and model call).

    Each step is dispatched as a :class:`DeepRAGStepEvent` as it is taken.

    Setup:
        ```bash
        pip install -c constraints.txt -e ".[hf,qdrant]" -e integrations/llama-index
        ```

    Args:
        llm (LLM | TextLM): a LlamaIndex LLM, or a rag-gates ``TextLM``.
        retriever (BaseRetriever | Retriever | None): a LlamaIndex retriever (its own
            ``similarity_top_k`` bounds what comes back) or a rag-gates ``Retriever``; None
            only with ``mode="never"``.
        gate (Gate | None): a rag-gates gate that decides per subquery (``mode="gate"``).
        config (DeepRAGConfig | None): loop settings; keyword ``overrides`` (``mode=``,
            ``threshold=``, ``k=``, ``max_steps=``) also work and are validated.
        callback_manager (CallbackManager | None): LlamaIndex callback manager.

    Instantiate:
        ```python
        from llama_index.core import VectorStoreIndex
        from llama_index.llms.rag_gates import RagGatesLLM
        from llama_index.query_engine.rag_gates import DeepRAGQueryEngine

        index = VectorStoreIndex.from_documents(documents, embed_model=embed_model)
        engine = DeepRAGQueryEngine(RagGatesLLM(), index.as_retriever(similarity_top_k=3),
                                    k=3, max_steps=6)
        ```

    Invoke:
        ```python
        response = engine.query("Who was the father of the director of Jaws?")
        str(response)
        print(response.metadata["trajectory"])
        [s["decision"]["retrieve"] for s in response.metadata["steps"]]
        ```

    Async:
        ```python
        response = await engine.aquery(question)
        ```
    """

    def __init__(
        self,
        llm: LLM | TextLM,
        retriever: LlamaIndexBaseRetriever | Retriever | None,
        config: DeepRAGConfig | None = None,
        *,
        gate: Gate | None = None,
        callback_manager: CallbackManager | None = None,
        **overrides: Any,
    ) -> None:
        lm = rag_gates_text_lm(llm)
        passages = rag_gates_retriever(retriever, optional=True)
        super().__init__(callback_manager=callback_manager)
        self.llm = llm
        self.retriever = retriever
        self.agent = DeepRAG(lm, passages, config, gate=gate, **overrides)

    @property
    def config(self) -> DeepRAGConfig:
        """The loop's settings."""
        return self.agent.config

    def _get_prompt_modules(self) -> PromptMixinType:
        return {}

    @staticmethod
    def _step_event(query_str: str, index: int, step: Step) -> None:
        dispatcher.event(DeepRAGStepEvent(query_str=query_str, step=step_json(index, step)))

    @staticmethod
    def _response(result: DeepRAGResult) -> Response:
        return Response(response=result.answer, source_nodes=passages_to_nodes(result.passages),
                        metadata=deeprag_metadata(result))

    def _query(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        index = 0
        for item in self.agent.stream(query_bundle.query_str):
            if isinstance(item, Step):
                self._step_event(query_bundle.query_str, index, item)
                index += 1
            else:
                return self._response(item)
        raise AssertionError("DeepRAG.stream ends with its result")  # pragma: no cover

    async def _aquery(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        index = 0
        async for item in self.agent.astream(query_bundle.query_str):
            if isinstance(item, Step):
                self._step_event(query_bundle.query_str, index, item)
                index += 1
            else:
                return self._response(item)
        raise AssertionError("DeepRAG.astream ends with its result")  # pragma: no cover
