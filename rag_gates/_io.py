"""Small file helpers shared by the package."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import IO, Any

__all__ = ["JsonlLog", "append_locked", "drop_torn_tail", "write_text_atomic"]

logger = logging.getLogger(__name__)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename, so a reader never
    sees a half-written file and an interruption leaves the old one in place."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


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


def append_locked(path: Path) -> IO[str]:
    """``path`` opened for appending, with an exclusive lock held until it is closed, so two
    processes resuming the same output (the same ``--out`` twice) cannot both write it: the
    second gets a :class:`~rag_gates.errors.FileInUseError` before it reads or writes a row.

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
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise FileInUseError(
            f"{path} is being written by another process (a second writer would duplicate "
            "its rows): wait for that run to finish, or write to another --out") from None
    return handle


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
        from rag_gates.errors import ArtifactError

        records: list[dict[str, Any]] = []
        drop_torn_tail(self.path)
        lines = self.path.read_text(encoding="utf-8").splitlines()
        try:
            header = json.loads(lines[0]) if lines else None
        except json.JSONDecodeError:
            header = None
        if lines and header != json.loads(json.dumps(self.header)):
            raise ArtifactError(
                f"{self.path} was written with other settings (its first line: "
                f"{lines[0][:200]}); delete it or write to another file")
        for number, line in enumerate(lines[1:], start=2):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ArtifactError(f"{self.path}:{number} is not valid JSON ({exc}); "
                                    "delete that line or the file") from exc
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
