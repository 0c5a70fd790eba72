"""Phrase normalisation and the token variants a phrase is matched in.

A phrase is always matched *literally*: it is turned into token ids by the index's tokenizer,
never parsed, so ``"Tom AND Jerry"``, ``"(a OR b)"`` or ``'"quoted"'`` mean exactly those
characters. Normalisation: Unicode NFC, runs of whitespace collapsed to one space, stripped.

A phrase is matched in several tokenizations (``variants``): with and without a leading space
(see :data:`rag_gates.corpus.types.SpaceMode`) and, when asked, in common casings. Variants
with identical ids are merged, and a variant whose ids contain another variant's ids is
dropped (its matches are already counted through the shorter one), so a count is the number of
positions where some variant starts, each counted once.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence

from rag_gates._text import check_encodable
from rag_gates.corpus.errors import EmptyPhraseError, InvalidPhraseError, PhraseTooLongError
from rag_gates.corpus.types import CaseMode, SpaceMode

__all__ = ["Variant", "case_forms", "normalize_phrase", "surface_forms", "token_variants"]

_WS = re.compile(r"\s+")

Variant = tuple[str, tuple[int, ...]]


def normalize_phrase(phrase: object, max_chars: int) -> str:
    """NFC, collapse whitespace, strip; raise a specific InvalidPhraseError when unusable
    (not a str, empty, too long, or not encodable: a lone surrogate, named by position)."""
    if not isinstance(phrase, str):
        raise InvalidPhraseError(f"a phrase must be a str, got {type(phrase).__name__}")
    try:  # a lone surrogate would reach the tokenizer or the HTTP client as a raw error
        check_encodable(phrase, "the phrase")
    except ValueError as exc:
        raise InvalidPhraseError(str(exc)) from None
    text = _WS.sub(" ", unicodedata.normalize("NFC", phrase)).strip()
    if not text:
        raise EmptyPhraseError("the phrase is empty (or only whitespace); pass some text")
    if len(text) > max_chars:
        raise PhraseTooLongError(
            f"the phrase has {len(text)} characters, more than the limit of {max_chars}; "
            "shorten it (entity names and claims are short) or raise max_phrase_chars")
    return text


def case_forms(phrase: str, case: CaseMode, lowercase_index: bool) -> list[str]:
    """The casings searched for a phrase, in priority order, without duplicates."""
    if lowercase_index:
        return [phrase.lower()]
    if case == "sensitive":
        return [phrase]
    forms = [phrase, phrase.lower(), phrase.upper(), phrase.title(),
             phrase[:1].upper() + phrase[1:]]
    return list(dict.fromkeys(forms))


def surface_forms(phrase: str, case: CaseMode, spaces: SpaceMode,
                  lowercase_index: bool = False) -> list[str]:
    """Every text form to tokenize: each casing with and/or without a leading space."""
    out: list[str] = []
    for form in case_forms(phrase, case, lowercase_index):
        if spaces in ("both", "leading"):
            out.append(" " + form)
        if spaces in ("both", "none"):
            out.append(form)
    return out


def _contains(longer: tuple[int, ...], shorter: tuple[int, ...]) -> bool:
    n, m = len(longer), len(shorter)
    return m < n and any(longer[i:i + m] == shorter for i in range(n - m + 1))


def token_variants(forms: Sequence[str], encode: Callable[[str], list[int]],
                   max_tokens: int) -> list[Variant]:
    """Tokenize each form; merge identical ids; drop a variant that contains another."""
    seen: dict[tuple[int, ...], str] = {}
    for form in forms:
        ids = tuple(encode(form))
        if not ids:
            continue
        if len(ids) > max_tokens:
            raise PhraseTooLongError(
                f"the phrase is {len(ids)} tokens long, more than the limit of {max_tokens}; "
                "shorten it or raise max_phrase_tokens")
        seen.setdefault(ids, form)
    if not seen:
        raise EmptyPhraseError(f"the phrase {forms[0].strip()!r} encodes to no tokens")
    keys = list(seen)
    kept = [k for k in keys if not any(_contains(k, other) for other in keys if other != k)]
    return [(seen[k], k) for k in kept]
