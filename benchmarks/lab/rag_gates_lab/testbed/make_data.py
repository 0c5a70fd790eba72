"""Write the data slices the testbed builder ships with (run once by the maintainers).

``popqa_facts.jsonl``: every row of the PopQA development file (upstream field names), with
the fields the builder reads; the file's two row layouts (rows with ``subj`` / ``prop`` /
``obj`` and rows with only ``subj_from_template`` / ``prop_inferred_from_template``) are
normalised, and of the gold paragraphs only the subject's own paragraph is kept.

``wiki_paragraphs.jsonl``: the distinct context paragraphs of the last ``--hotpot-rows``
HotpotQA development rows (the general text the testbed model keeps its language with),
leaving out every title that also appears in the first 300 rows, which the benchmarks
evaluate on, so the testbed's HotpotQA closed-book check is not helped by its training text::

    python -m rag_gates_lab.testbed.make_data ../shared/data \
        benchmarks/lab/rag_gates_lab/testbed/data
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HOTPOT_TAIL_ROWS = 80
HOTPOT_HELD_OUT_ROWS = 300


def slice_row(row: dict[str, Any]) -> dict[str, Any] | None:
    """The shipped form of one PopQA row (None when it names no subject or relation)."""
    subj = row.get("subj") or row.get("subj_from_template")
    prop = row.get("prop") or row.get("prop_inferred_from_template")
    answers = row.get("possible_answers")
    if isinstance(answers, str):
        answers = json.loads(answers)
    if not subj or not prop or not answers:
        return None
    gold = None
    for p in row.get("gold_paragraphs") or []:
        if p.get("title") == row.get("s_wiki_title") and p.get("text"):
            gold = {"title": p["title"], "text": p["text"]}
    return {"id": row.get("id"), "popqa_row_index": row.get("popqa_row_index"),
            "question": row["question"],
            "subj": subj, "prop": prop, "obj": row.get("obj") or answers[0],
            "possible_answers": answers, "s_pop": row.get("s_pop"), "o_pop": row.get("o_pop"),
            "gold_paragraph": gold, "sources": row.get("sources")}


def wiki_paragraphs(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Distinct paragraphs of the tail rows whose titles the evaluated head rows never use."""
    held_out = {str(t) for r in rows[:HOTPOT_HELD_OUT_ROWS] for t, _ in r["context"]}
    seen: set[tuple[str, str]] = set()
    out = []
    for r in rows[-HOTPOT_TAIL_ROWS:]:
        for title, sentences in r["context"]:
            text = "".join(sentences).strip()
            if text and str(title) not in held_out and (title, text) not in seen:
                seen.add((title, text))
                out.append({"title": str(title), "text": text, "hotpotqa_id": r["_id"]})
    return out


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.open(encoding="utf-8") if line.strip()]


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as out:
        for r in rows:
            out.write(json.dumps(r, ensure_ascii=False) + "\n")


def main(argv: list[str]) -> None:
    source, target = Path(argv[0]), Path(argv[1])
    popqa = _read(source / "popqa_dev.jsonl")
    facts = [r for r in (slice_row(row) for row in popqa) if r is not None]
    _write(target / "popqa_facts.jsonl", facts)
    wiki = wiki_paragraphs(_read(source / "hotpotqa_dev.jsonl"))
    _write(target / "wiki_paragraphs.jsonl", wiki)
    sys.stdout.write(f"{len(facts)} PopQA facts, {len(wiki)} Wikipedia paragraphs -> {target}\n")


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
