"""``QuCoGate``: retrieve before answering when the question's entities are rare in the corpus.

A model hallucinates about what its pre-training corpus rarely saw (QuCo-RAG, section 3.2).
The gate extracts the question's key entities, counts each in a corpus index
(:class:`~rag_gates.corpus.CorpusStats`: a local infini-gram index or the hosted API), and
retrieves when their mean count (``aggregate="mean"``, the paper's rule) or their smallest
count (``aggregate="min"``: one rare entity is enough) is at most ``tau_entity``.

Score: ``1 / (1 + frequency)``, the *rarity* of the question (1.0 = never seen, near 0 =
common), so that, like every gate here, a higher score means more need to retrieve; the
threshold is ``1 / (1 + tau_entity)``. ``rag-gates eval-gate --gate quco`` calibrates it on
labelled questions; :meth:`QuCoGate.tau_from_threshold` converts back.

Outcomes of odd input, all documented in the decision's ``evidence``:

* no entity extracted: no retrieval (score 0.0, ``evidence["entities"] == []``), as the paper;
* the corpus fails (timeout, 5xx, missing index, a count that is not a finite number), or
  the extractor's reply is unreadable (:class:`~rag_gates.errors.ExtractionError`, not the
  model's own ``[]``): the ``on_error`` policy: ``"retrieve"``
  (the gate could not decide: it retrieves, and so does any composite holding it),
  ``"skip"`` (score 0.0) or ``"raise"``; ``evidence["error"]`` names the failure,
  and :attr:`QuCoGate.errors` counts them;
* an entity containing AND/OR ("Tom and Jerry") is looked up as one literal phrase.

Example:
    >>> from rag_gates.corpus import CachedCorpusStats, LocalInfiniGram   # doctest: +SKIP
    >>> gate = QuCoGate(CachedCorpusStats(LocalInfiniGram("indexes/wiki")),
    ...                 tau_entity=20)                                    # doctest: +SKIP
    >>> d = gate.decide("Who is the mother of the director of film Polish-Russian War?")
    >>> d.retrieve, d.evidence["counts"]                                  # doctest: +SKIP
    (True, {'Polish-Russian War': 3})
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import JsonValue

from rag_gates.corpus.base import CorpusStats
from rag_gates.corpus.errors import CorpusError
from rag_gates.errors import ExtractionError
from rag_gates.extract.base import Extractor
from rag_gates.gate import BaseGate
from rag_gates.quco._common import (
    OnError,
    check_on_error,
    checked_count,
    corpus_failure,
    default_extractor_or_given,
    logger,
    timed_ms,
)

__all__ = ["QuCoGate"]

Aggregate = Literal["mean", "min"]


def rarity(frequency: float) -> float:
    """``1 / (1 + frequency)``: 1.0 for an unseen phrase, towards 0 for common ones."""
    return 1.0 / (1.0 + max(frequency, 0.0))


class QuCoGate(BaseGate):
    """Pre-generation gate of QuCo-RAG: rare question entities trigger retrieval.

    Args:
        stats: corpus statistics (wrap it in ``CachedCorpusStats`` to cache counts on disk).
        extractor: question-entity extractor; default ``rag_gates.extract.default_extractor()``.
        tau_entity: retrieve when the aggregated entity count is at most this. It depends on
            the corpus: 100,000 (HotpotQA) / 1,000 (2Wiki) on the 4.6T-token hosted index in
            the paper; calibrate it for a local index with ``rag-gates eval-gate``.
        aggregate: ``"mean"`` (paper) or ``"min"`` over the entities' counts.
        on_error: ``"retrieve"`` | ``"skip"`` | ``"raise"`` when the corpus or the
            extractor fails.
    """

    name = "quco"
    threshold_range = (0.0, 1.0)  # rarity 1 / (1 + count)

    def __init__(self, stats: CorpusStats, extractor: Extractor | None = None, *,
                 tau_entity: float = 1000.0, aggregate: Aggregate = "mean",
                 on_error: OnError = "retrieve") -> None:
        if not isinstance(stats, CorpusStats):
            raise TypeError(f"stats must be a rag_gates.corpus.CorpusStats (LocalInfiniGram, "
                            f"HostedInfiniGram, CachedCorpusStats), got {type(stats).__name__}")
        if not isinstance(tau_entity, int | float) or math.isnan(tau_entity) or tau_entity < 0:
            raise ValueError(f"tau_entity must be a count >= 0, got {tau_entity!r}")
        if aggregate not in ("mean", "min"):
            raise ValueError(f"aggregate must be 'mean' or 'min', got {aggregate!r}")
        super().__init__(rarity(float(tau_entity)))
        self.stats = stats
        self.extractor: Extractor = default_extractor_or_given(extractor)  # type: ignore[assignment]
        self.tau_entity = float(tau_entity)
        self.aggregate: Aggregate = aggregate
        self.on_error = check_on_error(on_error)
        self.errors = 0

    @classmethod
    def from_threshold(cls, stats: CorpusStats, threshold: float, **kwargs: Any) -> QuCoGate:
        """A gate from a threshold on the rarity score (as ``eval-gate`` calibrates it)."""
        return cls(stats, tau_entity=cls.tau_from_threshold(threshold), **kwargs)

    @staticmethod
    def tau_from_threshold(threshold: float) -> float:
        """The ``tau_entity`` whose rarity is ``threshold`` (0 < threshold <= 1)."""
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"a rarity threshold lies in (0, 1], got {threshold!r}")
        return 1.0 / threshold - 1.0

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        try:
            entities, extract_ms = timed_ms(lambda: self.extractor.entities(query))
        except ExtractionError as error:
            # An unreadable extractor reply is not "no entity": the question's rarity is
            # unknown, so the on_error policy applies as to a failed corpus lookup.
            self.errors += 1
            if self.on_error == "raise":
                raise
            logger.warning("entity extraction failed for %r (%s); on_error=%r", query[:80],
                           error, self.on_error)
            return (math.nan if self.on_error == "retrieve" else 0.0), {
                "entities": [], "tau_entity": self.tau_entity, "aggregate": self.aggregate,
                "error": f"{type(error).__name__}: {error}", "failed": "entity extraction",
                "on_error": self.on_error, "corpus_ms": 0.0}
        evidence: dict[str, JsonValue] = {
            "entities": list(entities), "tau_entity": self.tau_entity,
            "aggregate": self.aggregate, "extract_ms": extract_ms,
        }
        if not entities:
            evidence["corpus_ms"] = 0.0
            return 0.0, evidence
        try:
            results, corpus_ms = timed_ms(lambda: self.stats.count_batch(entities))
            for entity, result in zip(entities, results, strict=True):
                checked_count(result.value, f"entity {entity!r}")
        except CorpusError as error:
            self.errors += 1
            corpus_failure(self.on_error, f"entities {entities}", error)
            evidence.update({"error": f"{type(error).__name__}: {error}",
                             "on_error": self.on_error, "corpus_ms": 0.0})
            # "retrieve" is "could not decide" (NaN): the decision says why, and a composite
            # (quco&cbdr) retrieves instead of letting a confident partner skip.
            return (math.nan if self.on_error == "retrieve" else 0.0), evidence
        counts = [r.value for r in results]
        frequency = min(counts) if self.aggregate == "min" else sum(counts) / len(counts)
        evidence.update({
            "counts": {e: c for e, c in zip(entities, counts, strict=True)},
            "frequency": frequency, "approximate": any(r.approximate for r in results),
            "corpus_ms": corpus_ms, "index": results[0].index,
        })
        return rarity(frequency), evidence

    def undecided(self, score: float, evidence: dict[str, JsonValue]) -> str:
        if "error" in evidence:
            return f"{_failed(evidence)} failed ({evidence['error']}); on_error: retrieve"
        return super().undecided(score, evidence)

    def reason(self, score: float, retrieve: bool, evidence: dict[str, JsonValue]) -> str:
        if "error" in evidence:
            verb = "retrieve" if retrieve else "answer without retrieval"
            return f"{_failed(evidence)} failed ({evidence['error']}); on_error: {verb}"
        if not evidence.get("entities"):
            return "no entity found in the question: answer without retrieval"
        frequency = evidence.get("frequency")
        relation = "<=" if retrieve else ">"
        verb = "rare in the corpus: retrieve" if retrieve else "known to the corpus: no retrieval"
        return (f"{self.aggregate} entity count {frequency:.4g} {relation} tau_entity "
                f"{self.tau_entity:.4g}: {verb}")


def _failed(evidence: dict[str, JsonValue]) -> str:
    return str(evidence.get("failed", "corpus statistics"))
