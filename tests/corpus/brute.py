"""Brute-force reference answers: scan every document's tokens, no suffix array, no offsets."""

from __future__ import annotations

import itertools
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any


def doc_tokens(texts: Sequence[str], encode: Callable[[str], list[int]]) -> list[list[int]]:
    """Each document as the builder sees it: NFC text, skipped when empty."""
    out = []
    for text in texts:
        text = unicodedata.normalize("NFC", text)
        if text.strip():
            ids = encode(text)
            if ids:
                out.append(ids)
    return out


def phrase_variants(phrase: str, encode: Callable[[str], list[int]]) -> list[tuple[int, ...]]:
    """Leading-space and no-space tokenizations, deduplicated; a tokenization that contains
    the other one is dropped (the same text occurrence must not count twice)."""
    text = " ".join(unicodedata.normalize("NFC", phrase).split())
    forms = list(dict.fromkeys(tuple(encode(f)) for f in (" " + text, text) if encode(f)))

    def inside(small: tuple[int, ...], big: tuple[int, ...]) -> bool:
        return len(small) < len(big) and any(
            big[i:i + len(small)] == small for i in range(len(big) - len(small) + 1))

    return [f for f in forms if not any(inside(g, f) for g in forms if g != f)]


def positions(doc: list[int], variants: list[tuple[int, ...]]) -> set[int]:
    """Start positions where any variant occurs (a union: each position once)."""
    found = set()
    for v in variants:
        m = len(v)
        for p in range(len(doc) - m + 1):
            if tuple(doc[p:p + m]) == v:
                found.add(p)
    return found


def count(docs: list[list[int]], variants: list[tuple[int, ...]]) -> int:
    return sum(len(positions(d, variants)) for d in docs)


def doc_cooccurrence(docs: list[list[int]], va: list[tuple[int, ...]],
                     vb: list[tuple[int, ...]]) -> int:
    return sum(1 for d in docs if positions(d, va) and positions(d, vb))


def window_cooccurrence(docs: list[list[int]], va: list[tuple[int, ...]],
                        vb: list[tuple[int, ...]], window: int) -> int:
    hits = 0
    for d in docs:
        pa, pb = positions(d, va), positions(d, vb)
        if any(abs(x - y) <= window for x in pa for y in pb):
            hits += 1
    return hits


def window_occurrences(docs: list[list[int]], va: list[tuple[int, ...]],
                       vb: list[tuple[int, ...]], window: int) -> int:
    """The hosted API's AND query: occurrences of the rarer phrase (over the whole corpus)
    with an occurrence of the other starting at most ``window`` tokens away in the same
    document."""
    found = [(positions(d, va), positions(d, vb)) for d in docs]
    a_rarer = sum(len(a) for a, _ in found) <= sum(len(b) for _, b in found)
    return sum(1 for pa, pb in found
               for x in (pa if a_rarer else pb)
               if any(abs(x - y) <= window for y in (pb if a_rarer else pa)))


def index_docs(local: Any) -> list[list[int]]:
    """Each document's tokens read straight from a one-shard index (separator dropped)."""
    (shard,) = local._shards
    tokens = [int(t) for t in shard.tokens]
    starts = [int(o) // shard.width for o in shard.od] + [len(tokens)]
    return [tokens[s + 1:e] for s, e in itertools.pairwise(starts)]
