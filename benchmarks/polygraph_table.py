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
    parser.add_argument("--polygraph", type=Path, required=True)
    parser.add_argument("--records", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    poly = {}
    for line in args.polygraph.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            poly[row["id"]] = row
    records = {r.id: r for r in read_records(args.records)}
    ids = [i for i in poly if i in records]
    agree = sum(poly[i]["closed_book_answer"] == records[i].closed_book_answer for i in ids)
    label_agree = sum(poly[i]["closed_book_correct"] == records[i].closed_book_correct
                      for i in ids)
    ours = sorted({k for i in ids for k in records[i].scores})
    estimators = sorted({k for i in ids for k in poly[i]["scores"]})
    import numpy as np

    wrong = np.array([0.0 if records[i].closed_book_correct else 1.0 for i in ids])
    rows: list[dict[str, Any]] = []

    def score_of(i: str, name: str, ours_row: bool) -> float | None:
        value = records[i].scores.get(name) if ours_row else poly[i]["scores"].get(name)
        if value is None or value == "nan":
            return None
        value = float(value)
        return value if math.isfinite(value) else None

    for name, is_ours in [(g, True) for g in ours] + [(e, False) for e in estimators]:
        values = [score_of(i, name, is_ours) for i in ids]
        scores = np.array([math.nan if v is None else v for v in values])
        row: dict[str, Any] = {"gate": name, "kind": "rag-gates" if is_ours else "lm-polygraph",
                               "auroc": _auroc(scores, wrong),
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
        if not is_ours:
            secs = [poly[i]["seconds"].get(name) for i in ids]
            row["median_seconds"] = statistics.median(s for s in secs if s is not None)
        rows.append(row)
        print(json.dumps({k: row[k] for k in row if k != "kind"}), flush=True)
    write_text_atomic(args.out, json.dumps({
        "command": "python benchmarks/polygraph_table.py " + " ".join(
            sys.argv[1:] if argv is None else argv),
        "questions": len(ids), "closed_book_answers_identical": agree,
        "closed_book_labels_identical": label_agree,
        "closed_book_accuracy": float(1 - wrong.mean()),
        "retrieved_accuracy": float(np.mean([records[i].retrieved_correct for i in ids])),
        "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
