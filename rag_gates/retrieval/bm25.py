"""BM25 over a list of passages (bm25s: sparse matrices, milliseconds per query).

Example:
    >>> from rag_gates.retrieval import BM25Retriever
    >>> bm25 = BM25Retriever.from_passages(passages)
    >>> bm25.retrieve("Who directed Ed Wood?", k=3)
    >>> bm25.save("indexes/bm25"); BM25Retriever.load("indexes/bm25")
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rag_gates._optional import require
from rag_gates.retrieval.base import BatchRetriever
from rag_gates.types import Passage

__all__ = ["BM25Retriever"]

_PASSAGES = "passages.jsonl"


class BM25Retriever(BatchRetriever):
    """BM25 (Lucene variant) with English stopwords, lower-cased word tokens."""

    def __init__(self, index: Any, passages: Sequence[Passage]) -> None:
        self._index = index
        self.passages = list(passages)

    @property
    def name(self) -> str:
        return "bm25"

    @classmethod
    def from_passages(cls, passages: Sequence[Passage], *, show_progress: bool = False
                      ) -> BM25Retriever:
        if not passages:
            raise ValueError("cannot index an empty list of passages")
        bm25s = require("bm25s", "eval")
        texts = [f"{p.title}\n{p.text}" if p.title else p.text for p in passages]
        tokens = bm25s.tokenize(texts, stopwords="en", show_progress=show_progress)
        index = bm25s.BM25()
        index.index(tokens, show_progress=show_progress)
        return cls(index, passages)

    def _retrieve_batch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        bm25s = require("bm25s", "eval")
        k = min(k, len(self.passages))
        tokens = bm25s.tokenize(list(queries), stopwords="en", return_ids=False,
                                show_progress=False)
        # A query of only stopwords has no tokens; bm25s then scores every passage 0.
        ids, scores = self._index.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        return [
            [self.passages[int(i)].model_copy(update={"score": float(s)})
             for i, s in zip(row_ids, row_scores, strict=True) if s > 0]
            for row_ids, row_scores in zip(ids, scores, strict=True)
        ]

    def save(self, directory: str | Path, *, replace: bool = True) -> Path:
        """Write the index and passages; atomic (temp dir, then rename).

        ``replace=False`` keeps a complete index already at ``directory`` (a cache that
        another process built at the same time: readers may be using it)."""
        target = Path(directory)
        target.parent.mkdir(parents=True, exist_ok=True)
        build = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            self._index.save(str(build), show_progress=False)
            with (build / _PASSAGES).open("w", encoding="utf-8") as out:
                for p in self.passages:
                    out.write(p.model_dump_json() + "\n")
            if not replace and (target / _PASSAGES).is_file():
                return target
            if target.exists():
                shutil.rmtree(target)
            try:
                os.rename(build, target)
            except OSError:
                if replace or not (target / _PASSAGES).is_file():
                    raise  # not another process's finished copy
        finally:
            if build.exists():
                shutil.rmtree(build, ignore_errors=True)
        return target

    @classmethod
    def load(cls, directory: str | Path) -> BM25Retriever:
        bm25s = require("bm25s", "eval")
        path = Path(directory)
        if not (path / _PASSAGES).is_file():
            raise FileNotFoundError(f"{path} is not a saved BM25Retriever (no {_PASSAGES})")
        index = bm25s.BM25.load(str(path), show_progress=False)
        return cls(index, _read_passages(path / _PASSAGES))


def _read_passages(file: Path) -> list[Passage]:
    """The passages of a saved index, through the bounded reader: a damaged line raises
    :class:`~rag_gates.errors.ArtifactFileError` naming ``FILE:LINE``."""
    from rag_gates._files import iter_models
    from rag_gates.errors import ArtifactFileError

    return list(iter_models(file, Passage, what="a passage", finite=False,
                            fix="the saved index is damaged; delete it and build it again",
                            error=ArtifactFileError))
