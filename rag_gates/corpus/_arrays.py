"""numpy helpers over the memory-mapped index files (imported only when an index is used)."""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Any

import numpy as np

from rag_gates.corpus.errors import CorruptIndexError

__all__ = ["Shard", "ranks_to_ptrs", "verify_suffix_array", "window_doc_hits", "window_hits"]

NDArray = np.ndarray[Any, Any]


def ranks_to_ptrs(sa: NDArray, ptr_size: int, lo: int, hi: int) -> NDArray:
    """Byte offsets stored in suffix-array ranks ``[lo, hi)`` (little-endian, ptr_size bytes)."""
    n = hi - lo
    if n <= 0:
        return np.empty(0, dtype=np.int64)
    raw = np.asarray(sa[lo * ptr_size:hi * ptr_size]).reshape(n, ptr_size)
    if ptr_size == 8:
        return raw.copy().view("<i8").ravel()
    buf = np.zeros((n, 8), dtype=np.uint8)
    buf[:, :ptr_size] = raw
    return buf.view("<i8").ravel()


def _map(path: Path, load_to_ram: bool) -> Any:
    if load_to_ram:
        return path.read_bytes()
    with path.open("rb") as handle:
        return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)


class Shard:
    """One shard of an index: tokens, suffix array and document offsets, memory-mapped once
    and seen both as bytes (for the binary search) and as numpy arrays (for the rest)."""

    def __init__(self, ds: Path, sa: Path, od: Path, width: int, ptr_size: int,
                 doc_base: int, load_to_ram: bool = False) -> None:
        self.width = width
        self.ptr_size = ptr_size
        self.doc_base = doc_base
        self.ds_bytes = _map(ds, load_to_ram)
        self.sa_bytes = _map(sa, load_to_ram)
        self.tokens: NDArray = np.frombuffer(self.ds_bytes, dtype=f"<u{width}")
        self.ds_size = int(self.tokens.shape[0]) * width
        self.sa: NDArray = np.frombuffer(self.sa_bytes, dtype=np.uint8)
        self.od: NDArray = np.frombuffer(_map(od, load_to_ram), dtype="<i8")
        self.doc_cnt = int(self.od.shape[0])
        self.tok_cnt = self.ds_size // width
        self.sep = (1 << (8 * width)) - 1

    def find(self, needle: bytes) -> tuple[int, int]:
        """Suffix-array ranks ``[lo, hi)`` of the suffixes that start with ``needle``.

        The same binary search as the engine's (byte-wise lexicographic order), in Python over
        the mapped files: as fast as a call into the engine, which starts a thread per lookup
        and so waits for a free core on a busy machine.
        """
        ds, sa, w, n = self.ds_bytes, self.sa_bytes, self.ptr_size, len(needle)
        lo, hi = 0, self.tok_cnt
        while lo < hi:
            mid = (lo + hi) >> 1
            p = int.from_bytes(sa[mid * w:mid * w + w], "little")
            if ds[p:p + n] < needle:
                lo = mid + 1
            else:
                hi = mid
        start, hi = lo, self.tok_cnt
        while lo < hi:
            mid = (lo + hi) >> 1
            p = int.from_bytes(sa[mid * w:mid * w + w], "little")
            if ds[p:p + n] <= needle:
                lo = mid + 1
            else:
                hi = mid
        return start, lo

    def check(self, path: Path, samples: int = 1024) -> None:
        """Cheap consistency checks (documents, separators, a sample of the suffix array)."""
        od = self.od
        if int(od[0]) != 0 or int(od[-1]) >= self.ds_size:
            raise CorruptIndexError(f"{path}: document offsets out of range; rebuild the index")
        if self.doc_cnt > 1 and not bool(np.all(np.diff(od) > 0)):
            raise CorruptIndexError(f"{path}: document offsets are not increasing; rebuild")
        if bool(np.any(od % self.width)):
            raise CorruptIndexError(f"{path}: document offsets are not token-aligned; rebuild")
        if not bool(np.all(self.tokens[od // self.width] == self.sep)):
            raise CorruptIndexError(
                f"{path}: a document does not start with the separator token; the offsets do "
                "not belong to these tokens (rebuild the index)")
        n = self.ds_size // self.width
        rng = np.random.default_rng(0)
        ranks = np.unique(rng.integers(0, n, size=min(samples, n)))
        ptrs = np.concatenate([ranks_to_ptrs(self.sa, self.ptr_size, int(r), int(r) + 1)
                               for r in ranks])
        if bool(np.any((ptrs < 0) | (ptrs >= self.ds_size) | (ptrs % self.width != 0))):
            raise CorruptIndexError(
                f"{path}: the suffix array points outside the tokens; it is corrupt or belongs "
                "to another build (rebuild the index)")

    def doc_of(self, ptrs: NDArray) -> NDArray:
        """Shard-local document index of each byte offset."""
        return np.searchsorted(self.od, ptrs, side="right").astype(np.int64) - 1

    def doc_token_ranges(self, docs: NDArray) -> tuple[NDArray, NDArray]:
        """Token ranges ``[start, end)`` of shard-local documents (start = separator)."""
        starts = np.asarray(self.od[docs], dtype=np.int64)
        nxt = docs + 1
        ends = np.where(nxt < self.doc_cnt,
                        np.asarray(self.od[np.minimum(nxt, self.doc_cnt - 1)], dtype=np.int64),
                        self.ds_size)
        return starts // self.width, ends // self.width

    def scan(self, docs: NDArray, variants: list[tuple[int, ...]]) -> NDArray:
        """Byte offsets of every match of any variant inside the given documents."""
        starts, ends = self.doc_token_ranges(docs)
        lens = ends - starts
        total = int(lens.sum())
        if total == 0:
            return np.empty(0, dtype=np.int64)
        shift = np.repeat(starts - np.concatenate(([0], np.cumsum(lens)[:-1])), lens)
        positions = shift + np.arange(total, dtype=np.int64)
        arr = np.asarray(self.tokens[positions])
        found = []
        for ids in variants:
            m = len(ids)
            if m > total:
                continue
            cand = np.flatnonzero(arr[:total - m + 1] == ids[0])
            for k in range(1, m):
                cand = cand[arr[cand + k] == ids[k]]
            found.append(positions[cand] * self.width)
        return np.concatenate(found) if found else np.empty(0, dtype=np.int64)


def window_hits(p_small: NDArray, d_small: NDArray, p_large: NDArray, d_large: NDArray,
                window_bytes: int) -> NDArray:
    """For each small-side occurrence: is a large-side one in the same document with its start
    at most ``window_bytes`` away? (A boolean mask over ``p_small``.)

    Occurrences of one document are contiguous in sorted order, so checking the nearest
    large-side occurrence on each side of every small-side one is enough.
    """
    if p_small.size == 0 or p_large.size == 0:
        return np.zeros(p_small.size, dtype=bool)
    order = np.argsort(p_large, kind="stable")
    pl, dl = p_large[order], d_large[order]
    idx = np.searchsorted(pl, p_small, side="left")
    last = pl.size - 1
    ri = np.minimum(idx, last)
    hit: NDArray = (idx <= last) & (dl[ri] == d_small) & (pl[ri] - p_small <= window_bytes)
    li = np.maximum(idx - 1, 0)
    hit |= (idx >= 1) & (dl[li] == d_small) & (p_small - pl[li] <= window_bytes)
    return hit


def window_doc_hits(p_small: NDArray, d_small: NDArray, p_large: NDArray, d_large: NDArray,
                    window_bytes: int) -> NDArray:
    """Documents where some small-side occurrence has a large-side one within the window."""
    hit = window_hits(p_small, d_small, p_large, d_large, window_bytes)
    return np.unique(d_small[hit])


def verify_suffix_array(ds: Path, sa: Path, width: int, ptr_size: int,
                        chunk: int = 1 << 20) -> None:
    """Full check that ``sa`` is the suffix array of ``ds``; raises CorruptIndexError.

    Checks that it is a permutation of the token positions and that consecutive suffixes are
    in order on their first 8 bytes (the byte order the engine binary-searches in).
    """
    data = np.memmap(ds, dtype=np.uint8, mode="r")
    table = np.memmap(sa, dtype=np.uint8, mode="r")
    size = int(data.shape[0])
    n = size // width
    if int(table.shape[0]) != n * ptr_size:
        raise CorruptIndexError(f"{sa}: {table.shape[0]} bytes for {n} tokens")
    seen = np.zeros(n, dtype=bool)
    prev_key: int | None = None
    offsets = np.arange(8, dtype=np.int64)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        ptrs = ranks_to_ptrs(table, ptr_size, lo, hi)
        if bool(np.any((ptrs < 0) | (ptrs >= size) | (ptrs % width != 0))):
            raise CorruptIndexError(f"{sa}: pointer outside the tokens or not token-aligned")
        seen[ptrs // width] = True
        idx = ptrs[:, None] + offsets[None, :]
        inside = idx < size
        gathered = np.where(inside, np.asarray(data[np.minimum(idx, size - 1)]), 0)
        keys = gathered.astype(np.uint8).view(">u8").ravel()
        if bool(np.any(keys[1:] < keys[:-1])) or (prev_key is not None and int(keys[0]) < prev_key):
            raise CorruptIndexError(
                f"{sa}: suffixes are out of order; the suffix array is wrong (this happens when "
                "a small corpus is indexed with several parallel parts). Rebuild with 1 cpu")
        prev_key = int(keys[-1])
    if not bool(seen.all()):
        raise CorruptIndexError(
            f"{sa}: {int((~seen).sum())} token positions are missing from the suffix array; it "
            "is wrong (rebuild with 1 cpu)")
