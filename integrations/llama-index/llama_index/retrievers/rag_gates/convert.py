"""LlamaIndex nodes <-> rag-gates passages, and non-mutating node annotation.

Conventions:

* ``Passage.id`` is the node id, ``Passage.text`` the node's content without metadata
  (``MetadataMode.NONE``), ``Passage.score`` the ``NodeWithScore`` score.
* ``Passage.title`` is ``node.metadata["title"]`` (when a string); the other metadata
  entries become ``Passage.metadata``. Values that are not JSON (dates, objects) are stored
  as their ``str()``, since passages must round-trip through JSON.
* Relationships, embeddings and other node fields stay with the node; a passage made back
  into a node is a plain ``TextNode``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore, TextNode
from pydantic import JsonValue

from rag_gates.types import Passage

__all__ = [
    "ANNOTATION_KEY",
    "TITLE_KEY",
    "annotate_node",
    "node_to_passage",
    "nodes_to_passages",
    "passage_to_node",
    "passages_to_nodes",
]

TITLE_KEY = "title"
"""Metadata key that holds a passage's title on the node side."""
ANNOTATION_KEY = "rag_gates"
"""Default metadata key for rag-gates annotations (scores, verdicts) on nodes."""


def _jsonable(value: Any) -> JsonValue:
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value)


def _split(node: NodeWithScore | BaseNode) -> tuple[BaseNode, float | None]:
    if isinstance(node, NodeWithScore):
        return node.node, node.score
    if isinstance(node, BaseNode):
        return node, None
    raise TypeError(
        f"expected a llama_index NodeWithScore or BaseNode (TextNode, Document), "
        f"got {type(node).__name__}"
    )


def node_to_passage(node: NodeWithScore | BaseNode) -> Passage:
    """A rag-gates ``Passage`` with the node's id, text, score, title and metadata."""
    base, score = _split(node)
    metadata = dict(base.metadata)
    title = metadata.get(TITLE_KEY)
    if isinstance(title, str):
        del metadata[TITLE_KEY]
    else:
        title = None  # a non-string "title" stays an ordinary metadata entry
    return Passage(
        text=base.get_content(metadata_mode=MetadataMode.NONE),
        id=base.node_id,
        title=title,
        score=score,
        metadata={str(k): _jsonable(v) for k, v in metadata.items()},
    )


def nodes_to_passages(nodes: Iterable[NodeWithScore | BaseNode]) -> list[Passage]:
    """:func:`node_to_passage` over a list, order kept."""
    return [node_to_passage(n) for n in nodes]


def passage_to_node(passage: Passage) -> NodeWithScore:
    """A ``NodeWithScore`` over a ``TextNode`` with the passage's id, text and metadata.

    The title goes to ``metadata["title"]`` (it wins over a ``"title"`` already in the
    passage's metadata). A passage without id gets a fresh node id.
    """
    if not isinstance(passage, Passage):
        raise TypeError(f"expected a rag_gates.types.Passage, got {type(passage).__name__}")
    metadata: dict[str, Any] = copy.deepcopy(passage.metadata)
    if passage.title is not None:
        metadata[TITLE_KEY] = passage.title
    fields: dict[str, Any] = {"text": passage.text, "metadata": metadata}
    if passage.id is not None:
        fields["id_"] = passage.id
    return NodeWithScore(node=TextNode(**fields), score=passage.score)


def passages_to_nodes(passages: Iterable[Passage]) -> list[NodeWithScore]:
    """:func:`passage_to_node` over a list, order kept."""
    return [passage_to_node(p) for p in passages]


def annotate_node(
    node: NodeWithScore | BaseNode,
    key: str = ANNOTATION_KEY,
    value: Mapping[str, Any] | None = None,
) -> NodeWithScore:
    """A copy of ``node`` with ``metadata[key] = value``; the caller's node is not touched.

    The copy gets deep copies of the metadata and of ``value``, and ``key`` is added to the
    node's excluded LLM and embedding metadata keys, so annotations never leak into prompts
    or embeddings. Other fields (relationships, embedding) are shared with the original;
    nothing here modifies them. A ``BaseNode`` comes back wrapped with ``score=None``.
    """
    if not isinstance(key, str) or not key:
        raise ValueError(f"key must be a non-empty string, got {key!r}")
    if value is not None and not isinstance(value, Mapping):
        raise TypeError(f"value must be a dict of annotations, got {type(value).__name__}")
    base, score = _split(node)
    metadata = copy.deepcopy(base.metadata)
    metadata[key] = copy.deepcopy(dict(value or {}))
    annotated = base.model_copy(
        update={
            "metadata": metadata,
            "excluded_llm_metadata_keys": _with(base.excluded_llm_metadata_keys, key),
            "excluded_embed_metadata_keys": _with(base.excluded_embed_metadata_keys, key),
        }
    )
    return NodeWithScore(node=annotated, score=score)


def _with(keys: list[str], key: str) -> list[str]:
    return list(keys) if key in keys else [*keys, key]
