"""LlamaIndex query engines of rag-gates, and LlamaIndex's FLARE as a benchmark method.

* :class:`GatedQueryEngine`: any query engine behind any rag-gates gate; the LLM answers
  directly when the gate says retrieval is not worth it.
* :class:`QuCoQueryEngine`: QuCo-RAG's loop (gate, generation, claim verification,
  re-retrieval) on any LlamaIndex LLM and retriever.
* :class:`FlareMethod`: LlamaIndex's FLARE as a ``rag-gates bench`` method.
"""

from llama_index.query_engine.rag_gates.flare import FlareMethod
from llama_index.query_engine.rag_gates.gated import DEFAULT_DIRECT_PROMPT, GatedQueryEngine
from llama_index.query_engine.rag_gates.quco import QuCoQueryEngine, quco_metadata

__all__ = [
    "DEFAULT_DIRECT_PROMPT",
    "FlareMethod",
    "GatedQueryEngine",
    "QuCoQueryEngine",
    "quco_metadata",
]
