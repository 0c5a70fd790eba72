"""LlamaIndex retrieval integration of rag-gates.

* :class:`GatedRetriever`: any LlamaIndex retriever behind any rag-gates gate (retrieve only
  when the gate says so), reporting each :class:`GateDecisionEvent` through instrumentation.
* :class:`SelfRoutingRetriever`: SR-RAG's routing: the wrapped retriever's nodes, or one
  node of the model's own verbalized knowledge, by ``p_M * p_D >= tau``.
* :class:`PassageRetriever`: any rag-gates retriever (BM25, dense Qdrant) as a LlamaIndex one.
* :class:`LlamaIndexRetrieverAdapter`: any LlamaIndex retriever as a rag-gates ``Retriever``
  (what rag-gates pipelines such as QuCo take).
* Node <-> Passage conversion and non-mutating node annotation.
"""

from llama_index.retrievers.rag_gates.adapter import LlamaIndexRetrieverAdapter
from llama_index.retrievers.rag_gates.base import PassageRetriever
from llama_index.retrievers.rag_gates.convert import (
    ANNOTATION_KEY,
    TITLE_KEY,
    annotate_node,
    node_to_passage,
    nodes_to_passages,
    passage_to_node,
    passages_to_nodes,
)
from llama_index.retrievers.rag_gates.gated import GateDecisionEvent, GatedRetriever
from llama_index.retrievers.rag_gates.srrag import SelfRoutingRetriever

__all__ = [
    "ANNOTATION_KEY",
    "TITLE_KEY",
    "GateDecisionEvent",
    "GatedRetriever",
    "LlamaIndexRetrieverAdapter",
    "PassageRetriever",
    "SelfRoutingRetriever",
    "annotate_node",
    "node_to_passage",
    "nodes_to_passages",
    "passage_to_node",
    "passages_to_nodes",
]
