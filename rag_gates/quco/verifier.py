"""``ClaimVerifier``: flag generated claims whose entities never occur together in the corpus.

QuCo-RAG's runtime check (section 3.3): split the text into sentences, extract
``(head, relation, tail)`` claims, and count the documents in which head and tail co-occur.
A claim is flagged when that count is below ``tau_cooc`` (default 1: they never co-occur);
the query that would fix it is ``head + " " + relation``. A partial ``(head, relation)`` item
(what questions yield) is flagged when ``count(head)`` is below ``min_head_count`` (20, as in
the authors' code; ``check_partial=False`` turns this off).

The evidence is asymmetric. Zero co-occurrence strongly suggests a hallucination: the corpus
never puts the two together. A positive count does **not** prove the claim: the two may
co-occur in another relation ("X was born in Paris" vs "X died in Paris"). Read an unflagged
claim as "not contradicted by the corpus", never as "verified true".

Text with a lone surrogate (a broken ``\\ud800`` escape) is refused with a ValueError naming
the position where it enters (``verify``, ``verify_sentences``, ``check_claims``): otherwise
its corpus lookup fails and the ``on_error`` policy could report it as "nothing flagged".

Example:
    >>> verifier = ClaimVerifier(stats)                                     # doctest: +SKIP
    >>> report = verifier.verify("Ed Wood was born in Poughkeepsie. He directed Jaws.")
    >>> [(c.claim.head, c.claim.tail, c.cooccurrence) for c in report.flagged]
    [('Ed Wood', 'Jaws', 0)]
    >>> report.queries
    ['Ed Wood directed']
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rag_gates._text import check_encodable
from rag_gates.corpus.base import CorpusStats
from rag_gates.corpus.errors import CorpusError
from rag_gates.corpus.types import Scope, parse_scope
from rag_gates.errors import ExtractionError
from rag_gates.extract.base import Claim, Extractor
from rag_gates.extract.sentences import split_sentences
from rag_gates.quco._common import (
    OnError,
    check_on_error,
    checked_count,
    corpus_failure,
    default_extractor_or_given,
    logger,
    timed_ms,
)

__all__ = ["ClaimCheck", "ClaimVerifier", "SentenceCheck", "Verification"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class ClaimCheck(BaseModel):
    """One claim, the corpus counts behind it, and whether it is flagged."""

    model_config = _FROZEN

    claim: Claim
    flagged: bool = Field(..., description="True when the corpus gives the claim no support.")
    reason: str = Field(..., description="One sentence: the count and the threshold.")
    cooccurrence: int | None = Field(
        None, description="Documents (local) or windows (hosted) with head and tail together.")
    head_count: int | None = Field(None, description="Occurrences of the head (partial claims).")
    approximate: bool = Field(False, description="True when a count is an estimate.")
    error: str | None = Field(None, description="The corpus failure, when there was one.")

    @property
    def query(self) -> str:
        """The retrieval query for this claim: ``head + " " + relation``."""
        return self.claim.query()


class SentenceCheck(BaseModel):
    """The claims of one sentence and their checks."""

    model_config = _FROZEN

    sentence: str
    checks: tuple[ClaimCheck, ...] = ()
    unreadable: str | None = Field(
        None, description="Why the extractor's reply for this sentence held no usable item "
                          "(on_error='retrieve'): the sentence is flagged, and it is its own "
                          "retrieval query.")

    @property
    def flagged(self) -> bool:
        return self.unreadable is not None or any(c.flagged for c in self.checks)

    def queries(self) -> list[str]:
        """One retrieval query per flagged claim of this sentence (the sentence itself when
        its claims could not be read), de-duplicated."""
        own = [self.sentence] if self.unreadable is not None else []
        return list(dict.fromkeys(own + [c.query for c in self.checks if c.flagged]))


class Verification(BaseModel):
    """The verifier's answer for a text: every sentence, its claims, the flagged ones."""

    model_config = _FROZEN

    sentences: tuple[SentenceCheck, ...] = ()
    tau_cooc: int
    scope: str
    extract_ms: float = Field(0.0, ge=0.0, description="Time spent extracting claims.")
    corpus_ms: float = Field(0.0, ge=0.0, description="Time spent on corpus queries.")
    errors: int = Field(0, ge=0, description="Corpus or extractor failures met (see "
                                             "on_error).")

    @property
    def flagged(self) -> list[ClaimCheck]:
        return [c for s in self.sentences for c in s.checks if c.flagged]

    @property
    def first_flagged(self) -> int | None:
        """Index of the first sentence with a flagged claim, or None."""
        return next((i for i, s in enumerate(self.sentences) if s.flagged), None)

    @property
    def queries(self) -> list[str]:
        """One retrieval query per flagged claim (or unreadable sentence), de-duplicated, in
        order."""
        return list(dict.fromkeys(q for s in self.sentences for q in s.queries()))

    def summary(self) -> dict[str, Any]:
        """A JSON-ready digest: flagged claims with their counts and the queries to run."""
        return {
            "flagged": [
                {"head": c.claim.head, "relation": c.claim.relation, "tail": c.claim.tail,
                 "cooccurrence": c.cooccurrence, "head_count": c.head_count,
                 "reason": c.reason, "query": c.query}
                for c in self.flagged
            ],
            "queries": self.queries,
            "claims_checked": sum(len(s.checks) for s in self.sentences),
            "sentences": len(self.sentences),
            # Only when some sentence's claims could not be read (the usual shape otherwise).
            **({"unreadable": unreadable} if (unreadable := [
                {"sentence": s.sentence, "reason": s.unreadable}
                for s in self.sentences if s.unreadable is not None]) else {}),
        }


class ClaimVerifier:
    """Runtime claim verification against corpus co-occurrence (see the module docstring).

    Args:
        stats: corpus statistics (local index or hosted API; cache it with CachedCorpusStats).
        extractor: claim extractor; default ``rag_gates.extract.default_extractor()``.
        tau_cooc: flag a claim when head and tail co-occur fewer times than this (default 1).
        scope: co-occurrence scope: ``"document"`` (local indexes; the hosted API answers
            it with a 1,000-token window) or ``Window(tokens=n)``.
        check_partial: flag partial ``(head, relation)`` items whose head is rare.
        min_head_count: the head count below which a partial item is flagged (default 20).
        on_error: ``"retrieve"`` (flag the claim), ``"skip"`` (do not flag) or ``"raise"``.
    """

    name = "quco-verifier"

    def __init__(self, stats: CorpusStats, extractor: Extractor | None = None, *,
                 tau_cooc: int = 1, scope: Scope = "document", check_partial: bool = True,
                 min_head_count: int = 20, on_error: OnError = "retrieve") -> None:
        if not isinstance(stats, CorpusStats):
            raise TypeError(f"stats must be a rag_gates.corpus.CorpusStats, "
                            f"got {type(stats).__name__}")
        if not isinstance(tau_cooc, int) or tau_cooc < 1:
            raise ValueError(f"tau_cooc must be an int >= 1 (1 = flag zero co-occurrence), "
                             f"got {tau_cooc!r}")
        if not isinstance(min_head_count, int) or min_head_count < 0:
            raise ValueError(f"min_head_count must be an int >= 0, got {min_head_count!r}")
        self.stats = stats
        self.extractor: Extractor = default_extractor_or_given(extractor)  # type: ignore[assignment]
        self.tau_cooc = tau_cooc
        self.scope: Scope = scope
        self.scope_name = parse_scope(scope)
        self.check_partial = check_partial
        self.min_head_count = min_head_count
        self.on_error = check_on_error(on_error)
        self.errors = 0

    def verify(self, text: str) -> Verification:
        """Split ``text`` into sentences and check every claim of every sentence."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.verify_sentences(split_sentences(check_encodable(text, "text")))

    async def averify(self, text: str) -> Verification:
        return await asyncio.to_thread(self.verify, text)

    def verify_sentences(self, sentences: Sequence[str], *,
                         stop_at_first_flag: bool = False) -> Verification:
        """Check sentences in order; with ``stop_at_first_flag`` stop after the first flagged
        one (what the generation loop needs: later sentences are regenerated anyway)."""
        for i, sentence in enumerate(sentences):
            check_encodable(sentence, f"sentence {i}")
        checked: list[SentenceCheck] = []
        extract_ms = corpus_ms = 0.0
        errors = 0
        for sentence in sentences:
            start = time.perf_counter()
            try:
                claims = self.extractor.claims(sentence)
            except ExtractionError as error:
                # Unknown claims are not "no claim": the on_error policy, as for the corpus.
                extract_ms += (time.perf_counter() - start) * 1000.0
                errors += 1
                self.errors += 1
                if self.on_error == "raise":
                    raise
                logger.warning("claim extraction failed for %r (%s); on_error=%r",
                               sentence[:80], error, self.on_error)
                checked.append(SentenceCheck(sentence=sentence, unreadable=(
                    f"{type(error).__name__}: {error}" if self.on_error == "retrieve"
                    else None)))
                if stop_at_first_flag and checked[-1].flagged:
                    break
                continue
            extract_ms += (time.perf_counter() - start) * 1000.0
            checks: list[ClaimCheck] = []
            for claim in claims:
                if claim.is_partial and not self.check_partial:
                    continue
                check, ms = timed_ms(lambda c=claim: self._check(c))  # type: ignore[misc]
                corpus_ms += ms
                errors += check.error is not None
                checks.append(check)
            checked.append(SentenceCheck(sentence=sentence, checks=tuple(checks)))
            if stop_at_first_flag and checked[-1].flagged:
                break
        return Verification(sentences=tuple(checked), tau_cooc=self.tau_cooc,
                            scope=self.scope_name, extract_ms=extract_ms, corpus_ms=corpus_ms,
                            errors=errors)

    def check_claims(self, claims: Sequence[Claim]) -> list[ClaimCheck]:
        """Check claims you extracted yourself (an agent's own triples, say)."""
        for i, claim in enumerate(claims):
            for field in ("head", "relation", "tail"):
                value = getattr(claim, field)
                if isinstance(value, str):
                    check_encodable(value, f"claim {i} {field}")
        return [self._check(c) for c in claims]

    def _check(self, claim: Claim) -> ClaimCheck:
        try:
            if claim.tail is None:
                head = self.stats.count(claim.head)
                checked_count(head.value, f"head {claim.head!r}")
                flagged = head.value < self.min_head_count
                relation = "<" if flagged else ">="
                return ClaimCheck(
                    claim=claim, flagged=flagged, head_count=head.value,
                    approximate=head.approximate,
                    reason=f"count({claim.head!r}) = {head.value} {relation} "
                           f"min_head_count {self.min_head_count}")
            cooc = self.stats.cooccurrence(claim.head, claim.tail, self.scope)
            checked_count(cooc.value, f"the pair {claim.head!r} / {claim.tail!r}")
        except CorpusError as error:
            self.errors += 1
            corpus_failure(self.on_error, f"claim {claim.head!r} / {claim.tail!r}", error)
            flagged = self.on_error == "retrieve"
            return ClaimCheck(
                claim=claim, flagged=flagged, error=f"{type(error).__name__}: {error}",
                reason=f"corpus statistics failed; on_error={self.on_error!r}: "
                       f"{'flagged' if flagged else 'not flagged'}")
        flagged = cooc.value < self.tau_cooc
        relation = "<" if flagged else ">="
        return ClaimCheck(
            claim=claim, flagged=flagged, cooccurrence=cooc.value, head_count=cooc.a_count,
            approximate=cooc.approximate,
            reason=f"cooc({claim.head!r}, {claim.tail!r}) = {cooc.value} {relation} "
                   f"tau_cooc {self.tau_cooc} ({cooc.scope})")
