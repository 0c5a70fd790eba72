"""The benefit/detriment judge of Tok-RAG's released code (xsc1234/Tok-RAG), beside the
paper's equations (:mod:`rag_gates.tokrag.decoder`).

The paper scores a disagreement with ``p_R`` over every passage token (Eq. 15-16) at a fusion
layer ``l*`` (Eq. 14). The authors' scripts do something narrower, in input-embedding space
(``embed_tokens``), with no ``l*`` search and no ``p_R``:

* ``"authors-qa"`` (``Open-domain-QA/Tok-RAG_for_ODQA.py``, ``get_predict_emb_contrastive``):
  the retrieval side is the top-2 next-token probabilities times their embeddings, summed;
  the closed-book side the top-3 the same way. The passage tokens are ranked by attention
  (heads averaged) at one fixed layer; skipping punctuation, digits and special tokens, the
  three most attended ones each give a window ``[i - 2, i + 1]`` of passage tokens (their
  code's ``idx + token_window - 1``: one token to the right, not two). The score compares
  ``max(0, max cos(retrieval side, window token))`` with ``cos(retrieval side, closed-book
  side)``: above keeps the retrieval side.
* ``"authors-token"`` (``Primary experiment/comparing_benefit_and_detriment.py``, the token-
  level table): top-3 on both sides, the ten most attended passage tokens (no skipping, no
  window), the largest cosine among attention ranks 3-7 (their ``cos_sim[2:7]``).

Both return ``rag_side - llm_side`` so a score ``> 0`` keeps the RAG token (their ``>``; a
tie keeps the LLM's). Their scripts sweep the layer (``for i in range(32)``; layer index =
the 0-based decoder block whose attention is read, ``outputs.attentions[layer]``).

Example:
    >>> s = authors_score(probs, embeddings, attention, passage_ids, skip, variant="authors-qa")
    >>> s.score > 0     # keep the RAG stream's token
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from rag_gates._optional import require

require("torch", "hf")
import torch  # noqa: E402

__all__ = ["AUTHORS_VARIANTS", "AuthorsJudgement", "AuthorsVariant", "authors_score",
           "is_skipped_token"]

AuthorsVariant = Literal["authors-qa", "authors-token"]
AUTHORS_VARIANTS: tuple[AuthorsVariant, ...] = ("authors-qa", "authors-token")

# Their skip_words, as text after stripping the word-boundary marker: punctuation marks and
# digits (LLaMA-2 splits numbers into digits), plus special tokens (their "<s>").
_SKIPPED = frozenset({"", ".", "'", ")", "-", "]:", "]", "}:", ":", "["})


def is_skipped_token(text: str, *, special: bool = False) -> bool:
    """Whether the authors' QA judge passes over a passage token when it ranks attention.

    Only spaces are stripped (the word-boundary marker): a newline token is not in their
    list (LLaMA-2's ``<0x0A>``), so it is ranked like a word."""
    stripped = text.strip(" ")
    return special or stripped in _SKIPPED or (len(stripped) == 1 and stripped.isdigit())


@dataclass(frozen=True)
class AuthorsJudgement:
    """The authors' verdict at one step: ``score = rag_side - llm_side`` (> 0 keeps RAG)."""

    score: float
    rag_side: float
    llm_side: float
    layer: int


def _expected(probs: torch.Tensor, embeddings: torch.Tensor, k: int) -> torch.Tensor:
    """Top-``k`` probabilities times their tokens' embeddings, summed (not renormalised)."""
    values, indices = probs.topk(k)
    return (values[:, None] * embeddings[indices]).sum(0)


def authors_score(probs: torch.Tensor, embeddings: torch.Tensor, attention: torch.Tensor,
                  passage_ids: torch.Tensor, skip: torch.Tensor, *,
                  variant: AuthorsVariant = "authors-qa", layer: int = -1) -> AuthorsJudgement:
    """The released code's judge on one step.

    Args:
        probs: next-token probabilities ``[2, vocab]``, row 0 the RAG stream, row 1 the LLM's.
        embeddings: the input embedding matrix ``[vocab, d]``.
        attention: the RAG stream's newest position's attention over the passage tokens at
            the judged layer, heads averaged, ``[n]`` (not renormalised; only its order counts).
        passage_ids: the passage tokens ``[n]`` (contiguous in the prompt, in order).
        skip: ``[n]`` bool, tokens the QA variant passes over (:func:`is_skipped_token`).
        variant: ``"authors-qa"`` or ``"authors-token"`` (module docstring).
        layer: recorded in the result only.
    """
    cos = torch.nn.functional.cosine_similarity
    rag_k, llm_k = (2, 3) if variant == "authors-qa" else (3, 3)
    w_rag = _expected(probs[0].float(), embeddings, rag_k)
    w_llm = _expected(probs[1].float(), embeddings, llm_k)
    llm_side = float(cos(w_rag, w_llm, dim=0))
    order = attention.float().argsort(descending=True, stable=True)
    n = int(passage_ids.shape[0])
    if variant == "authors-qa":
        kept = [int(i) for i in order if not bool(skip[i])][:3]
        window = sorted({j for i in kept for j in range(max(0, i - 2), min(n - 1, i + 1) + 1)})
        # Their running maximum starts at 0: a passage side never scores below 0.
        rag_side = 0.0
        if window:
            sims = cos(w_rag[None], embeddings[passage_ids[window]], dim=1)
            best = float(sims.max())
            # max(0.0, nan) is 0.0: a NaN similarity must stay NaN, so the decoder's
            # non-finite check sees it (and keeps the passage's token) instead of a 0.
            rag_side = best if math.isnan(best) else max(0.0, best)
    elif variant == "authors-token":
        ranked = order[: min(10, n)][2:7]
        if ranked.numel() == 0:
            return AuthorsJudgement(float("nan"), float("nan"), llm_side, layer)
        rag_side = float(cos(w_rag[None], embeddings[passage_ids[ranked]], dim=1).max())
    else:
        raise ValueError(f"unknown variant {variant!r}; pick one of {AUTHORS_VARIANTS}")
    return AuthorsJudgement(rag_side - llm_side, rag_side, llm_side, layer)
