"""Calibration without gold answers against calibration with them, on the same questions
(issue 60), from committed runs: no model is run.

Each committed benchmark run holds, per question, the closed-book answer (`no-rag`) and the
answer with retrieval (`single`) of the embedded SmolLM2, with their gold-answer checks; each
committed `eval-gate` run holds a gate's score per question. From them, per data set:

- the labelled records (the gold checks) and the label-free records of each same-answer
  judge (`exact`; `f1:0.8`, `f1:0.5`): a skip counts as a harm when the two replies are not
  the same answer;
- each judge's false-agreement rate: the share of questions whose two replies differ in
  correctness (one right, one wrong) but which the judge calls the same answer (of all
  questions, and of those whose correctness differs);
- per gate, the certified skip rate at epsilon 0.05 and 0.1 (delta 0.1, exact bound) with
  labels and without (each judge);
- the Monte-Carlo violation rate of the label-free certificate judged with the true labels,
  the pool as the population (calibration_mc.py's protocol): draw `--n-cal` questions with
  replacement, certify without labels, and count a violation when the threshold's true
  accuracy drop on the whole pool exceeds epsilon. For the exact judge it must be at most
  delta.

    python benchmarks/calibration_no_labels.py --out benchmarks/results/calibration_no_labels.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from rag_gates.answers import accuracy
from rag_gates.calibration import (
    CalibrationError,
    CalibrationRecord,
    ModelIdentity,
    calibrate,
    parse_same_answer,
    read_records,
)

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "benchmarks" / "results" / "eval"
SETS = {  # data set -> (the run with no-rag and single, its gates' eval-gate runs)
    "popqa": ("popqa-500", ["answer-logprob", "first-token-prob", "cbdr", "quco"]),
    "hotpotqa": ("hotpotqa-200", ["answer-logprob", "first-token-prob", "cbdr", "quco"]),
    "2wiki": ("2wiki-200", ["quco"]),
}
JUDGES = ["exact", "f1:0.8", "f1:0.5"]
MODEL = ModelIdentity(name="SmolLM2-135M-Instruct (committed runs)", fingerprint="0" * 64)


def _pairs(run: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for line in (EVAL / run / "results.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["method"] in ("no-rag", "single"):
            out.setdefault(row["id"], {"question": row["question"],
                                       "answers": row["answers"]})[row["method"]] = row
    return {k: v for k, v in out.items() if "no-rag" in v and "single" in v}


def _scores(dataset: str, gates: list[str]) -> dict[str, dict[str, float | None]]:
    scores: dict[str, dict[str, float | None]] = {}
    for gate in gates:
        for line in (EVAL / f"gate-{gate}-{dataset}" / "decisions.jsonl").read_text(
        ).splitlines():
            d = json.loads(line)
            undecided = "undecided" in d.get("evidence", {})
            scores.setdefault(d["id"], {})[gate] = None if undecided else float(d["score"])
    return scores


def _from_bench(dataset: str) -> tuple[list[CalibrationRecord], list[str]]:
    run, gates = SETS[dataset]
    pairs, scores = _pairs(run), _scores(dataset, gates)
    ids = [i for i in pairs if i in scores and len(scores[i]) == len(gates)]
    gold = []
    for i in ids:
        p = pairs[i]
        gold.append(CalibrationRecord(
            id=i, question=p["question"], scores=scores[i],
            # the answer check the bench ran (containment accuracy), recomputed here
            closed_book_correct=accuracy(p["no-rag"]["prediction"], p["answers"]) > 0,
            retrieved_correct=accuracy(p["single"]["prediction"], p["answers"]) > 0,
            closed_book_answer=p["no-rag"]["prediction"],
            retrieved_answer=p["single"]["prediction"]))
    return gold, gates


def _from_calibrate(path: Path) -> tuple[list[CalibrationRecord], list[str]]:
    """The records a ``rag-gates calibrate`` work directory holds (both replies kept)."""
    gold = read_records(path)
    missing = [r.id for r in gold if r.retrieved_answer is None]
    if missing:
        raise SystemExit(f"{path}: {len(missing)} records keep no reply with retrieval "
                         "(written before records kept it): calibrate again into a new "
                         "--work-dir")
    return gold, sorted({g for r in gold for g in r.scores})


def records_for(dataset: str, calibrate_records: dict[str, Path]) -> tuple[
        list[CalibrationRecord], dict[str, list[CalibrationRecord]], list[str]]:
    gold, gates = (_from_calibrate(calibrate_records[dataset]) if dataset in calibrate_records
                   else _from_bench(dataset))
    free = {name: [CalibrationRecord.from_agreement(
        id=r.id, question=r.question, closed_book_answer=r.closed_book_answer or "",
        retrieved_answer=r.retrieved_answer or "", judge=parse_same_answer(name),
        scores=r.scores) for r in gold] for name in JUDGES}
    return gold, free, gates


def _certified(records: list[CalibrationRecord], gate: str, eps: float,
               delta: float) -> tuple[float | None, float]:
    try:
        spec = calibrate(records, max_loss=eps, delta=delta, bound="exact", model=MODEL,
                         retriever="committed runs", gates=[gate], composite=False,
                         family_wise=False).spec_for(gate)
    except CalibrationError:  # one class only (e.g. every pair of replies differs): none
        return None, 0.0
    return spec.threshold, (spec.skip_rate.lower if spec.certified else 0.0)


def _true_drop(gold: list[CalibrationRecord], gate: str, threshold: float | None) -> float:
    if threshold is None:
        return 0.0
    loss = [r.signed_loss_if_skipped for r in gold
            if r.scores[gate] is not None and r.scores[gate] < threshold]  # type: ignore[operator]
    return float(sum(loss)) / len(gold)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--n-cal", type=int, default=200)
    parser.add_argument("--delta", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calibrate-records", action="append", default=[],
                        metavar="NAME=PATH", help="Also a rag-gates calibrate work directory's "
                        "records.jsonl (gold labels and both replies kept), as data set NAME.")
    args = parser.parse_args(argv)
    extra = dict(item.split("=", 1) for item in args.calibrate_records)
    calibrate_records = {name: Path(path) for name, path in extra.items()}
    rng = np.random.default_rng(args.seed)
    result: dict[str, Any] = {"command": "python benchmarks/calibration_no_labels.py --out "
                              f"{args.out} --draws {args.draws} --n-cal {args.n_cal}" + "".join(
                                  f" --calibrate-records {c}" for c in args.calibrate_records),
                              "delta": args.delta, "sets": {}}
    for dataset in [*SETS, *calibrate_records]:
        gold, free, gates = records_for(dataset, calibrate_records)
        differ = [r.closed_book_correct != r.retrieved_correct for r in gold]
        entry: dict[str, Any] = {"questions": len(gold), "correctness_differs": sum(differ),
                                 "judges": {}, "gates": {}}
        for name, recs in free.items():
            false_agree = sum(d and r.closed_book_correct for d, r in zip(differ, recs,
                                                                          strict=True))
            entry["judges"][name] = {
                "disagree": sum(not r.closed_book_correct for r in recs),
                "false_agreement": false_agree,
                "false_agreement_rate": false_agree / len(gold),
                "false_agreement_of_differing": false_agree / max(1, sum(differ))}
        for gate in gates:
            row: dict[str, Any] = {}
            for eps in (0.05, 0.1):
                cell: dict[str, Any] = {"labelled": _certified(gold, gate, eps, args.delta)[1]}
                for name, recs in free.items():
                    threshold, skip = _certified(recs, gate, eps, args.delta)
                    violations = 0
                    for _ in range(args.draws):
                        pick = rng.integers(0, len(recs), size=args.n_cal)
                        draw = [recs[i].model_copy(update={"id": f"d{j}"})
                                for j, i in enumerate(pick)]
                        t, _ = _certified(draw, gate, eps, args.delta)
                        violations += _true_drop(gold, gate, t) > eps
                    cell[name] = {"certified_skip": skip,
                                  "true_drop_at_threshold": _true_drop(gold, gate, threshold),
                                  "mc_violation_rate": violations / args.draws}
                row[f"eps={eps:g}"] = cell
            entry["gates"][gate] = row
        result["sets"][dataset] = entry
        print(dataset, json.dumps(entry["judges"]), flush=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
