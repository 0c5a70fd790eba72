"""LlamaIndex node postprocessors of rag-gates.

* :class:`ConfidenceGainReranker`: CBDR's confidence-gain reranker (nodes ordered by how much
  each raises the model's probed confidence), a cross-encoder fine-tuned on it, or any
  rag-gates reranker, as a ``BaseNodePostprocessor`` for query engines.
"""

from llama_index.postprocessor.rag_gates.base import (
    RERANK_KEY,
    RETRIEVAL_SCORE_KEY,
    ConfidenceGainReranker,
)

__all__ = ["RERANK_KEY", "RETRIEVAL_SCORE_KEY", "ConfidenceGainReranker"]
