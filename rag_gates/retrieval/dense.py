"""Dense retrieval: sentence-transformer embeddings in a Qdrant collection.

Local mode (``path=...`` or ``":memory:"``) is the embedded default; ``url=...`` takes a Qdrant
server or cluster with the same code.

Example:
    >>> from rag_gates.retrieval import QdrantDenseRetriever
    >>> dense = QdrantDenseRetriever.build(passages, path="indexes/qdrant")  # MiniLM default
    >>> dense.retrieve("Who directed Ed Wood?", k=3)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rag_gates._optional import require
from rag_gates.retrieval.base import BatchRetriever
from rag_gates.types import Passage

__all__ = ["QdrantDenseRetriever"]


class QdrantDenseRetriever(BatchRetriever):
    """Cosine search over passage embeddings stored (with the passages) in Qdrant."""

    def __init__(self, client: Any, collection: str, embedder: Any | None = None) -> None:
        self.client = client
        self.collection = collection
        if embedder is None:
            from rag_gates.lm.defaults import load_default_embedder

            embedder = load_default_embedder()
        self.embedder = embedder

    @property
    def name(self) -> str:
        return "dense"

    @staticmethod
    def connect(path: str | None = None, url: str | None = None, *, read_only: bool = False,
                collection: str = "passages", api_key: str | None = None) -> Any:
        """A Qdrant client: local ``path`` (or ``":memory:"``), else a server ``url``.

        ``read_only``: a private in-memory copy of ``collection`` from the local ``path``,
        the folder released at once, so several processes search one index; without it the
        client is the folder's one writer (a folder held elsewhere raises
        :class:`~rag_gates.errors.StoreLockedError`). A server ``url`` is checked (no
        credentials or query string: pass ``api_key``) and asked for its collections once,
        so an unreachable one fails here with :class:`~rag_gates.errors.VectorStoreError`.
        """
        qdrant_client = require("qdrant_client", "qdrant")
        if url is not None:
            from rag_gates._qdrant import connect_server
            from rag_gates.errors import VectorStoreError

            return connect_server(url, api_key=api_key, what="url", error=VectorStoreError,
                                  hint="start it, check the URL and API key, or pass path= "
                                       "for a local index")
        if path in (None, ":memory:"):
            return qdrant_client.QdrantClient(location=":memory:")
        from pathlib import Path

        from rag_gates._qdrant import open_local, read_only_copy

        if read_only:
            return read_only_copy(Path(path), collection, what="dense index")[0]
        return open_local(Path(path), read_only_hint="QdrantDenseRetriever.connect(path, "
                                                     "read_only=True)")

    @classmethod
    def build(cls, passages: Sequence[Passage], *, path: str | None = None,
              url: str | None = None, collection: str = "passages", embedder: Any | None = None,
              batch_size: int = 64, show_progress: bool = False,
              api_key: str | None = None) -> QdrantDenseRetriever:
        """Embed ``passages`` and (re)create ``collection`` holding them."""
        if not passages:
            raise ValueError("cannot index an empty list of passages")
        models = require("qdrant_client.models", "qdrant")
        retriever = cls(cls.connect(path, url, api_key=api_key), collection, embedder)
        texts = [f"{p.title}\n{p.text}" if p.title else p.text for p in passages]
        vectors = retriever.embedder.encode(texts, batch_size=batch_size,
                                            normalize_embeddings=True,
                                            show_progress_bar=show_progress)
        client = retriever.client
        if client.collection_exists(collection):
            client.delete_collection(collection)
        client.create_collection(collection, vectors_config=models.VectorParams(
            size=int(vectors.shape[1]), distance=models.Distance.COSINE))
        for lo in range(0, len(passages), 512):
            client.upsert(collection, points=[
                models.PointStruct(id=i, vector=vectors[i].tolist(),
                                   payload=passages[i].model_dump(mode="json"))
                for i in range(lo, min(lo + 512, len(passages)))
            ])
        return retriever

    def _retrieve_batch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        vectors = self.embedder.encode(list(queries), normalize_embeddings=True,
                                       show_progress_bar=False)
        out = []
        for vector in vectors:
            hits = self.client.query_points(self.collection, query=vector.tolist(), limit=k,
                                            with_payload=True).points
            out.append([Passage.model_validate(h.payload).model_copy(update={"score": h.score})
                        for h in hits])
        return out
