"""SR-RAG end to end: route, then retrieve and answer, or verbalize and answer.

1. The gate decides (:class:`~rag_gates.srrag.gate.SelfRoutingGate`: ``p_M * p_D >= tau``;
   any other :class:`~rag_gates.gate.Gate` works too, giving selective retrieval with
   verbalization instead of a cold closed-book answer).
2. Retrieve: the top ``k`` passages, then the answer from them.
3. Otherwise: the model writes its background document (:class:`Verbalizer`, the GenRead
   prompt, capped), then answers from that document with the same QA prompt. An empty
   document is nothing to answer from: the pipeline retrieves instead, and the trace holds
   the overturned decision (:func:`~rag_gates.srrag.verbalizer.retrieve_instead`).

``gate=None`` always verbalizes (GenRead). The answer prompt is
:func:`rag_gates.prompts.qa_prompt`, the one source labelling scores the gold answer under.
Every decision, retrieval and model call is in the :class:`~rag_gates.types.Trace`.

Example:
    >>> pipe = SRRAGPipeline(lm, bm25, SelfRoutingGate(lm, policy, tau=0.1))
    >>> result = pipe.answer("Who wrote Hamlet?")
    >>> result.answer, result.passages[0].metadata.get("source"), result.trace.retrievals
    ('William Shakespeare', 'parametric', 0)
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from rag_gates.gate import Gate
from rag_gates.lm.recorded import generate_recorded
from rag_gates.prompts import qa_prompt
from rag_gates.retrieval.base import Retriever
from rag_gates.retrieval.recorded import retrieve_recorded
from rag_gates.srrag.verbalizer import Verbalizer, retrieve_instead, says_nothing
from rag_gates.types import Passage, PipelineResult, TraceRecorder

__all__ = ["SRRAGPipeline", "answer_prompt", "verbalize_recorded"]


def answer_prompt(question: str, passages: Sequence[Passage], dataset: str | None = None
                  ) -> str:
    """The answer prompt after retrieval or verbalization: the benchmark's QA prompt over
    ``passages`` (a verbalization is one untitled passage, so it reads ``- text``)."""
    return qa_prompt(question, passages, dataset=dataset)


def verbalize_recorded(rec: TraceRecorder, verbalizer: Verbalizer, question: str) -> Passage:
    """Verbalize and record the call (tokens, whether it hit the token cap) in the trace.

    A verbalization the verbalizer reused (``Verbalizer(reuse=N)``) is recorded with
    ``reused`` and the first call's time as ``reused_ms`` (:attr:`Trace.reused_ms`): its
    tokens are counted as if generated here, so each method's cost reads as if run alone.
    """
    with rec.timed("llm_call", "verbalize") as data:
        passage = verbalizer.verbalize(question)
        data["tokens"] = passage.metadata.get("tokens", 0)
        data["hit_token_cap"] = passage.metadata.get("hit_token_cap", False)
        data["passage_id"] = passage.id
        if passage.metadata.get("reused") is True:
            data["reused"] = True
            data["reused_ms"] = passage.metadata.get("verbalize_ms")
    return passage


class SRRAGPipeline:
    """Retrieve or verbalize, then answer (see the module docstring).

    Args:
        lm: the model that verbalizes and answers (any TextLM; the SR-RAG gate itself needs
            a white-box model).
        retriever: any rag_gates Retriever (None only with ``gate=None``).
        gate: decides per question; None = always verbalize (GenRead).
        verbalizer: default :class:`Verbalizer` on ``lm`` (GenRead prompt, 150 tokens).
        k: passages per retrieval.
        max_new_tokens: answer budget.
        dataset: picks the answer instruction (``pubmedqa``: yes/no/maybe).
    """

    def __init__(self, lm: Any, retriever: Retriever | None, gate: Gate | None, *,
                 verbalizer: Verbalizer | None = None, k: int = 3, max_new_tokens: int = 48,
                 dataset: str | None = None, name: str = "srrag") -> None:
        if gate is not None and not isinstance(retriever, Retriever):
            raise TypeError(f"retriever must follow rag_gates' Retriever protocol, got "
                            f"{type(retriever).__name__} (only gate=None needs none)")
        if k < 1 or max_new_tokens < 1:
            raise ValueError(f"k and max_new_tokens must be >= 1, got {k} and {max_new_tokens}")
        self.lm = lm
        self.retriever = retriever
        self.gate = gate
        self.verbalizer = verbalizer or Verbalizer(lm)
        self.k = k
        self.max_new_tokens = max_new_tokens
        self.dataset = dataset
        self.name = name

    def answer(self, question: str) -> PipelineResult:
        """Answer one question; the trace holds the decision, the retrieval or the
        verbalization, and the answer call."""
        rec = TraceRecorder()
        if self.gate is None or self.retriever is None:  # GenRead: always verbalize
            passages = [verbalize_recorded(rec, self.verbalizer, question)]
        else:
            decision = self.gate.decide(question)
            rec.add_decision(decision)
            if not decision.retrieve:
                verbalized = verbalize_recorded(rec, self.verbalizer, question)
                if says_nothing(verbalized):  # nothing to answer from: retrieve after all
                    decision = retrieve_instead(decision)
                    rec.add_decision(decision)
            passages = retrieve_recorded(rec, self.retriever, question, self.k) \
                if decision.retrieve else [verbalized]
        text = generate_recorded(rec, self.lm, answer_prompt(question, passages,
                                                             self.dataset),
                                 self.max_new_tokens)
        return PipelineResult(answer=text, trace=rec.trace(), passages=passages)

    async def aanswer(self, question: str) -> PipelineResult:
        """:meth:`answer` in a worker thread."""
        return await asyncio.to_thread(self.answer, question)
