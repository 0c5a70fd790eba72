"""CBDR end to end: gate on the probe's confidence, then (if retrieving) rerank and answer.

1. One forward pass of the QA prompt gives ``Conf(q)``.
2. ``Conf(q) > beta``: the answer continues from that same pass (no retrieval, no second
   prefill).
3. Otherwise: retrieve ``candidates`` passages, rerank them (confidence gain by default,
   reusing ``Conf(q)``; or any :class:`~rag_gates.rerank.PassageReranker`, e.g. a fine-tuned
   cross-encoder), and answer from the top ``k`` with the probe's RAG prompt.

Every step is in the :class:`~rag_gates.types.Trace`.

Example:
    >>> pipe = CBDRPipeline(lm, bm25, ConfidenceProbe.load("probe/", lm=lm), beta=0.9)
    >>> result = pipe.answer("Who wrote Hamlet?")
    >>> result.answer, result.trace.decisions()[0].evidence["confidence"]
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from rag_gates.cbdr.gate import CBDRGate
from rag_gates.cbdr.probe import ConfidenceProbe
from rag_gates.cbdr.rerank import ConfidenceGainReranker
from rag_gates.rerank import PassageReranker
from rag_gates.retrieval.base import Retriever
from rag_gates.retrieval.recorded import retrieve_recorded
from rag_gates.types import PipelineResult, TraceRecorder

__all__ = ["CBDRPipeline"]


class CBDRPipeline:
    """Confidence-gated retrieval with confidence-gain reranking (the CBDR paper's system).

    Args:
        lm: the white-box model the probe was trained on.
        retriever: any rag_gates Retriever (adapters wrap LlamaIndex and LangChain ones).
        probe: the trained :class:`ConfidenceProbe`.
        beta: skip retrieval when ``Conf(q) > beta`` (None: the probe's calibrated beta).
        candidates: passages retrieved for reranking.
        k: passages given to the model after reranking.
        reranker: default :class:`ConfidenceGainReranker` on the same model and probe.
        max_new_tokens: answer budget.
    """

    def __init__(self, lm: Any, retriever: Retriever, probe: ConfidenceProbe, *,
                 beta: float | None = None, candidates: int = 10, k: int = 3,
                 reranker: PassageReranker | None = None, max_new_tokens: int = 128,
                 name: str = "cbdr") -> None:
        if not isinstance(retriever, Retriever):
            raise TypeError(f"retriever must follow rag_gates' Retriever protocol, got "
                            f"{type(retriever).__name__}")
        if candidates < 1 or k < 1:
            raise ValueError(f"candidates and k must be >= 1, got {candidates} and {k}")
        if k > candidates:
            raise ValueError(f"k={k} passages cannot come from {candidates} candidates")
        self.gate = CBDRGate(lm, probe, beta)
        self.lm = self.gate.lm
        self.probe = probe
        self.retriever = retriever
        self.reranker: PassageReranker = reranker or ConfidenceGainReranker(lm, probe)
        self.candidates = candidates
        self.k = k
        self.max_new_tokens = max_new_tokens
        self.name = name

    def answer(self, question: str) -> PipelineResult:
        """Answer one question; the trace holds the decision, retrieval, rerank and calls."""
        rec = TraceRecorder()
        probed = self.gate.prefill(question, max_new_tokens=self.max_new_tokens)
        rec.add_decision(probed.decision)
        if not probed.decision.retrieve:
            with rec.timed("llm_call", "answer-closed-book") as data:
                g = probed.generate(max_new_tokens=self.max_new_tokens)
                data["tokens"] = g.completion_tokens
                data["finish_reason"] = g.finish_reason
            return PipelineResult(answer=g.text, trace=rec.trace())
        pool = retrieve_recorded(rec, self.retriever, question, self.candidates)
        # The zero-shot reranker runs the LLM; a cross-encoder does not.
        kind: Literal["llm_call", "note"] = (
            "llm_call" if isinstance(self.reranker, ConfidenceGainReranker) else "note")
        with rec.timed(kind, f"rerank-{self.reranker.name}") as data:
            ranked = self.reranker.rerank(question, pool, top_n=self.k,
                                          question_confidence=probed.confidence)
            data["candidates"] = ranked.candidates
            data["kept_ids"] = [s.passage.id for s in ranked.ranked]
            data["scores"] = [s.score for s in ranked.ranked]
            data["truncated"] = ranked.evidence.get("truncated", 0)
        passages = ranked.passages
        with rec.timed("llm_call", "answer-with-passages") as data:
            g = self.lm.generate(self.probe.prompts.rag(question, passages),
                                 max_new_tokens=self.max_new_tokens)
            data["tokens"] = g.completion_tokens
            data["finish_reason"] = g.finish_reason
        return PipelineResult(answer=g.text, trace=rec.trace(), passages=passages)

    async def aanswer(self, question: str) -> PipelineResult:
        """:meth:`answer` in a worker thread."""
        return await asyncio.to_thread(self.answer, question)
