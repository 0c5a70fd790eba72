"""LlamaIndex LLM integration of rag-gates.

* :class:`RagGatesLLM`: a LlamaIndex LLM over rag-gates' white-box model (the embedded
  SmolLM2 by default), with per-token log-probabilities.
* :func:`as_text_lm`: any LlamaIndex LLM as a rag-gates ``TextLM``.
"""

from llama_index.llms.rag_gates.base import (
    LOGPROBS_LAYOUT,
    LOGPROBS_LAYOUT_KEY,
    RagGatesLLM,
    to_llama_index_logprobs,
    to_rag_gates_messages,
)
from llama_index.llms.rag_gates.text_lm import (
    GenerationOptions,
    LlamaIndexTextLM,
    as_text_lm,
    from_llama_index_logprobs,
)

__all__ = [
    "LOGPROBS_LAYOUT",
    "LOGPROBS_LAYOUT_KEY",
    "GenerationOptions",
    "LlamaIndexTextLM",
    "RagGatesLLM",
    "as_text_lm",
    "from_llama_index_logprobs",
    "to_llama_index_logprobs",
    "to_rag_gates_messages",
]
