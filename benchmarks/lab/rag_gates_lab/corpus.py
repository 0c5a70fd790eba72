"""The open-retrieval corpus of a dataset: the union of every row's context paragraphs,
de-duplicated by (title, text), indexed with BM25 and densely (MiniLM in local Qdrant), and
the corpus-statistics index (infini-gram) QuCo-RAG's gate and verifier count entities in.

Retrieval indexes are built once and cached under ``$RAG_GATES_HOME/indexes/<dataset>-<hash>/``;
the hash covers the data file's bytes, so a changed file gets a new index.

The corpus-statistics index (:func:`load_corpus_stats`) covers the union of several datasets'
paragraphs (by default HotpotQA and 2WikiMultihopQA: both draw on the same Wikipedia), one
document per distinct (title, paragraph) with the title as its first line, so an entity named
only in a title is counted too; cased by default, as QuCo-RAG's authors' infini-gram index is,
with entities counted in the casing names are written in (see :func:`load_corpus_stats`). It
is cached under
``$RAG_GATES_HOME/indexes/corpus-stats-<hash>/``; the hash covers the data files' bytes, the
tokenizer, the build options and the document format, so changed data gets a new index. With
only the slices shipped in ``examples/data`` (no ``../shared``) it builds in seconds.

Example:
    >>> from rag_gates_lab.corpus import load_retriever, load_corpus_stats
    >>> bm25 = load_retriever("hotpotqa", "bm25")     # builds on first use, then loads
    >>> bm25.retrieve("Who directed Ed Wood?", k=3)
    >>> stats = load_corpus_stats()                   # hotpotqa + 2wiki paragraphs
    >>> stats.count("Ed Wood").value
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from rag_gates.corpus.base import CorpusStats
from rag_gates.corpus.paragraphs import (
    build_paragraph_stats,
    file_digest,
    paragraph_documents,
    publish_stats_index,
    stats_key,
    stats_options,
)
from rag_gates.lm.defaults import rag_gates_home
from rag_gates.retrieval.base import Retriever
from rag_gates.types import Passage
from rag_gates_lab.datasets import load_dataset, resolve_dataset_file
from rag_gates_lab.testbed.dataset import is_testbed

__all__ = [
    "CORPUS_STATS_DATASETS",
    "RETRIEVERS",
    "build_corpus_stats",
    "build_testbed_corpus_stats",
    "corpus_key",
    "corpus_passages",
    "corpus_stats_dir",
    "corpus_stats_documents",
    "index_dir",
    "load_corpus_stats",
    "load_retriever",
]

logger = logging.getLogger(__name__)

RETRIEVERS = ("bm25", "dense")
RetrieverName = Literal["bm25", "dense"]

#: The datasets whose paragraphs the default corpus-statistics index covers.
CORPUS_STATS_DATASETS = ("hotpotqa", "2wiki")


def _file_hash(path: Path) -> str:
    return file_digest(path)[:12]


def corpus_passages(dataset: str, path: str | Path | None = None) -> list[Passage]:
    """Every distinct context paragraph of the whole dataset file, in first-seen order
    (for ``testbed:DIR``: its retrieval corpus, one passage per fact plus the paragraphs)."""
    if is_testbed(dataset):
        from rag_gates_lab.testbed.dataset import testbed_passages

        return testbed_passages(dataset)
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


def corpus_key(dataset: str, path: str | Path | None = None) -> str:
    """The content hash of what a dataset's retrieval corpus is built from (the data file;
    a testbed's ``passages.jsonl``): the key of its cached indexes and of eval-gate's labels.

    Example:
        >>> corpus_key("hotpotqa", "examples/data/hotpotqa_dev_sample.jsonl")  # doctest: +SKIP
        '3f1c0b9e2d4a'
    """
    if is_testbed(dataset):
        from rag_gates_lab.testbed.dataset import testbed_dir

        return _file_hash(testbed_dir(dataset) / "passages.jsonl")
    return _file_hash(resolve_dataset_file(dataset, path))


def index_dir(dataset: str, path: str | Path | None = None) -> Path:
    """Cache directory of a dataset's indexes (keyed by :func:`corpus_key`); a testbed keeps
    its indexes inside its own directory."""
    if is_testbed(dataset):
        from rag_gates_lab.testbed.dataset import testbed_dir

        return testbed_dir(dataset) / "indexes" / f"retrieval-{corpus_key(dataset)}"
    return rag_gates_home() / "indexes" / f"{dataset}-{corpus_key(dataset, path)}"


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
        # Another process may have built the same cache meanwhile: its copy stands.
        bm25.save(directory, replace=False)
        return bm25
    from rag_gates.retrieval.dense import QdrantDenseRetriever

    done = directory / "complete"
    if done.is_file():  # read-only: every bench process searches its own copy
        return QdrantDenseRetriever(
            QdrantDenseRetriever.connect(str(directory / "qdrant"), read_only=True), "passages")
    passages = corpus_passages(dataset, path)
    logger.info("embedding %d %s paragraphs into local Qdrant", len(passages), dataset)
    directory.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=".dense.", dir=directory.parent))
    try:
        dense = QdrantDenseRetriever.build(passages, path=str(build / "qdrant"),
                                           show_progress=True)
        dense.client.close()
        (build / "complete").write_text(str(len(passages)))
        if not done.is_file():  # else another process built the same cache meanwhile
            if directory.exists():
                shutil.rmtree(directory)
            try:
                os.rename(build, directory)
            except OSError:
                if not done.is_file():
                    raise  # not another process's finished copy
    finally:
        if build.exists():
            shutil.rmtree(build, ignore_errors=True)
    return QdrantDenseRetriever(
        QdrantDenseRetriever.connect(str(directory / "qdrant"), read_only=True), "passages",
        dense.embedder)


# ------------------------------------------------------------------- corpus statistics
def _dataset_names(datasets: str | Sequence[str]) -> list[str]:
    names = datasets.split(",") if isinstance(datasets, str) else list(datasets)
    out = list(dict.fromkeys(n.strip() for n in names if n.strip()))
    if not out:
        raise ValueError("name at least one dataset, e.g. datasets=('hotpotqa', '2wiki')")
    return out


def _dataset_files(names: list[str], path: str | Path | None) -> list[tuple[str, Path]]:
    if path is not None and len(names) > 1 and not Path(path).is_dir():
        raise ValueError(
            f"path={str(path)!r} is a file but {len(names)} datasets were named; pass a "
            "directory holding every dataset's file, or one dataset")
    return [(name, resolve_dataset_file(name, path)) for name in names]


def corpus_stats_dir(datasets: str | Sequence[str] = CORPUS_STATS_DATASETS,
                     path: str | Path | None = None, *, tokenizer: Any = None,
                     lowercase: bool = False) -> Path:
    """Where :func:`build_corpus_stats` keeps (or will build) the index for these inputs."""
    from rag_gates.corpus.tokenizer import CorpusTokenizer

    files = _dataset_files(_dataset_names(datasets), path)
    tok = CorpusTokenizer.resolve(tokenizer)
    key = stats_key(files, tok.sha256(), stats_options(lowercase=lowercase))
    return rag_gates_home() / "indexes" / f"corpus-stats-{key}"


def corpus_stats_documents(datasets: str | Sequence[str] = CORPUS_STATS_DATASETS,
                           path: str | Path | None = None) -> list[dict[str, str]]:
    """The documents of the datasets' corpus-statistics index, in build order
    (:func:`rag_gates.corpus.paragraphs.paragraph_documents` of their files)."""
    return paragraph_documents(_dataset_files(_dataset_names(datasets), path))


def build_corpus_stats(datasets: str | Sequence[str] = CORPUS_STATS_DATASETS,
                       path: str | Path | None = None, *, tokenizer: Any = None,
                       lowercase: bool = False, progress: bool = False) -> Path:
    """Build the corpus-statistics index of ``datasets`` unless it is cached; its directory
    (:func:`rag_gates.corpus.paragraphs.build_paragraph_stats` of their files)."""
    return build_paragraph_stats(_dataset_files(_dataset_names(datasets), path),
                                 tokenizer=tokenizer, lowercase=lowercase, progress=progress)


def build_testbed_corpus_stats(testbed: str | Path, *, tokenizer: Any = None,
                               lowercase: bool = False, progress: bool = False) -> Path:
    """Build (once) the corpus-statistics index of a testbed's training corpus: every
    document of its ``corpus.jsonl`` (the fact statements, the Wikipedia paragraphs and the
    practice examples it was trained on) in the words it was trained on
    (:func:`~rag_gates_lab.testbed.build.document_words`), one document each. Kept in
    ``DIR/indexes/``."""
    from rag_gates.corpus.index_format import MANIFEST_NAME
    from rag_gates.corpus.tokenizer import CorpusTokenizer
    from rag_gates_lab.testbed.build import document_words

    directory = Path(testbed).expanduser()
    corpus = directory / "corpus.jsonl"
    if not corpus.is_file():
        raise FileNotFoundError(f"{corpus} does not exist: build the testbed first "
                                f"(rag-gates testbed build --out {directory})")
    tok = CorpusTokenizer.resolve(tokenizer)
    options = stats_options(lowercase=lowercase, progress=progress,
                             name=f"testbed-{directory.name}")
    identity = {"format": "testbed-corpus/v1", "corpus": file_digest(corpus),
                "tokenizer": tok.sha256(),
                "options": options.model_dump(exclude={"force", "progress", "name", "cpus",
                                                       "mem_gb", "ulimit", "batch_docs",
                                                       "verify"})}
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    target = directory / "indexes" / f"corpus-stats-{key}"
    if (target / MANIFEST_NAME).is_file():
        return target
    docs = []
    with corpus.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                docs.append({"id": row["id"], "title": row.get("title") or "",
                             "text": document_words(row)})
    logger.info("corpus statistics: %d testbed documents; building the index at %s",
                len(docs), target)
    return publish_stats_index(docs, target, tok, options,
                                {"format": "testbed-corpus/v1", "corpus": str(corpus),
                                 "sha256": identity["corpus"]})


def load_corpus_stats(datasets: str | Sequence[str] = CORPUS_STATS_DATASETS,
                      path: str | Path | None = None, *, tokenizer: Any = None,
                      case: Literal["sensitive", "insensitive"] = "sensitive",
                      cache: bool | str | Path = True, progress: bool = False,
                      testbed: str | Path | None = None) -> CorpusStats:
    """Phrase counts and co-occurrence over the datasets' union paragraphs (a CorpusStats).

    A :class:`~rag_gates.corpus.LocalInfiniGram` over the index built by
    :func:`build_corpus_stats` (once; then loaded from ``$RAG_GATES_HOME/indexes``), wrapped in
    a :class:`~rag_gates.corpus.CachedCorpusStats` (``cache``: True for the default SQLite file,
    a path for another, False for none).

    Args:
        datasets: dataset names (a sequence or ``"hotpotqa,2wiki"``).
        path: a directory holding the data files (default: the dataset search path:
            ``$RAG_GATES_DATA``, ``../shared/data``, then the slices in ``examples/data``), or a
            file when one dataset is named.
        tokenizer: the tokenizer to index with (default: the embedded model's).
        case: ``"sensitive"`` (default): a cased index, entities counted as written, as
            QuCo-RAG's authors count them (their hosted infini-gram index stores a
            case-sensitive tokenizer's ids and ``get_infini_gram_count`` sends the extracted
            entity as written: ``src/generate_quco.py``). Index and query agree by
            construction: the extractor writes a Title-Cased question's names in their own
            casing ("Prince Boris Of Leiningen" -> "Prince Boris of Leiningen", as the
            authors' extraction prompt does; :mod:`rag_gates.extract.heuristic`), and a
            lower-cased index lower-cases every lookup (the index records its casing).
            ``"insensitive"``: the index is built from lower-cased text and every lookup is
            lower-cased, so case is ignored exactly; one-word names then pick up common words
            ("Opera" 99 -> 343, "Back" 88 -> 497). Both layouts are cached side by side;
            docs/fidelity.md (QuCo-RAG, row Q20) has the measured effect of the choice.
        cache: True wraps the index in a CachedCorpusStats at its default SQLite file
            (``$RAG_GATES_HOME/corpus-cache.sqlite``), a path uses that file, False returns
            the bare LocalInfiniGram.
        progress: show the builder's progress bar on stderr (stages are logged either way).
        testbed: a testbed directory (``rag-gates testbed build``): count in exactly its
            training corpus instead of the datasets' paragraphs (``datasets`` and ``path``
            are then ignored), so QuCo counts what the testbed model saw.
    """
    from rag_gates.corpus.cache import CachedCorpusStats
    from rag_gates.corpus.local import LocalInfiniGram

    if case not in ("sensitive", "insensitive"):
        raise ValueError(f"case must be 'sensitive' or 'insensitive', got {case!r}")
    if testbed is not None:
        directory = build_testbed_corpus_stats(testbed, tokenizer=tokenizer,
                                               lowercase=case == "insensitive",
                                               progress=progress)
    else:
        directory = build_corpus_stats(datasets, path, tokenizer=tokenizer,
                                       lowercase=case == "insensitive", progress=progress)
    backend: CorpusStats = LocalInfiniGram(directory, case=case)
    if cache is False:
        return backend
    return CachedCorpusStats(backend, None if cache is True else cache)
