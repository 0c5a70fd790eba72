"""Stop strings, applied the same way everywhere: local decoding, streamed framework models,
and whole replies from models that ignore ``stop``.

A reply is cut at the stop string that is *complete first* (smallest end, then earliest
start): where a model that stops generating at a stop string would stop, so whole-text and
streamed cuts agree. Streams hold back text that could still become a stop string (and a
trailing half-decoded character), so no emitted piece ever has to be taken back.

Example:
    >>> cutter = StopCutter(["END"])
    >>> [cutter.feed(p) for p in ["ab", "cE", "N", "Dx"]], cutter.stopped
    (['', 'ab', 'c', ''], True)
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["StopCutter", "find_stop"]


def find_stop(text: str, stops: Sequence[str], start: int = 0) -> tuple[int, int] | None:
    """``(start, end)`` of the stop string in ``text`` that is complete first, or None."""
    best: tuple[int, int] | None = None
    for s in stops:
        i = text.find(s, start)
        if i >= 0 and (best is None or (i + len(s), i) < best):
            best = (i + len(s), i)
    return None if best is None else (best[1], best[0])


class StopCutter:
    """Cut growing text at the first stop string; hand out only text that is final.

    Give it the whole text so far with :meth:`update` (local decoding, where re-decoding
    may rewrite a half-decoded character) or the next piece with :meth:`feed` (streams);
    :meth:`flush` returns the rest at the end. ``text`` is the kept text, ``stopped`` tells
    whether a stop string was found.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self.holdback = max((len(s) for s in self.stops), default=1) - 1
        self.text = ""
        self.emitted = 0
        self.stopped = False

    def update(self, text: str) -> str:
        """Take the whole text so far; return the newly final part."""
        if self.stopped:
            return ""
        found = find_stop(text, self.stops)
        if found is not None:
            self.text, self.stopped = text[: found[0]], True
            return self.flush()
        self.text = text
        safe = len(text) - self.holdback
        while safe > self.emitted and text[safe - 1] == "\ufffd":
            safe -= 1  # a byte sequence the next token may complete
        if safe <= self.emitted:
            return ""
        out, self.emitted = text[self.emitted : safe], safe
        return out

    def feed(self, piece: str) -> str:
        """Take the next streamed piece; return the newly final part."""
        return self.update(self.text + piece)

    def flush(self) -> str:
        """Everything kept and not yet returned."""
        out, self.emitted = self.text[self.emitted :], len(self.text)
        return out
