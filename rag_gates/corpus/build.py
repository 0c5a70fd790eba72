"""Build an infini-gram index of your own corpus, offline: ``rag-gates index build``.

Input: JSON Lines files (one object per line with ``text`` and optional ``id``/``title``),
plain text files (one document per file, per blank-line paragraph or per line), gzip-compressed
or not, or directories of them. Text is NFC-normalised (and lower-cased with ``lowercase``),
tokenized with a local tokenizer (default: the embedded model's) and written in the infini-gram
on-disk format with 16-bit tokens (see :mod:`rag_gates.corpus.index_format`; a tokenizer with
65,535 ids or more is renumbered densely), with each document's id and title as infini-gram
metadata; then the suffix array is built with the ``rust_indexing`` program that ships inside
the ``infini-gram`` wheel, and verified in full.

The build happens in a hidden temporary directory beside the target and is renamed into place
at the end: an interrupted build leaves no half index. An existing target is replaced only with
``force=True``, and only if it is a rag-gates index (or empty). A build killed outright
(SIGKILL, power loss) cannot clean up: its directory records the building process (pid, start
time, host), and the next build of the same target removes the directories whose process is
gone. On Linux the indexer processes get the parent-death signal, so they never outlive the
build.

Pitfalls handled: infini-gram's own indexer fetches tokenizers from the hub (not used here);
with several parallel parts a small corpus gets a silently wrong suffix array (parts are only
used when each is at least 4 MB, and every suffix array is verified); its default file limit
exceeds the hard limit on many machines (``ulimit`` is capped at the hard limit).

Example:
    >>> from rag_gates.corpus import build_index                       # doctest: +SKIP
    >>> report = build_index(["wiki.jsonl"], "indexes/wiki")            # doctest: +SKIP
    >>> report.documents, report.tokens, report.skipped                 # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import ctypes
import gzip
import json
import logging
import math
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unicodedata
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rag_gates._files import parse_json, read_json
from rag_gates._optional import require
from rag_gates._text import check_encodable
from rag_gates.corpus.errors import CorpusError, IndexBuildError, IndexExistsError
from rag_gates.corpus.index_format import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    TOKENIZER_NAME,
    VOCAB_MAP_NAME,
    Manifest,
    file_digest,
)
from rag_gates.corpus.tokenizer import CorpusTokenizer
from rag_gates.errors import InputFileError

__all__ = ["BuildOptions", "BuildReport", "build_index", "iter_documents"]

logger = logging.getLogger(__name__)

HACK = 100_000  # bytes each suffix-array part overlaps the next (rust_indexing's --hacksize)
MIN_PART_BYTES = 4 * 1024 * 1024  # below this per part, one part (see the pitfall above)
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz")
TEXT_SUFFIXES = (".txt", ".txt.gz")
MAX_EXAMPLES = 20
OWNER_NAME = ".rag_gates_build_owner.json"  # inside a build directory, never published
# A build directory without an owner record (a build of an older version, or one killed in
# the instant between creating it and writing the record) is stale after this long.
UNOWNED_STALE_SECONDS = 3600.0
_PR_SET_PDEATHSIG = 1  # from <sys/prctl.h>


class BuildOptions(BaseModel):
    """Options of :func:`build_index` (and of ``rag-gates index build``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text_unit: Literal["file", "paragraph", "line"] = Field(
        "file", description="How plain text files split into documents.")
    lowercase: bool = Field(False, description="Lower-case all text (case-insensitive index).")
    cpus: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1, le=512,
                      description="Parallel suffix-array parts (used only for large corpora).")
    mem_gb: float = Field(4.0, gt=0, le=4096, description="Memory budget of the suffix array.")
    ulimit: int | None = Field(None, ge=64, description="Open-file limit for the indexer; "
                                                        "capped at the hard limit.")
    batch_docs: int = Field(512, ge=1, le=1_000_000, description="Documents per tokenizer call.")
    force: bool = Field(False, description="Replace an existing index at the target.")
    verify: bool = Field(True, description="Verify the suffix array after building it.")
    progress: bool = Field(False, description="Show a rich progress bar on stderr.")
    name: str | None = Field(None, description="Index name (default: the target's name).")


class BuildReport(BaseModel):
    """What a build did; also stored in the index manifest."""

    model_config = ConfigDict(frozen=True)

    out: str
    index_id: str
    documents: int
    tokens: int = Field(..., description="Token count including one separator per document.")
    text_tokens: int
    skipped: dict[str, int]
    skipped_examples: list[str]
    sources: list[str]
    size_bytes: int
    seconds: float = Field(..., description="The whole build: setup_seconds + index_seconds.")
    setup_seconds: float = Field(..., description=(
        "Reading options and loading the tokenizer; the first build with the default one "
        "converts the embedded model (once per machine, tens of seconds)."))
    index_seconds: float = Field(0.0, description=(
        "Indexing alone: reading, tokenizing, the suffix array, checks and digests."))
    converted_model: bool = Field(False, description=(
        "The setup converted the embedded model (the default tokenizer's first use)."))
    tokenize_seconds: float
    suffix_array_seconds: float
    verify_seconds: float
    digest_seconds: float = Field(0.0, description="Computing the files' SHA-256 digests.")
    tokens_per_second: float = Field(..., description="tokens / index_seconds.")
    suffix_array_parts: int
    tokenizer: str


@dataclass
class _Doc:
    text: str
    doc_id: str
    title: str | None
    path: str
    line: int


class _Skips:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.examples: list[str] = []

    def add(self, reason: str, where: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(f"{where}: {reason}")
        logger.debug("skipped %s (%s)", where, reason)


def _expand(paths: Sequence[str | os.PathLike[str]]) -> list[tuple[Path, Path]]:
    """(file, root) pairs: explicit files, and known files under directories, sorted."""
    out: list[tuple[Path, Path]] = []
    for raw in paths:
        p = Path(raw).expanduser()
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file()
                           and f.name.lower().endswith(JSONL_SUFFIXES + TEXT_SUFFIXES))
            if not found:
                raise IndexBuildError(
                    f"{p} holds no .jsonl, .ndjson or .txt files (optionally .gz)")
            out.extend((f, p) for f in found)
        elif p.is_file():
            out.append((p, p.parent))
        else:
            raise IndexBuildError(f"corpus path {p} does not exist")
    if not out:
        raise IndexBuildError("no corpus files given")
    return out


def _open_binary(path: Path) -> IO[bytes]:
    if path.name.lower().endswith(".gz"):
        return gzip.GzipFile(path, "rb")  # type: ignore[return-value]
    return path.open("rb")


def _jsonl_docs(path: Path, rel: str, skips: _Skips,
                advance: Callable[[int], None]) -> Iterator[_Doc]:
    with _open_binary(path) as handle:
        for number, raw in enumerate(handle, start=1):
            advance(len(raw))
            line = raw.strip()
            if not line:
                continue
            where = f"{rel}:{number}"
            try:
                decoded = line.decode("utf-8")
            except UnicodeDecodeError:
                skips.add("non_utf8", where)
                continue
            try:  # bounded: a deeply nested line is skipped, not a RecursionError
                row = parse_json(decoded, path, line=number, finite=False, surrogates_ok=True)
            except InputFileError:
                skips.add("invalid_json", where)
                continue
            if not isinstance(row, dict):
                skips.add("not_an_object", where)
                continue
            text = row.get("text")
            if not isinstance(text, str):
                skips.add("missing_text", where)
                continue
            doc_id = row.get("id")
            title = row.get("title")
            try:  # JSON escapes can make lone surrogates, which no tokenizer accepts
                for value in (text, doc_id, title):
                    if isinstance(value, str):
                        check_encodable(value)
            except ValueError:
                skips.add("unencodable_text", where)
                continue
            yield _Doc(text, str(doc_id) if doc_id is not None else where,
                       str(title) if title is not None else None, rel, number)


_PARAGRAPH = re.compile(r"\n[ \t\r\f\v]*\n")


def _text_docs(path: Path, rel: str, unit: str, skips: _Skips,
               advance: Callable[[int], None]) -> Iterator[_Doc]:
    with _open_binary(path) as handle:
        data = handle.read()
    advance(path.stat().st_size)
    lines: list[tuple[int, str]] = []
    data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    try:
        lines = list(enumerate(data.decode("utf-8").split("\n"), start=1))
    except UnicodeDecodeError:
        for number, raw in enumerate(data.split(b"\n"), start=1):
            try:
                lines.append((number, raw.decode("utf-8")))
            except UnicodeDecodeError:
                skips.add("non_utf8", f"{rel}:{number}")
    title = path.name.split(".")[0]
    if unit == "line":
        for number, line in lines:
            yield _Doc(line, f"{rel}:{number}", title, rel, number)
    elif unit == "paragraph":
        buffer: list[str] = []
        first = 1
        for number, line in [*lines, (len(lines) + 1, "")]:
            if line.strip():
                if not buffer:
                    first = number
                buffer.append(line)
            elif buffer:
                yield _Doc("\n".join(buffer), f"{rel}:{first}", title, rel, first)
                buffer = []
    else:
        yield _Doc("\n".join(line for _, line in lines), rel, title, rel, 1)


def iter_documents(paths: Sequence[str | os.PathLike[str]], text_unit: str = "file",
                   skips: Any = None, advance: Callable[[int], None] | None = None
                   ) -> Iterator[tuple[str, str, str | None, str, int]]:
    """(text, id, title, path, line) of every document the builder would index."""
    return _iter_files(_expand(paths), text_unit, skips if skips is not None else _Skips(),
                       advance or (lambda _n: None))


def _iter_files(files: list[tuple[Path, Path]], text_unit: str, sink: _Skips,
                step: Callable[[int], None]) -> Iterator[tuple[str, str, str | None, str, int]]:
    for file, root in files:
        rel = str(file.relative_to(root)) if file != root else file.name
        if file.name.lower().endswith(JSONL_SUFFIXES):
            docs = _jsonl_docs(file, rel, sink, step)
        else:
            docs = _text_docs(file, rel, text_unit, sink, step)
        for d in docs:
            yield d.text, d.doc_id, d.title, d.path, d.line


# ------------------------------------------------------------------------------ suffix array
def _rust_indexing() -> Path:
    module = require("infini_gram", "corpus")
    binary = Path(next(iter(module.__path__))) / "rust_indexing"
    if not binary.is_file() or not os.access(binary, os.X_OK):
        raise IndexBuildError(
            f"the infini-gram wheel has no executable rust_indexing at {binary}; reinstall "
            'infini-gram: pip install --force-reinstall "rag-gates[corpus]"')
    return binary


def _prctl() -> Any:
    """libc's prctl on Linux (resolved in the parent: the child between fork and exec should
    do as little as possible), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _child_setup(limit: int | None) -> Callable[[], None]:
    """Runs in each indexer child before exec: dies with the build (a SIGKILLed build would
    otherwise leave it running for minutes), and raises its open-file limit."""
    prctl = _prctl()
    parent = os.getpid()

    def apply() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:  # the build died before prctl took effect
                os._exit(1)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = limit if limit is not None else 65536
        if hard != resource.RLIM_INFINITY:
            want = min(want, hard)
        if want > soft or limit is not None:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))

    return apply


def _run_all(commands: list[list[str]], log: Path, limit: int | None, step: str) -> None:
    procs: list[subprocess.Popen[bytes]] = []
    with log.open("ab") as sink:
        try:
            for cmd in commands:
                procs.append(subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT,
                                              preexec_fn=_child_setup(limit)))
            codes = [p.wait() for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    if any(codes):
        tail = log.read_text(errors="replace")[-2000:]
        raise IndexBuildError(f"suffix array step {step!r} failed (exit {codes}): {tail}")


def _build_suffix_array(ds: Path, sa: Path, work: Path, width: int, options: BuildOptions
                        ) -> int:
    binary = str(_rust_indexing())
    ds_size = ds.stat().st_size
    ratio = max(1, math.ceil(math.log2(ds_size) / 8))
    mem_bytes = int(options.mem_gb * 1024**3)
    batches = 1
    while batches * (mem_bytes // 8) < ds_size:
        batches *= 2
    parallel = max(1, min(options.cpus, ds_size // MIN_PART_BYTES))
    total_jobs = batches * parallel
    part = ds_size // total_jobs
    if part % width:
        part += width - part % width
    parts_dir, merged_dir, log = work / "parts", work / "merged", work / "rust_indexing.log"
    parts_dir.mkdir()
    merged_dir.mkdir()
    common = ["--ratio", str(ratio), "--token-width", str(width)]
    for first in range(0, total_jobs, parallel):
        jobs = []
        for i in range(first, min(first + parallel, total_jobs)):
            s, e = i * part, min((i + 1) * part + HACK, ds_size)
            jobs.append([binary, "make-part", "--data-file", str(ds), "--parts-dir",
                         str(parts_dir), "--start-byte", str(s), "--end-byte", str(e), *common])
        _run_all(jobs, log, options.ulimit, "make-part")
    _run_all([[binary, "merge", "--data-file", str(ds), "--parts-dir", str(parts_dir),
               "--merged-dir", str(merged_dir), "--num-threads", str(parallel),
               "--hacksize", str(HACK), *common]], log, options.ulimit, "merge")
    shutil.rmtree(parts_dir)
    _run_all([[binary, "concat", "--data-file", str(ds), "--merged-dir", str(merged_dir),
               "--merged-file", str(sa), "--num-threads", str(parallel), *common]],
             log, options.ulimit, "concat")
    shutil.rmtree(merged_dir)
    expected = (ds_size // width) * ratio
    if not sa.is_file() or sa.stat().st_size != expected:
        tail = log.read_text(errors="replace")[-1000:] if log.exists() else ""
        raise IndexBuildError(
            f"rust_indexing wrote {sa.stat().st_size if sa.exists() else 0} bytes of suffix "
            f"array, expected {expected} (a wrong suffix array; with parallel parts this "
            f"happens on small corpora: use cpus=1). Indexer output: {tail}")
    return total_jobs


# ------------------------------------------------------------------------------ progress
class _Progress:
    def __init__(self, enabled: bool, total_bytes: int) -> None:
        self._progress: Any = None
        self._task: Any = None
        self.docs = 0
        self.tokens = 0
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(),
                TextColumn("{task.fields[docs]:,} docs, {task.fields[tokens]:,} tokens"),
                TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True),
                transient=False)
            self._progress.start()
            self._task = self._progress.add_task("tokenizing", total=total_bytes, docs=0,
                                                 tokens=0)

    def advance(self, n: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=n)

    def counts(self, docs: int, tokens: int) -> None:
        self.docs, self.tokens = docs, tokens
        if self._progress is not None:
            self._progress.update(self._task, docs=docs, tokens=tokens)

    def stage(self, text: str) -> None:
        logger.info(text)
        if self._progress is not None:
            self._progress.update(self._task, description=text)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


# ------------------------------------------------------------------------------ the build
def _dense_ids(ids: Any, lookup: Any, dense: list[int]) -> Any:
    """Map tokenizer ids to dense u16 ids, numbering new ids in order of first use."""
    import numpy as np

    new = ids[lookup[ids] < 0]
    if new.size:
        _, first = np.unique(new, return_index=True)
        for token in new[np.sort(first)].tolist():
            if len(dense) >= 0xFFFF:
                raise IndexBuildError(
                    "the corpus uses more than 65,535 distinct tokens of this tokenizer, the "
                    "most a 16-bit infini-gram index can hold; split the corpus into several "
                    "indexes or use a tokenizer with fewer tokens")
            lookup[token] = len(dense)
            dense.append(int(token))
    return lookup[ids]


def _process_start(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (Linux), to tell a recycled pid
    from the original process; None where /proc is unavailable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _owner_record(pid: int) -> dict[str, Any]:
    return {"pid": pid, "host": socket.gethostname(), "started": _process_start(pid)}


def _owner_gone(record: dict[str, Any]) -> bool:
    """True when the process that owned a build directory no longer runs on this host."""
    pid = record.get("pid")
    if record.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return False  # another machine's build (shared disk), or unknown: leave it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's
    with contextlib.suppress(OSError, ValueError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat[stat.rindex(")") + 2] in "ZX":  # dead, not yet reaped by its parent
            return True
    started = record.get("started")
    now = _process_start(pid)
    return started is not None and now is not None and started != now  # pid recycled


def _clean_stale_builds(target: Path) -> None:
    """Remove build directories of ``target`` left by builds that were killed outright."""
    prefix = f".{target.name}.building-"
    for d in target.parent.iterdir():
        if not d.name.startswith(prefix) or d.is_symlink() or not d.is_dir():
            continue
        stale = False
        try:
            record = read_json(d / OWNER_NAME, max_bytes=64 * 1024)
            stale = isinstance(record, dict) and _owner_gone(record)
        except (OSError, ValueError):  # InputFileError too: a damaged record
            with contextlib.suppress(OSError):
                stale = time.time() - d.stat().st_mtime > UNOWNED_STALE_SECONDS
        if stale:
            logger.info("removing %s, left by a build that was killed", d)
            shutil.rmtree(d, ignore_errors=True)


def _replaceable(out: Path) -> bool:
    return out.is_dir() and ((out / MANIFEST_NAME).is_file() or not any(out.iterdir()))


def build_index(corpus: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
                out: str | os.PathLike[str], tokenizer: Any = None,
                options: BuildOptions | None = None, **overrides: Any) -> BuildReport:
    """Build an infini-gram index of ``corpus`` at ``out``; returns a :class:`BuildReport`.

    Raises:
        IndexExistsError: ``out`` exists and ``force`` is not set (or it is not an index).
        IndexBuildError: no usable document, unreadable input, or the indexer failed. Nothing
            is left at ``out`` (or the old index is untouched) in every error case.
    """
    base = options or BuildOptions()
    opts = BuildOptions.model_validate({**base.model_dump(), **overrides}) if overrides else base
    np = require("numpy", "corpus")
    started = time.perf_counter()
    target = Path(out).expanduser().absolute()
    if target.exists() or target.is_symlink():
        if not opts.force:
            raise IndexExistsError(
                f"{target} already exists; pass --force (force=True) to replace it")
        if not _replaceable(target):
            raise IndexExistsError(
                f"{target} exists and is not a rag-gates index (no {MANIFEST_NAME}); refusing "
                "to delete it even with --force: choose another --out")
    paths = [corpus] if isinstance(corpus, str | os.PathLike) else list(corpus)
    files = _expand(paths)
    converted = CorpusTokenizer.converts_model(tokenizer)
    try:
        tok = CorpusTokenizer.resolve(tokenizer)
    except (OSError, ValueError, TypeError) as exc:
        raise IndexBuildError(f"cannot load the tokenizer: {exc}") from exc
    setup_seconds = time.perf_counter() - started
    # Tokens are stored as u16 (0xFFFF separates documents). A tokenizer with more ids is
    # remapped: ids get dense u16 numbers in order of first use (rust_indexing needs tens of
    # GB for 32-bit tokens), and the map is stored in the index.
    dtype, width, sep = "u16", 2, b"\xff\xff"
    np_dtype = np.dtype("<u2")
    remap = tok.vocab_size >= 0xFFFF
    lookup = np.full(tok.vocab_size + 1, -1, dtype=np.int64) if remap else None
    dense: list[int] = []
    index_id = uuid.uuid4().hex
    name = opts.name or target.name
    target.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale_builds(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.building-", dir=target.parent))
    (tmp / OWNER_NAME).write_text(json.dumps(_owner_record(os.getpid())), encoding="utf-8")
    progress = _Progress(opts.progress, sum(f.stat().st_size for f, _ in files))
    skips = _Skips()
    try:
        # encode_batch_fast (tokenizers >= 0.21) skips character offsets: ~15% faster.
        encode_batch = getattr(tok.backend, "encode_batch_fast", tok.backend.encode_batch)
        ds_path, od_path = tmp / "tokenized.0", tmp / "offset.0"
        mt_path, om_path = tmp / "metadata.0", tmp / "metaoff.0"
        n_docs = n_tokens = 0
        ds_bytes = mt_bytes = 0
        t0 = time.perf_counter()
        with ds_path.open("wb") as ds, od_path.open("wb") as od, mt_path.open("wb") as mt, \
                om_path.open("wb") as om:
            batch: list[tuple[str, str, str | None, str, int]] = []

            def flush() -> None:
                nonlocal n_docs, n_tokens, ds_bytes, mt_bytes
                encoded = encode_batch([b[0] for b in batch], add_special_tokens=False)
                offsets: list[int] = []
                metaoffs: list[int] = []
                chunks: list[bytes] = []
                metas: list[bytes] = []
                for (_, doc_id, title, path, line), enc in zip(batch, encoded, strict=True):
                    ids = enc.ids
                    if not ids:
                        skips.add("no_tokens", f"{path}:{line}")
                        continue
                    if lookup is not None:
                        ids = _dense_ids(np.asarray(ids, dtype=np.int64), lookup, dense)
                    body = sep + np.asarray(ids, dtype=np_dtype).tobytes()
                    offsets.append(ds_bytes)
                    chunks.append(body)
                    ds_bytes += len(body)
                    meta = json.dumps({"path": path, "linenum": line,
                                       "metadata": {"id": doc_id, "title": title}},
                                      ensure_ascii=False).encode("utf-8") + b"\n"
                    metaoffs.append(mt_bytes)
                    metas.append(meta)
                    mt_bytes += len(meta)
                    n_docs += 1
                    n_tokens += len(ids) + 1
                ds.write(b"".join(chunks))
                od.write(np.asarray(offsets, dtype="<u8").tobytes())
                mt.write(b"".join(metas))
                om.write(np.asarray(metaoffs, dtype="<u8").tobytes())
                batch.clear()
                progress.counts(n_docs, n_tokens)

            for text, doc_id, title, path, line in _iter_files(
                    files, opts.text_unit, skips, progress.advance):
                text = unicodedata.normalize("NFC", text)
                if opts.lowercase:
                    text = text.lower()
                if not text.strip():
                    skips.add("empty_text", f"{path}:{line}")
                    continue
                batch.append((text, doc_id, title, path, line))
                if len(batch) >= opts.batch_docs:
                    flush()
            if batch:
                flush()
        tokenize_seconds = time.perf_counter() - t0
        if n_docs == 0:
            detail = ", ".join(f"{k}={v}" for k, v in sorted(skips.counts.items())) or "none"
            raise IndexBuildError(
                f"no documents to index in {', '.join(str(p) for p in paths)} (skipped: "
                f"{detail}); JSONL rows need a non-empty 'text' string")

        progress.stage("building suffix array")
        t1 = time.perf_counter()
        work = tmp / "work"
        work.mkdir()
        sa_path = tmp / "table.0"
        jobs = _build_suffix_array(ds_path, sa_path, work, width, opts)
        shutil.rmtree(work)
        sa_seconds = time.perf_counter() - t1

        t2 = time.perf_counter()
        if opts.verify:
            progress.stage("verifying suffix array")
            from rag_gates.corpus._arrays import verify_suffix_array

            ptr_size = sa_path.stat().st_size // (ds_bytes // width)
            try:
                verify_suffix_array(ds_path, sa_path, width, ptr_size)
            except CorpusError as exc:
                raise IndexBuildError(f"the suffix array failed verification: {exc}") from exc
        verify_seconds = time.perf_counter() - t2

        tok.save(tmp / TOKENIZER_NAME)
        if remap:
            np.asarray(dense, dtype="<u4").tofile(tmp / VOCAB_MAP_NAME)
        sizes = {p.name: p.stat().st_size for p in sorted(tmp.iterdir())
                 if p.is_file() and p.name != OWNER_NAME}
        progress.stage("computing digests")
        t3 = time.perf_counter()
        digests = {name: file_digest(tmp / name) for name in sizes}
        digest_seconds = time.perf_counter() - t3
        seconds = time.perf_counter() - started
        report = BuildReport(
            out=str(target), index_id=index_id, documents=n_docs, tokens=n_tokens,
            text_tokens=n_tokens - n_docs, skipped=dict(sorted(skips.counts.items())),
            skipped_examples=skips.examples, sources=[str(p) for p in paths],
            size_bytes=sum(sizes.values()), seconds=seconds, setup_seconds=setup_seconds,
            tokenize_seconds=tokenize_seconds, suffix_array_seconds=sa_seconds,
            verify_seconds=verify_seconds, digest_seconds=digest_seconds,
            index_seconds=seconds - setup_seconds, converted_model=converted,
            # Over the indexing alone: a first-run model conversion is not indexing speed.
            tokens_per_second=(n_tokens / (seconds - setup_seconds)
                               if seconds > setup_seconds else 0.0),
            suffix_array_parts=jobs, tokenizer=tok.name)
        manifest = Manifest(
            format_version=FORMAT_VERSION, index_id=index_id, name=name, token_dtype=dtype,
            lowercase=opts.lowercase, documents=n_docs, tokens=n_tokens,
            vocab_map=VOCAB_MAP_NAME if remap else None,
            tokenizer={"name": tok.name, "sha256": tok.sha256(), "vocab_size": tok.vocab_size},
            files=sizes, digests=digests,
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            build=report.model_dump(exclude={"skipped", "sources", "out", "index_id"}),
            skipped=report.skipped, sources=report.sources)
        (tmp / MANIFEST_NAME).write_text(manifest.model_dump_json(indent=2), encoding="utf-8")
        progress.stage("publishing")
        (tmp / OWNER_NAME).unlink()
        _publish(tmp, target)
        logger.info("built %s: %d documents, %d tokens in %.1f s", target, n_docs, n_tokens,
                    seconds)
        return report
    finally:
        progress.close()
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _publish(tmp: Path, target: Path) -> None:
    """Rename the finished build into place; an old index is swapped out, then removed."""
    old: Path | None = None
    if target.exists() or target.is_symlink():
        old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(target, old)
    try:
        os.rename(tmp, target)
    except OSError as exc:
        if old is not None:
            os.rename(old, target)
        raise IndexExistsError(f"could not move the new index into {target}: {exc}") from exc
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
