"""Corpus statistics over QA datasets' paragraphs: the index QuCo-RAG counts entities in
when the corpus is the paragraphs of HotpotQA-style rows (``context``: ``[title,
sentences]`` pairs), as the demo and the benchmark use it.

One document per distinct (title, paragraph), the title as its first line, so an entity
named only in a title is counted too; cased by default, as QuCo-RAG's authors' infini-gram
index is. Built once and cached under ``$RAG_GATES_HOME/indexes/corpus-stats-<hash>/``; the
hash covers the data files' bytes, the tokenizer, the build options and the document format,
so changed data gets a new index. Interrupted builds leave nothing half-made.

Example:
    >>> from rag_gates.corpus.paragraphs import build_paragraph_stats
    >>> build_paragraph_stats([("hotpotqa", Path("hotpotqa_dev_sample.jsonl"))])
    ...                                                             # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rag_gates._files import iter_jsonl
from rag_gates._io import file_sha256 as file_digest
from rag_gates.lm.defaults import rag_gates_home

__all__ = ["QA_PARAGRAPHS_TAU_ENTITY", "build_paragraph_stats", "file_digest",
           "paragraph_documents", "publish_stats_index", "stats_key", "stats_options"]

logger = logging.getLogger(__name__)

# Changes whenever the documents written for the statistics index change shape.
_DOC_FORMAT = "title-newline-paragraph/v1"
_SOURCES_NAME = "sources.json"  # beside the index files; no infini-gram keyword in the name

DataFiles = Sequence[tuple[str, Path]]

#: QuCo's ``tau_entity`` for an index of HotpotQA and 2WikiMultihopQA paragraphs (a corpus of
#: thousands of paragraphs, not the paper's trillions of tokens), calibrated on PopQA rows:
#: the benchmark's default and the demo's.
QA_PARAGRAPHS_TAU_ENTITY = 82.0


def _row_paragraphs(row: Any) -> list[tuple[str | None, str]]:
    out: list[tuple[str | None, str]] = []
    context = row.get("context") if isinstance(row, dict) else None
    for title, sentences in context or []:
        text = "".join(sentences) if isinstance(sentences, list) else str(sentences)
        out.append((str(title), text.strip()))
    return out


def paragraph_documents(files: DataFiles) -> list[dict[str, str]]:
    """The documents of the corpus-statistics index, in build order: every distinct
    (title, paragraph) of the files' context fields, as ``{"id", "title", "text"}`` with
    ``text = title + "\\n" + paragraph`` (the paragraph alone when it has no title).
    ``files``: ``(dataset name, JSONL path)`` pairs; the name prefixes the ids."""
    seen: set[tuple[str | None, str]] = set()
    docs: list[dict[str, str]] = []
    for name, file in files:
        for _, row in iter_jsonl(file):
            for title, text in _row_paragraphs(row):
                key = (title, text)
                if not text or key in seen:
                    continue
                seen.add(key)
                docs.append({"id": f"{name}-{len(docs)}", "title": title or "",
                             "text": f"{title}\n{text}" if title else text})
    if not docs:
        raise ValueError(f"{', '.join(name for name, _ in files)}: no context paragraphs to "
                         "count in")
    return docs


def stats_options(**overrides: Any) -> Any:
    from rag_gates.corpus.build import BuildOptions

    # One suffix-array part: these corpora are small (about 4 MB of u16 tokens for the full
    # shared files), the machines share their cores, and small parts are where the indexer's
    # multi-part pitfall lives (docs/architecture.md).
    return BuildOptions(**{"cpus": 1, "lowercase": False, **overrides})


def stats_key(files: list[tuple[str, Path]], tokenizer_sha: str, options: Any) -> str:
    identity = {
        "format": _DOC_FORMAT,
        "datasets": [(name, file_digest(file)) for name, file in files],
        "tokenizer": tokenizer_sha,
        "options": options.model_dump(exclude={"force", "progress", "name", "cpus", "mem_gb",
                                               "ulimit", "batch_docs", "verify"}),
    }
    text = json.dumps(identity, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def publish_stats_index(docs: list[dict[str, str]], target: Path, tok: Any, options: Any,
                         sources: dict[str, Any]) -> Path:
    """Index ``docs`` in a temporary directory beside ``target``, then rename it into place
    (keeping another process's copy when it finished first)."""
    from rag_gates.corpus import build as corpus_build
    from rag_gates.corpus.errors import IndexExistsError
    from rag_gates.corpus.index_format import MANIFEST_NAME

    started = time.perf_counter()
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.building-", dir=target.parent))
    try:
        source = work / "paragraphs.jsonl"
        with source.open("w", encoding="utf-8") as handle:
            for doc in docs:
                handle.write(json.dumps(doc, ensure_ascii=False) + "\n")
        built = work / "index"
        report = corpus_build.build_index(source, built, tokenizer=tok, options=options)
        sources = {**sources, "documents": report.documents, "tokens": report.tokens}
        (built / _SOURCES_NAME).write_text(json.dumps(sources, indent=2), encoding="utf-8")
        try:
            os.rename(built, target)
        except OSError as exc:
            if not (target / MANIFEST_NAME).is_file():
                raise IndexExistsError(
                    f"{target} exists but holds no complete index ({exc}); delete it and "
                    "run again") from exc
            logger.info("corpus statistics: another process built %s first; using it", target)
            return target
    finally:
        shutil.rmtree(work, ignore_errors=True)
    logger.info("corpus statistics: built %s (%d documents, %d tokens) in %.1f s", target,
                report.documents, report.tokens, time.perf_counter() - started)
    return target


def paragraph_stats_key(files: DataFiles, tokenizer_sha: str, options: Any) -> str:
    """The cache key of the index of ``files``: their bytes, the tokenizer, the options."""
    return stats_key([(name, Path(file)) for name, file in files], tokenizer_sha, options)


def build_paragraph_stats(files: DataFiles, *, tokenizer: Any = None, lowercase: bool = False,
                          progress: bool = False) -> Path:
    """Build the corpus-statistics index of the paragraphs in ``files`` (``(dataset name,
    JSONL path)`` pairs) unless it is cached; its directory.

    ``lowercase``: index lower-cased text (a case-insensitive index); default: cased.

    The build writes the documents and the index into a temporary directory beside the cache
    and renames it into place, so an interrupted build leaves nothing half-made; when another
    process finished the same index first, its copy is kept and ours discarded.
    """
    from rag_gates.corpus.index_format import MANIFEST_NAME
    from rag_gates.corpus.tokenizer import CorpusTokenizer

    files = [(name, Path(file)) for name, file in files]
    tok = CorpusTokenizer.resolve(tokenizer)
    options = stats_options(lowercase=lowercase, progress=progress,
                            name="corpus-stats-" + "+".join(name for name, _ in files))
    key = stats_key(files, tok.sha256(), options)
    target = rag_gates_home() / "indexes" / f"corpus-stats-{key}"
    if (target / MANIFEST_NAME).is_file():
        logger.debug("corpus statistics index cached at %s", target)
        return target
    for name, file in files:
        logger.info("corpus statistics: reading the %s paragraphs of %s", name, file)
    docs = paragraph_documents(files)
    logger.info("corpus statistics: %d distinct paragraphs; building the index at %s",
                len(docs), target)
    sources = {"format": _DOC_FORMAT,
               "datasets": [{"name": name, "file": str(file), "sha256": file_digest(file)}
                            for name, file in files]}
    return publish_stats_index(docs, target, tok, options, sources)
