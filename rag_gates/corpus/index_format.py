"""The infini-gram on-disk index format, checked before the C++ engine ever sees it.

An index directory holds, per shard ``s``:

* ``tokenized.s``: every document as a separator (``0xFFFF`` for u16 tokens, ``0xFFFFFFFF``
  for u32) followed by its token ids, little-endian;
* ``offset.s``: one little-endian uint64 per document, the byte offset of its separator;
* ``table.s``: the suffix array, one ``ptr_size``-byte little-endian byte offset per token;
* optionally ``metadata.s`` (one JSON line per document) and ``metaoff.s`` (uint64 offsets).

rag-gates adds ``rag_gates_index.json`` (the manifest), ``tokenizer.json`` and, for tokenizers
with 65,535 or more ids, ``vocab_map.u32`` (index ids are dense 16-bit numbers given to
tokenizer ids in order of first use; this file lists the tokenizer id of each).

The manifest records the size and a SHA-256 of every other file. Sizes are checked at every
open; digests (:func:`verify_digests`) when the index is first opened on a machine, and the
verified state is kept under ``$RAG_GATES_HOME/index-checks/`` keyed by each file's path,
size, mtime, change time and inode, so later opens only ``stat`` the files. Damage that keeps
the sizes (a flipped token, two swapped suffix-array entries) changes counts without any other
sign; the digests catch it. They detect damage, not tampering: whoever can edit the files can
edit the manifest too. An index without digests (built before they existed, or by infini-gram's
own indexer) opens with a warning, or is refused under ``check_digests="require"``.

The engine (``infini_gram.cpp_engine``) is built without assertions: given a missing,
truncated or stray file it segfaults. It also classifies files by *substring of the full path*
(``"tokenized"``, ``"table"``, ``"offset"``, ``"metadata"``, ``"metaoff"``, ``"unigram"``), so a
directory such as ``/home/me/portable/idx`` ("portable" contains "table") confuses it. This
module replays that discovery and checks every precondition, raising
:class:`~rag_gates.corpus.errors.IndexNotFoundError` or
:class:`~rag_gates.corpus.errors.CorruptIndexError`, and hands the engine a neutral path.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rag_gates._files import read_json
from rag_gates._io import write_text_atomic
from rag_gates.corpus.errors import CorruptIndexError, CorruptIndexFileError, IndexNotFoundError
from rag_gates.errors import InputFileError

__all__ = [
    "DIGEST_ALGORITHM",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "KEYWORDS",
    "MANIFEST_NAME",
    "TOKENIZER_NAME",
    "VOCAB_MAP_NAME",
    "DigestCheck",
    "IndexFiles",
    "Manifest",
    "ShardFiles",
    "engine_path",
    "file_digest",
    "inspect_index_dir",
    "read_manifest",
    "verify_digests",
]

logger = logging.getLogger(__name__)

FORMAT_NAME: Literal["rag-gates-infini-gram"] = "rag-gates-infini-gram"
FORMAT_VERSION = 1
DIGEST_ALGORITHM = "sha256"  # with SHA-NI about twice as fast as blake2b on these machines
MANIFEST_NAME = "rag_gates_index.json"
MAX_MANIFEST_BYTES = 64 * 1024 * 1024  # a manifest lists shards and digests: kilobytes
TOKENIZER_NAME = "tokenizer.json"
VOCAB_MAP_NAME = "vocab_map.u32"  # dense index id -> tokenizer id, for tokenizers >= 65535 ids
# The engine's file classification, in its order of precedence.
KEYWORDS = ("tokenized", "table", "offset", "metadata", "metaoff", "unigram")
_KIND_BY_KEYWORD = {"tokenized": "ds", "table": "sa", "offset": "od", "metadata": "mt",
                    "metaoff": "om", "unigram": "ug"}


class Manifest(BaseModel):
    """What rag-gates records about an index it built (``rag_gates_index.json``)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    format: Literal["rag-gates-infini-gram"] = FORMAT_NAME
    format_version: int = Field(FORMAT_VERSION, ge=1)
    index_id: str = Field(..., min_length=8, description="Random id, new for every build.")
    name: str = Field(..., description="Directory name at build time.")
    token_dtype: Literal["u8", "u16", "u32"] = "u16"
    version: Literal[4] = 4
    lowercase: bool = Field(False, description="True when text was lower-cased at build time.")
    vocab_map: str | None = Field(None, description="File mapping the index's dense token ids "
                                                    "to tokenizer ids (large vocabularies).")
    documents: int = Field(..., ge=0)
    tokens: int = Field(..., ge=0, description="Tokens including one separator per document.")
    tokenizer: dict[str, str | int] = Field(default_factory=dict)
    files: dict[str, int] = Field(default_factory=dict, description="Size in bytes of each file.")
    digests: dict[str, str] = Field(
        default_factory=dict, description="'sha256:<hex>' of each file (empty: an index built "
                                          "before digests were recorded).")
    created_at: str = ""
    build: dict[str, object] = Field(default_factory=dict)
    skipped: dict[str, int] = Field(default_factory=dict)
    sources: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class ShardFiles:
    suffix: str
    ds: Path
    sa: Path
    od: Path
    mt: Path | None
    om: Path | None
    tok_cnt: int
    ptr_size: int
    doc_cnt: int


@dataclass(frozen=True)
class IndexFiles:
    directory: Path
    token_width: int
    shards: tuple[ShardFiles, ...]
    manifest: Manifest | None
    total_bytes: int
    extra: dict[str, Path] = field(default_factory=dict)

    @property
    def documents(self) -> int:
        return sum(s.doc_cnt for s in self.shards)

    @property
    def tokens(self) -> int:
        return sum(s.tok_cnt for s in self.shards)


def read_manifest(directory: Path) -> Manifest | None:
    path = directory / MANIFEST_NAME
    if not path.exists():
        return None
    fix = "rebuild the index with `rag-gates index build ... --force`"
    data = read_json(path, max_bytes=MAX_MANIFEST_BYTES, expect=dict,
                     fix=f"it is not a rag-gates manifest; {fix}", error=CorruptIndexFileError)
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        raise CorruptIndexFileError(
            f"{path} is not a rag-gates manifest ({exc}); {fix}", path=path) from exc


def _classify(path_text: str) -> str | None:
    for keyword in KEYWORDS:
        if keyword in path_text:
            return _KIND_BY_KEYWORD[keyword]
    return None


def _suffix(name: str, prefix: str) -> str:
    return name[len(prefix):] if name.startswith(prefix) else name


def inspect_index_dir(directory: str | os.PathLike[str],
                      token_dtype: Literal["u8", "u16", "u32"] | None = None) -> IndexFiles:
    """Validate an index directory the way the engine will read it; never touches the engine."""
    d = Path(directory).expanduser()
    if not d.exists():
        raise IndexNotFoundError(
            f"no index at {d}: build one with `rag-gates index build CORPUS --out {d}`")
    if not d.is_dir():
        raise IndexNotFoundError(f"{d} is a file, not an index directory")
    manifest = read_manifest(d)
    dtype = token_dtype or (manifest.token_dtype if manifest else "u16")
    width = {"u8": 1, "u16": 2, "u32": 4}[dtype]

    groups: dict[str, list[Path]] = {k: [] for k in ("ds", "sa", "od", "mt", "om", "ug")}
    for entry in sorted(d.iterdir()):
        # The engine tests the whole path; a neutral directory path is handed to it (see
        # engine_path), so only the entry name matters here.
        kind = _classify(entry.name)
        if kind is None:
            continue
        if not entry.is_file():
            raise CorruptIndexError(
                f"{entry} is not a regular file, but its name marks it as an index file "
                f"({kind}); move it out of the index directory")
        groups[kind].append(entry)
    if not groups["ds"]:
        what = "a rag-gates manifest but no" if manifest else "no"
        raise CorruptIndexError(
            f"{d} has {what} tokenized.* file, so it is not a complete infini-gram index; "
            "rebuild it with `rag-gates index build ... --force`")
    n = len(groups["ds"])
    for kind, name in (("sa", "table"), ("od", "offset")):
        if len(groups[kind]) != n:
            raise CorruptIndexError(
                f"{d} has {n} tokenized.* file(s) but {len(groups[kind])} {name}.* file(s); "
                "the build was interrupted or files were removed: rebuild the index")
    if len(groups["mt"]) not in (0, n) or len(groups["om"]) != len(groups["mt"]):
        raise CorruptIndexError(
            f"{d}: metadata.*/metaoff.* files do not match the {n} shard(s); rebuild the index")
    if groups["ug"] and len(groups["ug"]) != n:
        raise CorruptIndexError(f"{d}: unigram.* files do not match the {n} shard(s)")

    shards: list[ShardFiles] = []
    total = 0
    for i in range(n):
        ds, sa, od = groups["ds"][i], groups["sa"][i], groups["od"][i]
        suffix = _suffix(ds.name, "tokenized")
        if _suffix(sa.name, "table") != suffix or _suffix(od.name, "offset") != suffix:
            raise CorruptIndexError(
                f"{d}: shard files do not pair up ({ds.name}, {sa.name}, {od.name})")
        mt = groups["mt"][i] if groups["mt"] else None
        om = groups["om"][i] if groups["om"] else None
        ds_size, sa_size, od_size = ds.stat().st_size, sa.stat().st_size, od.stat().st_size
        if ds_size == 0 or sa_size == 0 or od_size == 0:
            raise CorruptIndexError(f"{d}: shard {suffix!r} has an empty file; rebuild the index")
        if ds_size % width:
            raise CorruptIndexError(
                f"{ds} is {ds_size} bytes, not a whole number of {width}-byte tokens: truncated "
                "or built with another token width")
        tok_cnt = ds_size // width
        if sa_size % tok_cnt:
            raise CorruptIndexError(
                f"{sa} ({sa_size} bytes) does not hold one pointer per token of {ds.name} "
                f"({tok_cnt} tokens): truncated, or the suffix array was never finished")
        ptr_size = sa_size // tok_cnt
        expected = max(1, math.ceil(math.log2(ds_size) / 8))
        if ptr_size != expected:
            raise CorruptIndexError(
                f"{sa} has {ptr_size}-byte pointers where {expected} are expected for "
                f"{ds_size} bytes of tokens: the files belong to different builds")
        if od_size % 8:
            raise CorruptIndexError(f"{od} is not a whole number of uint64 offsets")
        doc_cnt = od_size // 8
        if mt is not None and om is not None:
            if om.stat().st_size != doc_cnt * 8:
                raise CorruptIndexError(
                    f"{om} has {om.stat().st_size // 8} entries for {doc_cnt} documents")
            if mt.stat().st_size == 0:
                raise CorruptIndexError(f"{mt} is empty")
            total += mt.stat().st_size + om.stat().st_size
        shards.append(ShardFiles(suffix, ds, sa, od, mt, om, tok_cnt, ptr_size, doc_cnt))
        total += ds_size + sa_size + od_size

    if manifest is not None:
        for name, size in manifest.files.items():
            p = d / name
            if not p.is_file():
                raise CorruptIndexError(f"{p} is listed in the manifest but missing; rebuild")
            if p.stat().st_size != size:
                raise CorruptIndexError(
                    f"{p} is {p.stat().st_size} bytes, the manifest says {size}: the index was "
                    "modified or truncated after it was built; rebuild it")
    extra = {p.name: p for p in (d / MANIFEST_NAME, d / TOKENIZER_NAME) if p.exists()}
    return IndexFiles(d.resolve(), width, tuple(shards), manifest, total, extra)


def engine_path(directory: Path) -> tuple[str, Path | None]:
    """A path to ``directory`` that contains none of the engine's keywords.

    Returns the path and, when a symlink had to be made, the temporary folder holding it (the
    caller deletes it once the engine is constructed: the engine mmaps the files then).
    """
    text = str(directory)
    if _classify(text) is None:
        return text, None
    for _ in range(8):
        holder = Path(tempfile.mkdtemp(prefix="rgidx"))
        link = holder / "i"
        if _classify(str(link)) is None:
            link.symlink_to(directory, target_is_directory=True)
            return str(link), holder
        shutil.rmtree(holder, ignore_errors=True)
    raise CorruptIndexError(
        f"the path {text} contains one of {KEYWORDS}, which the infini-gram engine reads as a "
        "file kind, and no neutral temporary path could be made; move the index elsewhere")


# ------------------------------------------------------------------------------ digests
REBUILD_HINT = "rebuild it with `rag-gates index build CORPUS --out {dir} --force`"


def file_digest(path: Path) -> str:
    """``"sha256:<hex>"`` of a file, read in chunks (never whole into memory)."""
    with path.open("rb") as handle:
        return f"{DIGEST_ALGORITHM}:{hashlib.file_digest(handle, DIGEST_ALGORITHM).hexdigest()}"


@dataclass(frozen=True)
class DigestCheck:
    """What :func:`verify_digests` did: files hashed, files trusted from the verified-state
    cache (unchanged since they were last verified here), bytes hashed and the time taken."""

    hashed: list[str] = field(default_factory=list)
    trusted: list[str] = field(default_factory=list)
    bytes_hashed: int = 0
    seconds: float = 0.0
    recorded: bool = True  # False when the manifest has no digests


def _stamp(st: os.stat_result) -> list[int]:
    # The change time and inode move on any write or replacement, even when the mtime is put
    # back with utime, so they guard the cache as well as the size and mtime.
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _state_path(directory: Path) -> Path:
    from rag_gates.lm.defaults import rag_gates_home

    key = hashlib.sha256(str(directory).encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return rag_gates_home() / "index-checks" / f"{key}.json"


def _read_state(path: Path, directory: Path) -> dict[str, list[object]]:
    try:
        data = read_json(path, max_bytes=MAX_MANIFEST_BYTES)
    except InputFileError:
        return {}  # no state yet, or a damaged one: verify again
    if not isinstance(data, dict) or data.get("path") != str(directory) or \
            not isinstance(data.get("files"), dict):
        return {}
    return {k: v for k, v in data["files"].items() if isinstance(v, list)}


def _write_state(path: Path, directory: Path, files: dict[str, list[object]]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps({"path": str(directory), "files": files}))
    except OSError as exc:  # an unwritable cache only means verifying again next time
        logger.debug("could not record the verified state of %s in %s: %s", directory, path,
                     exc)


def verify_digests(files: IndexFiles, *, use_cache: bool = True,
                   names: Iterable[str] | None = None) -> DigestCheck:
    """Check every file against the digest its manifest recorded at build time.

    With ``use_cache`` a file whose (path, size, mtime, change time, inode) matches a previous
    successful check on this machine is trusted without reading it; the others are hashed
    and, when they match, recorded. Raises :class:`CorruptIndexError` naming the first file
    that is missing or whose content changed since the build, with the rebuild command.

    Example:
        >>> check = verify_digests(inspect_index_dir("indexes/wiki"))   # doctest: +SKIP
        >>> check.hashed, check.trusted                                 # doctest: +SKIP
        ([], ['metadata.0', 'metaoff.0', 'offset.0', 'table.0', ...])
    """
    start = time.perf_counter()
    manifest = files.manifest
    expected = dict(manifest.digests) if manifest is not None else {}
    if not expected:
        return DigestCheck(recorded=False)
    directory = files.directory
    wanted = sorted(expected) if names is None else sorted(set(names) & set(expected))
    state_path = _state_path(directory) if use_cache else None
    known = _read_state(state_path, directory) if state_path is not None else {}
    hashed: list[str] = []
    trusted: list[str] = []
    size = 0
    for name in wanted:
        path = directory / name
        try:
            stamp = _stamp(path.stat())
        except OSError as exc:
            raise CorruptIndexError(
                f"{path} is listed in the index manifest but cannot be read ({exc}); "
                + REBUILD_HINT.format(dir=directory)) from exc
        if known.get(name) == [*stamp, expected[name]]:
            trusted.append(name)
            continue
        try:
            digest = file_digest(path)
        except OSError as exc:
            raise CorruptIndexError(f"cannot read {path} ({exc}); "
                                    + REBUILD_HINT.format(dir=directory)) from exc
        if digest != expected[name]:
            raise CorruptIndexError(
                f"{path} does not match the digest recorded when the index was built: its "
                "content changed since (disk damage or an edit), so its counts cannot be "
                "trusted; " + REBUILD_HINT.format(dir=directory))
        hashed.append(name)
        size += stamp[0]
        known[name] = [*stamp, digest]
    if state_path is not None and hashed:
        _write_state(state_path, directory, known)
    return DigestCheck(hashed, trusted, size, time.perf_counter() - start)
