"""``ConfidenceGainReranker``: a rag-gates reranker (CBDR's confidence gain, or a
cross-encoder fine-tuned on it) as a LlamaIndex node postprocessor."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import llama_index.core.instrumentation as instrument
from llama_index.core.callbacks import CallbackManager, CBEventType, EventPayload
from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle
from llama_index.retrievers.rag_gates.convert import annotate_node, nodes_to_passages
from pydantic import ConfigDict, Field, PrivateAttr, field_validator

from rag_gates.cbdr.factories import RerankerFactories
from rag_gates.rerank import (
    PassageReranker,
    RerankResult,
    check_query,
    check_reranker,
    check_result,
    check_top_n,
)

__all__ = ["RERANK_KEY", "RETRIEVAL_SCORE_KEY", "ConfidenceGainReranker"]

dispatcher = instrument.get_dispatcher(__name__)

RERANK_KEY = "rag_gates_rerank"
"""Node metadata key of the reranker's annotation (excluded from prompts and embeddings)."""
RETRIEVAL_SCORE_KEY = "retrieval_score"
"""Node metadata key of the retrieval score when ``keep_retrieval_score`` is set (the key
LlamaIndex's ``SentenceTransformerRerank`` uses)."""


class ConfidenceGainReranker(RerankerFactories, BaseNodePostprocessor):
    """Rerank nodes by how much each one raises the model's confidence (CBDR), or with any
    other rag-gates reranker.

    The nodes become rag-gates passages (:func:`~llama_index.retrievers.rag_gates.
    node_to_passage`: node id, text without metadata, title), the wrapped reranker orders
    them, and the best ``top_n`` come back best first as **copies** of the caller's nodes:

    * ``score``: the reranker's score (for :meth:`from_probe`, ``Inc(q, c) = Conf(q + c) -
      Conf(q)``, the probe's confidence with the passage minus without it);
    * ``metadata["rag_gates_rerank"]``: ``{"reranker", "rank" (1 = best), "score",
      "candidates", "evidence"}`` where ``evidence`` is what the reranker measured for
      that passage (CBDR: ``confidence`` with it, ``truncated_tokens``) plus
      ``"retrieval_score"`` when ``keep_retrieval_score``. The key is excluded from LLM and
      embedding metadata, so it never reaches a prompt.

    With ``keep_retrieval_score`` the node's retrieval score is also kept in
    ``metadata["retrieval_score"]`` (as LlamaIndex's ``SentenceTransformerRerank`` does;
    here excluded from prompts too). The input nodes and their metadata are never modified.

    Each call emits LlamaIndex's ``ReRankStartEvent`` / ``ReRankEndEvent`` through the
    instrumentation dispatcher (inside the postprocessor's span) and a
    ``CBEventType.RERANKING`` event through the callback manager, as the built-in
    rerankers do. The whole result (with the call's evidence, e.g. CBDR's
    ``question_confidence`` and how many passages were cut) is kept in
    :attr:`last_result`.

    Setup:
        ```bash
        pip install -c constraints.txt -e ".[hf,qdrant]" -e integrations/llama-index
        ```

    Args:
        reranker (PassageReranker): any rag-gates reranker (``rag_gates.rerank``):
            :class:`rag_gates.cbdr.ConfidenceGainReranker`,
            :class:`rag_gates.cbdr.CrossEncoderReranker` or your own ``BaseReranker``.
        top_n (int | None): nodes to keep, best first; ``None`` keeps all, reordered.
        keep_retrieval_score (bool): keep each node's retrieval score in its metadata.
        callback_manager (CallbackManager | None): LlamaIndex callback manager (a
            ``RetrieverQueryEngine`` sets its own on its postprocessors).

    Instantiate:
        ```python
        from llama_index.postprocessor.rag_gates import ConfidenceGainReranker
        from rag_gates.cbdr import load_default_probe
        from rag_gates.lm import load_default_lm

        lm = load_default_lm()  # the embedded SmolLM2; the probe must be trained on it
        reranker = ConfidenceGainReranker.from_probe(lm, load_default_probe(lm), top_n=3)
        # or, without the LLM: a cross-encoder fine-tuned on CBDR preferences
        reranker = ConfidenceGainReranker.from_cross_encoder("rerankers/smollm2-cbdr")
        ```

    Invoke:
        ```python
        engine = index.as_query_engine(llm=llm, similarity_top_k=10,
                                       node_postprocessors=[reranker])
        response = engine.query("Were Scott Derrickson and Ed Wood of the same nationality?")
        [(n.node.metadata["title"], n.score) for n in response.source_nodes]  # score = Inc
        reranker.last_result.evidence["question_confidence"]                   # Conf(q)

        nodes = reranker.postprocess_nodes(retrieved_nodes, query_str=question)
        ```

    Async:
        ```python
        nodes = await reranker.apostprocess_nodes(retrieved_nodes, query_str=question)
        response = await engine.aquery(question)
        ```
    """

    # A misspelt option (top_k=2) is refused, not dropped (the base class ignores extras).
    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    top_n: int | None = Field(
        default=3,
        description="Number of nodes to return, best first; None = all of them, reordered.",
    )
    keep_retrieval_score: bool = Field(
        default=False,
        description=(
            "Keep each node's retrieval score in its metadata (under 'retrieval_score', and "
            "in the 'rag_gates_rerank' annotation)."
        ),
    )

    _reranker: Any = PrivateAttr()
    _last_result: RerankResult | None = PrivateAttr(default=None)

    def __init__(
        self,
        reranker: PassageReranker,
        top_n: int | None = 3,
        keep_retrieval_score: bool = False,
        callback_manager: CallbackManager | None = None,
        **kwargs: Any,
    ) -> None:
        check_reranker(reranker)
        if callback_manager is not None:
            kwargs["callback_manager"] = callback_manager
        super().__init__(top_n=top_n, keep_retrieval_score=keep_retrieval_score, **kwargs)
        self._reranker = reranker

    @field_validator("top_n", mode="before")
    @classmethod
    def _check_top_n(cls, value: Any) -> int | None:
        return check_top_n(value)

    @classmethod
    def class_name(cls) -> str:
        """Class name."""
        return "RagGatesConfidenceGainReranker"

    @property
    def reranker(self) -> PassageReranker:
        """The wrapped rag-gates reranker."""
        reranker: PassageReranker = self._reranker
        return reranker

    @property
    def last_result(self) -> RerankResult | None:
        """The most recent :class:`~rag_gates.rerank.RerankResult` of this instance (per call
        under concurrency: the nodes' annotations)."""
        return self._last_result

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _query(query_bundle: QueryBundle | None) -> str:
        if query_bundle is None:
            raise ValueError(
                "ConfidenceGainReranker needs the query: call postprocess_nodes(nodes, "
                "query_str=...) or postprocess_nodes(nodes, query_bundle=QueryBundle(...)); "
                "query engines pass it themselves"
            )
        # Checked before the empty-nodes shortcut: a bad query is the caller's bug either way.
        return check_query(query_bundle.query_str)

    def _start(self, nodes: list[NodeWithScore], query_bundle: QueryBundle) -> dict[str, Any]:
        top_n = len(nodes) if self.top_n is None else self.top_n
        dispatcher.event(ReRankStartEvent(query=query_bundle, nodes=nodes, top_n=top_n,
                                          model_name=self.reranker.name))
        return {
            EventPayload.NODES: nodes,
            EventPayload.MODEL_NAME: self.reranker.name,
            EventPayload.QUERY_STR: query_bundle.query_str,
            EventPayload.TOP_K: top_n,
        }

    def _reranked(self, nodes: list[NodeWithScore], result: Any) -> list[NodeWithScore]:
        self._last_result = result = check_result(result, self.reranker)
        out: list[NodeWithScore] = []
        for scored, annotation in result.annotations():
            original = nodes[scored.index]
            if self.keep_retrieval_score:
                annotation[RETRIEVAL_SCORE_KEY] = original.score
            # A fresh copy of the node: its metadata and excluded keys are its own.
            node = annotate_node(original, key=RERANK_KEY, value=annotation).node
            if self.keep_retrieval_score:
                node.metadata[RETRIEVAL_SCORE_KEY] = original.score
                for keys in (node.excluded_llm_metadata_keys, node.excluded_embed_metadata_keys):
                    if RETRIEVAL_SCORE_KEY not in keys:
                        keys.append(RETRIEVAL_SCORE_KEY)
            out.append(NodeWithScore(node=node, score=scored.score))
        return out

    # ------------------------------------------------------------------ postprocess
    @contextmanager
    def _reranking(self, nodes: list[NodeWithScore], query_bundle: QueryBundle
                   ) -> Iterator[Callable[[Any], list[NodeWithScore]]]:
        """Start/end events around one rerank; yields ``finish(result) -> copied nodes``
        (the sync and async paths differ only in how they call the reranker)."""
        payload = self._start(nodes, query_bundle)
        reranked: list[NodeWithScore] = []
        with self.callback_manager.event(CBEventType.RERANKING, payload=payload) as event:

            def finish(result: Any) -> list[NodeWithScore]:
                reranked.extend(self._reranked(nodes, result))
                event.on_end(payload={EventPayload.NODES: reranked})
                return reranked

            yield finish
        dispatcher.event(ReRankEndEvent(nodes=reranked))

    def _postprocess_nodes(
        self,
        nodes: list[NodeWithScore],
        query_bundle: QueryBundle | None = None,
    ) -> list[NodeWithScore]:
        query = self._query(query_bundle)
        if not nodes:
            return []
        assert query_bundle is not None  # checked by _query
        with self._reranking(nodes, query_bundle) as finish:
            return finish(self.reranker.rerank(query, nodes_to_passages(nodes),
                                               top_n=self.top_n))

    @dispatcher.span
    async def _apostprocess_nodes(
        self,
        nodes: list[NodeWithScore],
        query_bundle: QueryBundle | None = None,
    ) -> list[NodeWithScore]:
        query = self._query(query_bundle)
        if not nodes:
            return []
        assert query_bundle is not None  # checked by _query
        with self._reranking(nodes, query_bundle) as finish:
            return finish(await self.reranker.arerank(query, nodes_to_passages(nodes),
                                                      top_n=self.top_n))
