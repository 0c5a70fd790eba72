"""Does a certified threshold keep its promise? A Monte-Carlo over committed gate decisions.

    .venv/bin/python benchmarks/calibration_mc.py --draws 1000 \\
        --out benchmarks/results/calibration_mc.json

Each pool of labelled questions (every gate's recorded score, closed-book and single-
retrieval correctness; no model runs) is treated as the population. For each draw, n_cal
questions are drawn from it without replacement, in random order; a threshold is chosen on
them; the chosen threshold's accuracy drop against always retrieving is judged on the whole
pool ("pool") and on the questions not drawn ("test half", which adds its own sampling
noise). A draw *violates* when the drop exceeds epsilon. Rules compared:

* ``exact`` / ``exact-random`` / ``wsr`` / ``binomial``:
  :func:`rag_gates.calibration.calibrate`'s certification (Learn-then-Test fixed-sequence
  testing with the exact unconditional test on the harm and help counts, deterministic or
  randomised with one uniform per draw, the betting test on the signed loss, or the exact
  binomial tail on the harm count), delta 0.1 (the library's own vectorised functions:
  ``cut_table``, ``certified_cut``, ``fit_composite``, ``fit_cascade``; every
  configuration's first draw is checked against ``calibrate()`` itself). ``*-fw``: each
  of the 6 rows at delta / 6, as ``calibrate()`` does by default so that the best row keeps
  the guarantee.
* ``empirical``: the largest skip whose calibration drop is at most epsilon (what a tolerance
  on ``eval-gate``'s accuracy curve does).
* ``eval-gate``: ``eval-gate``'s own rule (best calibration accuracy, fewest retrievals among
  ties; ``rag_gates_lab.gate_eval.calibrate``), which ignores epsilon.

The composites are the library's, fitted on one half of the calibration draw and certified
on the other: ``weighted`` (a logistic combination of the four gates, label closed-book
answer wrong) and ``cascade`` (:func:`~rag_gates.calibration.calibrate.fit_cascade`: the
pair, order and band chosen on the fitting half, refitted per epsilon); the uncertified
rules choose their threshold on the same certification half.

Pools: (a) tb11 (``benchmarks/results/testbed/gates-tb11``): evaluation + calibration facts,
376 with both labels; (b) PopQA 500 with the embedded model (``benchmarks/results/eval``).
n_cal above a pool's size is skipped.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rag_gates._io import write_text_atomic
from rag_gates.calibration import CalibrationRecord, ModelIdentity, calibrate
from rag_gates.calibration.bounds import clopper_pearson
from rag_gates.calibration.calibrate import (
    _weighted_scores,
    cascade_scores,
    fit_cascade,
    fit_composite,
    random_u,
)
from rag_gates.calibration.certify import BOUNDS, certified_cut, cut_table, empirical_cut
from rag_gates_lab.runner import read_records

ROOT = Path(__file__).resolve().parent / "results"
GATES = ("answer-logprob", "first-token-prob", "quco", "cbdr")
COMPOSITE = "weighted(" + ",".join(GATES) + ")"
CASCADE = "cascade(" + ",".join(GATES) + ")"
RULES = (*BOUNDS, *(f"{b}-fw" for b in BOUNDS), "empirical", "eval-gate")


@dataclass
class Pool:
    name: str
    ids: list[str]
    questions: list[str]
    scores: dict[str, NDArray[np.float64]]   # gate -> (N,)
    loss: NDArray[np.float64]                # (N,) signed loss of skipping
    closed: NDArray[np.float64]              # (N,) closed-book correct

    @property
    def size(self) -> int:
        return len(self.ids)


def _decisions(path: Path) -> dict[str, float]:
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            out[row["id"]] = float(row["score"])
    return out


def _pool(name: str, decision_dirs: dict[str, list[Path]], label_dirs: list[Path]) -> Pool:
    """Join decisions to labels by question id, as gate_eval does (no-rag and single)."""
    labels = {(r.id, r.method): r for d in label_dirs for r in read_records(d)}
    scores = {g: {k: v for d in dirs for k, v in _decisions(d / "decisions.jsonl").items()}
              for g, dirs in decision_dirs.items()}
    ids = [i for i in scores[GATES[0]] if all(i in scores[g] for g in GATES)
           and (i, "no-rag") in labels and (i, "single") in labels]
    closed = np.array([labels[(i, "no-rag")].accuracy for i in ids])
    retrieved = np.array([labels[(i, "single")].accuracy for i in ids])
    table = {g: np.array([scores[g][i] for i in ids]) for g in GATES}
    for g in GATES:  # the fail-closed marker / non-finite scores: never skipped
        table[g][~np.isfinite(table[g]) | (table[g] >= 1e300)] = math.nan
    return Pool(name, ids, [labels[(i, "no-rag")].question for i in ids], table,
                retrieved - closed, closed)


def load_pools() -> list[Pool]:
    tb = ROOT / "testbed" / "gates-tb11"
    ev = ROOT / "eval"
    return [
        _pool("tb11", {g: [tb / g, tb / f"cal-{g}"] for g in GATES},
              [tb / "labels", tb / "cal-labels"]),
        _pool("popqa-500", {g: [ev / f"gate-{g}-popqa"] for g in GATES}, [ev / "popqa-500"]),
    ]


def _thresholds(ranked: NDArray[np.float64], cut: NDArray[np.int64]) -> NDArray[np.float64]:
    """The threshold of each draw's cut (skip when score < threshold); -inf = skip nothing."""
    _draws, n = ranked.shape
    scored = (~np.isnan(ranked)).sum(axis=1)
    at = np.take_along_axis(ranked, np.minimum(cut, n - 1)[:, None], axis=1)[:, 0]
    top = np.take_along_axis(ranked, np.maximum(cut - 1, 0)[:, None], axis=1)[:, 0]
    chosen = np.where(cut < scored, at, np.nextafter(top, np.inf))
    out: NDArray[np.float64] = np.where(cut == 0, -np.inf, chosen)
    return out


def _uncertified_cuts(pos: NDArray[np.int64], loss: NDArray[np.float64],
                      ok: NDArray[np.bool_], epsilon: float) -> dict[str, NDArray[np.int64]]:
    """The two uncertified rules' cuts: largest allowed cut with calibration drop <= eps, and
    the best-accuracy cut (the largest among ties)."""
    draws, n = loss.shape
    sorted_loss = np.zeros((draws, n))
    np.put_along_axis(sorted_loss, pos, loss, axis=1)
    drop = np.concatenate([np.zeros((draws, 1)), np.cumsum(sorted_loss, axis=1)], 1) / n
    index = np.arange(n + 1)[None, :]
    masked = np.where(ok, drop, np.inf)
    best = masked.min(axis=1, keepdims=True)
    best_acc = np.where(ok & (masked <= best + 1e-12), index, 0).max(axis=1)
    return {"empirical": empirical_cut(pos, loss, ok, epsilon), "eval-gate": best_acc}


def _judge(scores: NDArray[np.float64], loss: NDArray[np.float64],
           thresholds: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(drop, skip share) of each draw's threshold on rows ``scores`` ((D, M) or (M,))."""
    s = np.where(np.isnan(scores), np.inf, scores)
    skipped = s < thresholds[:, None]
    m = skipped.shape[1]
    return (skipped * loss).sum(axis=1) / m, skipped.sum(axis=1) / m


def _composite(pool: Pool, cal: NDArray[np.int64]) -> tuple[NDArray[np.float64],
                                                           NDArray[np.float64],
                                                           NDArray[np.int64]]:
    """Per draw: fit on the first half of the calibration draw, score the certification half
    and the whole pool. Returns (cert scores (D, n - n//2), pool scores (D, N), cert rows)."""
    draws, n = cal.shape
    half = n // 2
    x_all = np.stack([pool.scores[g] for g in GATES])          # (G, N)
    cert_scores = np.empty((draws, n - half))
    pool_scores = np.empty((draws, pool.size))
    for d in range(draws):
        fit_rows, cert_rows = cal[d, :half], cal[d, half:]
        fit = fit_composite(list(GATES), x_all[:, fit_rows], pool.closed[fit_rows])
        if fit is None:
            cert_scores[d] = math.nan
            pool_scores[d] = math.nan
            continue
        pool_scores[d] = _weighted_scores(fit, x_all)
        cert_scores[d] = pool_scores[d, cert_rows]
    return cert_scores, pool_scores, cal[:, half:]


def _cascade(pool: Pool, cal: NDArray[np.int64], epsilon: float
             ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.int64],
                        dict[str, Any]]:
    """As :func:`_composite` for the cascade chosen at ``epsilon`` on the fitting half; also
    how often each (cheap, expensive) pair was chosen and the mean expensive share."""
    draws, n = cal.shape
    half = n // 2
    x_all = np.stack([pool.scores[g] for g in GATES])
    cert_scores = np.empty((draws, n - half))
    pool_scores = np.empty((draws, pool.size))
    pairs: dict[str, int] = {}
    shares = []
    for d in range(draws):
        fit_rows, cert_rows = cal[d, :half], cal[d, half:]
        fit = fit_cascade(list(GATES), x_all[:, fit_rows], pool.loss[fit_rows],
                          pool.closed[fit_rows], epsilon)
        if fit is None:
            cert_scores[d] = math.nan
            pool_scores[d] = math.nan
            continue
        cheap, expensive = fit.cheap.gates[0], fit.expensive.gates[0]
        key = f"{cheap}>{expensive}"
        pairs[key] = pairs.get(key, 0) + 1
        shares.append(fit.expensive_share)
        pool_scores[d] = cascade_scores(fit, pool.scores[cheap], pool.scores[expensive])
        cert_scores[d] = pool_scores[d, cert_rows]
    info = {"pairs": {k: v / draws for k, v in sorted(pairs.items(), key=lambda kv: -kv[1])},
            "mean_expensive_share_fit": float(np.mean(shares)) if shares else None}
    return cert_scores, pool_scores, cal[:, half:], info


def _summary(eps: float, cut: NDArray[np.int64], drop_pool: NDArray[np.float64],
             skip_pool: NDArray[np.float64], drop_test: NDArray[np.float64] | None,
             skip_test: NDArray[np.float64] | None) -> dict[str, Any]:
    return {
        "violation_pool": float((drop_pool > eps + 1e-12).mean()),
        "violation_test": None if drop_test is None else float((drop_test > eps + 1e-12).mean()),
        "mean_skip_test": None if skip_test is None else float(skip_test.mean()),
        "mean_skip_pool": float(skip_pool.mean()),
        "mean_drop_pool": float(drop_pool.mean()),
        "none_certified": float((cut == 0).mean()),
    }


def run_config(pool: Pool, n: int, draws: int, epsilons: list[float], delta: float,
               seed: int) -> dict[str, Any]:
    rng = np.random.default_rng([seed, n, pool.size])
    perms = np.stack([rng.permutation(pool.size) for _ in range(draws)])
    cal, test = perms[:, :n], perms[:, n:]
    # The randomised exact test's uniform per draw; draw 0 uses calibrate()'s (seed 0), so
    # the check against calibrate() covers it too.
    u = rng.random(draws)
    u[0] = random_u(0)
    out: dict[str, Any] = {}
    Column = tuple[NDArray[np.float64], NDArray[np.int64], NDArray[np.float64]]
    columns: dict[str, dict[float, Column]] = {}
    for g in GATES:
        same = (pool.scores[g][cal], cal, np.broadcast_to(pool.scores[g], (draws, pool.size)))
        columns[g] = dict.fromkeys(epsilons, same)
    comp_cert, comp_pool, comp_rows = _composite(pool, cal)
    columns[COMPOSITE] = dict.fromkeys(epsilons, (comp_cert, comp_rows, comp_pool))
    columns[CASCADE] = {}
    cascade_info: dict[str, Any] = {}
    for eps in epsilons:
        c_cert, c_pool, c_rows, cascade_info[str(eps)] = _cascade(pool, cal, eps)
        columns[CASCADE][eps] = (c_cert, c_rows, c_pool)
    family = len(columns)
    has_test = test.shape[1] > 0
    # raw[eps][rule][gate] = (cut, certified lower skip bound, drops and skips) per draw
    raw: dict[float, dict[str, dict[str, tuple[Any, ...]]]] = {
        e: {r: {} for r in RULES} for e in epsilons}
    lower_cache: dict[tuple[int, int], float] = {}

    def lower(k: int, m: int) -> float:
        if (k, m) not in lower_cache:
            lower_cache[(k, m)] = clopper_pearson(k, m, 1 - delta)[0] if k else 0.0
        return lower_cache[(k, m)]

    for gate, per_eps_columns in columns.items():
        per_gate: dict[str, Any] = {}
        for eps in epsilons:
            cal_scores, rows, pool_scores = per_eps_columns[eps]
            loss = pool.loss[rows]
            pos, ok, ranked = cut_table(cal_scores)
            test_scores = np.take_along_axis(pool_scores, test, axis=1)
            test_loss = pool.loss[test]
            cuts: dict[str, NDArray[np.int64]] = {
                b: certified_cut(pos, loss, ok, epsilon=eps, delta=delta, bound=b, u=u)
                for b in BOUNDS}
            cuts.update({f"{b}-fw": certified_cut(pos, loss, ok, epsilon=eps,
                                                   delta=delta / family, bound=b, u=u)
                         for b in BOUNDS})
            cuts.update(_uncertified_cuts(pos, loss, ok, eps))
            per_eps: dict[str, Any] = {}
            for rule, cut in cuts.items():
                t = _thresholds(ranked, cut)
                drop_pool, skip_pool = _judge(pool_scores, pool.loss[None, :], t)
                drop_test, skip_test = _judge(test_scores, test_loss, t) if has_test \
                    else (None, None)
                per_eps[rule] = _summary(eps, cut, drop_pool, skip_pool, drop_test, skip_test)
                m = rows.shape[1]
                raw[eps][rule][gate] = (cut, np.array([lower(int(k), m) for k in cut]),
                                        drop_pool, skip_pool, drop_test, skip_test)
            per_gate[str(eps)] = per_eps
            _check_against_calibrate(pool, cal[0], gate, eps, delta,
                                     {b: float(_thresholds(ranked[:1], cuts[b][:1])[0])
                                      for b in BOUNDS})
        out[gate] = per_gate
    out["cascade_fits"] = cascade_info
    # "best": per draw, the gate with the highest certified skip rate (the lower end of its
    # Clopper-Pearson interval, as CalibrationReport.best ranks them), judged like the others.
    best: dict[str, Any] = {}
    for eps in epsilons:
        best[str(eps)] = {}
        for rule in RULES:
            gates = list(raw[eps][rule])
            keys = np.stack([raw[eps][rule][g][1] + 1e-9 * raw[eps][rule][g][0]
                             for g in gates])
            pick = keys.argmax(axis=0)
            take = np.arange(draws)

            def col(i: int, pick: NDArray[np.int64] = pick, gates: list[str] = gates,
                    rule: str = rule, eps: float = eps,
                    take: NDArray[np.int64] = take) -> Any:
                stacked = [raw[eps][rule][g][i] for g in gates]
                if stacked[0] is None:
                    return None
                return np.stack(stacked)[pick, take]

            best[str(eps)][rule] = _summary(eps, col(0), col(2), col(3), col(4), col(5))
            best[str(eps)][rule]["picked"] = {g: float((pick == i).mean())
                                              for i, g in enumerate(gates)}
    out["best"] = best
    return out


def _check_against_calibrate(pool: Pool, rows: NDArray[np.int64], gate: str, eps: float,
                             delta: float, expected: dict[str, float]) -> None:
    """The vectorised path gives calibrate()'s threshold on the same questions and order
    (for a composite: the same fit on the same half, certified at the same delta)."""
    composite = gate not in GATES
    names = list(GATES) if composite else [gate]
    records = [CalibrationRecord(
        id=pool.ids[i], question=pool.questions[i], closed_book_correct=bool(pool.closed[i]),
        retrieved_correct=bool(pool.closed[i] + pool.loss[i]),
        scores={g: None if math.isnan(pool.scores[g][i]) else pool.scores[g][i]
                for g in names})
        for i in rows]
    # calibrate() permutes with its seed; hand it the identity order by pre-permuting.
    inverse = np.argsort(np.random.default_rng(0).permutation(len(records)))
    records = [records[i] for i in inverse]
    for bound in BOUNDS:
        report = calibrate(records, max_loss=eps, delta=delta, bound=bound,
                           model=ModelIdentity(name="mc", fingerprint="mc"), retriever="-",
                           gates=names, composite=composite, family_wise=False)
        got = report.row(gate).threshold
        want = expected[bound]
        if not ((got is None and want == -math.inf) or got == want):
            raise AssertionError(f"{pool.name} {gate} eps={eps} {bound}: calibrate() gives "
                                 f"{got}, the vectorised path {want}")


def oracle(pool: Pool, epsilons: list[float]) -> dict[str, Any]:
    """The pool itself: the oracle's skip share (every question retrieval does not improve),
    and per gate what hindsight on the whole pool allows: the largest skip share whose drop
    is at most epsilon, and where the first harms fall in the gate's order."""
    per_gate: dict[str, Any] = {}
    for g in GATES:
        pos, ok, _ = cut_table(pool.scores[g][None, :])
        sorted_loss = np.zeros(pool.size)
        np.put_along_axis(sorted_loss, pos[0], pool.loss, axis=0)
        drop = np.concatenate([[0.0], np.cumsum(sorted_loss)]) / pool.size
        harms = np.nonzero(sorted_loss > 0)[0][:3]
        per_gate[g] = {
            "hindsight_skip": {str(e): float(np.nonzero(ok[0] & (drop <= e + 1e-12))[0].max()
                                             / pool.size) for e in epsilons},
            "share_before_first_harms": [float(h / pool.size) for h in harms]}
    return {"oracle_skip": float((pool.loss <= 0).mean()),
            "always_retrieve_accuracy": float((pool.closed + pool.loss).mean()),
            "closed_book_accuracy": float(pool.closed.mean()),
            "harm_share": float((pool.loss > 0).mean()),
            "help_share": float((pool.loss < 0).mean()),
            "gates": per_gate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--n-cal", type=int, nargs="+", default=[50, 100, 200, 400])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.01, 0.02, 0.05])
    parser.add_argument("--delta", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "calibration_mc.json")
    parser.add_argument("--table-only", action="store_true",
                        help="Only rewrite the markdown table next to --out from its JSON.")
    args = parser.parse_args()
    if args.table_only:
        write_text_atomic(args.out.with_suffix(".md"),
                          table(json.loads(args.out.read_text(encoding="utf-8"))))
        return
    start = time.perf_counter()
    result: dict[str, Any] = {
        "command": "python benchmarks/calibration_mc.py " + " ".join(
            f"--{k.replace('_', '-')} {v if not isinstance(v, list) else ' '.join(map(str, v))}"
            for k, v in vars(args).items() if k != "out") + f" --out {args.out}",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "numpy": np.__version__},
        "draws": args.draws, "delta": args.delta, "epsilons": args.epsilons,
        "gates": [*GATES, COMPOSITE, CASCADE, "best"], "rules": list(RULES), "pools": {}}
    for pool in load_pools():
        entry: dict[str, Any] = {"size": pool.size, **oracle(pool, args.epsilons),
                                 "n_cal": {}}
        for n in args.n_cal:
            if n > pool.size:
                continue
            t0 = time.perf_counter()
            entry["n_cal"][str(n)] = run_config(pool, n, args.draws, args.epsilons,
                                                args.delta, args.seed)
            print(f"{pool.name} n={n}: {time.perf_counter() - t0:.1f} s", flush=True)
        result["pools"][pool.name] = entry
    result["wall_s"] = time.perf_counter() - start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps(result, indent=1) + "\n")
    write_text_atomic(args.out.with_suffix(".md"), table(result))
    print(table(result))


def table(result: dict[str, Any]) -> str:
    """Markdown: per pool / n / epsilon / gate, each rule's violation share (judged on the
    whole pool) and mean share of retrievals skipped on the test half ("viol / skip");
    for the uncertified rules the violation share on the test half too."""
    certified = [r for r in result["rules"] if r not in ("empirical", "eval-gate")]
    lines = [f"{result['draws']} draws per row, delta {result['delta']}; "
             "viol = share of draws whose accuracy drop on the whole pool exceeds epsilon; "
             "skip = mean share of retrievals skipped on the test half (- : no test half); "
             "*-fw = each of the 6 rows certified at delta / 6; best = per draw the row with "
             "the highest certified skip rate."]
    for name, pool in result["pools"].items():
        lines.append(f"\n### {name} ({pool['size']} questions; oracle skip "
                     f"{pool['oracle_skip']:.2f}, always-retrieve accuracy "
                     f"{pool['always_retrieve_accuracy']:.3f})\n")
        head = " | ".join(f"{r} viol / skip" for r in certified)
        lines.append(f"| n | eps | gate | {head} | empirical viol / skip | eval-gate viol / skip |")
        lines.append("|" + "---|" * (5 + len(certified)))
        for n, per_n in pool["n_cal"].items():
            for eps in map(str, result["epsilons"]):
                for gate in result["gates"]:
                    cells = []
                    for rule in [*certified, "empirical", "eval-gate"]:
                        r = per_n[gate][eps][rule]
                        skip = r["mean_skip_test"]
                        cells.append(f"{r['violation_pool']:.3f} / "
                                     f"{'-' if skip is None else f'{skip:.3f}'}")
                    short = gate.split("(")[0]
                    lines.append(f"| {n} | {eps} | {short} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
