"""``SelfRoutingRetriever``: SR-RAG's routing as a LlamaIndex retriever.

Per query, a gate (SR-RAG's :class:`~rag_gates.srrag.SelfRoutingGate`: ``p_M * p_D >= tau``)
routes either to the wrapped retriever or to the model's own knowledge: then the model writes
a background document (GenRead) and that one node comes back, marked
``metadata["source"] = "parametric"``. Any query engine gains SR-RAG's routing with one swap
of its retriever.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager
from llama_index.core.schema import NodeWithScore, QueryBundle
from llama_index.retrievers.rag_gates.convert import ANNOTATION_KEY, annotate_node, passage_to_node
from llama_index.retrievers.rag_gates.gated import GatedRetriever
from pydantic import JsonValue

from rag_gates.gate import Gate
from rag_gates.srrag.verbalizer import retrieve_instead, says_nothing, verbalizer_for
from rag_gates.types import GateDecision, Passage

__all__ = ["SelfRoutingRetriever"]


class SelfRoutingRetriever(GatedRetriever):
    """Retrieved nodes, or one node of the model's own verbalized knowledge.

    For each query the gate decides on ``query_bundle.query_str`` (``gate.decide``;
    ``gate.adecide`` on the async path):

    * retrieval: the wrapped retriever's nodes, as annotated copies (as
      :class:`GatedRetriever`);
    * no retrieval: the verbalizer writes the model's background document for the query and
      it comes back as one node with ``metadata["source"] = "parametric"``,
      ``metadata["hit_token_cap"]`` and the decision under ``metadata["rag_gates"]`` (all of
      its metadata excluded from LLM and embedding metadata: the prompt sees the text); an
      empty verbalization is nothing to answer from, so the wrapped retriever's nodes come
      back instead, under the overturned decision (``retrieve`` true,
      ``evidence["verbalization"] == "empty"``), dispatched as a second decision event.

    Each decision (with ``p_M``, ``p_D`` and the neighbours that voted in its evidence) is
    dispatched as a :class:`~llama_index.retrievers.rag_gates.GateDecisionEvent` and kept in
    :attr:`last_decision`. The wrapped retriever's nodes are never modified.

    Args:
        retriever (BaseRetriever): The LlamaIndex retriever to route to.
        gate (Gate): Usually a ``rag_gates.srrag.SelfRoutingGate``; any rag-gates gate routes
            the same way.
        verbalizer (Verbalizer | None): Writes the parametric node; default a
            ``rag_gates.srrag.Verbalizer`` on ``gate.lm``.
        annotation_key (str): Node metadata key for the decision. Defaults to ``"rag_gates"``.
        callback_manager (CallbackManager | None): LlamaIndex callback manager.

    Example:
        >>> from llama_index.core.query_engine import RetrieverQueryEngine
        >>> from llama_index.retrievers.rag_gates import SelfRoutingRetriever
        >>> from rag_gates.srrag import SelfRoutingGate, SourcePolicy
        >>> # read-only (the default): a private copy, so every worker process opens the folder
        >>> policy = SourcePolicy.open_existing(lm, path="~/.cache/rag-gates/srrag/policy")
        >>> retriever = SelfRoutingRetriever(index.as_retriever(similarity_top_k=3),
        ...                                  gate=SelfRoutingGate(lm, policy, tau=0.1))
        >>> engine = RetrieverQueryEngine.from_args(retriever=retriever, llm=llm)
        >>> response = engine.query("Who wrote Hamlet?")
        >>> response.source_nodes[0].metadata.get("source")   # 'parametric' when routed so
    """

    def __init__(
        self,
        retriever: BaseRetriever,
        gate: Gate,
        verbalizer: Any = None,
        annotation_key: str = ANNOTATION_KEY,
        callback_manager: CallbackManager | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(retriever, gate, annotation_key=annotation_key,
                         callback_manager=callback_manager, **kwargs)
        self.verbalizer = verbalizer_for(gate, verbalizer)

    def _node(self, passage: Passage, decision: GateDecision, data: dict[str, JsonValue]
              ) -> list[NodeWithScore] | GateDecision:
        # An empty verbalization is nothing to answer from: retrieve instead (fail closed).
        if says_nothing(passage):
            return retrieve_instead(decision)
        node = passage_to_node(passage)
        # The verbalizer's metadata (source, model id, tokens, finish reason, sampling) says
        # how the document was written, not what it says: keep it out of the LLM's prompt
        # and the embedding text (SRRAGPipeline answers from the text alone).
        node.node.excluded_llm_metadata_keys = list(passage.metadata)
        node.node.excluded_embed_metadata_keys = list(passage.metadata)
        return [annotate_node(node, key=self.annotation_key, value=data)]

    def _skipped(self, query_bundle: QueryBundle, decision: GateDecision,
                 data: dict[str, JsonValue]) -> list[NodeWithScore] | GateDecision:
        return self._node(self.verbalizer.verbalize(query_bundle.query_str), decision, data)

    async def _askipped(self, query_bundle: QueryBundle, decision: GateDecision,
                        data: dict[str, JsonValue]) -> list[NodeWithScore] | GateDecision:
        return self._node(await self.verbalizer.averbalize(query_bundle.query_str), decision,
                          data)
