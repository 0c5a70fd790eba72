"""The estimator table (issue 57, item 2): LM-Polygraph's estimators beside our gates on the
same questions, the same model and the same labels.

    .venv/bin/python benchmarks/polygraph_table.py \\
        --polygraph benchmarks/results/polygraph/popqa-calibration.jsonl \\
        --records benchmarks/results/calibrate/uniform-300/work/records.jsonl \\
        --out benchmarks/results/polygraph/table.json

Joins the LM-Polygraph run (``benchmarks/polygraph_gates.py``: each estimator's uncertainty
and its seconds per decision) with ``rag-gates calibrate``'s records of the same questions
(our gates' scores, the closed-book and with-retrieval labels) by question id, on the
questions both hold. Per gate or estimator: the AUROC for "closed-book answer wrong" (a
non-finite score ranks as most uncertain) and the certified skip rate at epsilon 0.05 and
0.02 (delta 0.1, :func:`rag_gates.calibration.calibrate` on that score alone, exact bound,
no composite: each row's own certificate, not a family's), and the median seconds per decision.
The closed-book answers of the two runs are checked to agree (same model, prompt and budget).

``--llm-free FILE`` (repeatable) adds the rows of ``benchmarks/llm_free_gates.py`` (kind
``llm-free``: the top passage's similarity, the top BM25 score, entity popularity, QuCo's
entity counts; no model run), joined by question id like the LM-Polygraph rows; a name that
the records already score is left out (the records' row stands). ``--polygraph`` is optional,
so a data set without an LM-Polygraph run gets our gates beside the LLM-free rows.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from rag_gates._io import write_text_atomic
from rag_gates.calibration import CalibrationRecord, ModelIdentity, calibrate, read_records
from rag_gates.calibration.rows import _auroc

MODEL = ModelIdentity(name="SmolLM2-135M-Instruct", fingerprint="table")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--polygraph", type=Path, action="append", default=[],
                        help="benchmarks/polygraph_gates.py's JSONL (optional, repeatable: "
                             "runs of other estimators on the same questions are merged)")
    parser.add_argument("--ours", type=Path, action="append", default=[],
                        help="a JSONL of our gates scored outside calibrate (e.g. "
                             "benchmarks/p_true_gates.py's; repeatable), with seconds")
    parser.add_argument("--records", type=Path, required=True)
    parser.add_argument("--llm-free", type=Path, action="append", default=[],
                        help="benchmarks/llm_free_gates.py's JSONL (repeatable)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    poly = merge_runs(args.polygraph)
    extra_ours = merge_runs(args.ours)
    free: dict[str, dict[str, Any]] = {}
    for path in args.llm_free:
        for i, extra in read_rows(path).items():
            merged = free.setdefault(i, {"scores": {}, "seconds": {}})
            merged["scores"].update(extra["scores"])
            merged["seconds"].update(extra["seconds"])
    records = {r.id: r for r in read_records(args.records)}
    # The questions every source holds, in the polygraph file's order (else the records').
    ids = [i for i in (poly or records) if i in records and (not poly or i in poly)
           and (not free or i in free) and (not extra_ours or i in extra_ours)]
    ours_agree = sum(extra_ours[i]["closed_book_answer"] == records[i].closed_book_answer
                     for i in ids) if extra_ours else 0
    agree = sum(poly[i]["closed_book_answer"] == records[i].closed_book_answer
                for i in ids) if poly else 0
    label_agree = sum(poly[i]["closed_book_correct"] == records[i].closed_book_correct
                      for i in ids) if poly else 0
    ours = sorted({k for i in ids for k in records[i].scores})
    measured = sorted({k for i in ids for k in extra_ours[i]["scores"]}) if extra_ours else []
    estimators = sorted({k for i in ids for k in poly[i]["scores"]}) if poly else []
    llm_free = sorted({k for i in ids for k in free[i]["scores"]}) if free else []
    left_out = [k for k in llm_free if k in ours]
    llm_free = [k for k in llm_free if k not in ours]
    import numpy as np

    wrong = np.array([0.0 if records[i].closed_book_correct else 1.0 for i in ids])
    rows: list[dict[str, Any]] = []
    sources = {"rag-gates": {i: {"scores": records[i].scores} for i in ids},
               "rag-gates (timed)": extra_ours, "lm-polygraph": poly, "llm-free": free}

    def score_of(i: str, name: str, kind: str) -> float | None:
        value = sources[kind][i]["scores"].get(name)
        if value is None or value == "nan":
            return None
        value = float(value)
        return value if math.isfinite(value) else None

    for name, kind in ([(g, "rag-gates") for g in ours]
                       + [(g, "rag-gates (timed)") for g in measured]
                       + [(e, "lm-polygraph") for e in estimators]
                       + [(f, "llm-free") for f in llm_free]):
        values = [score_of(i, name, kind) for i in ids]
        scores = np.array([math.nan if v is None else v for v in values])
        row: dict[str, Any] = {"gate": name, "kind": kind, "auroc": _auroc(scores, wrong),
                               "unscored": int(np.isnan(scores).sum())}
        recs = [CalibrationRecord(id=i, question=records[i].question,
                                  closed_book_correct=records[i].closed_book_correct,
                                  retrieved_correct=records[i].retrieved_correct,
                                  scores={name: v}) for i, v in zip(ids, values, strict=True)]
        for eps in (0.05, 0.02):
            report = calibrate(recs, max_loss=eps, delta=0.1, bound="exact", model=MODEL,
                               retriever="the calibration corpus, bm25, k=3", gates=[name],
                               composite=False)
            r = report.row(name)
            row[f"certified_skip_{eps}"] = r.certified_skip_rate
            row[f"observed_skip_{eps}"] = r.observed_skip_rate if r.certified else 0.0
        if kind != "rag-gates":
            secs = [sources[kind][i]["seconds"].get(name) for i in ids]
            row["median_seconds"] = statistics.median(s for s in secs if s is not None)
        rows.append(row)
        print(json.dumps({k: row[k] for k in row if k != "kind"}), flush=True)
    write_text_atomic(args.out, json.dumps({
        "command": "python benchmarks/polygraph_table.py " + " ".join(
            sys.argv[1:] if argv is None else argv),
        "questions": len(ids),
        **({"closed_book_answers_identical": agree, "closed_book_labels_identical": label_agree}
           if poly else {}),
        **({"timed_gates_closed_book_answers_identical": ours_agree} if extra_ours else {}),
        **({"llm_free_left_out": left_out} if left_out else {}),
        "closed_book_accuracy": float(1 - wrong.mean()),
        "retrieved_accuracy": float(np.mean([records[i].retrieved_correct for i in ids])),
        "rows": rows}, indent=2) + "\n")


def merge_runs(paths: list[Path]) -> dict[str, dict[str, Any]]:
    """Per-question rows of several runs on the same questions, their ``scores`` and
    ``seconds`` merged by id (questions every run holds); runs whose closed-book answers
    differ on a question are refused (they would not score the same answer)."""
    merged: dict[str, dict[str, Any]] = {}
    for k, path in enumerate(paths):
        rows = read_rows(path)
        if k == 0:
            merged = {i: {**row, "scores": dict(row["scores"]),
                          "seconds": dict(row["seconds"])} for i, row in rows.items()}
            continue
        merged = {i: row for i, row in merged.items() if i in rows}
        for i, row in merged.items():
            other = rows[i]
            if other.get("closed_book_answer") != row.get("closed_book_answer"):
                raise SystemExit(f"{path}: question {i} has another closed-book answer than "
                                 f"{paths[0]}: not the same run settings")
            row["scores"].update(other["scores"])
            row["seconds"].update(other["seconds"])
    return merged


def read_rows(path: Path) -> dict[str, dict[str, Any]]:
    """A JSONL of per-question rows (``id``, ``scores``, ``seconds``) by id."""
    rows = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row["id"]] = row
    return rows


if __name__ == "__main__":
    main()
