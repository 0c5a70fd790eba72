"""The watching certificate (issue 59, item 2), measured from committed records: calibrate on
one PopQA relation, serve another (drift) or the same (no drift), and count how many
questions the watch needs to raise its alarm, how often it alarms without a drift, and what
its shadow checks cost. No model is run.

    .venv/bin/python benchmarks/calibration_watch.py --runs 500 \\
        --out benchmarks/results/calibration_watch.json

Pools (each question: three gates' recorded scores, the embedded SmolLM2's closed-book and
single-retrieval replies, their gold checks, and its PopQA relation, `prop` of the PopQA dev
row it came from, /work/shared/data/popqa_dev.jsonl, or the question's template when that
file is absent; both agree on every row):

* ``popqa-500``: benchmarks/results/eval/popqa-500 (no-rag and single) with the gates'
  eval-gate runs (gate-*-popqa): 310 occupation, 190 place-of-birth questions;
* ``sample-300``: the records ``rag-gates calibrate`` wrote on the shipped sample
  (benchmarks/results/calibrate/sample-300/work/records.jsonl): 111 / 189.

Protocol, per pool, gate (answer-logprob, first-token-prob, cbdr), direction (calibrate on
relation A, drift to B) and arm, ``--runs`` times: draw |A| questions of A with replacement
(A's questions are the population), certify with :func:`rag_gates.calibration.calibrate`
(exact bound, one gate, epsilon 0.05, delta 0.1), then serve a stream drawn with replacement
from a mixture: a share ``w`` of B's questions (w = 0: no drift) and ``1 - w`` of A's. The
watch samples each question with probability ``s`` (the shadow share); on a sampled
question ``x = 1`` when the gate skips it and its two replies differ under the watch's judge.
Its test is :func:`rag_gates.calibration.watch.capital_path` (the e-process a
:class:`~rag_gates.calibration.watch.WatchedGate` keeps; tests/calibration/test_watch.py
holds the two equal step by step), alarm at e-value ``1 / 0.1``, over a horizon of
``--horizon`` questions. The sampled questions are a uniform subsample, so the stream of
observations does not depend on ``s``; the question at which the j-th observation arrives is
``j`` plus a negative binomial ``NB(j, s)`` draw.

Arms (the certificate, and what the watch tests):

* ``label-free exact`` / ``label-free f1:0.5``: certified without labels with that judge,
  watched with the same judge at the spec's epsilon (H0 is what was certified);
* ``labelled, epsilon``: certified with gold labels, watched with ``exact`` at the spec's
  epsilon (H0: skipped-and-differing questions <= epsilon, stricter than the certificate);
* ``labelled, baseline``: the same certificate watched at
  :func:`rag_gates.calibration.watch.disagreement_baseline` of its calibration draw (an
  upper bound on the calibration share of skipped-and-differing questions): a drift test.

Per cell: the share of runs that certified a threshold; at each ``w`` the true rate of
skipped-and-differing questions on the served mixture and the true accuracy drop (gold),
averaged over the certified runs; at each ``s`` the share of runs that alarmed within the
horizon, the median and 90th-percentile questions until the alarm, and the false-alarm rate
(alarms among runs whose served rate is at most the watch's epsilon: H0 true). A synthetic
section runs the same test on Bernoulli streams at rate ``q = epsilon * ratio`` (ratio 1 is
H0's worst case). Cost: shadow checks per 100 questions (``100 s`` times the served skip
share), each one retrieval and one generation with passages, plus a closed-book generation
unless the gate generated it (answer-logprob does: rag_gates.answer_once); seconds from the
mean wall time of popqa-500's no-rag and single rows on this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibration_no_labels import records_for  # a sibling benchmark

from rag_gates.calibration import (
    CalibrationError,
    CalibrationRecord,
    ModelIdentity,
    calibrate,
    parse_same_answer,
)
from rag_gates.calibration.watch import capital_path, disagreement_baseline

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "benchmarks" / "results" / "calibrate" / "sample-300" / "work" / "records.jsonl"
POPQA_DEV = Path("/work/shared/data/popqa_dev.jsonl")
EVAL = ROOT / "benchmarks" / "results" / "eval" / "popqa-500" / "results.jsonl"
GATES = ("answer-logprob", "first-token-prob", "cbdr")
RELATIONS = ("occupation", "place of birth")
EPSILON, DELTA, ALARM_DELTA = 0.05, 0.1, 0.1
SHARES = (0.01, 0.05, 0.1)
MIXES = (0.0, 0.25, 0.5, 1.0)
RATIOS = (1.0, 1.5, 2.0, 3.0, 5.0)
MODEL = ModelIdentity(name="SmolLM2-135M-Instruct (committed runs)", fingerprint="0" * 64)
CHUNK = 250


def relations(records: list[CalibrationRecord]) -> dict[str, str]:
    """Each question's PopQA relation: the dev row's ``prop`` (or the relation its template
    was read as) when the PopQA data is here, checked against the question's template."""
    template = {r.id: "place of birth" if " born" in r.question else "occupation"
                for r in records}
    if not POPQA_DEV.is_file():
        return template
    rows = {}
    for line in POPQA_DEV.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        prop = row.get("prop") or row.get("prop_inferred_from_template")
        rows[f"popqa-{row['popqa_row_index']}"] = prop  # the benchmarks' id without one
        if row.get("id") is not None:
            rows[str(row["id"])] = prop
    out = {r.id: rows[r.id] for r in records}
    wrong = [i for i in out if out[i] != template[i]]
    if wrong:
        raise SystemExit(f"relation and template disagree on {len(wrong)} rows, e.g. {wrong[0]}")
    return out


def first_crossing(x: NDArray[np.float64], epsilon: float, alpha: float) -> NDArray[np.int64]:
    """Per row of ``x`` (runs, observations): the 1-based observation at which the capital
    first reaches ``1/alpha``, 0 if never (computed in chunks of runs)."""
    out = np.zeros(x.shape[0], dtype=np.int64)
    level = math.log(1.0 / alpha)
    for start in range(0, x.shape[0], CHUNK):
        hit = capital_path(x[start:start + CHUNK], epsilon, alpha) >= level
        any_hit = hit.any(axis=1)
        out[start:start + CHUNK] = np.where(any_hit, hit.argmax(axis=1) + 1, 0)
    return out


def delays(first: NDArray[np.int64], share: float, horizon: int,
           rng: np.random.Generator) -> NDArray[np.float64]:
    """The question at which each run's alarming observation arrives (NaN: none within the
    horizon): observation j arrives at question j + NB(j, share)."""
    out = np.full(first.shape, np.nan)
    fired = first > 0
    out[fired] = first[fired] + rng.negative_binomial(first[fired], share)
    out[out > horizon] = np.nan
    return out


def summarise(delay: NDArray[np.float64], h0: NDArray[np.bool_]) -> dict[str, Any]:
    fired = ~np.isnan(delay)
    return {"alarm_rate": float(fired.mean()) if delay.size else None,
            "median_questions": float(np.median(delay[fired])) if fired.any() else None,
            "p90_questions": float(np.percentile(delay[fired], 90)) if fired.any() else None,
            "runs_h0_true": int(h0.sum()),
            "false_alarm_rate": float(fired[h0].mean()) if h0.any() else None}


def certify_runs(pool: list[CalibrationRecord], gold: list[CalibrationRecord], rows_a: list[int],
                 gate: str, runs: int, rng: np.random.Generator, baseline: bool
                 ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Thresholds (NaN: none certified) of ``runs`` bootstrap draws of A, and with
    ``baseline`` each draw's disagreement baseline (exact judge; NaN when none)."""
    thresholds = np.full(runs, np.nan)
    bases = np.full(runs, np.nan)
    for r in range(runs):
        pick = [rows_a[i] for i in rng.integers(0, len(rows_a), size=len(rows_a))]
        draw = [pool[i].model_copy(update={"id": f"d{j}"}) for j, i in enumerate(pick)]
        try:
            spec = calibrate(draw, max_loss=EPSILON, delta=DELTA, bound="exact", model=MODEL,
                             retriever="committed runs", gates=[gate], composite=False,
                             family_wise=False).spec_for(gate)
        except CalibrationError:  # one class (e.g. every pair of replies differs): none
            continue
        if spec.threshold is None:
            continue
        thresholds[r] = spec.threshold
        if baseline:
            with contextlib.suppress(ValueError):  # a bound >= 1: nothing to watch
                bases[r] = disagreement_baseline([gold[i] for i in pick], spec, judge="exact",
                                                 delta=DELTA)
    return thresholds, bases


def run_cell(score: NDArray[np.float64], differ: NDArray[np.bool_], loss: NDArray[np.float64],
             rows_a: list[int], rows_b: list[int], thresholds: NDArray[np.float64],
             epsilons: NDArray[np.float64], args: argparse.Namespace,
             rng: np.random.Generator, reused: bool, seconds: dict[str, float]
             ) -> dict[str, Any]:
    ok = ~np.isnan(thresholds) & ~np.isnan(epsilons)
    th, eps = thresholds[ok], epsilons[ok]
    cell: dict[str, Any] = {"runs": int(thresholds.size), "certified_runs": int(ok.sum()),
                            "watch_epsilon_mean": float(eps.mean()) if ok.any() else None,
                            "mixes": {}}
    if not ok.any():
        return cell
    skip = (score[None, :] < th[:, None]) & ~np.isnan(score)[None, :]   # (runs, pool)
    x_rows = (skip & differ[None, :]).astype(np.float64)
    a, b = np.array(rows_a), np.array(rows_b)
    n_max = int(args.horizon * max(SHARES) + 8 * math.sqrt(args.horizon * max(SHARES)))
    for w in MIXES:
        q = (1 - w) * x_rows[:, a].mean(axis=1) + w * x_rows[:, b].mean(axis=1)
        skip_share = (1 - w) * skip[:, a].mean(axis=1) + w * skip[:, b].mean(axis=1)
        drop = ((1 - w) * (skip[:, a] * loss[a]).mean(axis=1)
                + w * (skip[:, b] * loss[b]).mean(axis=1))
        from_b = rng.random((th.size, n_max)) < w
        idx = np.where(from_b, b[rng.integers(0, b.size, (th.size, n_max))],
                       a[rng.integers(0, a.size, (th.size, n_max))])
        x = np.take_along_axis(x_rows, idx, axis=1)
        first = first_crossing_per_eps(x, eps)
        h0 = q <= eps
        checks = skip_share.mean()
        per_check_s = seconds["single"] + (0.0 if reused else seconds["no-rag"])
        entry: dict[str, Any] = {
            "served_rate_mean": float(q.mean()), "served_rate_max": float(q.max()),
            "served_skip_share": float(checks), "true_drop_mean": float(drop.mean()),
            "true_drop_above_epsilon_share": float((drop > EPSILON).mean()),
            "h0_true_share": float(h0.mean()), "shares": {}}
        for s in SHARES:
            stats = summarise(delays(first, s, args.horizon, rng), h0)
            per100 = 100 * s * checks
            stats["cost_per_100_questions"] = {
                "shadow_checks": per100, "retrievals": per100,
                "generations": per100 * (1 if reused else 2),
                "seconds": per100 * per_check_s}
            entry["shares"][f"{s:g}"] = stats
        cell["mixes"][f"{w:g}"] = entry
    return cell


def first_crossing_per_eps(x: NDArray[np.float64], eps: NDArray[np.float64]
                           ) -> NDArray[np.int64]:
    """:func:`first_crossing` where each run has its own epsilon (the baseline arm)."""
    if np.all(eps == eps[0]):
        return first_crossing(x, float(eps[0]), ALARM_DELTA)
    out = np.zeros(x.shape[0], dtype=np.int64)
    for value in np.unique(eps):
        rows = np.nonzero(eps == value)[0]
        out[rows] = first_crossing(x[rows], float(value), ALARM_DELTA)
    return out


def synthetic(args: argparse.Namespace, rng: np.random.Generator) -> dict[str, Any]:
    runs = args.synthetic_runs
    n_max = int(args.horizon * max(SHARES) + 8 * math.sqrt(args.horizon * max(SHARES)))
    out: dict[str, Any] = {"runs": runs, "epsilon": EPSILON, "alarm_delta": ALARM_DELTA,
                           "ratios": {}}
    for ratio in RATIOS:
        first = np.zeros(runs, dtype=np.int64)
        for start in range(0, runs, CHUNK):
            size = min(CHUNK, runs - start)
            x = (rng.random((size, n_max)) < EPSILON * ratio).astype(np.float64)
            first[start:start + size] = first_crossing(x, EPSILON, ALARM_DELTA)
        h0 = np.full(runs, ratio <= 1.0)
        out["ratios"][f"{ratio:g}"] = {
            "observations_median": float(np.median(first[first > 0])) if (first > 0).any()
            else None,
            "shares": {f"{s:g}": summarise(delays(first, s, args.horizon, rng), h0)
                       for s in SHARES}}
    return out


DRIFT_ROWS = (  # (pool, gate, calibrated on, arm): the cells docs/calibration.md shows
    ("popqa-500", "answer-logprob", "occupation", "label-free f1:0.5"),
    ("sample-300", "answer-logprob", "occupation", "label-free f1:0.5"),
    ("popqa-500", "cbdr", "occupation", "label-free f1:0.5"),
    ("popqa-500", "answer-logprob", "occupation", "labelled, baseline"),
    ("popqa-500", "cbdr", "occupation", "labelled, baseline"),
    ("popqa-500", "answer-logprob", "occupation", "labelled, epsilon"),
)
MIN_H0_RUNS = 50
"""A false-alarm rate over fewer runs whose served rate is at most epsilon is not shown."""


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def render(result: dict[str, Any]) -> str:
    """The markdown tables docs/calibration.md quotes."""
    shares = [f"{s:g}" for s in result["shares"]]
    head = " | ".join(f"s = {float(s) * 100:g}%: alarms, median (p90) questions"
                      for s in shares)
    lines = [f"Command: `{result['command']}` ({result['seconds']:.0f} s).", "",
             f"Synthetic streams (x ~ Bernoulli(ratio * epsilon), epsilon "
             f"{result['epsilon']:g}, alarm at e-value {1 / result['alarm_delta']:g}, "
             f"{result['synthetic']['runs']} runs, horizon {result['horizon_questions']:,} "
             "questions):", "", f"| ratio | {head} |", "|---|" + "---|" * len(shares)]
    for ratio, entry in result["synthetic"]["ratios"].items():
        cells = [f"{_pct(c['alarm_rate'])}, {_n(c['median_questions'])} "
                 f"({_n(c['p90_questions'])})" for c in entry["shares"].values()]
        lines.append(f"| {ratio} | " + " | ".join(cells) + " |")
    cells_by = {(pool, c["gate"], c["calibrated_on"], c["arm"]): c
                for pool, e in result["pools"].items() for c in e["cells"]}
    lines += ["", "Calibrated on one relation, served a mixture with a share w of the other "
              "(w = 0: no drift):", "",
              f"| pool | gate | certificate, watched at | certified runs | w | served rate "
              f"(true drop) | {head} |", "|---|---|---|---|---|---|" + "---|" * len(shares)]
    for key in DRIFT_ROWS:
        cell = cells_by[key]
        for w, mix in cell["mixes"].items():
            stats = [f"{_pct(x['alarm_rate'])}, {_n(x['median_questions'])} "
                     f"({_n(x['p90_questions'])})" for x in mix["shares"].values()]
            lines.append(f"| {key[0]} | {key[1]} | {key[3]} (epsilon "
                         f"{cell['watch_epsilon_mean']:.3f}) | {cell['certified_runs']} | {w} | "
                         f"{mix['served_rate_mean']:.3f} ({mix['true_drop_mean']:.3f}) | "
                         + " | ".join(stats) + " |")
    lines += ["", "No drift, every cell (2 pools x 3 gates x 2 directions), at s = 10% "
              "(the most observations):", "",
              "| arm | cells certified | runs with served rate <= epsilon (min) | alarm rate "
              "without drift (max) | false-alarm rate, H0 true (max) |", "|---|---|---|---|---|"]
    arms: dict[str, list[dict[str, Any]]] = {}
    for entry in result["pools"].values():
        for c in entry["cells"]:
            if c["certified_runs"]:
                arms.setdefault(c["arm"], []).append(c)
    top = shares[-1]
    for arm, cs in arms.items():
        calm = [c["mixes"]["0"] for c in cs]
        false = [m["shares"][top]["false_alarm_rate"] for m in calm
                 if m["shares"][top]["runs_h0_true"] >= MIN_H0_RUNS]
        lines.append(f"| {arm} | {len(cs)} | {_pct(min(m['h0_true_share'] for m in calm))} | "
                     f"{_pct(max(m['shares'][top]['alarm_rate'] for m in calm))} | "
                     f"{_pct(max(false) if false else None)} |")
    return "\n".join(lines) + "\n"


def wall_seconds() -> dict[str, float]:
    """Mean wall seconds of popqa-500's no-rag (one closed-book generation) and single (one
    BM25 retrieval and one generation with passages) rows."""
    sums: dict[str, list[float]] = {"no-rag": [], "single": []}
    for line in EVAL.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row["method"] in sums:
            sums[row["method"]].append(float(row["wall_s"]))
    return {k: float(np.mean(v)) for k, v in sums.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--synthetic-runs", type=int, default=2000)
    parser.add_argument("--horizon", type=int, default=100_000,
                        help="Questions served per run.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--render", action="store_true",
                        help="Only write OUT's markdown tables (OUT with .md) from OUT.")
    args = parser.parse_args(argv)
    if args.render:
        args.out.with_suffix(".md").write_text(render(json.loads(args.out.read_text())))
        return 0
    rng = np.random.default_rng(args.seed)
    start = time.time()
    seconds = wall_seconds()
    result: dict[str, Any] = {
        "command": f"python benchmarks/calibration_watch.py --runs {args.runs} "
                   f"--synthetic-runs {args.synthetic_runs} --horizon {args.horizon} "
                   f"--seed {args.seed} --out {args.out}",
        "epsilon": EPSILON, "delta": DELTA, "alarm_delta": ALARM_DELTA, "shares": SHARES,
        "mixes": MIXES, "horizon_questions": args.horizon, "wall_seconds_per_row": seconds,
        "pools": {}}
    pools = {"popqa-500": records_for("popqa", {}),
             "sample-300": records_for("sample", {"sample": SAMPLE})}
    for name, (gold, free, _gates) in pools.items():
        rel = relations(gold)
        by_rel = {r: [i for i, rec in enumerate(gold) if rel[rec.id] == r] for r in RELATIONS}
        entry: dict[str, Any] = {"questions": {r: len(v) for r, v in by_rel.items()},
                                 "cells": []}
        judges = {j: np.array([not parse_same_answer(j)(r.closed_book_answer or "",
                                                        r.retrieved_answer or "")
                               for r in gold]) for j in ("exact", "f1:0.5")}
        loss = np.array([float(r.signed_loss_if_skipped) for r in gold])
        for gate in GATES:
            score = np.array([np.nan if r.scores.get(gate) is None else r.scores[gate]
                              for r in gold], dtype=np.float64)
            for a_rel, b_rel in (RELATIONS, RELATIONS[::-1]):
                rows_a, rows_b = by_rel[a_rel], by_rel[b_rel]
                certs: dict[str, tuple[NDArray[np.float64], NDArray[np.float64]]] = {}
                for cert in ("gold", "exact", "f1:0.5"):
                    pool = gold if cert == "gold" else free[cert]
                    certs[cert] = certify_runs(pool, gold, rows_a, gate, args.runs, rng,
                                               baseline=cert == "gold")
                arms = {"label-free exact": ("exact", certs["exact"][0], None),
                        "label-free f1:0.5": ("f1:0.5", certs["f1:0.5"][0], None),
                        "labelled, epsilon": ("exact", certs["gold"][0], None),
                        "labelled, baseline": ("exact", certs["gold"][0], certs["gold"][1])}
                for arm, (judge, thresholds, bases) in arms.items():
                    eps = np.full(args.runs, EPSILON) if bases is None else bases
                    cell = run_cell(score, judges[judge], loss, rows_a, rows_b, thresholds,
                                    eps, args, rng, reused=gate == "answer-logprob",
                                    seconds=seconds)
                    cell.update(gate=gate, calibrated_on=a_rel, drift_to=b_rel, arm=arm,
                                judge=judge)
                    entry["cells"].append(cell)
                    print(f"{name} {gate} {a_rel}->{b_rel} {arm}: certified "
                          f"{cell['certified_runs']}/{args.runs}", flush=True)
        result["pools"][name] = entry
    result["synthetic"] = synthetic(args, rng)
    result["seconds"] = round(time.time() - start, 1)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
