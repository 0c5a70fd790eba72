"""Convert between LangChain ``Document`` and rag-gates ``Passage``.

Both directions build new objects: the caller's documents and passages are never changed,
and the result shares no mutable metadata with the input.
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

from langchain_core.documents import Document
from pydantic import JsonValue

from rag_gates.types import Passage

__all__ = [
    "annotate_document",
    "document_to_passage",
    "documents_to_passages",
    "passage_to_document",
    "passages_to_documents",
]

ANNOTATION_KEY = "rag_gates"
"""Default metadata key for rag-gates annotations (gate decisions, scores) on documents."""

# Metadata keys read as the passage score, in order: the usual key, then the one
# LangChain rerankers (Cohere, FlashRank, cross-encoders) write.
SCORE_KEYS = ("score", "relevance_score")


def _json_safe(value: Any) -> JsonValue:
    """A JSON-safe copy of ``value``: containers rebuilt, anything else non-JSON as str()."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, numbers.Integral):  # int, numpy integers
        return int(value)
    if isinstance(value, numbers.Real):  # float, numpy floats
        number = float(value)
        # NaN and infinities are not JSON; str() keeps them readable and reversible.
        return number if math.isfinite(number) else str(number)
    if isinstance(value, Mapping):
        return _json_safe_dict(value)
    if isinstance(value, list | tuple | set | frozenset):
        return [_json_safe(v) for v in value]
    return str(value)


def _json_safe_dict(mapping: Mapping[Any, Any]) -> dict[str, JsonValue]:
    return {str(k): _json_safe(v) for k, v in mapping.items()}


def _score(metadata: Mapping[str, Any]) -> float | None:
    for key in SCORE_KEYS:
        value = metadata.get(key)
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            number = float(value)
            if math.isfinite(number):
                return number
    return None


def document_to_passage(doc: Document, *, score: float | None = None) -> Passage:
    """A LangChain ``Document`` as a rag-gates ``Passage``.

    - ``text``: ``doc.page_content``.
    - ``id``: ``doc.id``, else ``metadata["id"]`` (as str), else None.
    - ``title``: ``metadata["title"]`` (as str), else None.
    - ``score``: the ``score`` argument, else a finite number in ``metadata["score"]`` or
      ``metadata["relevance_score"]``, else None.
    - ``metadata``: a JSON-safe copy of ``doc.metadata`` (title, id and score included, so
      :func:`passage_to_document` restores them). Keys become str; tuples and sets become
      lists; any value JSON cannot hold (datetime, Path, NaN, custom objects, ...) is
      converted with ``str()``, so it comes back as a string.
    """
    if not isinstance(doc, Document):
        raise TypeError(
            f"expected a langchain_core Document, got {type(doc).__name__}; "
            "build one with Document(page_content=text, metadata={...})"
        )
    metadata = doc.metadata or {}
    doc_id = doc.id if doc.id is not None else metadata.get("id")
    title = metadata.get("title")
    return Passage(
        text=doc.page_content,
        id=None if doc_id is None else str(doc_id),
        title=None if title is None else str(title),
        score=score if score is not None else _score(metadata),
        metadata=_json_safe_dict(metadata),
    )


def passage_to_document(passage: Passage) -> Document:
    """A rag-gates ``Passage`` as a LangChain ``Document``.

    ``id`` becomes ``Document.id``; ``title`` and ``score`` are written to the metadata
    (``"title"``, ``"score"``) unless the metadata already holds them (``score`` also counts
    as held under ``"relevance_score"``), so a Document -> Passage -> Document round trip
    gives back an equal Document.
    """
    if not isinstance(passage, Passage):
        raise TypeError(f"expected a rag_gates Passage, got {type(passage).__name__}")
    # Deep copy: a Passage is frozen, but its metadata dict and nested values are not.
    metadata = copy.deepcopy(dict(passage.metadata))
    if passage.title is not None:
        metadata.setdefault("title", passage.title)
    if passage.score is not None and not any(k in metadata for k in SCORE_KEYS):
        metadata["score"] = passage.score
    return Document(page_content=passage.text, id=passage.id, metadata=metadata)


def documents_to_passages(docs: Iterable[Document | tuple[Document, float]]) -> list[Passage]:
    """Convert documents, or ``(document, score)`` pairs as ``similarity_search_with_score``
    returns them."""
    out: list[Passage] = []
    for item in docs:
        if isinstance(item, tuple):
            doc, score = item
            out.append(document_to_passage(doc, score=float(score)))
        else:
            out.append(document_to_passage(item))
    return out


def passages_to_documents(passages: Iterable[Passage]) -> list[Document]:
    """Convert passages to documents, in order."""
    return [passage_to_document(p) for p in passages]


def annotate_document(
    doc: Document, value: Mapping[str, Any], key: str = ANNOTATION_KEY
) -> Document:
    """A copy of ``doc`` with ``metadata[key] = value``; ``doc`` itself is not touched.

    The copy gets deep copies of the metadata and of ``value`` (same class, id and other
    fields), so later changes to either side do not leak into the other.
    """
    if not isinstance(doc, Document):
        raise TypeError(f"expected a langchain_core Document, got {type(doc).__name__}")
    if not isinstance(key, str) or not key:
        raise ValueError(f"key must be a non-empty string, got {key!r}")
    if not isinstance(value, Mapping):
        raise TypeError(f"value must be a dict of annotations, got {type(value).__name__}")
    metadata = copy.deepcopy(dict(doc.metadata))
    metadata[key] = copy.deepcopy(dict(value))
    return doc.model_copy(update={"metadata": metadata})
