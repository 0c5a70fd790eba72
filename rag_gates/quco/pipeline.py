"""``QuCoPipeline``: QuCo-RAG's dynamic generation loop over any TextLM and any retriever.

1. Pre-check (:class:`~rag_gates.quco.gate.QuCoGate`): rare question entities -> retrieve
   top-k with the question before generating.
2. Generate a chunk (greedy, up to ``chunk_tokens``), split it into sentences and verify them
   in order (:class:`~rag_gates.quco.verifier.ClaimVerifier`). Sentences before the first
   flagged one are accepted.
3. On a flag: retrieve top-k for each flagged claim's query (``head relation``), merge and
   de-duplicate, rebuild the prompt (new documents + question + accepted text), regenerate
   from the flagged sentence, and verify again, at most ``max_rounds`` times. (The authors'
   code does not re-verify; we do, bounded.) Documents replace the previous round's unless
   ``accumulate_documents``.
4. Stop on "the answer is", the model's end of answer, the token budget, an empty
   generation, or no progress (a regenerated text identical to the rejected one is accepted
   as it is, since more retrieval did not change it).

Every decision, retrieval, model call and verification is in the returned :class:`Trace`.

Defined outcomes of odd input: an empty question raises ValueError; a question without
entities is answered without the pre-check retrieving; an empty generation ends the loop
with the text accepted so far (possibly ""); a corpus failure follows ``on_error``; a
retriever that raises propagates unless ``on_retriever_error="continue"``, which answers from
the documents already held and records the error in the trace.

Example:
    >>> from rag_gates.quco import QuCoPipeline                               # doctest: +SKIP
    >>> pipeline = QuCoPipeline(lm, retriever, stats, tau_entity=20)          # doctest: +SKIP
    >>> result = pipeline.run("Who is the mother of the director of Polish-Russian War?")
    >>> result.answer, result.trace.retrievals                                # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rag_gates.corpus.base import CorpusStats
from rag_gates.corpus.types import Window
from rag_gates.extract.base import Extractor
from rag_gates.extract.sentences import split_sentences
from rag_gates.lm.base import TextLM
from rag_gates.prompts import continue_prompt
from rag_gates.quco._common import OnError, default_extractor_or_given
from rag_gates.quco.gate import QuCoGate
from rag_gates.quco.verifier import ClaimVerifier, Verification
from rag_gates.retrieval.base import Retriever
from rag_gates.retrieval.recorded import retrieve_recorded
from rag_gates.types import GateDecision, Passage, PipelineResult, TraceEvent, TraceRecorder

__all__ = ["QuCoConfig", "QuCoPipeline", "QuCoResult"]

logger = logging.getLogger(__name__)

_ANSWER_IS = re.compile(r"\bthe answer is\b", re.IGNORECASE)
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*$")


def _token_share(tokens: int, text: str, kept: list[str]) -> int:
    """Tokens of ``text`` spent on the ``kept`` sentences, estimated by their share of
    characters (the budget counts accepted text only)."""
    if not kept or not text:
        return 0
    return round(tokens * min(1.0, sum(len(s) + 1 for s in kept) / len(text)))


class QuCoConfig(BaseModel):
    """Settings of the QuCo-RAG loop. Unknown keys are an error (no silent typos)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tau_entity: float = Field(1000.0, ge=0, description="Pre-check: retrieve when the "
                              "aggregated question-entity count is at most this.")
    aggregate: Literal["mean", "min"] = Field("mean", description="How entity counts combine.")
    tau_cooc: int = Field(1, ge=1, description="Flag a claim with fewer co-occurrences.")
    scope: Literal["document"] | Window = Field(
        "document", description="Co-occurrence scope: 'document' or Window(tokens=n).")
    check_partial: bool = Field(True, description="Flag partial (head, relation) items whose "
                                "head count is below min_head_count.")
    min_head_count: int = Field(20, ge=0, description="Head count for partial items.")
    k: int = Field(3, ge=1, le=50, description="Passages per query.")
    chunk_tokens: int = Field(128, ge=1, le=4096, description="New tokens per generation step.")
    max_new_tokens: int = Field(256, ge=1, le=16384, description="Budget of accepted answer "
                                "tokens; rejected drafts do not count (max_rounds bounds them).")
    max_rounds: int = Field(6, ge=0, le=100, description="Verify-retrieve-regenerate rounds.")
    pre_check: bool = Field(True, description="Run the question gate (ablation: False).")
    runtime_check: bool = Field(True, description="Verify generated claims (ablation: False).")
    accumulate_documents: bool = Field(False, description="Keep earlier rounds' documents.")
    on_error: OnError = Field("retrieve", description="When the corpus fails: 'retrieve', "
                              "'skip' or 'raise'.")
    on_retriever_error: Literal["raise", "continue"] = Field(
        "raise", description="When the retriever raises: propagate, or continue with the "
                             "documents already held (recorded in the trace).")
    dataset: str | None = Field(None, description="Dataset name, to pick its prompt wording.")


class QuCoResult(PipelineResult):
    """The answer, the passages used and the trace (:class:`PipelineResult`), plus the
    pre-check decision, every verification, the rounds and why the loop stopped."""

    decision: GateDecision | None = Field(None, description="The pre-check's decision.")
    verifications: list[Verification] = Field(default_factory=list)
    rounds: int = Field(0, ge=0, description="Regeneration rounds triggered by flags.")
    stop_reason: str = Field("", description="Why the loop ended.")


class QuCoPipeline:
    """QuCo-RAG over any TextLM, any rag_gates Retriever and any CorpusStats.

    Args:
        lm: a TextLM (local HF model, or an API model through the LangChain/LlamaIndex
            adapters): only text goes through it.
        retriever: a rag_gates Retriever (BM25Retriever, QdrantDenseRetriever, or a framework
            retriever through the integration packages).
        stats: corpus statistics for the gate and the verifier.
        extractor: entity/claim extractor; default ``rag_gates.extract.default_extractor()``.
        config: a :class:`QuCoConfig`; keyword overrides (``tau_entity=20``) also work.
    """

    name = "quco"

    def __init__(self, lm: TextLM, retriever: Retriever, stats: CorpusStats,
                 extractor: Extractor | None = None, config: QuCoConfig | None = None,
                 **overrides: Any) -> None:
        base = config or QuCoConfig()
        # Re-validated, so a misspelt or mistyped override is an error, not a silent default.
        self.config = QuCoConfig(**{**dict(base), **overrides}) if overrides else base
        if not isinstance(lm, TextLM):
            raise TypeError(f"lm must follow rag_gates' TextLM protocol, got {type(lm).__name__}")
        if not isinstance(retriever, Retriever):
            raise TypeError(f"retriever must follow rag_gates' Retriever protocol, got "
                            f"{type(retriever).__name__}")
        self.lm = lm
        self.retriever = retriever
        self.extractor: Extractor = default_extractor_or_given(extractor)  # type: ignore[assignment]
        c = self.config
        self.gate = QuCoGate(stats, self.extractor, tau_entity=c.tau_entity,
                             aggregate=c.aggregate, on_error=c.on_error)
        self.verifier = ClaimVerifier(stats, self.extractor, tau_cooc=c.tau_cooc, scope=c.scope,
                                      check_partial=c.check_partial,
                                      min_head_count=c.min_head_count, on_error=c.on_error)

    def _retrieve(self, rec: TraceRecorder, queries: list[str]) -> list[Passage]:
        merged: dict[tuple[str | None, str], Passage] = {}
        for query in queries:
            try:
                found = retrieve_recorded(rec, self.retriever, query, self.config.k)
            except Exception as error:
                if self.config.on_retriever_error == "raise":
                    raise
                logger.warning("retriever failed for %r: %s", query, error)
                rec.add(TraceEvent(kind="note", name="retriever-error",
                                   data={"query": query, "error": f"{type(error).__name__}: "
                                                                  f"{error}"}))
                continue
            for p in found:
                merged.setdefault((p.id, p.text), p)
        return list(merged.values())

    def _verify(self, rec: TraceRecorder, sentences: list[str]) -> Verification:
        with rec.timed("verification", self.verifier.name) as data:
            v = self.verifier.verify_sentences(sentences, stop_at_first_flag=True)
            summary = v.summary()
            data.update({"flagged": summary["flagged"], "queries": summary["queries"],
                         "claims_checked": summary["claims_checked"],
                         "extract_ms": v.extract_ms, "corpus_ms": v.corpus_ms,
                         "errors": v.errors})
        return v

    def run(self, question: str) -> QuCoResult:
        """Answer ``question`` with QuCo-RAG's loop; see the module docstring for the steps."""
        if not isinstance(question, str):
            raise TypeError(f"question must be a str, got {type(question).__name__}")
        if not question.strip():
            raise ValueError("question is empty or whitespace")
        c = self.config
        rec = TraceRecorder()
        docs: list[Passage] = []
        used: dict[tuple[str | None, str], Passage] = {}
        decision: GateDecision | None = None
        if c.pre_check:
            decision = self.gate.decide(question)
            rec.add_decision(decision)
            if decision.retrieve:
                docs = self._retrieve(rec, [question])
        for p in docs:
            used.setdefault((p.id, p.text), p)
        accepted: list[str] = []
        verifications: list[Verification] = []
        budget, rounds, rejected = c.max_new_tokens, 0, ""
        stop_reason = "budget"
        while budget > 0:
            prompt = continue_prompt(question, docs, " ".join(accepted), c.dataset)
            with rec.timed("llm_call", "generate") as data:
                g = self.lm.generate(prompt, max_new_tokens=min(c.chunk_tokens, budget))
                data["tokens"] = g.completion_tokens
                data["finish_reason"] = g.finish_reason
            text = g.text.strip()
            if not text:
                stop_reason = "empty generation"
                break
            sentences = split_sentences(text)
            if g.finish_reason == "length" and len(sentences) > 1 \
                    and not _SENTENCE_END.search(sentences[-1]):
                sentences = sentences[:-1]  # cut mid-sentence: written again next step
            flagged_at = None
            if c.runtime_check:
                v = self._verify(rec, sentences)
                verifications.append(v)
                flagged_at = v.first_flagged
            if flagged_at is not None and rounds < c.max_rounds and text != rejected:
                accepted.extend(sentences[:flagged_at])
                budget -= _token_share(g.completion_tokens, text, sentences[:flagged_at])
                rounds += 1
                rejected = text
                fresh = self._retrieve(rec, v.sentences[flagged_at].queries())
                docs = list({(p.id, p.text): p for p in [*docs, *fresh]}.values()) \
                    if c.accumulate_documents else (fresh or docs)
                for p in fresh:
                    used.setdefault((p.id, p.text), p)
                continue
            if flagged_at is not None:
                rec.add(TraceEvent(kind="note", name="quco", data={
                    "accepted_unverified": sentences[flagged_at],
                    "why": "max_rounds reached" if rounds >= c.max_rounds else "no progress"}))
            accepted.extend(sentences)
            budget -= max(_token_share(g.completion_tokens, text, sentences), 1)
            if _ANSWER_IS.search(" ".join(accepted)):
                stop_reason = "answer given"
                break
            if g.finish_reason != "length":
                stop_reason = "end of answer"
                break
        return QuCoResult(answer=" ".join(accepted), trace=rec.trace(),
                          passages=list(used.values()), decision=decision,
                          verifications=verifications, rounds=rounds, stop_reason=stop_reason)

    async def arun(self, question: str) -> QuCoResult:
        """``run`` in a worker thread (the model and the corpus calls block)."""
        return await asyncio.to_thread(self.run, question)

    def answer(self, question: str) -> QuCoResult:
        """Alias of :meth:`run`, the name every pipeline answers to (and the benchmark calls)."""
        return self.run(question)
