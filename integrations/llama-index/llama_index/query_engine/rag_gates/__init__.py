"""LlamaIndex query engines of rag-gates, and LlamaIndex's FLARE as a benchmark method."""

from llama_index.query_engine.rag_gates.flare import FlareMethod

__all__ = ["FlareMethod"]
