"""``CachedCorpusStats``: a persistent SQLite cache in front of any :class:`CorpusStats`.

Keys are ``(backend, index identity, answer-changing options, query)``: a rebuilt local index
gets a new identity (its manifest's ``index_id``), so stale answers are never served. Values
are the backend's answers as JSON; a hit returns the same answer with ``cached=True`` and the
lookup's latency (tens of microseconds). Errors are never cached.

Safe for many threads (one connection per thread) and many processes (WAL journal, busy
timeout, idempotent ``INSERT OR REPLACE``): concurrent writers of the same key write the same
answer.

A file that is not a rag-gates cache (another table layout) is refused when the cache is
made; a damaged answer row or a SQLite fault while reading raises
:class:`~rag_gates.corpus.errors.CorpusCacheError` naming the file, a
:class:`~rag_gates.corpus.errors.CorpusError` like a backend failure, so gates apply their
``on_error`` policy to it (by default: retrieve). A failed *write* (the file locked by
other workers past the busy timeout, a full disk) loses only the caching: the backend's
answer is returned, the fault logged and counted in ``write_errors``.

Example:
    >>> stats = CachedCorpusStats(LocalInfiniGram("indexes/wiki"))    # doctest: +SKIP
    >>> stats.count("Honolulu").cached, stats.count("Honolulu").cached  # doctest: +SKIP
    (False, True)
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import sqlite3
import threading
import time
import unicodedata
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from rag_gates._fork import rebuild_after_fork
from rag_gates.corpus.base import CorpusStats
from rag_gates.corpus.errors import CorpusCacheError, CorpusError
from rag_gates.corpus.types import CooccurrenceResult, CorpusAnswer, CountResult, Scope, parse_scope

logger = logging.getLogger(__name__)

__all__ = ["CachedCorpusStats", "default_cache_path"]

A = TypeVar("A", bound=CorpusAnswer)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS answers (
    key TEXT PRIMARY KEY,
    backend TEXT NOT NULL,
    index_key TEXT NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    created REAL NOT NULL
) WITHOUT ROWID
"""
_COLUMNS = ["key", "backend", "index_key", "kind", "payload", "created"]


_WS = re.compile(r"\s+")


def _canon(phrase: object) -> str:
    """The phrase as backends normalise it (NFC, collapsed whitespace), for the cache key."""
    if not isinstance(phrase, str):
        return repr(phrase)
    return _WS.sub(" ", unicodedata.normalize("NFC", phrase)).strip()


def default_cache_path() -> Path:
    """``$RAG_GATES_HOME/corpus-cache.sqlite`` (default ``~/.cache/rag-gates/...``)."""
    from rag_gates.lm.defaults import rag_gates_home

    return rag_gates_home() / "corpus-cache.sqlite"


class CachedCorpusStats(CorpusStats):
    """Wrap ``backend`` with a persistent cache at ``path``.

    Args:
        backend: any CorpusStats (local or hosted).
        path: SQLite file (created with its folder); default :func:`default_cache_path`.
        ttl_seconds: answers older than this are recomputed (None: never expire).
    """

    def __init__(self, backend: CorpusStats, path: str | os.PathLike[str] | None = None,
                 ttl_seconds: float | None = None, busy_timeout_s: float = 30.0) -> None:
        if ttl_seconds is not None and ttl_seconds <= 0:
            raise ValueError("ttl_seconds must be positive (or None for no expiry)")
        self.backend = backend
        self.backend_name = backend.backend_name
        self.path = Path(path).expanduser() if path is not None else default_cache_path()
        self.ttl_seconds = ttl_seconds
        self._busy_ms = int(busy_timeout_s * 1000)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._parents: list[sqlite3.Connection] = []  # a forked child's inherited, unused
        rebuild_after_fork(self)
        self.hits = 0
        self.misses = 0
        self.write_errors = 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CorpusError(f"cannot create the corpus cache folder {self.path.parent}: {exc}"
                              ) from exc
        self._connect()  # create the schema now, and fail early on an unusable path
        identity = {"backend": backend.backend_name, "index": backend.index_key,
                    "options": backend.options_key()}
        self._prefix = json.dumps(identity, sort_keys=True, default=str)

    @property
    def index_name(self) -> str:
        return self.backend.index_name

    @property
    def index_key(self) -> str:
        return self.backend.index_key

    def options_key(self) -> dict[str, Any]:
        return self.backend.options_key()

    # ----------------------------------------------------------------------------- sqlite
    def _after_fork(self) -> None:
        """In a forked worker: its own connections (SQLite's must not cross a fork); the
        parent's are kept referenced so the child never finalizes them."""
        self._parents.extend(self._connections)
        self._local = threading.local()
        self._connections = []
        self._lock = threading.Lock()

    def _connect(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        conn = None
        try:
            conn = sqlite3.connect(self.path, timeout=self._busy_ms / 1000.0,
                                   isolation_level=None)
            conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
            # Read the schema before anything writes: a file that is refused (another
            # program's database) must be left byte for byte as it was, and switching to WAL
            # rewrites its header.
            self._check_schema(conn)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(_SCHEMA)
        except (sqlite3.Error, CorpusCacheError) as exc:
            if conn is not None:
                conn.close()
            if isinstance(exc, CorpusCacheError):
                raise
            raise CorpusCacheError(f"cannot open the corpus cache at {self.path}: {exc}; pass "
                                   "another path, or delete the file if it is a damaged "
                                   "cache") from exc
        self._local.conn = conn
        with self._lock:
            self._connections.append(conn)
        return conn

    def _check_schema(self, conn: sqlite3.Connection) -> None:
        """Refuse (read-only) a database that is not a corpus cache: a table 'answers' of
        other columns, or other tables and no 'answers' (an empty file is a new cache)."""
        tables = [row[0] for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
        if "answers" in tables:
            columns = [row[1] for row in conn.execute("PRAGMA table_info(answers)")]
            if columns != _COLUMNS:
                raise CorpusCacheError(
                    f"{self.path} holds a table 'answers' with the columns {columns}, so it is "
                    f"not a rag-gates corpus cache (columns {_COLUMNS}); pass another path, or "
                    "delete the file if it is a cache from an incompatible version (the file "
                    "is left as it is)")
        elif tables:
            raise CorpusCacheError(
                f"{self.path} is another program's database (tables {tables[:5]}, no "
                "'answers'), not a rag-gates corpus cache; pass another path (the file is left "
                "as it is)")

    @contextlib.contextmanager
    def _sqlite(self, action: str) -> Iterator[sqlite3.Connection]:
        """The thread's connection; a SQLite fault becomes a CorpusCacheError naming the file."""
        conn = self._connect()
        try:
            yield conn
        except sqlite3.Error as exc:
            raise CorpusCacheError(
                f"the corpus cache {self.path} failed while {action} ({type(exc).__name__}: "
                f"{exc}); check the disk, or delete the file to start a fresh cache") from exc

    def _key(self, kind: str, query: dict[str, Any]) -> str:
        text = self._prefix + "|" + kind + "|" + json.dumps(query, sort_keys=True)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def _get(self, key: str, model: type[A]) -> A | None:
        start = time.perf_counter()
        with self._sqlite("reading an answer") as conn:
            row = conn.execute(
                "SELECT payload, created FROM answers WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        try:
            if self.ttl_seconds is not None and time.time() - float(row[1]) > self.ttl_seconds:
                return None
            answer = model.model_validate_json(row[0])
        except (ValidationError, TypeError, ValueError) as exc:
            first = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
            raise CorpusCacheError(
                f"{self.path}: a cached {model.__name__} is unreadable ({first}); the file is "
                "damaged: remove this backend's answers with CachedCorpusStats.clear() or "
                "delete the file") from None
        return answer.model_copy(update={
            "cached": True, "latency_ms": (time.perf_counter() - start) * 1000.0})

    def _put(self, key: str, kind: str, answer: BaseModel) -> None:
        self._put_many([(key, kind, answer)])

    def _put_many(self, rows: list[tuple[str, str, BaseModel]]) -> None:
        if not rows:
            return
        try:
            self._write(rows)
        except CorpusCacheError as exc:
            # The answers in hand are good: a write that fails costs the caching only.
            self.write_errors += 1
            logger.warning("%s; %d answer(s) returned uncached", exc, len(rows))

    def _write(self, rows: list[tuple[str, str, BaseModel]]) -> None:
        now = time.time()
        with self._sqlite("storing answers") as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(
                    "INSERT OR REPLACE INTO answers (key, backend, index_key, kind, payload, "
                    "created) VALUES (?, ?, ?, ?, ?, ?)",
                    [(k, self.backend.backend_name, self.backend.index_key, kind,
                      a.model_dump_json(), now) for k, kind, a in rows])
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    # ----------------------------------------------------------------------------- queries
    @staticmethod
    def _count_query(phrase: str) -> dict[str, Any]:
        return {"phrase": _canon(phrase)}

    @staticmethod
    def _cooc_query(a: str, b: str, scope: Scope) -> dict[str, Any]:
        return {"a": _canon(a), "b": _canon(b), "scope": parse_scope(scope)}

    def count(self, phrase: str) -> CountResult:
        key = self._key("count", self._count_query(phrase))
        hit = self._get(key, CountResult)
        if hit is not None:
            self.hits += 1
            return hit
        self.misses += 1
        answer = self.backend.count(phrase)
        self._put(key, "count", answer)
        return answer

    def cooccurrence(self, a: str, b: str, scope: Scope = "document") -> CooccurrenceResult:
        key = self._key("cooccurrence", self._cooc_query(a, b, scope))
        hit = self._get(key, CooccurrenceResult)
        if hit is not None:
            self.hits += 1
            return hit
        self.misses += 1
        answer = self.backend.cooccurrence(a, b, scope)
        self._put(key, "cooccurrence", answer)
        return answer

    def count_batch(self, phrases: Sequence[str]) -> list[CountResult]:
        keys = [self._key("count", self._count_query(p)) for p in phrases]
        found: list[CountResult | None] = [self._get(k, CountResult) for k in keys]
        missing = [i for i, f in enumerate(found) if f is None]
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        if missing:
            fresh = self.backend.count_batch([phrases[i] for i in missing])
            for i, answer in zip(missing, fresh, strict=True):
                found[i] = answer
            self._put_many([(keys[i], "count", found[i]) for i in missing  # type: ignore[misc]
                            if found[i] is not None])
        return [f for f in found if f is not None]

    def cooccurrence_batch(self, pairs: Sequence[tuple[str, str]],
                           scope: Scope = "document") -> list[CooccurrenceResult]:
        keys = [self._key("cooccurrence", self._cooc_query(a, b, scope)) for a, b in pairs]
        found: list[CooccurrenceResult | None] = [self._get(k, CooccurrenceResult) for k in keys]
        missing = [i for i, f in enumerate(found) if f is None]
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        if missing:
            fresh = self.backend.cooccurrence_batch([pairs[i] for i in missing], scope)
            for i, answer in zip(missing, fresh, strict=True):
                found[i] = answer
            self._put_many([(keys[i], "cooccurrence", found[i])  # type: ignore[misc]
                            for i in missing if found[i] is not None])
        return [f for f in found if f is not None]

    # SQLite in a worker thread: another process holding the write lock would otherwise
    # block the event loop for up to busy_timeout_s.
    async def acount(self, phrase: str) -> CountResult:
        key = self._key("count", self._count_query(phrase))
        hit = await asyncio.to_thread(self._get, key, CountResult)
        if hit is not None:
            self.hits += 1
            return hit
        self.misses += 1
        answer = await self.backend.acount(phrase)
        await asyncio.to_thread(self._put, key, "count", answer)
        return answer

    async def acooccurrence(self, a: str, b: str,
                            scope: Scope = "document") -> CooccurrenceResult:
        key = self._key("cooccurrence", self._cooc_query(a, b, scope))
        hit = await asyncio.to_thread(self._get, key, CooccurrenceResult)
        if hit is not None:
            self.hits += 1
            return hit
        self.misses += 1
        answer = await self.backend.acooccurrence(a, b, scope)
        await asyncio.to_thread(self._put, key, "cooccurrence", answer)
        return answer

    def clear(self) -> int:
        """Delete this backend+index's answers; returns how many were removed."""
        with self._sqlite("clearing answers") as conn:
            cur = conn.execute("DELETE FROM answers WHERE backend = ? AND index_key = ?",
                               (self.backend.backend_name, self.backend.index_key))
        return int(cur.rowcount)

    def __len__(self) -> int:
        with self._sqlite("counting answers") as conn:
            row = conn.execute("SELECT COUNT(*) FROM answers").fetchone()
        return int(row[0])

    def close(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            # A connection made in another thread cannot be closed here; sqlite frees it then.
            with contextlib.suppress(sqlite3.ProgrammingError):
                conn.close()
        self._local = threading.local()
        self.backend.close()
