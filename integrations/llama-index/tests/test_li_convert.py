"""Node <-> Passage conversion and non-mutating annotation."""

from __future__ import annotations

import copy
import datetime as dt

import pytest
from llama_index.core.schema import (
    Document,
    MetadataMode,
    NodeRelationship,
    NodeWithScore,
    RelatedNodeInfo,
    TextNode,
)
from llama_index.retrievers.rag_gates import (
    annotate_node,
    node_to_passage,
    nodes_to_passages,
    passage_to_node,
    passages_to_nodes,
)

from rag_gates.types import Passage


def make_node() -> NodeWithScore:
    node = TextNode(
        id_="n1",
        text="Paris is the capital of France.",
        metadata={"title": "France", "source": "wiki", "year": 2024, "tags": ["geo"]},
        relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id="doc-1")},
        embedding=[0.1, 0.2],
    )
    return NodeWithScore(node=node, score=0.75)


def test_node_to_passage() -> None:
    p = node_to_passage(make_node())
    assert p == Passage(
        text="Paris is the capital of France.",
        id="n1",
        title="France",
        score=0.75,
        metadata={"source": "wiki", "year": 2024, "tags": ["geo"]},
    )
    bare = node_to_passage(make_node().node)  # a BaseNode has no score
    assert bare.score is None and bare.id == "n1"


def test_round_trips() -> None:
    nws = make_node()
    back = passage_to_node(node_to_passage(nws))
    assert back.node.node_id == "n1" and back.score == 0.75
    assert back.node.get_content(metadata_mode=MetadataMode.NONE) == nws.node.get_content(
        metadata_mode=MetadataMode.NONE
    )
    assert back.node.metadata == nws.node.metadata
    passage = Passage(text="t", id="p", title="T", score=1.5, metadata={"a": {"b": [1, None]}})
    assert node_to_passage(passage_to_node(passage)) == passage
    assert nodes_to_passages(passages_to_nodes([passage, passage])) == [passage, passage]


def test_passage_without_id_or_title() -> None:
    node = passage_to_node(Passage(text="plain"))
    assert node.node.node_id and node.score is None and node.node.metadata == {}
    assert node_to_passage(node).title is None


def test_document_and_non_json_metadata() -> None:
    when = dt.date(2024, 5, 1)
    doc = Document(text="body", metadata={"title": 3, "when": when})
    p = node_to_passage(doc)
    assert p.text == "body" and p.id == doc.doc_id
    assert p.title is None  # a non-string "title" stays ordinary metadata
    assert p.metadata == {"title": 3, "when": "2024-05-01"}
    assert Passage.model_validate_json(p.model_dump_json()) == p


def test_annotate_node_copies_and_never_mutates() -> None:
    nws = make_node()
    before = copy.deepcopy(nws.model_dump())
    metadata_obj = nws.node.metadata
    value = {"cbdr": {"score": 0.9, "keep": True}}
    out = annotate_node(nws, "rag_gates", value)
    assert out is not nws and out.node is not nws.node
    assert out.node.metadata["rag_gates"] == value and out.score == 0.75
    assert out.node.node_id == "n1"
    # The caller's node, its metadata dict and the value are unchanged.
    assert nws.model_dump() == before
    assert nws.node.metadata is metadata_obj and "rag_gates" not in metadata_obj
    out.node.metadata["rag_gates"]["cbdr"]["score"] = 0.0
    out.node.metadata["tags"].append("changed")
    assert value["cbdr"]["score"] == 0.9 and nws.node.metadata["tags"] == ["geo"]
    # The annotation never reaches prompts or embeddings.
    assert "rag_gates" not in out.node.get_content(metadata_mode=MetadataMode.LLM)
    assert "rag_gates" not in out.node.get_content(metadata_mode=MetadataMode.EMBED)
    assert nws.node.excluded_llm_metadata_keys == []


def test_annotate_node_defaults_and_errors() -> None:
    node = make_node().node
    out = annotate_node(node, value={"x": 1})
    assert isinstance(out, NodeWithScore) and out.score is None
    assert out.node.metadata["rag_gates"] == {"x": 1}
    twice = annotate_node(out, value={"y": 2})
    assert twice.node.metadata["rag_gates"] == {"y": 2}
    assert twice.node.excluded_llm_metadata_keys.count("rag_gates") == 1
    assert annotate_node(node).node.metadata["rag_gates"] == {}
    with pytest.raises(ValueError, match="key"):
        annotate_node(node, "", {})
    with pytest.raises(TypeError, match="dict"):
        annotate_node(node, "k", [1])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="NodeWithScore"):
        node_to_passage("text")  # type: ignore[arg-type]
