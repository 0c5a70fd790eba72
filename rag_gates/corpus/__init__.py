"""Corpus statistics for retrieval gates: phrase counts and co-occurrence (infini-gram).

One interface, :class:`CorpusStats`, three implementations:

* :class:`LocalInfiniGram`: an index of your own corpus on local disk, built with
  :func:`build_index` / ``rag-gates index build``; exact counts and exact document- or
  window-level co-occurrence;
* :class:`HostedInfiniGram`: the public infini-gram API (trillions of tokens) over HTTP;
* :class:`CachedCorpusStats`: a persistent SQLite cache in front of either.

:func:`serve_index` / ``rag-gates index serve`` shares one local index over HTTP in the hosted
API's protocol, so many processes query it through :class:`HostedInfiniGram`.

Every answer is a frozen pydantic model (:class:`CountResult`, :class:`CooccurrenceResult`)
with the value, an ``approximate`` flag, the backend, the index and the latency. Phrases are
always matched literally (``"Tom AND Jerry"`` is never an AND query).

``import rag_gates.corpus`` is light: numpy, infini_gram, tokenizers and httpx are imported
when an index is opened or a request is made (``pip install "rag-gates[corpus]"``).

Example:
    >>> from rag_gates.corpus import LocalInfiniGram, CachedCorpusStats, Window
    >>> stats = CachedCorpusStats(LocalInfiniGram("indexes/wiki"))    # doctest: +SKIP
    >>> stats.count("Honolulu").value                                   # doctest: +SKIP
    >>> stats.cooccurrence("Barack Obama", "Honolulu", scope=Window(tokens=50))  # doctest: +SKIP
"""

from __future__ import annotations

from rag_gates.corpus.base import CorpusStats
from rag_gates.corpus.build import BuildOptions, BuildReport, build_index
from rag_gates.corpus.cache import CachedCorpusStats, default_cache_path
from rag_gates.corpus.errors import (
    CorpusCacheError,
    CorpusError,
    CorruptIndexError,
    EmptyPhraseError,
    HostedError,
    HostedProtocolError,
    HostedQueryError,
    HostedTimeoutError,
    HostedUnavailableError,
    IndexBuildError,
    IndexExistsError,
    IndexNotFoundError,
    InvalidCountError,
    InvalidPhraseError,
    PhraseTooLongError,
    UnsupportedScopeError,
)
from rag_gates.corpus.hosted import HostedConfig, HostedInfiniGram
from rag_gates.corpus.local import IndexStats, LocalConfig, LocalInfiniGram
from rag_gates.corpus.serve import IndexServer, ServeConfig, serve_index
from rag_gates.corpus.tokenizer import CorpusTokenizer
from rag_gates.corpus.types import (
    CaseMode,
    CooccurrenceResult,
    CorpusAnswer,
    CountResult,
    Scope,
    SpaceMode,
    Window,
)

__all__ = [
    "BuildOptions",
    "BuildReport",
    "CachedCorpusStats",
    "CaseMode",
    "CooccurrenceResult",
    "CorpusAnswer",
    "CorpusCacheError",
    "CorpusError",
    "CorpusStats",
    "CorpusTokenizer",
    "CorruptIndexError",
    "CountResult",
    "EmptyPhraseError",
    "HostedConfig",
    "HostedError",
    "HostedInfiniGram",
    "HostedProtocolError",
    "HostedQueryError",
    "HostedTimeoutError",
    "HostedUnavailableError",
    "IndexBuildError",
    "IndexExistsError",
    "IndexNotFoundError",
    "IndexServer",
    "IndexStats",
    "InvalidCountError",
    "InvalidPhraseError",
    "LocalConfig",
    "LocalInfiniGram",
    "PhraseTooLongError",
    "Scope",
    "ServeConfig",
    "SpaceMode",
    "UnsupportedScopeError",
    "Window",
    "build_index",
    "default_cache_path",
    "serve_index",
]
