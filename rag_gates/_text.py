"""One check for text crossing into rag-gates: it must encode as UTF-8.

Lone surrogates (``"a\\ud800b"``, what ``json.loads`` makes of a broken ``"\\ud800"`` escape)
are legal in a Python ``str`` but reach tokenizers, codecs and HTTP clients as raw errors far
from the caller. Every public boundary that takes text (prompts, queries, passages, corpus
phrases) calls :func:`check_encodable`, so the error names the argument and the position.
"""

from __future__ import annotations

__all__ = ["check_encodable", "check_text"]


def check_encodable(text: str, what: str = "text") -> str:
    """Return ``text`` unchanged, or raise ValueError naming ``what`` and the position of the
    first character that cannot be encoded as UTF-8 (a lone surrogate).

    Example:
        >>> check_encodable("Who wrote Hamlet?", "query")
        'Who wrote Hamlet?'
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        raise ValueError(
            f"{what} has a character that cannot be encoded as UTF-8 at position {exc.start} "
            f"(U+{ord(bad):04X}, a lone surrogate): decode the source text with "
            f"errors='replace' or remove the character"
        ) from None
    return text


def check_text(value: object, what: str = "query") -> str:
    """Return ``value`` if it is a non-empty, encodable str; else raise TypeError (not a str)
    or ValueError (empty or whitespace; a lone surrogate, see :func:`check_encodable`), each
    naming ``what``. The one check of queries at gates, retrievers and rerankers.

    Example:
        >>> check_text("Who wrote Hamlet?")
        'Who wrote Hamlet?'
    """
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    if not value.strip():
        raise ValueError(f"{what} is empty or whitespace")
    return check_encodable(value, what)
