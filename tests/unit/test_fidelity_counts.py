"""docs/fidelity.md's Counts table is the count of its rows' verdicts (issue 55: "the row
counts at the top of docs/fidelity.md are true")."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "fidelity.md"
SECTIONS = {"QuCo-RAG": "Q", "Tok-RAG": "T", "CBDR": "C", "DeepRAG": "D", "SR-RAG": "S"}
VERDICTS = ("same", "deviation", "fixed", "unchecked")
_CELL = re.compile(r"(?<!\\)\|")  # a table cell boundary; "\|" inside a code span is text


def _verdict(cell: str) -> str:
    word = re.sub(r"[*_`]", "", cell).strip().lower()
    for verdict in VERDICTS:
        if word.startswith(verdict):
            return verdict
    raise AssertionError(f"a row's verdict is none of {VERDICTS}: {cell[:80]!r}")


def _counted() -> dict[str, dict[str, int]]:
    text = DOC.read_text(encoding="utf-8")
    out: dict[str, dict[str, int]] = {}
    for chunk in text.split("\n## ")[1:]:
        title = chunk.split("\n", 1)[0].split(" ")[0]
        if title not in SECTIONS:
            continue
        counts = {"rows": 0, **{v: 0 for v in VERDICTS}}
        for line in chunk.splitlines():
            if not re.match(rf"\|\s*{SECTIONS[title]}\d+\s*\|", line):
                continue
            cells = _CELL.split(line.strip().strip("|"))
            counts["rows"] += 1
            counts[_verdict(cells[-1])] += 1
        out[title] = counts
    return out


def _stated() -> dict[str, dict[str, int]]:
    text = DOC.read_text(encoding="utf-8")
    table = text.split("## Counts", 1)[1].split("\n\n", 2)[1]
    out = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        numbers = [int(c.split(" ")[0]) for c in cells[1:]]
        out[cells[0]] = dict(zip(["rows", *VERDICTS], numbers, strict=True))
    return out


def test_the_counts_table_counts_the_rows() -> None:
    counted = _counted()
    assert set(counted) == set(SECTIONS)
    assert _stated() == counted


# A citation of what a row was checked against: a file's line ("l. 405", "G 1441",
# "sragsamplev2.py:178", "P line 3") or the paper's place ("section 3.2", "Eq. 7",
# "Algorithm 1", "appendix B.1", "Fig. 5", "footnote 4", "Table 3", "arXiv 2305.14739").
_CITATION = re.compile(
    r"l\.\s*\d|\b[GP] (line )?\d|line \d|\.py:\d|:\d{2,}\b|[Ss]ec(tion|\.)\s*\d|Eq\.\s*\d"
    r"|Algorithm \d|appendix [A-Z]|Fig\.\s*\d|footnote \d|Table \d|arXiv \d{4}\.\d{4,5}")


def test_every_same_row_names_what_it_was_checked_against() -> None:
    """Issue 55's "done when": every "same" row names the line (the authors' file and line,
    or the paper's section / equation) it was checked against, in its rule or verdict."""
    text = DOC.read_text(encoding="utf-8")
    uncited = []
    for line in text.splitlines():
        match = re.match(r"\|\s*([QTCDS]\d+)\s*\|", line)
        if not match:
            continue
        cells = _CELL.split(line.strip().strip("|"))
        if _verdict(cells[-1]) == "same" and not (
                _CITATION.search(cells[1]) or _CITATION.search(cells[-1])):
            uncited.append(match.group(1))
    assert uncited == []
