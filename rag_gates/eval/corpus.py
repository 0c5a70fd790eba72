"""The open-retrieval corpus of a dataset: the union of every row's context paragraphs,
de-duplicated by (title, text), indexed with BM25 and densely (MiniLM in local Qdrant).

Indexes are built once and cached under ``$RAG_GATES_HOME/indexes/<dataset>-<hash>/``; the
hash covers the data file's bytes, so a changed file gets a new index.

Example:
    >>> from rag_gates.eval.corpus import load_retriever
    >>> bm25 = load_retriever("hotpotqa", "bm25")     # builds on first use, then loads
    >>> bm25.retrieve("Who directed Ed Wood?", k=3)
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Literal

from rag_gates.eval.datasets import load_dataset, resolve_dataset_file
from rag_gates.lm.defaults import rag_gates_home
from rag_gates.retrieval.base import Retriever
from rag_gates.types import Passage

__all__ = ["RETRIEVERS", "corpus_passages", "index_dir", "load_retriever"]

logger = logging.getLogger(__name__)

RETRIEVERS = ("bm25", "dense")
RetrieverName = Literal["bm25", "dense"]


def _file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:12]


def corpus_passages(dataset: str, path: str | Path | None = None) -> list[Passage]:
    """Every distinct context paragraph of the whole dataset file, in first-seen order."""
    load = load_dataset(dataset, path)
    seen: dict[tuple[str | None, str], Passage] = {}
    for example in load.examples:
        for p in example.context:
            key = (p.title, p.text)
            if p.text and key not in seen:
                seen[key] = p.model_copy(update={"id": f"{dataset}-{len(seen)}"})
    if not seen:
        raise ValueError(f"{dataset} has no context paragraphs to retrieve from")
    return list(seen.values())


def index_dir(dataset: str, path: str | Path | None = None) -> Path:
    """Cache directory of a dataset's indexes (keyed by the data file's content hash)."""
    file = resolve_dataset_file(dataset, path)
    return rag_gates_home() / "indexes" / f"{dataset}-{_file_hash(file)}"


def load_retriever(dataset: str, kind: str = "bm25", path: str | Path | None = None
                   ) -> Retriever:
    """BM25 or dense retriever over the dataset's union corpus, built once and cached."""
    if kind not in RETRIEVERS:
        raise ValueError(f"unknown retriever {kind!r}; valid names: {', '.join(RETRIEVERS)}")
    directory = index_dir(dataset, path) / kind
    if kind == "bm25":
        from rag_gates.retrieval.bm25 import BM25Retriever

        if (directory / "passages.jsonl").is_file():
            return BM25Retriever.load(directory)
        passages = corpus_passages(dataset, path)
        logger.info("indexing %d %s paragraphs with BM25", len(passages), dataset)
        bm25 = BM25Retriever.from_passages(passages)
        bm25.save(directory)
        return bm25
    from rag_gates.retrieval.dense import QdrantDenseRetriever

    done = directory / "complete"
    if done.is_file():
        return QdrantDenseRetriever(QdrantDenseRetriever.connect(str(directory / "qdrant")),
                                    "passages")
    passages = corpus_passages(dataset, path)
    logger.info("embedding %d %s paragraphs into local Qdrant", len(passages), dataset)
    directory.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=".dense.", dir=directory.parent))
    try:
        dense = QdrantDenseRetriever.build(passages, path=str(build / "qdrant"),
                                           show_progress=True)
        dense.client.close()
        (build / "complete").write_text(str(len(passages)))
        if directory.exists():
            shutil.rmtree(directory)
        os.rename(build, directory)
    finally:
        if build.exists():
            shutil.rmtree(build, ignore_errors=True)
    return QdrantDenseRetriever(QdrantDenseRetriever.connect(str(directory / "qdrant")),
                                "passages", dense.embedder)
