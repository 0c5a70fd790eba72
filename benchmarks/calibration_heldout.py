"""Judge each gate `rag-gates calibrate` certified on questions it never saw.

`rag-gates calibrate --limit N` certifies on the first N questions of ``--data``; the work
directory may hold records of later questions too (kept, unused). This script applies every
row of the certification table (its threshold; the composites with their fitted weights,
band and pair) to those later questions and reports the skip rate and the accuracy drop
against always retrieving there, next to what the table promised (the certified skip rate:
the lower end of its interval; the drop: at most epsilon, with probability 1 - delta over
the draw of the certification questions). One held-out set is one draw: a drop above
epsilon here is not by itself a broken guarantee, but a drop far above it would be worth a
look.

    python benchmarks/calibration_heldout.py benchmarks/results/calibrate/sample-200 \\
        --data examples/data/calibration_questions.jsonl \\
        --out benchmarks/results/calibrate/sample-200/heldout.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from rag_gates.calibration import read_records
from rag_gates.calibration.calibrate import _weighted_scores, cascade_scores
from rag_gates.calibration.spec import CascadeFit, WeightedFit


def judge(run: Path, data: Path) -> dict[str, object]:
    report = json.loads((run / "work" / "report.json").read_text())
    records = {r.id: r for r in read_records(run / "work" / "records.jsonl")}
    ids = [json.loads(line).get("id") for line in data.read_text().splitlines() if line.strip()]
    used = report["questions"]
    later = [records[i] for i in ids[used:] if i in records]
    if not later:
        raise SystemExit(f"{run}/work holds no records beyond the first {used} questions")
    composite = report.get("composite")
    rows = []
    for row in report["rows"]:
        if row["threshold"] is None:
            continue
        if composite and row["gate"] == report.get("composite_name"):
            # The served Weighted gate's arithmetic, as calibration scored it.
            fit = WeightedFit(**composite)
            scores = list(_weighted_scores(fit, np.array(
                [[r.scores[g] for r in later] for g in fit.gates], dtype=np.float64)))
        elif report.get("cascade") and row["gate"] == report.get("cascade_name"):
            cascade = CascadeFit(**report["cascade"])
            scores = list(cascade_scores(
                cascade, np.array([r.scores[cascade.cheap.gates[0]] for r in later]),
                np.array([r.scores[cascade.expensive.gates[0]] for r in later])))
        else:
            scores = [r.scores[row["gate"]] for r in later]
        # A gate retrieves when its score >= threshold: a lower score skips.
        skipped = [s < row["threshold"] for s in scores]
        drop = sum(int(r.retrieved_correct) - int(r.closed_book_correct)
                   for r, skip in zip(later, skipped, strict=True) if skip) / len(later)
        rows.append({"gate": row["gate"], "threshold": row["threshold"],
                     "certified_skip_rate": row["skip_rate"]["lower"],
                     "certification_skip_rate": row["skip_rate"]["observed"],
                     "heldout_skip_rate": sum(skipped) / len(later),
                     "heldout_drop": drop, "epsilon": report["epsilon"]})
    return {"run": str(run), "certification_questions": used, "heldout_questions": len(later),
            "always_retrieve_accuracy": sum(r.retrieved_correct for r in later) / len(later),
            "closed_book_accuracy": sum(r.closed_book_correct for r in later) / len(later),
            "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="the calibrate output folder (holding work/)")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = judge(args.run, args.data)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
