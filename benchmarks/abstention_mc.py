"""Does a certified three-way policy keep both promises? A Monte-Carlo over labelled records
(issue 59, item 1: ``rag-gates calibrate --abstain``).

    .venv/bin/python benchmarks/abstention_mc.py --draws 200 \\
        --records popqa-sample=benchmarks/results/calibrate/abstain-300/work/records.jsonl \\
        --out benchmarks/results/abstention_mc.json

Each pool of labelled records (every gate's recorded score, the with-passages score, closed-book
and with-retrieval correctness; no model runs) is treated as the population. For each draw,
``n_cal`` records are drawn from it without replacement; :func:`calibrate_abstention` certifies
a skip threshold and an abstention threshold on them; the pair is judged on the whole pool:

* the accuracy drop of the skips against always retrieving (promise 1: <= epsilon);
* the share of questions answered wrongly (promise 2: <= alpha).

A draw *violates* when either exceeds its bound; the rate must stay at or below delta (each
gate is certified at delta / gates, as ``calibrate --abstain`` does, so the best gate keeps
it). Also reported: the shares answered closed book, answered from the passages and abstained
on, the error among answered questions, and the two baselines on the pool (always retrieve and
answer; the plain certificate's skips without abstention).

Pools: ``synthetic`` (a population of 40,000 like the unit test's: a gate score that predicts a
wrong closed-book answer, a with-passages score that predicts a wrong answer with retrieval),
and every ``--records NAME=PATH`` (records written by ``rag-gates calibrate`` since it records
``retrieved_scores``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from rag_gates._io import write_text_atomic
from rag_gates.calibration import (
    CalibrationRecord,
    ModelIdentity,
    calibrate_abstention,
    read_records,
)
from rag_gates.calibration.abstain import PASSAGE_SCORE, policy_outcomes
from rag_gates.calibration.bounds import clopper_pearson

MODEL = ModelIdentity(name="monte-carlo", fingerprint="0" * 64)


def synthetic_pool(n: int, seed: int) -> list[CalibrationRecord]:
    rng = np.random.default_rng(seed)
    s1, s2 = rng.random(n), rng.random(n)
    closed = rng.random(n) < 0.9 * (1 - s1) ** 2
    retrieved = (closed | (rng.random(n) < 0.85 * (1 - s2))) & ~(rng.random(n) < 0.03)
    return [CalibrationRecord(
        id=f"s{i}", question=f"Question {i}?", closed_book_correct=bool(closed[i]),
        retrieved_correct=bool(retrieved[i]), scores={"good": float(s1[i])},
        retrieved_scores={PASSAGE_SCORE: float(s2[i])}) for i in range(n)]


def _array(records: list[CalibrationRecord], gate: str | None) -> np.ndarray:
    values = [(r.scores.get(gate) if gate is not None else r.retrieved_scores.get(PASSAGE_SCORE))
              for r in records]
    return np.array([math.nan if v is None else float(v) for v in values])


def judge(records: list[CalibrationRecord], gate: str, t1: float | None,
          t2: float | None) -> dict[str, float]:
    s1, s2 = _array(records, gate), _array(records, None)
    closed = np.array([r.closed_book_correct for r in records])
    retrieved = np.array([r.retrieved_correct for r in records])
    out = policy_outcomes(s1, s2, t1, t2, closed, retrieved)
    loss = retrieved.astype(int) - closed.astype(int)
    answered = ~out["abstained"]
    return {"drop": float(np.mean(out["skipped"] * loss)),
            "error": float(out["wrong"].mean()),
            "skipped": float(out["skipped"].mean()),
            "answered_retrieved": float(out["answered_retrieved"].mean()),
            "abstained": float(out["abstained"].mean()),
            "answered_error": float(out["wrong"].sum() / answered.sum()) if answered.any()
            else math.nan,
            "accuracy": float(out["right"].mean())}


def run_pool(name: str, pool: list[CalibrationRecord], *, draws: int, n_cals: list[int],
             epsilon: float, alphas: list[float], delta: float, bound: str,
             seed: int) -> list[dict[str, Any]]:
    rows = []
    retrieved_error = 1 - float(np.mean([r.retrieved_correct for r in pool]))
    for n_cal in n_cals:
        if n_cal > len(pool):
            continue
        for alpha in alphas:
            rng = np.random.default_rng([seed, n_cal, int(alpha * 1000)])
            judged: list[dict[str, float]] = []
            gates: dict[str, int] = {}
            started = time.perf_counter()
            for d in range(draws):
                pick = rng.choice(len(pool), size=n_cal, replace=False)
                sample = [pool[i] for i in pick]
                report = calibrate_abstention(sample, max_loss=epsilon, max_error=alpha,
                                              delta=delta, bound=bound,  # type: ignore[arg-type]
                                              model=MODEL, retriever=name, seed=d)
                spec = report.best
                assert spec.abstain is not None
                gates[spec.gate] = gates.get(spec.gate, 0) + 1
                judged.append(judge(pool, spec.gate, spec.threshold, spec.abstain.threshold))
            seconds = time.perf_counter() - started
            drop_v = sum(j["drop"] > epsilon for j in judged)
            error_v = sum(j["error"] > alpha for j in judged)
            either = sum(j["drop"] > epsilon or j["error"] > alpha for j in judged)
            lo, hi = clopper_pearson(either, draws, 0.95)

            def mean(key: str, judged: list[dict[str, float]] = judged) -> float:
                values = [j[key] for j in judged if not math.isnan(j[key])]
                return float(np.mean(values)) if values else math.nan

            rows.append({
                "pool": name, "pool_size": len(pool), "n_cal": n_cal, "epsilon": epsilon,
                "alpha": alpha, "delta": delta, "bound": bound, "draws": draws,
                "violation_rate": either / draws, "violation_ci95": [lo, hi],
                "drop_violations": drop_v / draws, "error_violations": error_v / draws,
                "mean_skipped": mean("skipped"),
                "mean_answered_retrieved": mean("answered_retrieved"),
                "mean_abstained": mean("abstained"), "mean_error": mean("error"),
                "mean_answered_error": mean("answered_error"),
                "mean_accuracy": mean("accuracy"),
                "baseline_always_retrieve_error": retrieved_error,
                "gates_picked": gates, "seconds_per_draw": seconds / draws})
            print(json.dumps({k: rows[-1][k] for k in (
                "pool", "n_cal", "alpha", "violation_rate", "mean_skipped", "mean_abstained",
                "mean_error", "mean_answered_error")}), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", action="append", default=[],
                        help="NAME=PATH of records with the with-passages score.")
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--n-cal", type=int, action="append", default=None)
    parser.add_argument("--epsilon", type=float, default=0.05)
    parser.add_argument("--alpha", type=float, action="append", default=None)
    parser.add_argument("--delta", type=float, default=0.1)
    parser.add_argument("--bound", default="exact")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-synthetic", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/abstention_mc.json"))
    args = parser.parse_args(argv)
    pools: dict[str, list[CalibrationRecord]] = {}
    if not args.no_synthetic:
        pools["synthetic"] = synthetic_pool(40_000, seed=1)
    for item in args.records:
        name, _, path = item.partition("=")
        pools[name] = [r for r in read_records(path) if r.labels == "gold"]
    rows = []
    for name, pool in pools.items():
        rows += run_pool(name, pool, draws=args.draws, n_cals=args.n_cal or [100, 200],
                         epsilon=args.epsilon, alphas=args.alpha or [0.2, 0.3, 0.5],
                         delta=args.delta, bound=args.bound, seed=args.seed)
    write_text_atomic(args.out, json.dumps({
        "command": "python benchmarks/abstention_mc.py " + " ".join(
            sys.argv[1:] if argv is None else argv),
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
