"""The one reader of the files rag-gates is given: bounded, UTF-8 checked, and every
failure an :class:`~rag_gates.errors.InputFileError` naming the file (``FILE:LINE`` for a
line of a JSON Lines file).

A spec, a record file, a work directory's config, ``--data``, a corpus, a weights file, a
probe's config, a policy's labels: each comes from outside and may be damaged, truncated,
edited by hand or not the file meant. Read raw, each failure surfaces far from the file and
without its name: ``UnicodeDecodeError`` with a byte offset, ``RecursionError`` from
``json.loads`` on deep nesting, ``AttributeError`` on a JSON list where an object was
expected, a NaN threshold accepted as a number. Here every read is

- bounded in size (a whole file: ``max_bytes``; a JSON Lines line: ``max_line_bytes``),
- decoded as strict UTF-8 (the error names the byte offset, and the line),
- refused when it holds NUL bytes (a binary file where text was wanted),
- for JSON, bounded in nesting (:func:`rag_gates._json.loads_bounded`), and, where the
  caller wants finite numbers (the default), free of ``NaN``, ``Infinity`` and numbers that
  overflow to infinity (``1e400``), and free of lone surrogates (``"\\ud800"`` escapes,
  which no tokenizer or codec takes),

and every failure is one typed error (a ``ValueError``, so existing handlers keep working)
whose message names the file and says what to do. ``error=`` picks a subclass where a
caller's handlers expect one (:class:`~rag_gates.errors.ArtifactFileError`,
:class:`~rag_gates.errors.SpecFileError`).

Example:
    >>> from rag_gates._files import read_json, iter_jsonl          # doctest: +SKIP
    >>> config = read_json(work / "config.json", expect=dict)        # doctest: +SKIP
    >>> for line, row in iter_jsonl(Path("questions.jsonl")): ...    # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

from rag_gates._json import DEFAULT_MAX_DEPTH, JSONDepthError, loads_bounded
from rag_gates.errors import InputFileError

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_LINE_BYTES", "decode_text", "iter_jsonl",
           "iter_models", "parse_json", "read_bytes", "read_json", "read_text"]

ModelT = TypeVar("ModelT", bound="BaseModel")

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
"""A whole file read at once (a spec, a config, a corpus file): far above any this package
writes, low enough that a wrong path (a disk image, a model's weights) is refused at once."""
DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024
"""One line of a JSON Lines file (a question, a passage, a record)."""

PathLike = str | os.PathLike[str]


def _where(path: PathLike, line: int | None) -> str:
    return f"{os.fspath(path)}:{line}" if line is not None else os.fspath(path)


def _fail(error: type[InputFileError], path: PathLike, line: int | None, problem: str,
          fix: str) -> InputFileError:
    # "FILE:3 is not JSON (...)", "FILE holds a NUL byte", "FILE:3: NaN is not ...".
    sep = " " if problem.startswith(("is ", "holds ")) else ": "
    message = f"{_where(path, line)}{sep}{problem}"
    return error(f"{message}; {fix}" if fix else message, path=path, line=line)


def _open_binary(path: PathLike, error: type[InputFileError], fix: str) -> BinaryIO:
    """``path`` opened for reading bytes; a directory, a missing or unreadable file raises
    ``error`` naming it."""
    try:
        return open(path, "rb")
    except IsADirectoryError:
        raise _fail(error, path, None, "is a directory, not a file", fix) from None
    except FileNotFoundError:
        raise _fail(error, path, None, "no such file", fix) from None
    except OSError as exc:
        raise _fail(error, path, None, f"cannot be read ({exc.strerror or exc})", fix) from None


def read_bytes(path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES, fix: str = "",
               error: type[InputFileError] = InputFileError) -> bytes:
    """The bytes of ``path``, at most ``max_bytes`` of them: a larger file, a directory, a
    missing or unreadable file raises ``error`` naming it (``fix``: what to do)."""
    with _open_binary(path, error, fix) as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise _fail(error, path, None, f"is larger than {max_bytes:,} bytes (the limit for "
                    "this file); is it the file meant?", fix)
    return data


def decode_text(data: bytes, path: PathLike, *, line: int | None = None, fix: str = "",
                binary_ok: bool = False,
                error: type[InputFileError] = InputFileError) -> str:
    """``data`` (the bytes of ``path``, or of its line ``line``) as strict UTF-8: invalid
    UTF-8 raises ``error`` naming the file, the line (counted from ``line``, or from the
    start of a whole file) and the byte offset; a NUL byte (a binary file) too, unless
    ``binary_ok``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if line is not None:
            at, offset = line, f"byte {exc.start} of the line"
        else:
            at = data.count(b"\n", 0, exc.start) + 1
            offset = f"byte {exc.start} of the file"
        raise _fail(error, path, at, f"is not UTF-8 text ({exc.reason} at {offset}); save "
                    "it as UTF-8", fix) from None
    if not binary_ok and "\x00" in text:
        nul = data.index(b"\x00")
        at = line if line is not None else data.count(b"\n", 0, nul) + 1
        raise _fail(error, path, at, f"holds a NUL byte (byte {nul}): a binary file, not "
                    "text", fix)
    return text


def read_text(path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES, fix: str = "",
              binary_ok: bool = False, error: type[InputFileError] = InputFileError) -> str:
    """The text of ``path``: :func:`read_bytes` then :func:`decode_text`."""
    return decode_text(read_bytes(path, max_bytes=max_bytes, fix=fix, error=error), path,
                       fix=fix, binary_ok=binary_ok, error=error)


class _NotFinite(ValueError):
    pass


def _refuse_constant(name: str) -> float:
    raise _NotFinite(f"{name} is not a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(f"{text[:40]} overflows to {value} (not a finite number)")
    return value


def _first_unencodable(value: Any) -> str | None:
    """The first str (a key or a value) in ``value`` that holds a lone surrogate."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return (f"a string holds a lone surrogate (U+{ord(value[exc.start]):04X} at "
                    f"position {exc.start} of {value[:40]!r}), which is not text")
        return None
    if isinstance(value, dict):
        items: Any = (x for kv in value.items() for x in kv)
    elif isinstance(value, list):
        items = value
    else:
        return None
    for item in items:
        found = _first_unencodable(item)
        if found is not None:
            return found
    return None


def parse_json(text: str | bytes, path: PathLike, *, line: int | None = None,
               max_depth: int = DEFAULT_MAX_DEPTH, finite: bool = True,
               expect: type | None = None, fix: str = "", surrogates_ok: bool = False,
               error: type[InputFileError] = InputFileError) -> Any:
    """``text`` (all of ``path``, or its line ``line``) parsed as JSON, nested at most
    ``max_depth`` levels; with ``finite`` (the default) ``NaN``, ``Infinity`` and numbers
    that overflow (``1e400``) are refused; strings with lone surrogates are refused unless
    ``surrogates_ok`` (a caller that sorts them itself); ``expect`` (``dict`` or ``list``):
    the value must be one. Every failure raises ``error`` naming the file and line."""
    if isinstance(text, bytes):
        text = decode_text(text, path, line=line, fix=fix, error=error)
    hooks: dict[str, Any] = ({"parse_constant": _refuse_constant,
                              "parse_float": _finite_float} if finite else {})
    try:
        value = loads_bounded(text, max_depth=max_depth, what="the JSON", **hooks)
    except _NotFinite as exc:
        raise _fail(error, path, line, f"{exc}: JSON numbers here must be finite", fix
                    ) from None
    except JSONDepthError as exc:
        raise _fail(error, path, line, str(exc), fix) from None
    except json.JSONDecodeError as exc:
        raise _fail(error, path, line, f"is not JSON ({exc})", fix) from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of over 4,300 digits
        raise _fail(error, path, line, f"is not JSON ({str(exc)[:200]})", fix) from None
    problem = None if surrogates_ok else _first_unencodable(value)
    if problem is not None:
        raise _fail(error, path, line, problem, fix)
    if expect is not None and not isinstance(value, expect):
        raise _fail(error, path, line, f"holds a JSON {_json_type(value)}, not a JSON "
                    f"{_json_type(expect())}", fix)
    return value


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def read_json(path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES,
              max_depth: int = DEFAULT_MAX_DEPTH, finite: bool = True,
              expect: type | None = None, fix: str = "",
              error: type[InputFileError] = InputFileError) -> Any:
    """The JSON value of the file ``path``: :func:`read_bytes` then :func:`parse_json`."""
    data = read_bytes(path, max_bytes=max_bytes, fix=fix, error=error)
    return parse_json(decode_text(data, path, fix=fix, error=error), path,
                      max_depth=max_depth, finite=finite, expect=expect, fix=fix, error=error)


def iter_jsonl(path: PathLike, *, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
               max_depth: int = DEFAULT_MAX_DEPTH, finite: bool = True,
               expect: type | None = dict, first_line: int = 1, fix: str = "",
               error: type[InputFileError] = InputFileError
               ) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` of each non-blank line of the JSON Lines file ``path``,
    read one line at a time (each at most ``max_line_bytes``), each parsed as by
    :func:`parse_json` (``expect``: each value must be one, by default an object). Any
    failure raises ``error`` naming ``FILE:LINE``. ``first_line``: skip the lines before
    it (a header read otherwise)."""
    with _open_binary(path, error, fix) as handle:
        number = 0
        while True:
            raw = handle.readline(max_line_bytes + 1)
            if not raw:
                return
            number += 1
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                raise _fail(error, path, number, f"is longer than {max_line_bytes:,} bytes "
                            "(the limit for one line)", fix)
            if number < first_line:
                continue
            text = decode_text(raw, path, line=number, fix=fix, error=error)
            if not text.strip():
                continue
            yield number, parse_json(text, path, line=number, max_depth=max_depth,
                                     finite=finite, expect=expect, fix=fix, error=error)


def iter_models(path: PathLike, model: type[ModelT], *, what: str, fix: str = "",
                error: type[InputFileError] = InputFileError, **options: Any
                ) -> Iterator[ModelT]:
    """Each non-blank line of the JSON Lines file ``path`` as a ``model`` (a pydantic
    model), read by :func:`iter_jsonl` (``options`` pass on to it); a line that is not one
    raises ``error`` naming ``FILE:LINE``, ``what`` it should be and its first problem."""
    from pydantic import ValidationError

    for number, row in iter_jsonl(path, fix=fix, error=error, **options):
        try:
            yield model.model_validate(row)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "the line"
            raise _fail(error, path, number, f"not {what} ({where}: {first['msg']})",
                        fix) from None
