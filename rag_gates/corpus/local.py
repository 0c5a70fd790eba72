"""``LocalInfiniGram``: exact counts and co-occurrence over an infini-gram index on local disk.

* ``count``: a suffix-array lookup for every variant of the phrase (see
  :mod:`rag_gates.corpus.phrases`), summed; exact. The lookup is the engine's binary search,
  done in Python over the mapped files by default (``lookup="python"``: same answers and
  median speed as ``lookup="engine"``, without the engine's thread start per lookup, which
  costs 4-8 ms whenever the machine's cores are busy).
* ``cooccurrence(scope="document")``: the number of documents containing both phrases, exact.
  The engine's own AND query is not used: it only pairs occurrences within ``max_diff_tokens``,
  and for each occurrence of the rarer phrase it merges the nearest partners on both sides into
  one span that it drops when the span crosses a document boundary, so it misses pairs on
  short documents even inside the window. Instead each phrase's matches are mapped to document
  ids through the document offsets and the two sets intersected; when one phrase is much
  rarer, its documents are scanned for the other phrase instead of mapping all of the other's
  matches (``strategy``).
* ``cooccurrence(scope=Window(tokens=n))``: documents in which an occurrence of ``a`` and one of
  ``b`` start at most ``n`` tokens apart, inside the same document; exact.

Values of co-occurrence are in documents (``unit="documents"``). Occurrences may overlap
(``cooccurrence("New York", "York")`` counts every document with "New York").

Example:
    >>> stats = LocalInfiniGram("/path/to/index")                    # doctest: +SKIP
    >>> stats.count("Tom AND Jerry")          # literal: never an AND query  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rag_gates._optional import require
from rag_gates.corpus.base import CorpusStats
from rag_gates.corpus.errors import CorpusError, CorruptIndexError
from rag_gates.corpus.index_format import (
    REBUILD_HINT,
    TOKENIZER_NAME,
    DigestCheck,
    IndexFiles,
    engine_path,
    inspect_index_dir,
    verify_digests,
)
from rag_gates.corpus.phrases import normalize_phrase, surface_forms, token_variants
from rag_gates.corpus.tokenizer import CorpusTokenizer
from rag_gates.corpus.types import (
    CaseMode,
    CooccurrenceResult,
    CountResult,
    Scope,
    SpaceMode,
    parse_scope,
    window_tokens,
)

if TYPE_CHECKING:  # pragma: no cover
    from rag_gates.corpus._arrays import Shard

__all__ = ["IndexStats", "LocalConfig", "LocalInfiniGram"]

logger = logging.getLogger(__name__)
_WARNED_NO_DIGESTS: set[str] = set()  # warn once per index and process


class LocalConfig(BaseModel):
    """Options of :class:`LocalInfiniGram`; every one that changes answers is in cache keys."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    case: CaseMode = Field("sensitive", description="Case handling (see CaseMode).")
    spaces: SpaceMode = Field("both", description="Leading-space / no-space variants.")
    max_phrase_chars: int = Field(1000, ge=1, le=100_000,
                                  description="Longer phrases raise PhraseTooLongError.")
    max_phrase_tokens: int = Field(500, ge=1, le=40_000,
                                   description="Longer phrases raise PhraseTooLongError (the "
                                               "suffix array orders suffixes on their first "
                                               "50,000 tokens).")
    strategy: Literal["auto", "map", "scan"] = Field(
        "auto", description="Co-occurrence: 'map' maps every match of both phrases to its "
                            "document, 'scan' scans the rarer phrase's documents for the other, "
                            "'auto' picks the cheaper. All give the same answer.")
    token_dtype: Literal["u8", "u16", "u32"] | None = Field(
        None, description="Token width of indexes built elsewhere (default: the manifest's, "
                          "else u16).")
    lookup: Literal["python", "engine"] = Field(
        "python", description="'python': binary search of the suffix array in Python over the "
                              "mapped files; 'engine': infini-gram's C++ find. Same answers "
                              "and median speed; the engine starts a thread per lookup, which "
                              "on a busy machine waits for a core (4-8 ms tails).")
    load_to_ram: bool = Field(False, description="Read the index into RAM instead of mmap.")
    prefetch: bool = Field(False, description="Engine prefetching; helps indexes on slow "
                                              "disks, costs ~0.2 ms per lookup otherwise.")
    verify_on_open: bool = Field(True, description="Cheap consistency checks when opening.")
    check_digests: Literal["verify", "require", "off"] = Field(
        "verify", description="Content digests recorded at build time: 'verify' checks them "
                              "on the first open on this machine (then only when a file's "
                              "size, mtime or inode changes) and warns when the index has "
                              "none; 'require' also refuses an index without digests; 'off' "
                              "skips the check.")


class IndexStats(BaseModel):
    """What ``rag-gates index stats`` shows."""

    model_config = ConfigDict(frozen=True)

    name: str
    path: str
    index_id: str | None
    documents: int
    tokens: int
    shards: int
    size_bytes: int
    token_dtype: str
    lowercase: bool
    tokenizer: str
    created_at: str | None
    build: dict[str, Any] = Field(default_factory=dict)
    skipped: dict[str, int] = Field(default_factory=dict)


class _Found:
    """Segments of suffix-array ranks per shard, shaped like the engine's FindResult."""

    def __init__(self, segments: list[tuple[int, int]]) -> None:
        self.segment_by_shard = segments
        self.cnt = sum(hi - lo for lo, hi in segments)


class LocalInfiniGram(CorpusStats):
    """Exact phrase counts and co-occurrence over a local infini-gram index.

    Args:
        index_dir: a directory built by ``rag-gates index build`` (or by infini-gram's own
            indexer, then pass ``tokenizer``).
        tokenizer: defaults to the ``tokenizer.json`` stored in the index; must be the tokenizer
            the index was built with.
        config: a :class:`LocalConfig`; keyword overrides (``case="insensitive"``) also work.

    Raises:
        IndexNotFoundError: no directory at ``index_dir``.
        CorruptIndexError: files missing, truncated or inconsistent (checked before the C++
            engine opens them, since it would crash on them), or a file whose content differs
            from the SHA-256 recorded at build time (checked on the first open on this
            machine; ``digest_check`` says what was hashed and what was trusted).
    """

    backend_name = "local-infini-gram"

    def __init__(self, index_dir: str | os.PathLike[str], tokenizer: Any = None,
                 config: LocalConfig | None = None, **overrides: Any) -> None:
        base = config or LocalConfig()
        self.config = (LocalConfig.model_validate({**base.model_dump(), **overrides})
                       if overrides else base)
        self.files: IndexFiles = inspect_index_dir(index_dir, self.config.token_dtype)
        self.path = self.files.directory
        self.digest_check = self._check_digests()
        manifest = self.files.manifest
        self.lowercase = bool(manifest.lowercase) if manifest else False
        self._dtype = self.config.token_dtype or (manifest.token_dtype if manifest else "u16")
        if tokenizer is None:
            stored = self.path / TOKENIZER_NAME
            if not stored.is_file():
                raise CorruptIndexError(
                    f"{self.path} has no {TOKENIZER_NAME}; pass tokenizer=... (the tokenizer the "
                    "index was built with)")
            self.tokenizer = CorpusTokenizer.from_file(stored, name=str(
                manifest.tokenizer.get("name", stored)) if manifest else str(stored))
        else:
            self.tokenizer = CorpusTokenizer.resolve(tokenizer)
        self._open()

    # ----------------------------------------------------------------------------- opening
    def _check_digests(self) -> DigestCheck:
        mode = self.config.check_digests
        if mode == "off":
            return DigestCheck(recorded=bool(self.files.manifest and self.files.manifest.digests))
        check = verify_digests(self.files)
        if not check.recorded:
            message = (f"the index at {self.path} has no content digests (built before rag-gates "
                       "recorded them, or by another indexer), so damage that keeps file sizes "
                       "cannot be detected when it opens; "
                       + REBUILD_HINT.format(dir=self.path)
                       + " (or run `rag-gates index stats --verify` for the deep check)")
            if mode == "require":
                raise CorruptIndexError(message)
            if str(self.path) not in _WARNED_NO_DIGESTS:
                _WARNED_NO_DIGESTS.add(str(self.path))
                logger.warning(message)
        elif check.hashed:
            logger.info("verified the digests of %d file(s) of %s (%.1f MB) in %.0f ms",
                        len(check.hashed), self.path, check.bytes_hashed / 1e6,
                        check.seconds * 1000)
        return check

    def _open(self) -> None:
        require("numpy", "corpus")
        from rag_gates.corpus._arrays import Shard

        width = self.files.token_width
        self._lookup: Any = None
        manifest = self.files.manifest
        if manifest is not None and manifest.vocab_map:
            import numpy as np

            map_path = self.path / manifest.vocab_map
            if not map_path.is_file():
                raise CorruptIndexError(f"{map_path} is missing; rebuild the index")
            dense = np.fromfile(map_path, dtype="<u4").astype(np.int64)
            if dense.size and int(dense.max()) >= self.tokenizer.vocab_size + 1:
                raise CorruptIndexError(
                    f"{map_path} names token ids this tokenizer does not have: it is not the "
                    "tokenizer the index was built with")
            lookup = np.full(self.tokenizer.vocab_size + 1, -1, dtype=np.int64)
            lookup[dense] = np.arange(dense.size)
            self._lookup = lookup
        elif self.tokenizer.vocab_size >= (1 << (8 * width)) - 1:
            raise CorruptIndexError(
                f"the tokenizer has {self.tokenizer.vocab_size} tokens, too many for this "
                f"index's {self._dtype} tokens: it is not the tokenizer the index was built with")
        shards: list[Shard] = []
        base = 0
        for f in self.files.shards:
            shard = Shard(f.ds, f.sa, f.od, width, f.ptr_size, base, self.config.load_to_ram)
            if self.config.verify_on_open:
                shard.check(f.ds)
            shards.append(shard)
            base += f.doc_cnt
        self._shards: list[Shard] = shards
        self._closed = False
        self._engine_obj: Any = None
        self._engine_lock = threading.Lock()
        if self.config.lookup == "engine":
            self._cpp: Any = self.engine.engine

    @property
    def engine(self) -> Any:
        """The ``infini_gram.engine.InfiniGramEngine`` over this index (opened on first use,
        after the checks that keep its C++ side from crashing on a bad index)."""
        if self._closed:
            raise CorpusError(f"this LocalInfiniGram over {self.path} was closed")
        with self._engine_lock:
            if self._engine_obj is None:
                self._engine_obj = self._open_engine()
            return self._engine_obj

    def _open_engine(self) -> Any:
        engine_mod = require("infini_gram.engine", "corpus")
        width = self.files.token_width
        path, holder = engine_path(self.path)
        depth = 1 if self.config.prefetch else 0
        top = (1 << (8 * width)) - 1  # the separator id; every real id is below it
        try:
            return engine_mod.InfiniGramEngine(
                index_dir=path, eos_token_id=min(self.tokenizer.eos_token_id, top - 1),
                vocab_size=top, version=4, token_dtype=self._dtype,
                load_to_ram=self.config.load_to_ram, ds_prefetch_depth=depth,
                sa_prefetch_depth=3 * depth, od_prefetch_depth=3 * depth)
        except (RuntimeError, AssertionError, ValueError) as exc:
            raise CorruptIndexError(f"the infini-gram engine could not open {self.path}: {exc}") \
                from exc
        finally:
            if holder is not None:
                shutil.rmtree(holder, ignore_errors=True)

    # ----------------------------------------------------------------------------- identity
    @property
    def index_name(self) -> str:
        m = self.files.manifest
        return m.name if m else self.path.name

    @property
    def index_key(self) -> str:
        m = self.files.manifest
        if m is not None:
            return f"local:{m.index_id}"
        stamp = ",".join(f"{f.ds.name}:{f.ds.stat().st_size}:{f.sa.stat().st_mtime_ns}"
                         for f in self.files.shards)
        return f"local-path:{self.path}:{stamp}"

    def options_key(self) -> dict[str, Any]:
        return {"case": self.config.case, "spaces": self.config.spaces,
                "tokenizer": self.tokenizer.sha256()[:16]}

    def stats(self) -> IndexStats:
        m = self.files.manifest
        return IndexStats(
            name=self.index_name, path=str(self.path), index_id=m.index_id if m else None,
            documents=self.files.documents, tokens=self.files.tokens,
            shards=len(self.files.shards),
            size_bytes=sum(p.stat().st_size for p in self.path.iterdir() if p.is_file()),
            token_dtype=self._dtype, lowercase=self.lowercase, tokenizer=self.tokenizer.name,
            created_at=m.created_at if m else None, build=dict(m.build) if m else {},
            skipped=dict(m.skipped) if m else {})

    def verify(self) -> DigestCheck:
        """The deep check: every file against its build-time digest (read again, whatever the
        verified-state cache says) and every suffix array in full (seconds per 100M tokens).
        Raises CorruptIndexError; returns what the digest part hashed."""
        from rag_gates.corpus._arrays import verify_suffix_array

        check = verify_digests(self.files, use_cache=False)
        for f in self.files.shards:
            verify_suffix_array(f.ds, f.sa, self.files.token_width, f.ptr_size)
        return check

    # ----------------------------------------------------------------------------- phrases
    def _encode(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text)
        if self._lookup is None:
            return ids
        # Large vocabularies: index ids are dense; a token the corpus never used maps to -1
        # (that variant cannot occur).
        lookup = self._lookup
        return [int(lookup[i]) if 0 <= i < lookup.size else -1 for i in ids]

    def _variants(self, phrase: str) -> tuple[str, list[tuple[str, tuple[int, ...]]]]:
        text = normalize_phrase(phrase, self.config.max_phrase_chars)
        forms = surface_forms(text, self.config.case, self.config.spaces, self.lowercase)
        return text, token_variants(forms, self._encode, self.config.max_phrase_tokens)

    @property
    def _approximate_case(self) -> bool:
        return self.config.case == "insensitive" and not self.lowercase

    def _find(self, ids: tuple[int, ...]) -> Any:
        """Suffix-array segments of ``ids`` in every shard (``cnt``, ``segment_by_shard``)."""
        if self._closed:
            raise CorpusError(f"this LocalInfiniGram over {self.path} was closed")
        if min(ids) < 0:  # a token the corpus never used
            return _Found([(0, 0)] * len(self._shards))
        if self.config.lookup == "engine":
            return self._cpp.find(input_ids=list(ids))
        width = self.files.token_width
        needle = b"".join(i.to_bytes(width, "little") for i in ids)
        return _Found([shard.find(needle) for shard in self._shards])

    # ----------------------------------------------------------------------------- queries
    def count(self, phrase: str) -> CountResult:
        start = time.perf_counter()
        text, variants = self._variants(phrase)
        value = sum(int(self._find(ids).cnt) for _, ids in variants)
        return CountResult(
            value=value, approximate=self._approximate_case, backend=self.backend_name,
            index=self.index_name, latency_ms=(time.perf_counter() - start) * 1000.0,
            phrase=text, variants=tuple(form for form, _ in variants))

    def cooccurrence(self, a: str, b: str, scope: Scope = "document") -> CooccurrenceResult:
        start = time.perf_counter()
        canonical = parse_scope(scope)
        text_a, va = self._variants(a)
        text_b, vb = self._variants(b)
        value, na, nb = self._cooccurrence(
            [ids for _, ids in va], [ids for _, ids in vb], window_tokens(canonical),
            self.config.strategy)
        return CooccurrenceResult(
            value=value, approximate=self._approximate_case, backend=self.backend_name,
            index=self.index_name, latency_ms=(time.perf_counter() - start) * 1000.0,
            a=text_a, b=text_b, scope=canonical, requested_scope=canonical, unit="documents",
            a_count=na, b_count=nb)

    def _cooccurrence(self, va: list[tuple[int, ...]], vb: list[tuple[int, ...]],
                      window: int | None, strategy: str) -> tuple[int, int, int]:
        import numpy as np

        from rag_gates.corpus._arrays import window_doc_hits

        fa = [self._find(ids) for ids in va]
        fb = [self._find(ids) for ids in vb]
        na = sum(int(f.cnt) for f in fa)
        nb = sum(int(f.cnt) for f in fb)
        if na == 0 or nb == 0:
            return 0, na, nb
        total = 0
        for s, shard in enumerate(self._shards):
            seg_a = [f.segment_by_shard[s] for f in fa]
            seg_b = [f.segment_by_shard[s] for f in fb]
            ca = sum(hi - lo for lo, hi in seg_a)
            cb = sum(hi - lo for lo, hi in seg_b)
            if ca == 0 or cb == 0:
                continue
            if ca <= cb:
                small, large, large_ids, c_large = seg_a, seg_b, vb, cb
            else:
                small, large, large_ids, c_large = seg_b, seg_a, va, ca
            p_small = _ptrs_of(shard, small)
            d_small = shard.doc_of(p_small)
            docs = np.unique(d_small)
            p_large = _partners(shard, docs, large, large_ids, c_large, strategy)
            d_large = shard.doc_of(p_large)
            if window is None:
                total += int(np.intersect1d(docs, d_large).size)
            else:
                total += int(window_doc_hits(p_small, d_small, p_large, d_large,
                                             window * shard.width).size)
        return total, na, nb

    # ----------------------------------------------------------------------------- raw ids
    def index_ids(self, token_ids: Sequence[int]) -> tuple[int, ...]:
        """The index's ids for a sequence of the tokenizer's ids (what a client of the hosted
        protocol sends). On a lower-cased index the ids are decoded, lower-cased and encoded
        again, so a cased query matches as :meth:`count` would match its text; an id the
        corpus never used maps to -1 (it cannot occur)."""
        ids = [int(i) for i in token_ids]
        if self.lowercase and ids:
            text = self.tokenizer.decode(ids)
            if "\ufffd" not in text and text.lower() != text:  # only whole characters
                ids = self.tokenizer.encode(text.lower())
        if self._lookup is None:
            return tuple(ids)
        lookup = self._lookup
        return tuple(int(lookup[i]) if 0 <= i < lookup.size else -1 for i in ids)

    def count_ids(self, token_ids: Sequence[int]) -> int:
        """Occurrences of exactly this id sequence (the tokenizer's ids; one variant)."""
        ids = self.index_ids(token_ids)
        return int(self._find(ids).cnt) if ids else 0

    def cnf_occurrences(self, cnf: Sequence[Sequence[Sequence[int]]], window: int,
                        max_clause_freq: int | None = None) -> tuple[int, bool]:
        """The hosted API's AND query, computed exactly: occurrences of the rarest clause (a
        clause matches any of its terms; rarest per shard, as the engine does) that have an
        occurrence of every other clause starting at most ``window`` tokens away in the same
        document. Terms are the tokenizer's ids. Above ``max_clause_freq`` matches the rarest
        clause is subsampled evenly and the count scaled; the flag says so. Returns
        ``(count, approximate)``. Unlike the engine's ``count_cnf``, a pair is never dropped
        because a third occurrence nearby lies in another document."""
        import numpy as np

        from rag_gates.corpus._arrays import window_hits

        clauses = [[self.index_ids(t) for t in clause if t] for clause in cnf]
        finds = [[self._find(ids) for ids in clause] for clause in clauses]
        if not finds or any(sum(int(f.cnt) for f in fs) == 0 for fs in finds):
            return 0, False
        if len(finds) == 1:
            return sum(int(f.cnt) for f in finds[0]), False
        total, approximate = 0.0, False
        for s, shard in enumerate(self._shards):
            segments = [[f.segment_by_shard[s] for f in fs] for fs in finds]
            counts = [sum(hi - lo for lo, hi in seg) for seg in segments]
            if min(counts) == 0:
                continue
            order = sorted(range(len(counts)), key=counts.__getitem__)
            anchor = _ptrs_of(shard, segments[order[0]])
            factor = 1.0
            if max_clause_freq is not None and anchor.size > max_clause_freq:
                # Evenly spaced over suffix order: spread over the whole shard, deterministic.
                pick = np.linspace(0, anchor.size - 1, max_clause_freq).astype(np.int64)
                factor, anchor = anchor.size / max_clause_freq, anchor[pick]
                approximate = True
            d_anchor = shard.doc_of(anchor)
            docs = np.unique(d_anchor)
            keep = np.ones(anchor.size, dtype=bool)
            for c in order[1:]:
                other = _partners(shard, docs, segments[c], clauses[c], counts[c],
                                  self.config.strategy)
                keep &= window_hits(anchor, d_anchor, other, shard.doc_of(other),
                                    window * shard.width)
            total += int(keep.sum()) * factor
        return int(total), approximate

    def close(self) -> None:
        self._closed = True
        self._engine_obj = None
        self._cpp = None
        self._shards = []


def _ptrs_of(shard: Shard, segments: Sequence[tuple[int, int]]) -> Any:
    """Byte offsets of every match in these suffix-array segments of one shard."""
    import numpy as np

    from rag_gates.corpus._arrays import ranks_to_ptrs

    parts = [ranks_to_ptrs(shard.sa, shard.ptr_size, lo, hi) for lo, hi in segments]
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def _partners(shard: Shard, docs: Any, segments: Sequence[tuple[int, int]],
              variants: Sequence[tuple[int, ...]], count: int, strategy: str) -> Any:
    """Byte offsets of the other side's matches: every one ('map'), or only those inside
    ``docs`` found by scanning their tokens ('scan'); 'auto' picks the cheaper."""
    use_scan = strategy == "scan"
    if strategy == "auto":
        starts, ends = shard.doc_token_ranges(docs)
        scan_cost = int((ends - starts).sum()) * len(variants) + 20 * docs.size
        use_scan = scan_cost < 4 * count
    if use_scan:
        return shard.scan(docs, [ids for ids in variants if ids and min(ids) >= 0])
    return _ptrs_of(shard, segments)
