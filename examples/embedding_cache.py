"""Embed your documents once: each framework's own embedding cache, on disk, shared by runs.

Embedding the 491 example documents with all-MiniLM-L6-v2 took 16-43 s on the 2-core machine
the benchmarks run on (two threads, one), most of an example's run, and gives the same vectors
every time. So the examples embed
them through the cache each framework ships, and a second run (or another example) reads the
vectors back instead of computing them:

- LangChain: :func:`cached_embeddings` wraps your embeddings in ``CacheBackedEmbeddings`` over a
  ``LocalFileStore`` (one file per document text, keyed by its SHA-256). Questions are embedded
  afresh each time (``query_embedding_cache`` stays off), as the store's retriever expects.
- LlamaIndex: :func:`embedded_nodes` runs the documents through an ``IngestionPipeline``
  (the splitting ``VectorStoreIndex.from_documents`` applies, then your embedding model) with an
  ``IngestionCache`` persisted to a file; ``VectorStoreIndex(nodes, ...)`` then stores the
  nodes' vectors without embedding them again.

What a key covers: in LangChain, the text and the embeddings' ``model_name``, ``model_kwargs``
and ``encode_kwargs``; in LlamaIndex, every document's text with all its metadata and the
embedding model's serialised fields (name or path, normalisation, maximum length, batch
size), all documents together, so one edited document embeds them all again. Not the
model's weights: delete :data:`EMBEDDING_CACHE` after replacing a model's files in place. It
lives under ``$RAG_GATES_HOME`` (default ``~/.cache/rag-gates``), beside the extracted models.
Every file is written whole or not at all (written beside, then renamed), so an interrupted
run leaves no half-written vector behind.

    >>> from langchain_huggingface import HuggingFaceEmbeddings      # doctest: +SKIP
    >>> from rag_gates.lm import default_embedder_path              # doctest: +SKIP
    >>> embeddings = cached_embeddings(HuggingFaceEmbeddings(       # doctest: +SKIP
    ...     model_name=str(default_embedder_path())))
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rag_gates.lm import rag_gates_home

EMBEDDING_CACHE = rag_gates_home() / "example-embeddings"


def _settings_key(settings: dict[str, Any]) -> str:
    """A short, file-name-safe key for an embedding model's settings."""
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _atomic_file_store(root: Path) -> Any:
    """LangChain's ``LocalFileStore`` whose ``mset`` writes each value under a temporary key,
    then renames it over the real one (``LocalFileStore`` writes in place)."""
    from langchain_classic.storage import LocalFileStore

    class AtomicLocalFileStore(LocalFileStore):
        def mset(self, key_value_pairs: Sequence[tuple[str, bytes]]) -> None:
            for key, value in key_value_pairs:
                partial = f"{key}.{os.getpid()}.partial"
                super().mset([(partial, value)])
                os.replace(Path(self.root_path) / partial, Path(self.root_path) / key)

    return AtomicLocalFileStore(root)


def cached_embeddings(embeddings: Any, cache_dir: Path | None = None) -> Any:
    """``embeddings`` (LangChain's ``HuggingFaceEmbeddings``) behind ``CacheBackedEmbeddings``:
    ``embed_documents`` reads each text's vector from ``cache_dir`` (default
    ``EMBEDDING_CACHE / "langchain"``) and computes only the missing ones."""
    from langchain_classic.embeddings import CacheBackedEmbeddings

    namespace = _settings_key({"model_name": embeddings.model_name,
                               "model_kwargs": embeddings.model_kwargs,
                               "encode_kwargs": embeddings.encode_kwargs})
    store = _atomic_file_store(cache_dir or EMBEDDING_CACHE / "langchain")
    return CacheBackedEmbeddings.from_bytes_store(embeddings, store, namespace=namespace,
                                                  key_encoder="sha256")


def embedded_nodes(documents: Sequence[Any], embed_model: Any,
                   cache_dir: Path | None = None) -> list[Any]:
    """The nodes ``VectorStoreIndex.from_documents(documents, embed_model=embed_model)`` would
    store, each with its embedding, computed once and read back from the ingestion cache in
    ``cache_dir`` (default ``EMBEDDING_CACHE / "llama-index"``) on later runs."""
    from llama_index.core import Settings
    from llama_index.core.ingestion import IngestionCache, IngestionPipeline

    directory = cache_dir or EMBEDDING_CACHE / "llama-index"
    path = directory / "ingestion_cache.json"
    cache = IngestionCache.from_persist_path(str(path)) if path.exists() else IngestionCache()
    pipeline = IngestionPipeline(transformations=[*Settings.transformations, embed_model],
                                 cache=cache)
    nodes = pipeline.run(documents=list(documents))
    # Write beside the file, then rename: a run reading the cache never sees half a file.
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".ingestion_cache.", dir=directory)
    os.close(fd)
    try:
        cache.persist(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return list(nodes)
