"""Gate expressions: ``cascade(quco,cbdr,0.2,0.8)``, ``quco & cbdr:0.4``,
``weighted(FILE)``, parsed into composed gates (:data:`GATE_GRAMMAR`, docs/composition.md)."""

from __future__ import annotations

import contextvars
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rag_gates._files import read_json
from rag_gates.errors import WeightsFileError
from rag_gates.gate.base import Gate
from rag_gates.gate.composite import AllOf, AnyOf, Cascade, Weighted

GATE_GRAMMAR = """\
expr     := any
any      := all ('|' all)*                      AnyOf: retrieve if any retrieves
all      := unit ('&' unit)*                    AllOf: retrieve if all do ('&' binds tighter)
unit     := '(' expr ')'
          | 'cascade(' expr ',' expr ',' LO ',' HI ')'
                                                the second decides when the first's score
                                                is in [LO, HI], else the first does
          | 'weighted(' FILE ')'                weights fitted by rag-gates fit-weighted
          | NAME [':' THRESHOLD]                a registered gate, optionally at a threshold
                                                (on the gate's score scale)
limits:   4096 characters, 64 gate names, 32 levels of nesting ('(', cascade, weighted,
          counted through the gates a weights file names)
examples: quco&cbdr   quco|answer-logprob:1.2   cascade(quco,cbdr,0.2,0.8)
          (quco&cbdr)|first-token-prob"""

#: The longest gate expression read (checked before it is tokenized).
MAX_EXPRESSION_CHARS = 4096
#: The most gate names one expression holds (each may load a model or an index).
MAX_EXPRESSION_TERMS = 64
#: The deepest nesting of '(', cascade( and weighted(, through weights files too (the parser
#: and the composite gates recurse once per level).
MAX_EXPRESSION_DEPTH = 32
#: The largest weights file read (a fitted file is well under 10 KB).
MAX_WEIGHTS_FILE_BYTES = 1024 * 1024

_TOKEN = re.compile(r"\s*(?:(?P<punct>[()&|,])|(?P<word>[^\s()&|,]+))")
# Nesting and the weights files being read, across the nested parses a weights file's gate
# names start (resolve -> make_gate -> parse_gate_expression): per thread and task.
_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("rag_gates_gate_depth",
                                                             default=0)
_READING: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "rag_gates_weights_files", default=())


def is_gate_expression(text: str) -> bool:
    """True when ``text`` is a composite expression rather than one gate's name."""
    return any(c in text for c in "()&|,")


def _is_gate_name(tokens: list[tuple[str, int]], i: int) -> bool:
    """Whether token ``i`` names a gate (not punctuation, a keyword, a band or a file)."""
    word = tokens[i][0]
    if word in "()&|," or (i + 1 < len(tokens) and tokens[i + 1][0] == "("):
        return False
    if i >= 2 and tokens[i - 1][0] == "(" and tokens[i - 2][0] == "weighted":
        return False
    try:
        float(word)
    except ValueError:
        return True
    return False


def _shown(text: str) -> str:
    return repr(text if len(text) <= 80 else f"{text[:60]}...{text[-12:]}")


def parse_gate_expression(text: str, resolve: Callable[[str, float | None], Gate],
                          load_weights: Callable[[str], dict[str, Any]] | None = None
                          ) -> Gate:
    """Build the gate an expression names (grammar and limits: :data:`GATE_GRAMMAR`).

    ``resolve(name, threshold)`` builds one registered gate (threshold None: its default);
    ``load_weights(path)`` reads a ``weighted(FILE)`` JSON (default: the file, at most
    :data:`MAX_WEIGHTS_FILE_BYTES`). A malformed expression raises :class:`ValueError`
    saying where and what was expected; one over a limit (:data:`MAX_EXPRESSION_CHARS`,
    :data:`MAX_EXPRESSION_TERMS`, :data:`MAX_EXPRESSION_DEPTH`) names the limit, and is
    refused before any gate is built for the terms past it. A weights file that is not the
    JSON ``rag-gates fit-weighted`` writes, or whose gates name the file itself, raises
    :class:`~rag_gates.errors.WeightsFileError` naming the file.

    Example:
        >>> class Words(BaseGate):
        ...     def score(self, query, **signals):
        ...         return float(len(query.split())), {}
        >>> def resolve(name, threshold):
        ...     gate = Words(threshold if threshold is not None else 3.0)
        ...     gate.name = name
        ...     return gate
        >>> parse_gate_expression("short:2&long:9", resolve).name
        '(short&long)'
    """
    if not isinstance(text, str):
        raise TypeError(f"a gate expression is a str, got {type(text).__name__}")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"gate expression {_shown(text)} is {len(text):,} characters long, "
                         f"more than the limit of {MAX_EXPRESSION_CHARS:,} characters")
    tokens: list[tuple[str, int]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            break
        tokens.append((m.group("punct") or m.group("word"), m.start(m.lastindex or 0)))
        pos = m.end()
    if not tokens:
        raise ValueError(f"empty gate expression {text!r}\n{GATE_GRAMMAR}")
    # Count the gate names first: none is built (a model, an index) if there are too many.
    names = sum(1 for i in range(len(tokens)) if _is_gate_name(tokens, i))
    if names > MAX_EXPRESSION_TERMS:
        raise ValueError(f"gate expression {_shown(text)} names {names} gates, more than the "
                         f"limit of {MAX_EXPRESSION_TERMS} gates in one expression")
    cursor = 0

    def fail(expected: str) -> ValueError:
        where = (f"at {tokens[cursor][0]!r} (character {tokens[cursor][1]})"
                 if cursor < len(tokens) else "at its end")
        return ValueError(f"gate expression {text!r}: expected {expected} {where}\n"
                          f"{GATE_GRAMMAR}")

    def peek() -> str | None:
        return tokens[cursor][0] if cursor < len(tokens) else None

    def take(expected: str) -> str:
        nonlocal cursor
        if cursor >= len(tokens) or (expected not in ("a gate name", "a number", "a file")
                                     and tokens[cursor][0] != expected):
            raise fail(repr(expected) if len(expected) == 1 else expected)
        cursor += 1
        return tokens[cursor - 1][0]

    def number() -> float:
        word = take("a number")
        try:
            value = float(word)
        except ValueError:
            cursor_back()
            raise fail("a number") from None
        if not math.isfinite(value):
            cursor_back()
            raise fail("a finite number")
        return value

    def cursor_back() -> None:
        nonlocal cursor
        cursor -= 1

    def joined(operator: str, operand: Callable[[], Gate],
               combine: Callable[..., Gate]) -> Gate:
        """``operand (operator operand)*``: the one operand, or all of them combined."""
        parts = [operand()]
        while peek() == operator:
            take(operator)
            parts.append(operand())
        return parts[0] if len(parts) == 1 else combine(*parts)

    def any_() -> Gate:
        return joined("|", all_, AnyOf)

    def all_() -> Gate:
        return joined("&", unit, AllOf)

    def unit() -> Gate:
        word = peek()
        if word is None or word in "&|,)":
            raise fail("a gate name or '('")
        nested = word == "(" or (word in ("cascade", "weighted") and cursor + 1 < len(tokens)
                                 and tokens[cursor + 1][0] == "(")
        if not nested:
            return named(take("a gate name"))
        depth = _DEPTH.get() + 1
        if depth > MAX_EXPRESSION_DEPTH:
            raise ValueError(
                f"gate expression {_shown(text)} is nested deeper than "
                f"{MAX_EXPRESSION_DEPTH} levels (the limit; '(', cascade( and weighted( "
                "count, through the gates of weights files too)")
        token = _DEPTH.set(depth)
        try:
            return inner()
        finally:
            _DEPTH.reset(token)

    def inner() -> Gate:
        word = take("a gate name")
        if word == "(":
            gate = any_()
            take(")")
            return gate
        take("(")
        if word == "cascade":
            cheap = any_()
            take(",")
            expensive = any_()
            take(",")
            lo = number()
            take(",")
            hi = number()
            take(")")
            if lo > hi:
                raise ValueError(f"gate expression {text!r}: cascade band {lo:g}..{hi:g} "
                                 "is empty (LO must be <= HI)")
            return Cascade(cheap, expensive, (lo, hi))
        path = take("a file")
        take(")")
        return _weighted_from_file(path, resolve, load_weights)

    def named(word: str) -> Gate:
        name, colon, threshold = word.partition(":")
        if colon:
            try:
                value = float(threshold)
            except ValueError:
                raise ValueError(f"gate expression {text!r}: {word!r} has threshold "
                                 f"{threshold!r}, not a number\n{GATE_GRAMMAR}") from None
            if not math.isfinite(value):
                raise ValueError(f"gate expression {text!r}: threshold of {name!r} must be "
                                 f"finite, got {threshold!r}")
            return resolve(name, value)
        return resolve(name, None)

    gate = any_()
    if cursor != len(tokens):
        raise fail("'&', '|' or the end")
    return gate


def _read_weights(path: str) -> Any:
    """A weights file's JSON, bounded in size and depth before it is parsed."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"weighted({path}): no such file; fit one with "
                                "rag-gates fit-weighted")
    # The bounded reader: size, nesting, UTF-8 and finite numbers, each failure naming it.
    return read_json(file, max_bytes=MAX_WEIGHTS_FILE_BYTES, max_depth=8,
                     fix=f"weighted({path}) expects the JSON written by rag-gates "
                         "fit-weighted (a few hundred bytes)", error=WeightsFileError)


_WEIGHTS_SHAPE = ('an object {"gates": [names], "weights": [numbers, one per gate], "bias": '
                  'number, and optionally "center"/"scale" (numbers, one per gate), '
                  '"threshold" (a probability in [0, 1]) and "gate_thresholds" (a number or '
                  'null per gate)}, as rag-gates fit-weighted writes it')


def _check_weights(path: str, data: Any) -> tuple[list[str], list[float | None]]:
    """The gate names and their thresholds of a weights file's data, or WeightsFileError
    naming the file, what is wrong and the shape expected."""

    def bad(what: str) -> WeightsFileError:
        return WeightsFileError(f"weighted({path}): {what}; expected {_WEIGHTS_SHAPE}")

    def is_number(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)

    if not isinstance(data, dict):
        raise bad(f"the file holds a JSON {type(data).__name__}, not a JSON object")
    names = data.get("gates")
    if not isinstance(names, list) or not names or not all(
            isinstance(n, str) and n for n in names):
        raise bad("'gates' is not a non-empty list of gate names")
    if len(names) > MAX_EXPRESSION_TERMS:
        raise bad(f"it names {len(names)} gates, more than the limit of "
                  f"{MAX_EXPRESSION_TERMS}")
    n = len(names)
    for key, required in (("weights", True), ("center", False), ("scale", False),
                          ("gate_thresholds", False)):
        value = data.get(key)
        if value is None and not required:
            continue
        allowed_null = key == "gate_thresholds"
        if not isinstance(value, list) or len(value) != n or not all(
                is_number(v) or (allowed_null and v is None) for v in value):
            got = f"{len(value)} values" if isinstance(value, list) else repr(value)[:40]
            raise bad(f"{key!r} must be {n} finite numbers{' or nulls' if allowed_null else ''}"
                      f" (one per gate), got {got}")
    for key in ("bias", "threshold"):
        if key in data and not is_number(data[key]):
            raise bad(f"{key!r} must be a finite number, got {data[key]!r}")
    thresholds = data.get("gate_thresholds") or [None] * n
    return names, [None if t is None else float(t) for t in thresholds]


def _weighted_from_file(path: str, resolve: Callable[[str, float | None], Gate],
                        load: Callable[[str], dict[str, Any]] | None) -> Weighted:
    key = str(Path(path).expanduser().resolve()) if load is None else path
    reading = _READING.get()
    if key in reading:
        chain = " -> ".join(f"weighted({p})" for p in (*reading[reading.index(key):], key))
        raise WeightsFileError(f"weighted({path}) names itself through its gates ({chain}): "
                               "a weights file cannot include itself")
    data = _read_weights(path) if load is None else load(path)
    names, thresholds = _check_weights(path, data)
    token = _READING.set((*reading, key))
    try:
        gates = [resolve(name, t) for name, t in zip(names, thresholds, strict=True)]
    finally:
        _READING.reset(token)
    try:
        return Weighted.from_json(data, gates)
    except ValueError as exc:
        raise WeightsFileError(f"weighted({path}): {exc}") from None
