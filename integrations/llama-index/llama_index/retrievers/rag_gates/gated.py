"""``GatedRetriever``: any LlamaIndex retriever behind any rag-gates gate.

The gate decides, per query, whether retrieval is worth it. When it says no, the wrapped
retriever is not called and no nodes come back (the LLM answers from its own knowledge);
when it says yes, the wrapped retriever's nodes come back as annotated copies. Every
decision is dispatched as a :class:`GateDecisionEvent` through LlamaIndex instrumentation.
"""

from __future__ import annotations

import inspect
from typing import Any

import llama_index.core.instrumentation as instrument
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager
from llama_index.core.instrumentation.events.base import BaseEvent
from llama_index.core.schema import NodeWithScore, QueryBundle
from llama_index.retrievers.rag_gates.convert import ANNOTATION_KEY, annotate_node
from pydantic import Field, JsonValue

from rag_gates.gate import Gate
from rag_gates.gated import (
    GateErrorPolicy,
    adecide,
    agated_retrieve,
    annotation,
    check_decision,
    check_gate,
    check_gate_error_policy,
    decide,
    gated_retrieve,
)
from rag_gates.types import GateDecision

__all__ = ["GateDecisionEvent", "GatedRetriever"]

dispatcher = instrument.get_dispatcher(__name__)


class GateDecisionEvent(BaseEvent):
    """A rag-gates gate decided whether to retrieve for a query.

    Dispatched by :class:`GatedRetriever` inside its retrieval span, before the wrapped
    retriever runs (or instead of it). ``decision`` is
    ``GateDecision.model_dump(mode="json")``; rebuild the model with
    :meth:`gate_decision`.
    """

    query_str: str = Field(..., description="The query the gate decided on.")
    retrieve: bool = Field(..., description="True when the gate asked for retrieval.")
    decision: dict[str, JsonValue] = Field(
        ...,
        description=(
            "The full decision as JSON: gate, retrieve, score, threshold, reason, evidence, "
            "latency_ms."
        ),
    )

    @classmethod
    def class_name(cls) -> str:
        """Class name."""
        return "GateDecisionEvent"

    def gate_decision(self) -> GateDecision:
        """The decision as a rag-gates :class:`~rag_gates.types.GateDecision`."""
        return GateDecision.model_validate(self.decision)


def emit_decision(gate: Any, query_str: str, decision: Any) -> dict[str, JsonValue]:
    """Check that ``gate`` returned a GateDecision, send it as a :class:`GateDecisionEvent`
    through LlamaIndex's instrumentation, and return it as JSON (the node annotation)."""
    data = annotation(check_decision(gate, decision))
    dispatcher.event(GateDecisionEvent(query_str=query_str, retrieve=decision.retrieve,
                                       decision=data))
    return data


class GatedRetriever(BaseRetriever):
    """Wrap any LlamaIndex retriever so it only retrieves when a rag-gates gate says so.

    For each query the gate decides on ``query_bundle.query_str`` (``gate.decide``, or
    ``gate.adecide`` on the async path):

    * no retrieval: the wrapped retriever is not called and the result is ``[]``, so a
      ``RetrieverQueryEngine`` answers without context;
    * retrieval: the wrapped retriever's nodes come back as copies with
      ``metadata[annotation_key] = decision.model_dump(mode="json")`` (the key is excluded
      from LLM and embedding metadata, so it never reaches a prompt). The wrapped
      retriever's nodes are never modified.

    Each decision is dispatched as a :class:`GateDecisionEvent` (see
    ``llama_index.core.instrumentation``) and kept in :attr:`last_decision`.

    In a ``RetrieverQueryEngine``, a "no" leaves the response synthesizer without nodes,
    and LlamaIndex's synthesizers then return their empty response ("Empty Response")
    without calling the LLM; ``response.source_nodes`` is ``[]``.

    Args:
        retriever (BaseRetriever): The LlamaIndex retriever to gate (a vector index's
            ``as_retriever()``, BM25, a fusion retriever, ...).
        gate (Gate): Any rag-gates gate (``rag_gates.gate.Gate``): ``decide(query)`` and
            ``adecide(query)`` returning a ``GateDecision``.
        annotation_key (str): Node metadata key for the decision. Defaults to
            ``"rag_gates"``.
        on_gate_error (str): when ``gate.decide`` raises (a prompt too long for the gate's
            model, a served model's timeout): ``"raise"`` (default: the query fails with
            the gate's error) or ``"retrieve"`` (fail closed: retrieve, the decision's
            reason and ``evidence["error"]`` name the error, and a warning is logged).
            ``gated_retriever_tool`` uses ``"retrieve"`` for its calls, since an agent
            turns a tool's exception into a message and answers without the documents.
        callback_manager (CallbackManager | None): LlamaIndex callback manager.

    Example:
        >>> from llama_index.core import VectorStoreIndex
        >>> from llama_index.core.query_engine import RetrieverQueryEngine
        >>> from llama_index.retrievers.rag_gates import GatedRetriever
        >>> index = VectorStoreIndex.from_documents(documents)
        >>> retriever = GatedRetriever(index.as_retriever(similarity_top_k=3), gate=my_gate)
        >>> engine = RetrieverQueryEngine.from_args(retriever=retriever, llm=llm)
        >>> response = engine.query("Were Scott Derrickson and Ed Wood of the same nationality?")
        >>> retriever.last_decision.reason
        >>> response.source_nodes[0].metadata["rag_gates"]["score"]
    """

    def __init__(
        self,
        retriever: BaseRetriever,
        gate: Gate,
        annotation_key: str = ANNOTATION_KEY,
        callback_manager: CallbackManager | None = None,
        on_gate_error: GateErrorPolicy = "raise",
        **kwargs: Any,
    ) -> None:
        if not isinstance(retriever, BaseRetriever):
            raise TypeError(
                f"retriever must be a LlamaIndex BaseRetriever (e.g. index.as_retriever()), "
                f"got {type(retriever).__name__}; for a rag-gates Retriever wrap it in "
                "PassageRetriever first"
            )
        check_gate(gate)
        if not isinstance(annotation_key, str) or not annotation_key:
            raise ValueError(f"annotation_key must be a non-empty string, got {annotation_key!r}")
        policy = check_gate_error_policy(on_gate_error)
        unknown = sorted(set(kwargs) - set(inspect.signature(BaseRetriever.__init__).parameters))
        if unknown:
            raise TypeError(
                f"GatedRetriever got unexpected keyword argument(s) {', '.join(unknown)}; how "
                "many nodes come back is the wrapped retriever's setting: "
                "index.as_retriever(similarity_top_k=5)")
        super().__init__(callback_manager=callback_manager, **kwargs)
        self.on_gate_error: GateErrorPolicy = policy
        self.retriever = retriever
        self.gate = gate
        self.annotation_key = annotation_key
        self.last_decision: GateDecision | None = None
        """The most recent decision (per instance; read events when queries run concurrently)."""

    def _record(self, query_bundle: QueryBundle, decision: GateDecision) -> dict[str, JsonValue]:
        data = emit_decision(self.gate, query_bundle.query_str, decision)
        self.last_decision = decision
        return data

    def _annotated(
        self, nodes: list[NodeWithScore], data: dict[str, JsonValue]
    ) -> list[NodeWithScore]:
        return [annotate_node(n, key=self.annotation_key, value=data) for n in nodes]

    def _skipped(self, query_bundle: QueryBundle, decision: GateDecision,
                 data: dict[str, JsonValue]) -> list[NodeWithScore] | GateDecision:
        """The nodes when the gate says no: none. Subclasses may answer otherwise, or
        return a decision to retrieve instead (it is recorded, and the retrieval runs)."""
        return []

    async def _askipped(self, query_bundle: QueryBundle, decision: GateDecision,
                        data: dict[str, JsonValue]) -> list[NodeWithScore] | GateDecision:
        return self._skipped(query_bundle, decision, data)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return gated_retrieve(
            decide(self.gate, query_bundle.query_str, self.on_gate_error),
            record=lambda decision: self._record(query_bundle, decision),
            skipped=lambda decision, data: self._skipped(query_bundle, decision, data),
            retrieve=lambda: self.retriever.retrieve(query_bundle),
            annotate=self._annotated)

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        async def record(decision: GateDecision) -> dict[str, JsonValue]:
            return self._record(query_bundle, decision)

        return await agated_retrieve(
            await adecide(self.gate, query_bundle.query_str, self.on_gate_error),
            record=record,
            skipped=lambda decision, data: self._askipped(query_bundle, decision, data),
            retrieve=lambda: self.retriever.aretrieve(query_bundle),
            annotate=self._annotated)
