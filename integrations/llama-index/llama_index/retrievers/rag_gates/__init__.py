"""LlamaIndex retrieval integration of rag-gates: Node <-> Passage conversion and node
annotation (retrievers and postprocessors build on these)."""

from llama_index.retrievers.rag_gates.convert import (
    ANNOTATION_KEY,
    TITLE_KEY,
    annotate_node,
    node_to_passage,
    nodes_to_passages,
    passage_to_node,
    passages_to_nodes,
)

__all__ = [
    "ANNOTATION_KEY",
    "TITLE_KEY",
    "annotate_node",
    "node_to_passage",
    "nodes_to_passages",
    "passage_to_node",
    "passages_to_nodes",
]
