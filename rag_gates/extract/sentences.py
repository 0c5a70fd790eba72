"""A dependency-free English sentence splitter for generated text and Wikipedia prose.

QuCo-RAG verifies generated text sentence by sentence, so the splitter must not cut a claim
in half at "Dr." or "U.S." and must not glue two claims together. The rules:

* a sentence ends at ``.``, ``!``, ``?`` or an ellipsis (``...``/``…``), optionally followed
  by closing quotes or brackets, then whitespace, then something that can start a sentence
  (an upper-case letter, a digit, or an opening quote/bracket);
* not after a known abbreviation (``Mr.``, ``Dr.``, ``St.``, ``Jr.``, ``e.g.``, ``Inc.``,
  month abbreviations, ...) or a single-letter initial (``J. R. R. Tolkien``);
* after a dotted acronym (``U.S.``, ``U.K.``) or ``etc.`` only when the next word is a
  typical sentence opener (``He``, ``The``, ``In``, ...): "born in the U.S. Army" stays whole,
  "moved to the U.S. He died there." splits;
* decimals (``3.5``), version numbers and URLs never split (no whitespace after the dot);
* a blank line, or a line break before a bullet (``-``, ``*``, ``•``), always ends a sentence.

Returned sentences are stripped and never empty; the empty or whitespace-only text gives
``[]``.

Example:
    >>> split_sentences("Dr. J. R. R. Tolkien was born in 1892. He wrote The Hobbit.")
    ['Dr. J. R. R. Tolkien was born in 1892.', 'He wrote The Hobbit.']
    >>> split_sentences('She said "Go." Then she left... The U.S. Army won.')
    ['She said "Go."', 'Then she left...', 'The U.S. Army won.']
"""

from __future__ import annotations

import re

__all__ = ["ABBREVIATIONS", "split_sentences"]

#: Lower-cased abbreviations (without the final dot) after which a period never ends a sentence.
ABBREVIATIONS: frozenset[str] = frozenset({
    "mr", "mrs", "ms", "mx", "dr", "prof", "st", "jr", "sr", "sen", "rep", "gov", "pres",
    "gen", "col", "lt", "maj", "capt", "cpt", "sgt", "cmdr", "adm", "rev", "hon", "fr",
    "mt", "ft", "ave", "blvd", "rd", "co", "corp", "inc", "ltd", "bros", "dept", "univ",
    "no", "nos", "vol", "vols", "pp", "p", "fig", "figs", "ch", "sec", "art", "ed", "eds",
    "vs", "v", "cf", "al", "approx", "ca", "c", "est", "e.g", "i.e", "viz", "op", "cit",
    "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
    "mon", "tue", "tues", "wed", "thu", "thur", "thurs", "fri", "sat", "sun",
    "a.m", "p.m", "ph.d", "b.a", "m.a", "b.sc", "m.sc", "d.c", "u.s.a", "n.y",
})

# After these (acronyms, "etc.") a sentence ends only if the next word opens a sentence.
_OPENERS: frozenset[str] = frozenset({
    "a", "an", "the", "he", "she", "it", "they", "we", "i", "you", "his", "her", "its",
    "their", "our", "this", "that", "these", "those", "there", "in", "on", "at", "after",
    "before", "during", "however", "thus", "therefore", "so", "but", "and", "also", "then",
    "when", "while", "as", "since", "although", "it's", "today", "later", "both", "according",
})

_BOUNDARY = re.compile(
    r"""
    (?P<end>(?:\.{3}|…|[.!?]+)[\"'”’»)\]]*)   # terminal punctuation, closing quotes/brackets
    (?P<space>\s+)                           # whitespace
    (?=[\"'“‘«(\[]*[A-Z0-9\u00C0-\u024F])     # next sentence: opening quote/bracket, capital, digit
    """,
    re.VERBOSE,
)
_HARD_BREAK = re.compile(r"\n[ \t]*\n\s*|\n(?=[ \t]*(?:[-*•]|\d+[.)])\s)")
_WORD_BEFORE = re.compile(r"([A-Za-z][A-Za-z.]*)$")
_ACRONYM = re.compile(r"^(?:[A-Za-z]\.){2,}[A-Za-z]?$")  # U.S. / U.K / e.g. (dots inside)
_NEXT_WORD = re.compile(r"[\"'“‘«(\[]*([A-Za-z][\w'’]*)")


def _is_boundary(text: str, match: re.Match[str]) -> bool:
    end = match.group("end")
    if end[0] in "!?" or end.startswith("...") or end.startswith("…"):
        return True
    # A single "." (possibly closed by quotes): look at the word it ends.
    if end.rstrip("\"'”’»)]") != ".":
        return True
    before = _WORD_BEFORE.search(text, 0, match.start())
    if before is None:
        return True
    word = before.group(1)
    lowered = word.lower().rstrip(".")
    next_word = _NEXT_WORD.match(text, match.end())
    opener = next_word is not None and next_word.group(1).lower() in _OPENERS
    if len(word) == 1 and word.isupper():
        return False  # an initial: "J. R. R. Tolkien", "George W. Bush"
    if _ACRONYM.match(word + ".") or lowered == "etc":
        return opener
    return lowered not in ABBREVIATIONS


def split_sentences(text: str) -> list[str]:
    """Split ``text`` into sentences; never returns empty strings (see the module doc).

    Raises:
        TypeError: if ``text`` is not a string.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    out: list[str] = []
    for block in _HARD_BREAK.split(text):
        start = 0
        for match in _BOUNDARY.finditer(block):
            if _is_boundary(block, match):
                piece = block[start:match.start("space")].strip()
                if piece:
                    out.append(piece)
                start = match.end()
        piece = block[start:].strip()
        if piece:
            out.append(piece)
    return out
