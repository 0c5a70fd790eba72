"""Draw the shipped calibration sample: questions drawn uniformly from a named population.

    .venv/bin/python benchmarks/make_calibration_sample.py \\
        --out-questions examples/data/calibration_questions.jsonl \\
        --out-corpus examples/data/calibration_corpus.jsonl \\
        --record benchmarks/results/calibrate/uniform-300/sample.json

The population is every PopQA development row that has a gold paragraph (``gold_paragraphs``
in the shared development file, /work/shared/data/popqa_dev.jsonl: 689 rows, 379 place of
birth and 310 occupation). ``--n`` of them (300) are drawn without replacement, uniformly,
by ``random.Random(seed).sample(population, n)`` over the population in the file's order;
the questions are written in the order drawn, so the first N of them are a uniform sample
too (``rag-gates calibrate --limit N``).

Each question is a line of ``rag-gates calibrate --data``: ``id`` (``popqa-ROW``, ROW being
PopQA's ``popqa_row_index``), ``question``, ``answers`` (PopQA's ``possible_answers``),
``group`` (the relation, PopQA's ``prop``: ``--by-group`` certifies one threshold per
relation) and ``source`` (the row, and which committed benchmark rows it also is: every row
of this population is one, see ``--overlap``). The corpus ``rag-gates calibrate --corpus``
searches: the drawn rows' gold paragraphs (in the order drawn, each distinct title and text
once, ids ``popqa-0``, ``popqa-1``, ...) and, as distractors, every paragraph of
``--distractors`` (the testbed's 783 HotpotQA Wikipedia paragraphs, ids continuing the
count: ``wiki-N``). ``--record`` writes the population, its size and relation mix, the draw
(seed, method, the ids in order), the overlaps and the files' SHA-256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
POPULATION = "PopQA development rows that have a gold paragraph"
DEFAULT_OVERLAPS = (
    "an evaluation row of benchmarks/results/eval/popqa-500"
    "=benchmarks/results/eval/popqa-500/results.jsonl",
    "an evaluation row of benchmarks/results/srrag/popqa-200"
    "=benchmarks/results/srrag/popqa-200/results.jsonl",
    "a training row of SR-RAG's shipped policy (rag_gates/srrag/policies/smollm2.jsonl)"
    "=rag_gates/srrag/policies/smollm2.jsonl",
)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def benchmark_id(row: dict[str, Any], line: int) -> str:
    """The id the benchmarks give a PopQA row (rag_gates_lab.datasets._popqa's rule): the
    row's own ``id`` when it has one, else ``popqa-ROW``."""
    return str(row.get("id") or f"popqa-{row.get('popqa_row_index', line)}")


def population(rows: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """(line, row) of every row with a gold paragraph, in the file's order."""
    return [(line, row) for line, row in enumerate(rows) if row.get("gold_paragraphs")]


def draw(pool: list[tuple[int, dict[str, Any]]], n: int, seed: int
         ) -> list[tuple[int, dict[str, Any]]]:
    if n > len(pool):
        raise SystemExit(f"--n {n} is more than the population's {len(pool)} rows")
    return random.Random(seed).sample(pool, n)


def overlap_sets(specs: list[str]) -> list[tuple[str, Path, set[str]]]:
    """``LABEL=PATH`` -> (label, path, the ids of PATH's JSONL rows)."""
    out = []
    for spec in specs:
        label, _, path = spec.rpartition("=")
        if not label:
            raise SystemExit(f"--overlap {spec!r}: give LABEL=PATH")
        file = ROOT / path
        out.append((label, Path(path), {str(r.get("id")) for r in _jsonl(file)}))
    return out


def question_line(line: int, row: dict[str, Any],
                  overlaps: list[tuple[str, Path, set[str]]]) -> dict[str, Any]:
    answers = row["possible_answers"]
    if isinstance(answers, str):  # upstream stores a JSON list as a string on some rows
        answers = json.loads(answers)
    index = row["popqa_row_index"]
    also = [label for label, _, ids in overlaps if benchmark_id(row, line) in ids]
    source = f"PopQA dev row {index}" + (f"; also {' and '.join(also)}" if also else "")
    return {"id": f"popqa-{index}", "question": row["question"],
            "answers": [str(a) for a in answers], "group": row["prop"], "source": source}


def corpus_lines(drawn: list[tuple[int, dict[str, Any]]],
                 distractors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    gold = dict.fromkeys((str(p["title"]), str(p["text"]))
                         for _, row in drawn for p in row["gold_paragraphs"])
    out = [{"id": f"popqa-{i}", "title": title, "text": text}
           for i, (title, text) in enumerate(gold)]
    out += [{"id": f"wiki-{len(gold) + i}", "title": d["title"], "text": d["text"]}
            for i, d in enumerate(distractors)]
    return out


def _write_jsonl(path: Path, rows: list[dict[str, Any]], *, ascii_only: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=ascii_only) + "\n" for r in rows),
                    encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--popqa", type=Path, default=Path("/work/shared/data/popqa_dev.jsonl"),
                        help="the PopQA development file (JSONL)")
    parser.add_argument("--distractors", type=Path, default=ROOT / "benchmarks" / "lab"
                        / "rag_gates_lab" / "testbed" / "data" / "wiki_paragraphs.jsonl",
                        help="JSONL paragraphs ({title, text}) added to the corpus")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overlap", action="append", metavar="LABEL=PATH",
                        help="committed benchmark rows (a JSONL with 'id', relative to the "
                             "repository) a drawn row is noted in 'source' as also being; "
                             "default: PopQA 500, SR-RAG's PopQA 200 and SR-RAG's policy")
    parser.add_argument("--out-questions", type=Path, required=True)
    parser.add_argument("--out-corpus", type=Path, required=True)
    parser.add_argument("--record", type=Path, required=True,
                        help="JSON: the population, its size, the draw, the files' SHA-256")
    args = parser.parse_args()

    rows = _jsonl(args.popqa)
    pool = population(rows)
    drawn = draw(pool, args.n, args.seed)
    overlaps = overlap_sets(args.overlap or list(DEFAULT_OVERLAPS))
    questions = [question_line(line, row, overlaps) for line, row in drawn]
    corpus = corpus_lines(drawn, _jsonl(args.distractors))
    _write_jsonl(args.out_questions, questions, ascii_only=False)
    _write_jsonl(args.out_corpus, corpus, ascii_only=True)

    def rel(path: Path) -> str:
        path = path.resolve()
        return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)

    def mix(rows_: list[dict[str, Any]]) -> dict[str, int]:
        return dict(sorted(Counter(str(r["prop"]) for r in rows_).items()))

    record = {
        "population": f"{POPULATION} ({rel(args.popqa)}: rows with a non-empty "
                      "'gold_paragraphs')",
        "population_size": len(pool),
        "population_groups": mix([r for _, r in pool]),
        "development_rows": len(rows),
        "draw": f"random.Random({args.seed}).sample(population in the file's order, "
                f"{args.n}); written in the order drawn",
        "seed": args.seed,
        "n": args.n,
        "sample_groups": mix([r for _, r in drawn]),
        "first_200_groups": mix([r for _, r in drawn[:200]]),
        "overlaps": {label: {"file": str(path),
                             "rows": sum(benchmark_id(r, line) in ids for line, r in drawn),
                             "of_population": sum(benchmark_id(r, line) in ids
                                                  for line, r in pool)}
                     for label, path, ids in overlaps},
        "ids": [q["id"] for q in questions],
        "corpus": {"gold_paragraphs": sum(c["id"].startswith("popqa-") for c in corpus),
                   "distractors": sum(c["id"].startswith("wiki-") for c in corpus),
                   "distractor_file": rel(args.distractors)},
        "sha256": {rel(p): _sha256(p) for p in
                   (args.popqa, args.distractors, args.out_questions, args.out_corpus)},
        "command": " ".join([
            "python benchmarks/make_calibration_sample.py", f"--n {args.n} --seed {args.seed}",
            f"--out-questions {rel(args.out_questions)}",
            f"--out-corpus {rel(args.out_corpus)}", f"--record {rel(args.record)}"]),
    }
    args.record.parent.mkdir(parents=True, exist_ok=True)
    args.record.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    summary = {k: v for k, v in record.items() if k not in ("ids", "sha256")}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
