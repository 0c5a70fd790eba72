"""JSON from outside (a request body, a server's reply, a file) with its nesting bounded
before it is parsed.

``json.loads`` recurses once per level of nesting: 60,000 ``[`` end in a ``RecursionError``
(a traceback, not a ``ValueError``), far from the code that read the text. :func:`loads_bounded`
counts the depth first, by a scan that skips string literals, and refuses text nested deeper
than ``max_depth`` with :class:`JSONDepthError` (a ``ValueError``, so every caller that
already handles malformed JSON handles it too).

Example:
    >>> loads_bounded('{"query_ids": [[[1, 2]]]}', max_depth=4, what="the request")
    {'query_ids': [[[1, 2]]]}
    >>> loads_bounded("[" * 100, max_depth=4, what="the request")
    Traceback (most recent call last):
    ...
    rag_gates._json.JSONDepthError: the request is nested deeper than 4 levels (the limit)...
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["DEFAULT_MAX_DEPTH", "JSONDepthError", "json_depth", "loads_bounded"]

#: Deep enough for every JSON this package reads (the deepest, a CNF query, is 4 levels).
DEFAULT_MAX_DEPTH = 64

# A string literal (escapes included), in the unrolled form that never backtracks; and the
# characters that open or close a level.
_STRING_STR = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_STRING_BYTES = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_BRACKET_STR = re.compile(r"[\[\]{}]")
_BRACKET_BYTES = re.compile(rb"[\[\]{}]")


class JSONDepthError(ValueError):
    """JSON text nested deeper than the reader's limit; refused before it was parsed."""


def json_depth(text: str | bytes, stop_above: int | None = None) -> int:
    """The deepest nesting of arrays and objects in ``text`` (brackets inside strings do not
    count), or the first depth above ``stop_above`` when the scan stops there.

    Example:
        >>> json_depth('{"a": [1, "]]]", {"b": []}]}')
        4
    """
    if isinstance(text, bytes):
        marks = b"".join(_BRACKET_BYTES.findall(_STRING_BYTES.sub(b'""', text))).decode()
    else:
        marks = "".join(_BRACKET_STR.findall(_STRING_STR.sub('""', text)))
    depth = deepest = 0
    for mark in marks:
        if mark in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if stop_above is not None and depth > stop_above:
                    return depth
        else:
            depth -= 1
    return deepest


def loads_bounded(text: str | bytes, *, max_depth: int = DEFAULT_MAX_DEPTH,
                  what: str = "the JSON", **hooks: Any) -> Any:
    """``json.loads(text, **hooks)`` once its nesting is known to be at most ``max_depth``
    levels; deeper text raises :class:`JSONDepthError` naming ``what`` and the limit, without
    being parsed. Malformed JSON raises ``json.JSONDecodeError`` as usual. ``hooks``:
    ``json.loads``'s (e.g. ``parse_constant`` to refuse ``NaN``)."""
    if json_depth(text, stop_above=max_depth) > max_depth:
        raise JSONDepthError(f"{what} is nested deeper than {max_depth} levels (the limit); "
                             "refused before parsing")
    return json.loads(text, **hooks)
