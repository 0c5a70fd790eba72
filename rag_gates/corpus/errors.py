"""Errors raised by the corpus-statistics backends; each message says what to do about it."""

from __future__ import annotations

from rag_gates.errors import InputFileError, RagGatesError

__all__ = [
    "CorpusCacheError",
    "CorpusError",
    "CorruptIndexError",
    "CorruptIndexFileError",
    "EmptyPhraseError",
    "HostedError",
    "HostedProtocolError",
    "HostedQueryError",
    "HostedTimeoutError",
    "HostedUnavailableError",
    "IndexBuildError",
    "IndexExistsError",
    "IndexNotFoundError",
    "InvalidCountError",
    "InvalidPhraseError",
    "PhraseTooLongError",
    "UnsupportedScopeError",
]


class CorpusError(RagGatesError):
    """Base class of every corpus-statistics error."""


class CorpusCacheError(CorpusError):
    """The corpus cache file is unusable: another program's database, a corrupt answer row,
    or a SQLite fault. A corpus failure like any other: gates follow their ``on_error``."""


class InvalidPhraseError(CorpusError, ValueError):
    """A phrase cannot be looked up as given (wrong type, empty, too long)."""


class EmptyPhraseError(InvalidPhraseError):
    """The phrase is empty or whitespace only."""


class PhraseTooLongError(InvalidPhraseError):
    """The phrase exceeds the character or token limit of the backend."""


class UnsupportedScopeError(CorpusError, ValueError):
    """The backend cannot answer co-occurrence in the requested scope."""


class InvalidCountError(CorpusError, ValueError):
    """A backend answered a count that is not a finite number >= 0 (a third-party backend
    that skips the result types' validation): a corpus failure, so gates follow their
    ``on_error``."""


class IndexNotFoundError(CorpusError, FileNotFoundError):
    """No index exists at the given path."""


class CorruptIndexError(CorpusError):
    """The index directory exists but its files are missing, truncated or inconsistent."""


class CorruptIndexFileError(InputFileError, CorruptIndexError):
    """A file of an index (its manifest) cannot be read: not UTF-8, not JSON, nested too
    deep, too large; an :class:`~rag_gates.errors.InputFileError` naming it."""


class IndexExistsError(CorpusError, FileExistsError):
    """The build target exists; pass ``force=True`` (``--force``) to replace it."""


class IndexBuildError(CorpusError):
    """Building an index failed; nothing was written at the target path."""


class HostedError(CorpusError):
    """Base class of errors from the hosted infini-gram API client."""


class HostedTimeoutError(HostedError, TimeoutError):
    """No complete answer arrived within the client's total timeout (all retries included)."""


class HostedUnavailableError(HostedError, ConnectionError):
    """The server kept failing (5xx, 429, dropped connections) until the retries ran out."""


class HostedProtocolError(HostedError):
    """The server answered with something that is not the infini-gram JSON protocol."""


class HostedQueryError(HostedError, ValueError):
    """The server rejected the query (an ``error`` field or a 4xx status); not retried."""
