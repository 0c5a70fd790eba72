"""Local Qdrant folders opened from several processes: one writer, or many read-only copies.

Qdrant's local mode (``QdrantClient(path=...)``) locks its folder for as long as a client
holds it, so a second process that opens it fails with qdrant-client's raw ``RuntimeError``.
Two ways are offered here:

- :func:`open_local`: the folder's single writer; a folder held elsewhere raises
  :class:`~rag_gates.errors.StoreLockedError` naming read-only opening and a server URL;
- :func:`read_only_copy`: a private in-memory client holding a copy of one collection. The
  folder is held only while its points are read (the on-disk client is closed at once), and
  readers in several processes take turns through a lock file of their own, so they never
  collide on Qdrant's lock; a writer that holds the folder is waited for, then refused.

Example:
    >>> client, points = read_only_copy(Path("policy"), "srrag-policy")   # doctest: +SKIP
    >>> client.count("srrag-policy").count == len(points)                 # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from rag_gates._optional import require
from rag_gates.errors import StoreLockedError

__all__ = ["DEFAULT_LOCK_WAIT_S", "READERS_LOCK", "connect_server", "open_local",
           "read_only_copy", "server_error"]

logger = logging.getLogger(__name__)

#: How long a read-only opening waits for other readers and for a writer holding the folder.
DEFAULT_LOCK_WAIT_S = 60.0
#: The readers' own lock file, inside the folder (Qdrant ignores files it does not know).
READERS_LOCK = ".rag-gates-readers.lock"
_SERVER = ("serve it from a Qdrant server (e.g. docker run -p 6333:6333 qdrant/qdrant) and "
           "pass url=http://HOST:6333")
_POLL_S = 0.05


def server_error(exc: BaseException, client: Any = None, *,
                 api_key: str | None = None) -> str:
    """``TYPE: message`` of an exception raised by a Qdrant client, scrubbed of the API key
    sent (``api_key``, or the one ``client`` holds) and of URL credentials: a server may
    echo the key in its refusal (a 403 body), and qdrant-client puts the raw body in the
    exception. The one scrub of every Qdrant error this package shows."""
    from rag_gates._http import scrub_text

    options = getattr(client, "init_options", None) or {}
    secrets = [api_key, options.get("api_key") if isinstance(options.get("api_key"), str)
               else None]
    return scrub_text(f"{type(exc).__name__}: {exc}", secrets)


def connect_server(url: str, *, api_key: str | None, timeout: int = 10, what: str,
                   error: type[Exception], hint: str) -> Any:
    """A client of the Qdrant server at ``url``, asked for its collections once so an
    unreachable or refusing server fails here. The one way every Qdrant server URL is
    opened: the URL passes :func:`~rag_gates._http.check_server_url` (no credentials or
    query string, whatever the scheme's case; the key goes in ``api_key``), and every error
    shows the URL redacted and the server's words scrubbed of the key.

    Raises:
        ValueError: the URL is malformed or carries a secret (shown redacted), or the key
            has surrounding whitespace or a control character (never shown).
        error: the server cannot be reached or refused; the message ends with ``hint``.
    """
    from rag_gates._http import check_api_key, check_server_url, redact_url, register_secret

    check_server_url(url, what, "Pass the API key as api_key= (or QDRANT_API_KEY for the "
                     "CLI), never in the URL.")
    if api_key is not None:  # a newline from a file: the client's refusal would print it
        check_api_key(api_key, "api_key (QDRANT_API_KEY for the CLI)")
        # httpcore's debug lines print response headers, which a server may fill with it.
        register_secret(api_key)
    qdrant_client = require("qdrant_client", "qdrant")
    client = qdrant_client.QdrantClient(url=url, api_key=api_key, timeout=timeout,
                                        check_compatibility=False)
    try:
        client.get_collections()
    except Exception as exc:  # the client raises transport-specific types
        client.close()
        raise error(f"cannot reach the Qdrant server at {redact_url(url)} "
                    f"({server_error(exc, api_key=api_key)}); {hint}") from None
    return client


def _held(exc: BaseException) -> bool:
    """Is this qdrant-client's error for a folder another client holds?"""
    return isinstance(exc, RuntimeError) and "already accessed by another instance" in str(exc)


def open_local(path: Path, *, read_only_hint: str) -> Any:
    """``QdrantClient(path=...)`` for the folder's one writer (the folder is created).

    Raises:
        StoreLockedError: another process holds the folder; the message names
            ``read_only_hint`` (how this store is opened read-only) and a server URL.
    """
    qdrant_client = require("qdrant_client", "qdrant")
    try:
        return qdrant_client.QdrantClient(path=str(path))
    except RuntimeError as exc:
        if not _held(exc):
            raise
        raise StoreLockedError(
            f"{path} is open in another process: Qdrant's local mode admits one client per "
            f"folder. To query it from several processes, open it read-only "
            f"({read_only_hint}: each process loads a private in-memory copy and releases "
            f"the folder at once); to write to it from several processes, {_SERVER}"
        ) from None


@contextlib.contextmanager
def _readers_turn(path: Path, deadline: float) -> Iterator[None]:
    """Hold the readers' lock of ``path`` (waiting until ``deadline``); where ``fcntl``
    does not exist (Windows) readers do not take turns and rely on the retry below."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on POSIX
        yield
        return
    handle: IO[str] = (path / READERS_LOCK).open("a", encoding="utf-8")
    try:
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise StoreLockedError(
                        f"{path}: other processes kept reading it past the wait; retry, or "
                        f"{_SERVER}") from None
                time.sleep(_POLL_S)
        yield
    finally:
        handle.close()  # closing the file releases the lock


def read_only_copy(path: Path, collection: str, *, wait_s: float = DEFAULT_LOCK_WAIT_S,
                   what: str = "store") -> tuple[Any, list[Any]]:
    """A private in-memory Qdrant client holding a copy of ``collection`` from the local
    folder ``path``, and the points copied (ids, vectors and payloads).

    Nothing is created: a folder that does not exist, or that lacks the collection, gives a
    client without it (the caller says what to build). Qdrant's lock on the folder is held
    only while the points are read; a writer holding it is waited for up to ``wait_s``
    seconds.

    Raises:
        StoreLockedError: a writer kept the folder for ``wait_s`` seconds.
    """
    qdrant_client = require("qdrant_client", "qdrant")
    models = require("qdrant_client.models", "qdrant")
    memory = qdrant_client.QdrantClient(location=":memory:")
    if not (path / "meta.json").is_file():
        return memory, []
    deadline = time.monotonic() + wait_s
    started = time.monotonic()
    info, points = None, []
    with _readers_turn(path, deadline):
        while True:
            try:
                disk = qdrant_client.QdrantClient(path=str(path))
                break
            except RuntimeError as exc:
                if not _held(exc):
                    raise
                if time.monotonic() > deadline:
                    raise StoreLockedError(
                        f"the {what} at {path} has been open in another process (a writer) "
                        f"for {time.monotonic() - started:.0f} s, and Qdrant's local mode "
                        "admits one client per folder: close the writer's client (or let it "
                        f"finish), then open it read-only again; or {_SERVER}") from None
                logger.info("waiting for the writer holding %s", path)
                time.sleep(0.5)
        try:
            if disk.collection_exists(collection):
                info = disk.get_collection(collection)
                offset = None
                while True:
                    batch, offset = disk.scroll(collection, limit=4096, offset=offset,
                                                with_payload=True, with_vectors=True)
                    points.extend(batch)
                    if offset is None:
                        break
        finally:
            disk.close()  # releases Qdrant's lock on the folder
    if info is not None:
        params = info.config.params
        memory.create_collection(collection, vectors_config=params.vectors,
                                 sparse_vectors_config=params.sparse_vectors,
                                 metadata=info.config.metadata)
        for lo in range(0, len(points), 1024):
            memory.upsert(collection, points=[
                models.PointStruct(id=p.id, vector=p.vector, payload=p.payload)
                for p in points[lo: lo + 1024]])
    return memory, points
