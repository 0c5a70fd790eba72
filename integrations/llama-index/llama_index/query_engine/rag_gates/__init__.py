"""LlamaIndex query engines of rag-gates, and LlamaIndex's FLARE and SubQuestion query engines
as benchmark methods.

* :class:`GatedQueryEngine`: any query engine behind any rag-gates gate; the LLM answers
  directly when the gate says retrieval is not worth it.
* :class:`DeepRAGQueryEngine`: DeepRAG's step-by-step loop (a retrieve-or-answer decision
  per subquery) on any LlamaIndex LLM and retriever, each step dispatched as an event.
* :class:`QuCoQueryEngine`: QuCo-RAG's loop (gate, generation, claim verification,
  re-retrieval) on any LlamaIndex LLM and retriever.
* :class:`FlareMethod`: LlamaIndex's FLARE as a ``rag-gates bench`` method.
* :class:`SubQuestionMethod`: LlamaIndex's ``SubQuestionQueryEngine`` as a ``rag-gates bench``
  method (DeepRAG's decomposition peer).
"""

from llama_index.query_engine.rag_gates.deeprag import (
    DeepRAGQueryEngine,
    DeepRAGStepEvent,
    deeprag_metadata,
)
from llama_index.query_engine.rag_gates.flare import FlareMethod
from llama_index.query_engine.rag_gates.gated import (
    DEFAULT_ABSTAIN_MESSAGE,
    DEFAULT_DIRECT_PROMPT,
    GatedQueryEngine,
)
from llama_index.query_engine.rag_gates.quco import QuCoQueryEngine, quco_metadata
from llama_index.query_engine.rag_gates.subquestion import SubQuestionMethod

__all__ = [
    "DEFAULT_ABSTAIN_MESSAGE",
    "DEFAULT_DIRECT_PROMPT",
    "DeepRAGQueryEngine",
    "DeepRAGStepEvent",
    "FlareMethod",
    "GatedQueryEngine",
    "QuCoQueryEngine",
    "SubQuestionMethod",
    "deeprag_metadata",
    "quco_metadata",
]
