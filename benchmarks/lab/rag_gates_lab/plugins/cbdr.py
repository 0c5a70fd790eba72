"""CBDR in ``rag-gates bench`` and ``rag-gates eval-gate`` (entry points).

Methods:

- ``cbdr`` / ``cbdr@BETA``: gate at ``beta`` (default: the probe's calibrated beta,
  :attr:`~rag_gates.cbdr.probe.ConfidenceProbe.beta`), then BM25 top-
  :data:`CANDIDATES` reranked by confidence gain, top-k to the model;
- ``cbdr-ce@BETA``: the same gate with a fine-tuned cross-encoder reranker from
  ``$RAG_GATES_CBDR_RERANKER`` (the output of ``rag-gates cbdr train-reranker``).

Gate: ``cbdr`` (the probe alone). The probe is :func:`~rag_gates.cbdr.shipped.load_default_probe`
(``$RAG_GATES_CBDR_PROBE`` or the shipped SmolLM2 probe).
"""

from __future__ import annotations

import os
from typing import Any

from rag_gates.cbdr.pipeline import CBDRPipeline
from rag_gates.cbdr.rerank import CrossEncoderReranker
from rag_gates.cbdr.shipped import load_default_probe
from rag_gates.methods import MethodContext, need_retriever
from rag_gates_lab.plugins.options import METHOD_OPTIONS, parse_beta

__all__ = ["CANDIDATES", "RERANKER_ENV", "cbdr_ce_method",
           "cbdr_method", "parse_beta"]

#: Passages retrieved for the reranker to choose the top-k from.
CANDIDATES = 10
RERANKER_ENV = "RAG_GATES_CBDR_RERANKER"


def _pipeline(ctx: MethodContext, base: str, reranker: Any = None) -> CBDRPipeline:
    beta = parse_beta(ctx.option, base)
    name = base if ctx.option is None else f"{base}@{ctx.option}"
    return CBDRPipeline(ctx.lm, need_retriever(ctx, name), load_default_probe(ctx.lm),
                        beta=beta, candidates=max(CANDIDATES, ctx.k), k=ctx.k,
                        reranker=reranker, max_new_tokens=ctx.max_new_tokens, name=name)


def cbdr_method(ctx: MethodContext) -> CBDRPipeline:
    """CBDR with the zero-shot confidence-gain reranker."""
    return _pipeline(ctx, "cbdr")


def cbdr_ce_method(ctx: MethodContext) -> CBDRPipeline:
    """CBDR with the fine-tuned cross-encoder at ``$RAG_GATES_CBDR_RERANKER``."""
    path = os.environ.get(RERANKER_ENV)
    if not path:
        raise ValueError(f"cbdr-ce needs a fine-tuned cross-encoder: set {RERANKER_ENV} to the "
                         "output directory of 'rag-gates cbdr train-reranker'")
    return _pipeline(ctx, "cbdr-ce", CrossEncoderReranker(path))


cbdr_method.accepts_option = True  # type: ignore[attr-defined]
cbdr_ce_method.accepts_option = True  # type: ignore[attr-defined]
# Checked before any model is loaded, and before this module is imported (options.py).
cbdr_method.validate_option = METHOD_OPTIONS["cbdr"]  # type: ignore[attr-defined]
cbdr_ce_method.validate_option = METHOD_OPTIONS["cbdr-ce"]  # type: ignore[attr-defined]
