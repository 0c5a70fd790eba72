"""Reuse of recent prompts' keys and values, so a prompt that extends one re-runs only its
new tokens.

Step-by-step agents re-send a growing prompt: DeepRAG's every call is the previous prompt,
the text just generated and a little more, and its data synthesis branches many children off
one prefix. :class:`PrefixCache` keeps the key/value tensors of the last prompts (by
reference: transformers' ``DynamicCache`` concatenates into new tensors as it grows, so the
stored ones are never written again) and, for a new prompt, hands back the longest common
token prefix with any of them; only the rest is prefilled. A causal model's keys and values
for a prefix do not depend on what follows it, so the result is the same computation, up to
the floating-point order of a split matrix product (logits agree to ~1e-5).

Off by default (it holds memory): ``HFWhiteBoxLM(..., prefix_cache_mb=256)`` or
``lm.enable_prefix_cache(256)``.

Example:
    >>> lm.enable_prefix_cache(max_mb=256)
    >>> lm.generate(history + step1)   # prefills everything, keeps the keys and values
    >>> lm.generate(history + step1 + step2)   # prefills step2 only
    >>> lm.prefix_cache.stats                   # doctest: +SKIP
    {'lookups': 2, 'hits': 1, 'reused_tokens': 412, 'prefilled_tokens': 530}
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from rag_gates._fork import rebuild_after_fork

__all__ = ["PrefixCache"]

#: A shorter common prefix is not worth a lookup hit (the saved work is negligible).
MIN_REUSE_TOKENS = 8


class PrefixCache:
    """The key/value tensors of recent prompts, at most ``max_bytes`` in all (least recently
    used dropped first).

    Args:
        max_bytes: memory budget for the stored tensors; a prompt bigger than the whole
            budget is not stored.
        min_reuse: shortest common prefix (tokens) worth reusing.
    """

    def __init__(self, max_bytes: int, *, min_reuse: int = MIN_REUSE_TOKENS) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        if min_reuse < 1:
            raise ValueError(f"min_reuse must be >= 1, got {min_reuse}")
        self.max_bytes = max_bytes
        self.min_reuse = min_reuse
        self._entries: OrderedDict[tuple[int, ...], tuple[list[tuple[Any, Any]], int]] = \
            OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        rebuild_after_fork(self)
        self.stats = {"lookups": 0, "hits": 0, "reused_tokens": 0, "prefilled_tokens": 0}

    def _after_fork(self) -> None:
        """In a forked worker: a fresh lock (the parent's may have been held at the fork)."""
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        """Memory held by the stored tensors."""
        return self._bytes

    def lookup(self, ids: Sequence[int]) -> tuple[int, list[tuple[Any, Any]]] | None:
        """The longest usable common prefix with a stored prompt: ``(n, layers)`` with each
        layer's ``(keys, values)`` cut to ``n`` positions, or None. ``n`` stops one short of
        the whole prompt, so at least its last token is run (its logits are needed)."""
        with self._lock:
            self.stats["lookups"] += 1
            best, best_key = 0, None
            for key in self._entries:
                n = _common_prefix(key, ids)
                if n > best:
                    best, best_key = n, key
            best = min(best, len(ids) - 1)
            if best_key is None or best < self.min_reuse:
                self.stats["prefilled_tokens"] += len(ids)
                return None
            layers, _ = self._entries[best_key]
            self._entries.move_to_end(best_key)
            self.stats["hits"] += 1
            self.stats["reused_tokens"] += best
            self.stats["prefilled_tokens"] += len(ids) - best
            return best, [(k[:, :, :best], v[:, :, :best]) for k, v in layers]

    def store(self, ids: Sequence[int], layers: Sequence[tuple[Any, Any]]) -> None:
        """Keep ``layers`` (each layer's keys and values, ``[1, heads, len(ids), dim]``) as
        the cache of prompt ``ids``."""
        key = tuple(ids)
        size = sum(k.element_size() * k.nelement() + v.element_size() * v.nelement()
                   for k, v in layers)
        if size > self.max_bytes:
            return
        with self._lock:
            if key in self._entries:
                self._bytes -= self._entries.pop(key)[1]
            self._entries[key] = (list(layers), size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped

    def clear(self) -> None:
        """Drop every stored prompt."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
