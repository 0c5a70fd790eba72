"""The SR-RAG policy keys of a labels file, cached on disk so a second load skips the model.

:func:`~rag_gates.srrag.shipped.load_default_policy` keys every labelled question by the
model's hidden state: one forward pass per question, minutes for the shipped file on a CPU,
paid by every process that loads it. :func:`policy_keys` computes them once and keeps them in
``$RAG_GATES_HOME/srrag/key-cache/`` (default ``~/.cache/rag-gates/...``), one file per
combination of what the keys depend on (:func:`cache_identity`): the model's weights
fingerprint (:meth:`~rag_gates.calibration.ModelIdentity.of`), the SHA-256 of the labelled
questions in their order (what the keys are computed from: a label whose source is edited keeps
its key, a question edited, added or moved misses), the key function (model id, layer, layers,
routing prompt, size, batch size), the torch version and :data:`KEY_CACHE_VERSION`.

A file is a JSON header line (that identity, the shape, and the SHA-256 of the vectors that
follow) and the float32 vectors. It is written atomically (a reader sees the old file or the
new one), under an exclusive lock so that of several processes loading at once one computes
and the others wait for its file. A file whose header, size or checksum does not match is
never used: the keys are recomputed and it is rewritten, with a warning naming it. Fail
closed: a cache that cannot be read, locked or written changes no decision, the keys are
computed (and a log line says why). ``RAG_GATES_SRRAG_KEY_CACHE=0`` (or ``cache_keys=False``)
turns the cache off.

The directory does not grow without bound: a hit marks its file used (its modification time),
and after each write only the :data:`KEY_CACHE_KEEP` (``$RAG_GATES_SRRAG_KEY_CACHE_KEEP``)
most recently used files stay (each about 1 MB for the shipped labels); older ones, lock files
no process holds whose key file is gone, and temporary files a killed writer left over a day
ago are removed, with a log line per file (:func:`prune`).

Example:
    >>> keys = HiddenStateKeys(lm)                                      # doctest: +SKIP
    >>> vectors = policy_keys(keys, [e.question for e in entries])     # doctest: +SKIP
    >>> vectors.shape                                                   # doctest: +SKIP
    (450, 576)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import JsonValue

__all__ = ["KEY_CACHE_ENV", "KEY_CACHE_KEEP", "KEY_CACHE_KEEP_ENV", "KEY_CACHE_VERSION",
           "LOCK_WAIT_S", "cache_enabled", "cache_identity", "keep_files", "key_cache_dir",
           "policy_keys", "prune"]

logger = logging.getLogger(__name__)

#: Bump when the key computation changes (routing prompt layout, pooling, dtype): every
#: cached file then misses and is recomputed.
KEY_CACHE_VERSION = 1
KEY_CACHE_ENV = "RAG_GATES_SRRAG_KEY_CACHE"
_FORMAT = "rag-gates/srrag-keys/1"
_OFF = {"0", "false", "no", "off"}
#: How long a process waits for another one computing the same keys before computing them
#: itself (the shipped file takes minutes on a busy CPU).
LOCK_WAIT_S = 1800.0
#: How many key files the cache keeps (the most recently used): one per model weights and
#: labels file a user loads, so a few suffice; every extra one costs a forward pass per label.
KEY_CACHE_KEEP = 8
KEY_CACHE_KEEP_ENV = "RAG_GATES_SRRAG_KEY_CACHE_KEEP"
#: A temporary file older than this (seconds) is a killed writer's, never to be renamed.
_STALE_TMP_S = 86400.0


def key_cache_dir() -> Path:
    """``$RAG_GATES_HOME/srrag/key-cache`` (default ``~/.cache/rag-gates/srrag/key-cache``)."""
    from rag_gates.lm.defaults import rag_gates_home

    return rag_gates_home() / "srrag" / "key-cache"


def cache_enabled(cache_keys: bool | None = None) -> bool:
    """``cache_keys`` if given, else on unless ``$RAG_GATES_SRRAG_KEY_CACHE`` is 0/false/off."""
    if cache_keys is not None:
        return cache_keys
    return os.environ.get(KEY_CACHE_ENV, "").strip().lower() not in _OFF


def cache_identity(keys: Any, questions: Sequence[str]) -> dict[str, JsonValue] | None:
    """Everything the cached vectors depend on, or None when the model's weights cannot be
    fingerprinted (a model known only by name could change under the same name: no cache)."""
    from rag_gates.calibration.spec import ModelIdentity

    lm = getattr(keys, "lm", None)
    model = ModelIdentity.of(lm) if lm is not None else None
    if model is None or model.kind != "weights":
        return None
    import torch

    asked = hashlib.sha256(json.dumps(list(questions)).encode()).hexdigest()
    return {"version": KEY_CACHE_VERSION, "weights": model.fingerprint, "questions": asked,
            "key_function": dict(keys.identity),
            "batch_size": int(getattr(keys, "batch_size", 0)), "torch": torch.__version__}


def policy_keys(keys: Any, questions: Sequence[str], *, cache_keys: bool | None = None) -> Any:
    """``keys.keys(questions)`` as a float32 ``[n, dim]`` array, from the cache when a whole
    file for this identity is there, else computed and cached (see the module docstring)."""
    np = _numpy()
    if not cache_enabled(cache_keys):
        return _compute(keys, questions)
    try:
        identity = cache_identity(keys, questions)
    except Exception as exc:  # a model whose weights cannot be read: keys still computable
        logger.warning("SR-RAG key cache: cannot fingerprint the model (%s: %s); computing "
                       "the keys without the cache", type(exc).__name__, exc)
        return _compute(keys, questions)
    if identity is None:
        logger.info("SR-RAG key cache: the model has no weights to fingerprint; computing "
                    "the keys without the cache")
        return _compute(keys, questions)
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]
    path = key_cache_dir() / f"{digest}.keys"
    shape = (len(questions), int(keys.dim))
    cached = _read(path, identity, shape)
    if cached is not None:
        _touch(path)
        return cached
    from rag_gates._io import append_locked
    from rag_gates.errors import FileInUseError

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = append_locked(path.with_suffix(".lock"), wait_s=LOCK_WAIT_S, on_wait=lambda: (
            logger.info("SR-RAG key cache: another process is computing %s; waiting for it",
                        path)))
    except (OSError, FileInUseError) as exc:
        logger.warning("SR-RAG key cache: cannot lock %s (%s: %s); computing the keys without "
                       "the cache", path, type(exc).__name__, exc)
        return _compute(keys, questions)
    with lock:
        cached = _read(path, identity, shape)  # the process we waited for wrote it
        if cached is not None:
            return cached
        vectors = np.ascontiguousarray(_compute(keys, questions), dtype="<f4")
        if np.isfinite(vectors).all():
            if _write(path, identity, vectors):
                prune(path.parent, protect=path)
        else:  # a broken model's keys: refused by the datastore, and never kept
            logger.warning("SR-RAG key cache: the keys are not finite (a NaN or inf weight?); "
                           "not caching them")
    return vectors


def _compute(keys: Any, questions: Sequence[str]) -> Any:
    np = _numpy()
    vectors = keys.keys(list(questions))
    vectors = vectors.numpy() if hasattr(vectors, "numpy") else vectors
    return np.asarray(vectors, dtype=np.float32)


def _read(path: Path, identity: dict[str, JsonValue], shape: tuple[int, int]) -> Any | None:
    """The vectors of a whole, matching cache file; None when there is none, and (with a
    warning) when it is damaged or another's."""
    from rag_gates._files import parse_json, read_bytes
    from rag_gates.errors import InputFileError

    np = _numpy()
    if not path.exists():
        return None
    # A cache file holds the vectors it promises, 4 bytes each, and a short header.
    limit = shape[0] * shape[1] * 4 + 64 * 1024
    try:
        data = read_bytes(path, max_bytes=limit)
    except InputFileError as exc:
        logger.warning("SR-RAG key cache: %s; recomputing the keys", exc)
        return None
    head, newline, body = data.partition(b"\n")
    try:
        header = parse_json(head, path, line=1) if newline else None
    except InputFileError:  # not UTF-8, not JSON, nested too deep: damaged
        header = None
    problem = None
    if not isinstance(header, dict) or header.get("format") != _FORMAT:
        problem = "not a key-cache file"
    elif header.get("identity") != identity:
        problem = "written for other keys"
    elif header.get("shape") != list(shape) or len(body) != shape[0] * shape[1] * 4:
        problem = f"{len(body)} bytes of vectors, {shape[0]}x{shape[1]} float32 expected"
    elif hashlib.sha256(body).hexdigest() != header.get("sha256"):
        problem = "its checksum does not match its vectors"
    if problem is not None:
        logger.warning("SR-RAG key cache: %s is damaged (%s); recomputing the keys", path,
                       problem)
        return None
    return np.frombuffer(body, dtype="<f4").reshape(shape).astype(np.float32)


def prune(directory: Path, keep: int | None = None, *, protect: Path | None = None
          ) -> list[Path]:
    """Remove all but the ``keep`` (default :func:`keep_files`) most recently used key files
    of ``directory``, never ``protect`` (the file just written); a lock file whose key file
    is gone or removed here, when no process holds it; and temporary files over a day old.
    Returns what was removed. Best effort: a file that cannot be removed stays (logged), and
    no error is raised. A lock is removed only while this process holds it; a process that
    opened it just before then locks a file no longer in the directory and may compute the
    same keys beside a later one: duplicated work, never a wrong or torn file (writes are
    atomic, and a reader checks what it reads)."""
    from rag_gates._io import append_locked
    from rag_gates.errors import FileInUseError

    keep = keep_files() if keep is None else keep
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")

    def modified(file: Path) -> float | None:
        try:
            return file.stat().st_mtime
        except OSError:  # removed meanwhile by another process's prune
            return None

    newest_first = sorted(directory.glob("*.keys"), key=lambda f: -(modified(f) or 0.0))
    doomed = [f for f in newest_first if f != protect][keep - (protect is not None):]
    now = time.time()
    for tmp in directory.glob(".*.tmp"):
        mtime = modified(tmp)
        if mtime is not None and now - mtime > _STALE_TMP_S:
            doomed.append(tmp)
    removed = [f for f in doomed if _remove(f)]
    for lock in directory.glob("*.lock"):
        key_file = lock.with_suffix(".keys")
        if key_file == protect or (key_file.exists() and key_file not in removed):
            continue
        try:
            with append_locked(lock, wait_s=0.0):  # held by no one: nobody computes it now
                if _remove(lock):
                    removed.append(lock)
        except (OSError, FileInUseError):
            continue
    for file in removed:
        logger.info("SR-RAG key cache: removed %s (beyond the %d most recently used files, "
                    "its lock, or a stale temporary file)", file, keep)
    return removed


def keep_files() -> int:
    """How many key files the cache keeps: ``$RAG_GATES_SRRAG_KEY_CACHE_KEEP`` (an integer
    >= 1), else :data:`KEY_CACHE_KEEP`; an unreadable value keeps the default, with a
    warning."""
    raw = os.environ.get(KEY_CACHE_KEEP_ENV, "").strip()
    if not raw:
        return KEY_CACHE_KEEP
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        logger.warning("SR-RAG key cache: %s=%r is not an integer >= 1; keeping %d files",
                       KEY_CACHE_KEEP_ENV, raw, KEY_CACHE_KEEP)
        return KEY_CACHE_KEEP
    return value


def _remove(file: Path) -> bool:
    try:
        file.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        logger.warning("SR-RAG key cache: cannot remove %s (%s: %s)", file,
                       type(exc).__name__, exc)
        return False
    return True


def _touch(path: Path) -> None:
    """Mark a cache file used, so pruning keeps it; best effort (a read-only cache still
    serves its files)."""
    with contextlib.suppress(OSError):
        os.utime(path)


def _write(path: Path, identity: dict[str, JsonValue], vectors: Any) -> bool:
    from rag_gates._io import write_bytes_atomic

    body = vectors.tobytes()
    header = {"format": _FORMAT, "identity": identity, "shape": list(vectors.shape),
              "dtype": "float32-le", "sha256": hashlib.sha256(body).hexdigest()}
    try:
        write_bytes_atomic(path, json.dumps(header).encode() + b"\n" + body)
    except OSError as exc:
        logger.warning("SR-RAG key cache: cannot write %s (%s: %s); the keys are used "
                       "without being cached", path, type(exc).__name__, exc)
        return False
    return True


def _numpy() -> Any:
    from rag_gates._optional import require

    return require("numpy", "qdrant")
