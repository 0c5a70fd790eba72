"""Tok-RAG for LlamaIndex: decoding that weighs the model with and without the retrieved
nodes token by token (and CAD / AdaCAD over the same two streams).

* :class:`TokRAGSynthesizer`: a response synthesizer that hands the retrieved nodes to the
  decoder separately from the question; ``index.as_query_engine(response_synthesizer=
  TokRAGSynthesizer(lm=lm))`` switches a query engine to Tok-RAG with one argument.
* :class:`TokRAGLLM`: the decoder as a ``CustomLLM``; ``complete(question, passages=nodes)``
  returns per-token logprobs and the choices in ``CompletionResponse.additional_kwargs``.
"""

from llama_index.response_synthesizers.rag_gates.base import (
    CHOICES_KEY,
    TokRAGLLM,
    TokRAGSynthesizer,
    to_passages,
)

__all__ = ["CHOICES_KEY", "TokRAGLLM", "TokRAGSynthesizer", "to_passages"]
