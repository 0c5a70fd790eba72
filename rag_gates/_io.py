"""Small file helpers shared by the package."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

__all__ = ["JsonlLog", "append_locked", "drop_torn_tail", "file_sha256", "output_path_problem",
           "parse_lines_but_a_torn_tail",
           "write_bytes_atomic", "write_text_atomic"]

T = TypeVar("T")

logger = logging.getLogger(__name__)


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of a file, read in chunks (never whole into memory)."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename, so a reader never
    sees a half-written file and an interruption leaves the old one in place. The temporary
    file is this call's own, so two processes writing the same file at once both succeed
    (the last rename wins) instead of renaming each other's half-written file."""
    _write_atomic(path, "w", text)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """:func:`write_text_atomic` for bytes."""
    _write_atomic(path, "wb", data)


def _write_atomic(path: Path, mode: str, data: str | bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def output_path_problem(path: Path, *, directory: bool) -> str | None:
    """Why ``path`` cannot be written as a command's output (None: it can): it is a file
    where a directory is wanted, or a folder above it is a file. Checked before a command
    loads a model, so the mistake is said at once rather than as a traceback at the end."""
    if directory and path.exists() and not path.is_dir():
        return f"{path} is a file; give a directory (it is created if it does not exist)"
    if not directory and path.is_dir():
        return f"{path} is a directory; give a file path (e.g. {path / 'gate.json'})"
    for parent in path.parents:  # the nearest that exists must be a directory
        if parent.exists():
            return None if parent.is_dir() else (
                f"{parent} is a file, so {path} cannot be created inside it")
    return None


def drop_torn_tail(path: Path) -> bool:
    """Cut a last line left without its newline by an interrupted write, so the next
    appended record is not glued onto it; True (and a warning) when something was cut.
    A missing or empty file is left alone."""
    if not path.is_file() or path.stat().st_size == 0:
        return False
    with path.open("rb+") as handle:
        data = handle.read()
        if data.endswith(b"\n"):
            return False
        handle.truncate(data.rfind(b"\n") + 1)
    logger.warning("dropped an interrupted last line of %s", path)
    return True


def parse_lines_but_a_torn_tail(lines: list[str], parse: Callable[[str], T], *, file: Path,
                                first_line: int = 1, what: str = "a record",
                                fix: str = "delete that line or the file",
                                finite: bool = False) -> list[T]:
    """``parse`` of each non-blank line (``lines`` start at line ``first_line`` of ``file``),
    once the line is known to be bounded JSON (:func:`rag_gates._files.parse_json`: nesting
    bounded, no lone surrogates; with ``finite``, no NaN or Infinity). A last line that does
    not parse is an interrupted write: dropped with a warning. Any other line that does not
    parse raises :class:`~rag_gates.errors.ArtifactFileError` naming ``FILE:LINE``: dropping
    it would leave every figure read from the file silently short."""
    from rag_gates._files import parse_json
    from rag_gates.errors import ArtifactFileError

    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        number = first_line + i
        try:
            parse_json(line, file, line=number, finite=finite, expect=None)
            out.append(parse(line))
        except ValueError as exc:
            if i == last:
                logger.warning("%s:%d: ignoring an incomplete last line (interrupted write)",
                               file, number)
                continue
            raise ArtifactFileError(f"{file}:{number} is not {what} ({str(exc)[:200]}); "
                                    f"{fix}", path=file, line=number) from None
    return out


def append_locked(path: Path, *, wait_s: float = 0.0,
                  on_wait: Callable[[], None] | None = None,
                  advice: str | None = None) -> IO[str]:
    """``path`` opened for appending, with an exclusive lock held until it is closed, so two
    processes resuming the same output (the same ``--out`` twice) cannot both write it: the
    second gets a :class:`~rag_gates.errors.FileInUseError` before it reads or writes a row.

    ``wait_s``: wait up to this many seconds (``math.inf``: as long as it takes) for the
    other writer to finish instead, calling ``on_wait()`` once when the wait starts; a
    shared cache (eval-gate's labels) is then read, and completed, after the other writer.

    ``advice``: the refusal's message when the lock is held (default: the file is being
    written; wait, or write to another ``--out``).

    Take it before reading the rows already there, so the rows read are the whole truth.
    Advisory (``flock``): every rag-gates writer takes it; where ``fcntl`` does not exist
    (Windows) the file is opened unlocked.
    """
    from rag_gates.errors import FileInUseError

    handle = path.open("a", encoding="utf-8")
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on POSIX
        return handle
    deadline = time.monotonic() + wait_s
    waiting = False
    while True:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            if time.monotonic() >= deadline:
                handle.close()
                waited = f" (waited {wait_s:.0f} s)" if wait_s else ""
                raise FileInUseError(
                    (advice + waited) if advice is not None else
                    f"{path} is being written by another process{waited} (a second writer "
                    "would duplicate its rows): wait for that run to finish, or write to "
                    "another --out") from None
        except BaseException:
            handle.close()
            raise
        if not waiting and on_wait is not None:
            on_wait()
        waiting = True
        time.sleep(0.2)


class JsonlLog:
    """An append-only JSON-lines file whose first line records the settings it is written
    with, so an interrupted job resumes where it stopped and never mixes two settings.

    :meth:`open` checks the header (a file written with other settings raises
    :class:`~rag_gates.errors.ArtifactError` naming the file), drops a last line left
    half-written by an interruption, and returns the records already there; :meth:`append`
    writes one record and flushes it.

    Example:
        >>> log = JsonlLog(Path("rows.jsonl"), {"model": "smol"})       # doctest: +SKIP
        >>> done = {r["id"] for r in log.open()}                        # doctest: +SKIP
        >>> log.append({"id": "q1", "found": True}); log.close()        # doctest: +SKIP
    """

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = path
        self.header = {"header": header}
        self._handle: IO[str] | None = None

    def open(self) -> list[dict[str, Any]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = append_locked(self.path)  # before reading: the rows read are all
        try:
            records = self._read()
            if not self.path.stat().st_size:  # new, or only a torn first line was there
                self._write(self.header)
        except BaseException:
            self.close()
            raise
        return records

    def _read(self) -> list[dict[str, Any]]:
        from rag_gates._files import parse_json, read_text
        from rag_gates.errors import ArtifactFileError, InputFileError

        records: list[dict[str, Any]] = []
        drop_torn_tail(self.path)
        fix = "delete that line or the file"
        lines = read_text(self.path, fix=fix, error=ArtifactFileError).splitlines()
        try:
            header = parse_json(lines[0], self.path, line=1) if lines else None
        except InputFileError:
            header = None
        if lines and header != json.loads(json.dumps(self.header)):
            raise ArtifactFileError(
                f"{self.path} was written with other settings (its first line: "
                f"{lines[0][:200]}); delete it or write to another file", path=self.path)
        for number, line in enumerate(lines[1:], start=2):
            records.append(parse_json(line, self.path, line=number, finite=False,
                                      expect=dict, fix=fix, error=ArtifactFileError))
        return records

    def _write(self, obj: dict[str, Any]) -> None:
        assert self._handle is not None, "call open() first"
        self._handle.write(json.dumps(obj, ensure_ascii=False) + "\n")
        self._handle.flush()

    def append(self, record: dict[str, Any]) -> None:
        """Write one record (one line) and flush it."""
        self._write(record)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self) -> JsonlLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
