"""Answers and query scopes of the corpus-statistics interface: frozen pydantic models.

Every answer carries the number (``value``), whether it is an estimate (``approximate``), the
backend and index that produced it, the phrases as they were matched, and the latency.

Example:
    >>> from rag_gates.corpus.types import CountResult, Window, parse_scope
    >>> parse_scope(Window(tokens=50)), parse_scope("document"), parse_scope(10)
    ('window:50', 'document', 'window:10')
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "CaseMode",
    "CooccurrenceResult",
    "CorpusAnswer",
    "CountResult",
    "Scope",
    "SpaceMode",
    "Window",
    "parse_scope",
    "window_tokens",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")

CaseMode = Literal["sensitive", "insensitive"]
"""``sensitive``: match the phrase as written. ``insensitive``: on an index built with
``lowercase=True`` this is exact (both sides are lower-cased); on a cased index the phrase is
matched as written, lower-case, UPPER-case, Title Case and Capitalized, and the answer is
flagged ``approximate`` because other casings (``mcDonald``) are not searched."""

SpaceMode = Literal["both", "leading", "none"]
"""Which tokenizations of a phrase are matched. Byte-level BPE tokenizers encode ``"Paris"``
and ``" Paris"`` as different tokens (start of text or after ``(`` versus after a space), so
``both`` (the default) matches the two; ``leading`` only the mid-sentence form."""


class Window(BaseModel):
    """Co-occurrence within ``tokens`` tokens inside one document (start to start)."""

    model_config = _FROZEN

    tokens: int = Field(..., ge=1, le=1_000_000,
                        description="Largest distance, in tokens, between the starts of the two "
                                    "phrases' occurrences; both must be in the same document.")


Scope = Literal["document"] | Window | int
"""``"document"``: both phrases occur somewhere in the same document. ``Window(tokens=n)`` (or
the int ``n``): they occur in the same document with their starts at most ``n`` tokens apart."""


def parse_scope(scope: Scope) -> str:
    """Canonical text of a scope: ``"document"`` or ``"window:N"``; raises ValueError."""
    if isinstance(scope, Window):
        return f"window:{scope.tokens}"
    if isinstance(scope, bool):
        raise ValueError(f"scope must be 'document', a Window or an int, got {scope!r}")
    if isinstance(scope, int):
        return f"window:{Window(tokens=scope).tokens}"
    if scope == "document":
        return "document"
    raise ValueError(f"scope must be 'document', a Window or an int, got {scope!r}")


def window_tokens(scope: str) -> int | None:
    """The window size of a canonical scope, or None for ``"document"``."""
    return None if scope == "document" else int(scope.split(":", 1)[1])


class CorpusAnswer(BaseModel):
    """Fields common to every corpus-statistics answer."""

    model_config = _FROZEN

    value: int = Field(..., ge=0, description="The number asked for (see ``unit``).")
    approximate: bool = Field(
        False, description="True when the value is an estimate (subsampling by the hosted "
                           "engine, a scope the backend can only approximate, or a case "
                           "folding it cannot do exactly).")
    backend: str = Field(..., description="Which backend answered, e.g. 'local-infini-gram'.")
    index: str = Field(..., description="Which index answered (directory name or API index).")
    latency_ms: float = Field(0.0, ge=0.0, description="Wall time of this answer.")
    cached: bool = Field(False, description="True when served from a persistent cache.")


class CountResult(CorpusAnswer):
    """How often a phrase occurs in the corpus (occurrences, summed over its variants)."""

    kind: Literal["count"] = "count"
    phrase: str = Field(..., description="The phrase after normalisation.")
    variants: tuple[str, ...] = Field(
        (), description="The surface forms that were matched, e.g. ('Paris', ' Paris').")
    unit: Literal["occurrences"] = "occurrences"


class CooccurrenceResult(CorpusAnswer):
    """Whether, and how often, two phrases occur together."""

    kind: Literal["cooccurrence"] = "cooccurrence"
    a: str = Field(..., description="First phrase after normalisation.")
    b: str = Field(..., description="Second phrase after normalisation.")
    scope: str = Field(..., description="Scope actually computed: 'document' or 'window:N'.")
    requested_scope: str = Field(..., description="Scope that was asked for.")
    unit: Literal["documents", "occurrences"] = Field(
        ..., description="'documents' (local: documents in which the pair occurs in scope) or "
                         "'occurrences' (hosted API: occurrences of the rarer phrase with the "
                         "other one within the window).")
    a_count: int | None = Field(None, ge=0, description="Occurrences of a, when known.")
    b_count: int | None = Field(None, ge=0, description="Occurrences of b, when known.")
