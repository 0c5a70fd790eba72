"""CBDR rerankers: order passages by the confidence they add to *this* model.

- :class:`ConfidenceGainReranker` (zero-shot): ``Inc(q, c) = Conf(q + c) - Conf(q)``, the
  probe's confidence with the passage (RAG prompt) minus without it (QA prompt), every
  candidate in batched forward passes of the LLM.
- :class:`CrossEncoderReranker`: a sentence-transformers ``CrossEncoder`` (e.g. the one
  ``rag-gates cbdr train-reranker`` fine-tunes on Inc preferences) that ranks without the LLM.

Truncation rule (zero-shot): a passage longer than ``max_passage_tokens`` model tokens keeps
its first ``max_passage_tokens`` (the head of a paragraph names its subject); if the RAG prompt
would still not fit the model's context window, the passage is cut further to fit. Every cut
is counted in the result's evidence (``truncated``) and in the passage's own
(``truncated_tokens``).

Example:
    >>> reranker = ConfidenceGainReranker(lm, probe)
    >>> result = reranker.rerank("Who wrote Hamlet?", passages, top_n=3)
    >>> [(s.passage.title, s.score) for s in result.ranked]     # score = Inc
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import JsonValue

from rag_gates.cbdr.probe import ConfidenceProbe
from rag_gates.errors import ContextLengthError
from rag_gates.lm.base import require_white_box
from rag_gates.rerank import BaseReranker, PassageScores
from rag_gates.types import Passage

__all__ = ["ConfidenceGainReranker", "CrossEncoderReranker"]

# Tokens kept free between the prompt and the context limit: re-encoding a cut passage can
# merge or split a few tokens at the cut.
_CUT_MARGIN = 8


class ConfidenceGainReranker(BaseReranker):
    """Zero-shot CBDR reranker: score = ``Conf(q + c) - Conf(q)``.

    Args:
        lm: the white-box model the probe was trained on.
        probe: the trained :class:`ConfidenceProbe`.
        batch_size: prompts per forward pass.
        max_passage_tokens: longer passages are cut to their first this-many tokens.

    ``rerank(query, passages, top_n, question_confidence=c)`` skips the question-only pass
    when the caller already has ``Conf(q)`` (the CBDR gate computed it).
    """

    name = "confidence-gain"

    def __init__(self, lm: Any, probe: ConfidenceProbe, *, batch_size: int = 4,
                 max_passage_tokens: int = 512) -> None:
        # Any: the truncation rule needs the HF model's tokenizer, encode and max_context.
        self.lm: Any = require_white_box(lm, "ConfidenceGainReranker")
        if not isinstance(probe, ConfidenceProbe):
            raise TypeError(f"probe must be a ConfidenceProbe, got {type(probe).__name__}")
        probe.check_compatible(self.lm)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_passage_tokens < 1:
            raise ValueError(f"max_passage_tokens must be >= 1, got {max_passage_tokens}")
        self.probe = probe
        self.batch_size = batch_size
        self.max_passage_tokens = max_passage_tokens

    def _room(self, query: str) -> int:
        """Tokens a passage may take in the RAG prompt for ``query`` (encoded once a call;
        a title's own tokens come off it per passage)."""
        overhead = len(self.lm.encode(self.probe.prompts.rag(query, [Passage(text="")])))
        room = self.lm.max_context - overhead - _CUT_MARGIN
        if room < 1:
            raise ContextLengthError(
                f"the question and prompt alone take {overhead} tokens of the "
                f"{self.lm.max_context}-token context; no room for a passage")
        return room

    def _fit(self, passage: Passage, room: int) -> tuple[Passage, int]:
        """The passage cut by the truncation rule, and how many tokens were dropped."""
        tok = self.lm.tokenizer
        # Literal ids, as the prompt encodes the passage: its "<|im_end|>" is plain text.
        ids = self.lm.token_ids(passage.text)
        title = len(self.lm.token_ids(f"{passage.title}: ")) if passage.title else 0
        keep = max(1, min(self.max_passage_tokens, room - title))
        if len(ids) <= keep:
            return passage, 0
        text = str(tok.decode(ids[:keep], skip_special_tokens=True))
        return passage.model_copy(update={"text": text}), len(ids) - keep

    def score_passages(self, query: str, passages: Sequence[Passage], **signals: Any
                       ) -> PassageScores:
        question_confidence = signals.get("question_confidence")
        room = self._room(query)
        fitted = [self._fit(p, room) for p in passages]
        prompts = [self.probe.prompts.rag(query, [p]) for p, _ in fitted]
        if question_confidence is None:
            prompts.insert(0, self.probe.prompts.qa(query))
        feats = self.probe.features(self.lm, prompts, batch_size=self.batch_size)
        confs = [float(c) for c in self.probe.confidence_from_hidden(feats)]
        base = float(question_confidence) if question_confidence is not None else confs.pop(0)
        truncated = sum(1 for _, cut in fitted if cut)
        evidence: dict[str, JsonValue] = {
            "question_confidence": base, "truncated": truncated,
            "max_passage_tokens": self.max_passage_tokens, "layer": self.probe.layer,
            "probe_model": self.probe.config.model_id}
        per_passage: list[dict[str, JsonValue]] = [
            {"confidence": c, "truncated_tokens": cut} for c, (_, cut) in zip(confs, fitted,
                                                                              strict=True)]
        return PassageScores(scores=[c - base for c in confs], evidence=evidence,
                             per_passage=per_passage)


class CrossEncoderReranker(BaseReranker):
    """Rank with a sentence-transformers ``CrossEncoder`` (no LLM in the loop).

    Args:
        model: a loaded ``CrossEncoder`` or a path to one (e.g. the output directory of
            ``rag-gates cbdr train-reranker``).
        batch_size: pairs per forward pass.
        max_length: tokens per (query, passage) pair; longer pairs are cut by the encoder.

    Example:
        >>> reranker = CrossEncoderReranker("rerankers/smollm2-cbdr")
        >>> reranker.rerank("Who wrote Hamlet?", passages, top_n=3).passages
    """

    name = "cross-encoder"

    def __init__(self, model: Any, *, batch_size: int = 16, max_length: int = 256) -> None:
        if isinstance(model, str) or hasattr(model, "__fspath__"):
            from rag_gates._optional import require

            require("sentence_transformers", "hf")
            from sentence_transformers import CrossEncoder

            model = CrossEncoder(str(model), max_length=max_length, local_files_only=True)
        if not callable(getattr(model, "predict", None)):
            raise TypeError("model must be a sentence-transformers CrossEncoder or a path to one")
        self.model = model
        self.batch_size = batch_size

    def score_passages(self, query: str, passages: Sequence[Passage], **signals: Any
                       ) -> PassageScores:
        pairs = [(query, f"{p.title}: {p.text}" if p.title else p.text) for p in passages]
        scores = self.model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False,
                                    convert_to_numpy=True)
        return PassageScores(scores=[float(s) for s in scores])
