"""``ConfidenceGainReranker``: a rag-gates reranker (CBDR's confidence gain, or a
cross-encoder fine-tuned on it) as a LangChain document compressor."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import (
    BaseCallbackManager,
    Callbacks,
    adispatch_custom_event,
    dispatch_custom_event,
)
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.runnables import RunnableConfig
from pydantic import ConfigDict, Field, JsonValue, PrivateAttr, field_validator

from langchain_rag_gates.documents import annotate_document, documents_to_passages
from rag_gates.cbdr.factories import RerankerFactories
from rag_gates.rerank import (
    RerankResult,
    check_query,
    check_reranker,
    check_result,
    check_top_n,
)

__all__ = ["ConfidenceGainReranker"]

RERANK_KEY = "rag_gates_rerank"
"""Document metadata key of the reranker's annotation, and name of the custom event."""
RERANK_EVENT = RERANK_KEY
SCORE_KEY = "relevance_score"
"""Document metadata key of the reranker's score (the key LangChain's rerankers write)."""


def _event_data(result: RerankResult, documents: Sequence[Document]) -> dict[str, JsonValue]:
    """What the custom event carries: the call's evidence and each kept document's score."""
    return {
        "reranker": result.reranker,
        "query": result.query,
        "candidates": result.candidates,
        "ranked": [
            {"index": s.index, "id": documents[s.index].id, "score": s.score,
             "evidence": dict(s.evidence)}
            for s in result.ranked
        ],
        "evidence": dict(result.evidence),
        "latency_ms": result.latency_ms,
    }


def _event_config(callbacks: Callbacks | None) -> RunnableConfig | None:
    """Where to send the custom event: only inside a run (a callback manager with a parent
    run, as ``ContextualCompressionRetriever`` passes), since LangChain's custom events
    belong to a run."""
    if isinstance(callbacks, BaseCallbackManager) and callbacks.parent_run_id is not None:
        return RunnableConfig(callbacks=callbacks)
    return None


class ConfidenceGainReranker(RerankerFactories, BaseDocumentCompressor):
    """Rerank documents by how much each one raises the model's confidence (CBDR), or with
    any other rag-gates reranker.

    The documents become rag-gates passages
    (:func:`~langchain_rag_gates.document_to_passage`), the wrapped reranker orders them,
    and the best ``top_n`` come back best first as **new** ``Document`` objects: the
    metadata is copied, then annotated with

    - ``"relevance_score"``: the reranker's score (for :meth:`from_probe`,
      ``Inc(q, c) = Conf(q + c) - Conf(q)``, the probe's confidence with the passage minus
      without it);
    - ``"rag_gates_rerank"``: ``{"reranker", "rank" (1 = best), "score", "candidates",
      "evidence"}`` where ``evidence`` is what the reranker measured for that document
      (CBDR: ``confidence`` with it, ``truncated_tokens``).

    The caller's documents are never modified. Inside a run (as in a
    ``ContextualCompressionRetriever``), each call is also reported to the callback
    handlers as the custom event ``"rag_gates_rerank"`` (the call's evidence, such as CBDR's
    ``question_confidence``, and each kept document's index, id, score and evidence); the
    whole result is kept in :attr:`last_result`.

    Setup:
        ```bash
        pip install -c constraints.txt -e ".[hf,qdrant]" -e integrations/langchain langchain-classic
        ```

    Key init args:
        reranker: rag_gates.rerank.PassageReranker
            Any rag-gates reranker: ``rag_gates.cbdr.ConfidenceGainReranker`` (zero-shot,
            runs the LLM), ``rag_gates.cbdr.CrossEncoderReranker`` (a cross-encoder
            fine-tuned on CBDR preferences, no LLM) or your own ``BaseReranker``.
        top_n: int | None
            Number of documents to return, best first (default 3); ``None`` = all,
            reordered.

    Instantiate:
        ```python
        from langchain_rag_gates import ConfidenceGainReranker
        from rag_gates.cbdr import load_default_probe
        from rag_gates.lm import load_default_lm

        lm = load_default_lm()  # the embedded SmolLM2; the probe must be trained on it
        compressor = ConfidenceGainReranker.from_probe(lm, load_default_probe(lm), top_n=3)
        # or, without the LLM: a cross-encoder fine-tuned on CBDR preferences
        compressor = ConfidenceGainReranker.from_cross_encoder("rerankers/smollm2-cbdr")
        ```

    Invoke:
        ```python
        docs = compressor.compress_documents(documents, "Who directed Ed Wood?")
        docs[0].metadata["relevance_score"]                  # Inc
        docs[0].metadata["rag_gates_rerank"]["evidence"]     # {'confidence': ..., ...}
        compressor.last_result.evidence["question_confidence"]
        ```

    Use within a ContextualCompressionRetriever:
        ```python
        from langchain_classic.retrievers import ContextualCompressionRetriever

        retriever = ContextualCompressionRetriever(
            base_compressor=compressor, base_retriever=store.as_retriever(search_kwargs={"k": 10})
        )
        docs = retriever.invoke("Were Scott Derrickson and Ed Wood of the same nationality?")
        ```

    Async:
        ```python
        docs = await compressor.acompress_documents(documents, "Who directed Ed Wood?")
        docs = await retriever.ainvoke(question)
        ```
    """

    reranker: Any = Field(
        ...,
        exclude=True,
        description=(
            "Any rag-gates reranker (rag_gates.rerank.PassageReranker): the CBDR "
            "confidence-gain reranker, a cross-encoder, or your own."
        ),
    )
    top_n: int | None = Field(
        3, description="Number of documents to return, best first; None = all, reordered."
    )

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    _last_result: RerankResult | None = PrivateAttr(None)

    @field_validator("reranker")
    @classmethod
    def _check_reranker(cls, value: Any) -> Any:
        return check_reranker(value)

    @field_validator("top_n", mode="before")
    @classmethod
    def _check_top_n(cls, value: Any) -> int | None:
        return check_top_n(value)

    @property
    def last_result(self) -> RerankResult | None:
        """The most recent :class:`~rag_gates.rerank.RerankResult` of this instance (per
        call under concurrency: the documents' annotations or the custom events)."""
        return self._last_result

    def _reranked(self, documents: Sequence[Document], result: Any) -> list[Document]:
        self._last_result = result = check_result(result, self.reranker)
        out: list[Document] = []
        for scored, annotation in result.annotations():
            doc = annotate_document(documents[scored.index], annotation, key=RERANK_KEY)
            doc.metadata[SCORE_KEY] = scored.score  # the copy's own metadata
            out.append(doc)
        return out

    def compress_documents(
        self,
        documents: Sequence[Document],
        query: str,
        callbacks: Callbacks | None = None,
    ) -> Sequence[Document]:
        """The best ``top_n`` documents for ``query``, best first, as annotated copies."""
        documents = list(documents)
        check_query(query)  # a bad query is the caller's bug, also with nothing to rerank
        if not documents:
            return []
        result = self.reranker.rerank(query, documents_to_passages(documents),
                                      top_n=self.top_n)
        out = self._reranked(documents, result)
        config = _event_config(callbacks)
        if config is not None:
            dispatch_custom_event(RERANK_EVENT, _event_data(result, documents), config=config)
        return out

    async def acompress_documents(
        self,
        documents: Sequence[Document],
        query: str,
        callbacks: Callbacks | None = None,
    ) -> Sequence[Document]:
        """:meth:`compress_documents` through the reranker's ``arerank`` (a local model runs
        in a worker thread, so the event loop is never blocked)."""
        documents = list(documents)
        check_query(query)  # a bad query is the caller's bug, also with nothing to rerank
        if not documents:
            return []
        result = await self.reranker.arerank(query, documents_to_passages(documents),
                                             top_n=self.top_n)
        out = self._reranked(documents, result)
        config = _event_config(callbacks)
        if config is not None:
            await adispatch_custom_event(RERANK_EVENT, _event_data(result, documents),
                                         config=config)
        return out
