"""A local dense index (Qdrant folder) searched by several clients at once: read-only copies,
and the typed error a second writer gets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag_gates.errors import StoreLockedError
from rag_gates.retrieval.dense import QdrantDenseRetriever
from rag_gates.types import Passage

pytest.importorskip("qdrant_client")

PASSAGES = [Passage(id="p1", title="France", text="The capital of France is Paris."),
            Passage(id="p2", text="William Shakespeare wrote Hamlet in London."),
            Passage(id="p3", text="The quick brown fox jumps over the lazy dog.")]


class LetterCounts:
    """A deterministic sentence encoder: normalised letter counts (enough to rank these)."""

    def encode(self, texts: list[str], **_: Any) -> Any:
        rows = np.zeros((len(texts), 26), dtype=np.float32)
        for i, text in enumerate(texts):
            for ch in text.lower():
                if "a" <= ch <= "z":
                    rows[i, ord(ch) - 97] += 1
        return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


def test_read_only_copies_of_one_dense_index_search_at_once(tmp_path: Path) -> None:
    where = str(tmp_path / "qdrant")
    built = QdrantDenseRetriever.build(PASSAGES, path=where, embedder=LetterCounts())
    expected = [p.id for p in built.retrieve("Who wrote Hamlet?", k=3)]
    with pytest.raises(StoreLockedError, match=r"read_only=True.*url=http://HOST:6333"):
        QdrantDenseRetriever.connect(where)  # a second writer while the builder holds it
    built.client.close()
    copies = [QdrantDenseRetriever(QdrantDenseRetriever.connect(where, read_only=True),
                                   "passages", LetterCounts()) for _ in range(2)]
    for copy in copies:
        assert [p.id for p in copy.retrieve("Who wrote Hamlet?", k=3)] == expected
    writer = QdrantDenseRetriever.connect(where)  # the copies left the folder free
    writer.close()
