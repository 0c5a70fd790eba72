"""Our certificate against MAPIE's Learn-then-Test (issue 57): certified skip rate and the
Monte-Carlo violation rate, on the committed records, with the pool as the population.

    .venv/bin/python benchmarks/calibration_peers.py --draws 1000 \\
        --out benchmarks/results/calibration_peers.json

No model is run. Each data set of labelled questions (every gate's recorded score, closed-
book and single-retrieval correctness) is the population. For each draw, n_cal questions
(half the pool) are drawn from it without replacement, in random order; every method
certifies a threshold on the *same* draw; the threshold's accuracy drop against always
retrieving is judged on the whole pool. A draw *violates* when that drop exceeds epsilon; a
method whose violation rate exceeds delta is reported as broken (ours included).

Methods, each certifying one gate at a time at (epsilon, delta):

* ``exact`` / ``exact-random`` / ``wsr`` / ``binomial``: :func:`rag_gates.calibration.calibrate`
  with ``gates=[gate]``, ``composite=False``, ``family_wise=False`` (the library's vectorised
  ``cut_table`` / ``certified_cut``; the first draw of every configuration is checked
  against ``calibrate()`` itself, threshold and certified skip rate).
* ``mapie-fst`` / ``mapie-holm``: ``mapie.risk_control.BinaryClassificationController``
  (MAPIE 1.6.0, called as a user would), fixed-sequence testing or Bonferroni-Holm (MAPIE's
  default), Hoeffding-Bentkus p-values, on MAPIE's default parameter grid
  ``np.linspace(0, 0.99, 100)``. MAPIE's binary risks need a 0/1 loss, so the risk is the
  share of questions *skipped where retrieval would have fixed the answer* (a
  :class:`mapie.risk_control.BinaryRisk`: occurrence "predicted skip and harm", condition
  "every question"): the harm rate, which bounds the accuracy drop from above (the drop is
  harms minus helps). The positive class is "skip"; its probability is a fixed,
  data-independent map of the gate score (higher score = retrieve): ``1 - score`` for the
  gates scored in [0, 1], ``exp(-score)`` for answer-logprob (its score is minus the mean
  token log-probability, so this is the geometric-mean token probability). An unscored
  question gets -1 and is never skipped (fail closed, as ours). Among the valid parameters
  MAPIE picks the one minimising a secondary risk, here the retrieval share (a BinaryRisk:
  occurrence "predicted retrieve").
* ``mapie-fst-cuts``: the same controller with fixed-sequence testing over every distinct
  score of the calibration draw (the grid ours tests; valid for fixed-sequence testing for
  the reason :mod:`rag_gates.calibration.certify` gives): the grid's share of the
  difference, without the p-value's.
* ``mapie-signed``: the signed loss. MAPIE's BinaryRisk rejects a non-0/1 occurrence; a
  ``ContinuousRisk`` passed in a one-element list is accepted by the controller, so the loss
  rescaled to [0, 1] (``(1 + loss) / 2`` for a skipped question, 1/2 for a retrieved one,
  target ``(1 + epsilon) / 2``) is given that way, fixed-sequence, default grid. The
  controller computes the Bentkus p-value with ``binary=True`` whatever the risk (MAPIE
  1.6.0 ``_BaseLTTController._calibrate``), which is only valid for a 0/1 loss; reported for
  completeness.

UQLM (0.6.7) is not compared: its threshold tuning (``uqlm.utils.tuner.Tuner``) needs no
model but maximises F-beta / accuracy of "response correct" on the tuning rows, with no risk
target and no confidence level (not a certificate: the class of calibration_mc.py's
``eval-gate`` rule), and installing it would downgrade numpy (2.4 to 1.26), pandas,
transformers and huggingface_hub in the project environment.

Data sets (n_cal = half the pool): tb11 (``benchmarks/results/testbed/gates-tb11``,
evaluation + calibration facts), PopQA 500 and HotpotQA 200 with the embedded model
(``benchmarks/results/eval``), and the shipped PopQA calibration sample's
``rag-gates calibrate`` records (``benchmarks/results/calibrate/sample-200/work``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import platform
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rag_gates._io import write_text_atomic
from rag_gates.calibration import (
    CalibrationRecord,
    ModelIdentity,
    calibrate,
    read_records,
)
from rag_gates.calibration.bounds import clopper_pearson
from rag_gates.calibration.calibrate import random_u
from rag_gates.calibration.certify import BOUNDS, certified_cut, cut_table

ROOT = Path(__file__).resolve().parent / "results"
GATES = ("answer-logprob", "first-token-prob", "quco", "cbdr")
MAPIE_METHODS = ("mapie-fst", "mapie-holm", "mapie-fst-cuts", "mapie-signed")
METHODS = (*BOUNDS, *MAPIE_METHODS)
MAPIE_GRID = np.linspace(0, 0.99, 100)  # BinaryClassificationController's default
_TOL = 1e-12


@dataclass
class Pool:
    name: str
    source: str
    ids: list[str]
    questions: list[str]
    scores: dict[str, NDArray[np.float64]]   # gate -> (N,), NaN = could not score
    loss: NDArray[np.float64]                # (N,) signed loss of skipping, in {-1, 0, 1}
    closed: NDArray[np.float64]              # (N,) closed-book correct

    @property
    def size(self) -> int:
        return len(self.ids)


def _usable(score: Any, evidence: dict[str, Any] | None = None) -> float:
    """A recorded score, NaN for an undecided or unscored question (fail closed)."""
    if score is None or (evidence and "undecided" in evidence):
        return math.nan
    value = float(score)
    return value if math.isfinite(value) and value < 1e300 else math.nan


def _decisions(paths: list[Path]) -> dict[str, float]:
    out: dict[str, float] = {}
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                out[row["id"]] = _usable(row["score"], row.get("evidence"))
    return out


def _labels(paths: list[Path]) -> dict[tuple[str, str], dict[str, Any]]:
    """(id, method) -> the run record (its question and gold-checked accuracy)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                out[(row["id"], row["method"])] = row
    return out


def _run_pool(name: str, source: str, decisions: dict[str, list[Path]],
              runs: list[Path]) -> Pool:
    """Join committed eval-gate decisions to a committed run's no-rag and single records."""
    labels = _labels([r / "results.jsonl" for r in runs])
    scores = {g: _decisions([d / "decisions.jsonl" for d in dirs])
              for g, dirs in decisions.items()}
    gates = list(decisions)
    ids = [i for i in scores[gates[0]] if all(i in scores[g] for g in gates)
           and (i, "no-rag") in labels and (i, "single") in labels]
    closed = np.array([float(labels[(i, "no-rag")]["accuracy"]) for i in ids])
    retrieved = np.array([float(labels[(i, "single")]["accuracy"]) for i in ids])
    return Pool(name, source, ids, [labels[(i, "no-rag")]["question"] for i in ids],
                {g: np.array([scores[g][i] for i in ids]) for g in gates},
                retrieved - closed, closed)


def records_pool(name: str, path: Path) -> Pool:
    """A ``rag-gates calibrate`` work directory's records.jsonl as a pool."""
    records = read_records(path)
    gates = [g for g in GATES if any(g in r.scores for r in records)]
    return Pool(name, str(path.relative_to(ROOT.parent.parent)), [r.id for r in records],
                [r.question for r in records],
                {g: np.array([_usable(r.scores.get(g)) for r in records]) for g in gates},
                np.array([float(r.signed_loss_if_skipped) for r in records]),
                np.array([float(r.closed_book_correct) for r in records]))


def load_pools() -> list[Pool]:
    tb = ROOT / "testbed" / "gates-tb11"
    ev = ROOT / "eval"
    return [
        _run_pool("tb11", "benchmarks/results/testbed/gates-tb11",
                  {g: [tb / g, tb / f"cal-{g}"] for g in GATES},
                  [tb / "labels", tb / "cal-labels"]),
        _run_pool("popqa-500", "benchmarks/results/eval/popqa-500 + gate-*-popqa",
                  {g: [ev / f"gate-{g}-popqa"] for g in GATES}, [ev / "popqa-500"]),
        _run_pool("hotpotqa-200", "benchmarks/results/eval/hotpotqa-200 + gate-*-hotpotqa",
                  {g: [ev / f"gate-{g}-hotpotqa"] for g in GATES}, [ev / "hotpotqa-200"]),
        records_pool("calibrate-sample", ROOT / "calibrate" / "sample-200" / "work"
                     / "records.jsonl"),
    ]


# ---------------------------------------------------------------------------------------
# Ours: the library's certification, vectorised over draws.

def _thresholds(ranked: NDArray[np.float64], cut: NDArray[np.int64]) -> NDArray[np.float64]:
    """Each draw's threshold for its cut (skip when score < threshold; -inf: skip nothing),
    as calibrate() states it."""
    n = ranked.shape[1]
    scored = (~np.isnan(ranked)).sum(axis=1)
    at = np.take_along_axis(ranked, np.minimum(cut, n - 1)[:, None], axis=1)[:, 0]
    top = np.take_along_axis(ranked, np.maximum(cut - 1, 0)[:, None], axis=1)[:, 0]
    chosen = np.where(cut < scored, at, np.nextafter(top, np.inf))
    out: NDArray[np.float64] = np.where(cut == 0, -np.inf, chosen)
    return out


def ours(cal_scores: NDArray[np.float64], cal_loss: NDArray[np.float64],
         pool_scores: NDArray[np.float64], epsilon: float, delta: float,
         u: NDArray[np.float64]) -> dict[str, tuple[NDArray[np.int64], NDArray[np.bool_]]]:
    """Per bound: (cut per draw (D,), pool rows skipped (D, N))."""
    pos, ok, ranked = cut_table(cal_scores)
    out: dict[str, tuple[NDArray[np.int64], NDArray[np.bool_]]] = {}
    s = np.where(np.isnan(pool_scores), np.inf, pool_scores)
    for bound in BOUNDS:
        cut = certified_cut(pos, cal_loss, ok, epsilon=epsilon, delta=delta, bound=bound,
                            u=u)
        out[bound] = cut, s[None, :] < _thresholds(ranked, cut)[:, None]
    return out


def check_against_calibrate(pool: Pool, gate: str, rows: NDArray[np.int64], epsilon: float,
                            delta: float, cuts: dict[str, int]) -> None:
    """calibrate() on the same rows in the same order certifies the same cut (its
    certified skip rate is then the same Clopper-Pearson lower end)."""
    records = [CalibrationRecord(
        id=pool.ids[i], question=pool.questions[i], closed_book_correct=bool(pool.closed[i]),
        retrieved_correct=bool(pool.closed[i] + pool.loss[i]),
        scores={gate: None if math.isnan(pool.scores[gate][i]) else pool.scores[gate][i]})
        for i in rows]
    # calibrate() permutes with its seed (0); hand it the identity order by pre-permuting.
    inverse = np.argsort(np.random.default_rng(0).permutation(len(records)))
    records = [records[i] for i in inverse]
    n = len(records)
    for bound in BOUNDS:
        row = calibrate(records, max_loss=epsilon, delta=delta, bound=bound,
                        model=ModelIdentity(name="peers", fingerprint="peers"), retriever="-",
                        gates=[gate], composite=False, family_wise=False).row(gate)
        want = certified_skip(cuts[bound], n, delta)
        if round(row.observed_skip_rate * n) != cuts[bound] or \
                not math.isclose(row.certified_skip_rate, want, abs_tol=1e-12):
            raise AssertionError(f"{pool.name} {gate} eps={epsilon} {bound}: calibrate() "
                                 f"skips {row.observed_skip_rate * n:.0f} (certified "
                                 f"{row.certified_skip_rate}), the vectorised path "
                                 f"{cuts[bound]} ({want})")


def certified_skip(k: int, n: int, delta: float) -> float:
    """The certified skip rate of calibrate()'s report: the lower end of the Clopper-Pearson
    interval (confidence 1 - delta) of k skipped out of n; 0 when nothing is skipped."""
    return clopper_pearson(k, n, 1.0 - delta)[0] if k > 0 else 0.0


# ---------------------------------------------------------------------------------------
# MAPIE, called as a user would.

def skip_probability(gate: str, scores: NDArray[np.float64]) -> NDArray[np.float64]:
    """The probability of the positive class "skip" handed to MAPIE: a fixed map of the
    gate score (higher score = retrieve), chosen before any data; -1 (never skipped) for an
    unscored question."""
    s = np.asarray(scores, dtype=np.float64)
    p = np.exp(-s) if gate == "answer-logprob" else 1.0 - s
    out: NDArray[np.float64] = np.where(np.isnan(s), -1.0, p)
    return out


def _predict_proba(x: NDArray[np.float64]) -> NDArray[np.float64]:
    p = np.asarray(x, dtype=np.float64)[:, 0]
    out: NDArray[np.float64] = np.column_stack([1.0 - p, p])
    return out


def _every(y_true: NDArray[Any], y_pred: NDArray[Any]) -> NDArray[np.bool_]:
    return np.ones(len(y_true), dtype=bool)


def mapie_controller(method: str, p_cal: NDArray[np.float64], loss_cal: NDArray[np.float64],
                     epsilon: float, delta: float) -> Any:
    """A calibrated ``BinaryClassificationController`` for one MAPIE method on one draw
    (``p_cal``: skip probabilities of the calibration rows; ``loss_cal``: their signed
    losses)."""
    from mapie.risk_control import BinaryClassificationController, BinaryRisk, ContinuousRisk

    harm = BinaryRisk(risk_occurrence=lambda yt, yp: (yp == 1) & (yt == 1),
                      risk_condition=_every, higher_is_better=False)
    retrieval_share = BinaryRisk(risk_occurrence=lambda yt, yp: yp == 0,
                                 risk_condition=_every, higher_is_better=False)
    grid = MAPIE_GRID
    fwer = "bonferroni_holm" if method == "mapie-holm" else "fixed_sequence"
    if method == "mapie-fst-cuts":
        grid = np.unique(p_cal[p_cal >= 0])
    risk: Any
    if method == "mapie-signed":
        # y = 1 + signed loss in {0, 1, 2}; per question (1 + loss) / 2 if skipped, else 1/2.
        risk = [ContinuousRisk(lambda yt, yp: 0.5 + 0.5 * (yt - 1.0) * yp)]
        target: Any = [(1.0 + epsilon) / 2.0]
        y = (loss_cal + 1).astype(int)
    else:
        risk, target, y = harm, epsilon, (loss_cal > 0).astype(int)
    controller = BinaryClassificationController(
        predict_function=_predict_proba, risk=risk, target_level=target,
        confidence_level=1.0 - delta, best_predict_param_choice=retrieval_share,
        list_predict_params=grid, fwer_method=fwer)
    with warnings.catch_warnings():
        # "No predict parameters were found", the signed loss's non-monotone warning.
        warnings.simplefilter("ignore", UserWarning)
        controller.calibrate(p_cal[:, None], y)
    return controller


def mapie_skips(controller: Any, p: NDArray[np.float64]) -> NDArray[np.bool_]:
    """The rows MAPIE's calibrated controller skips (none when nothing was certified)."""
    if controller.best_predict_param is None:
        return np.zeros(p.shape[0], dtype=bool)
    out: NDArray[np.bool_] = controller.predict(p[:, None]) == 1
    return out


# ---------------------------------------------------------------------------------------

def summary(epsilon: float, delta: float, n: int, skipped_cal: NDArray[np.int64],
            skipped_pool: NDArray[np.bool_], loss: NDArray[np.float64]) -> dict[str, Any]:
    """One method's figures over the draws: ``skipped_cal`` (D,) calibration rows skipped,
    ``skipped_pool`` (D, N) the pool rows its threshold skips."""
    draws = skipped_cal.shape[0]
    drop = (skipped_pool * loss[None, :]).sum(axis=1) / loss.size
    violations = int((drop > epsilon + _TOL).sum())
    lo, hi = clopper_pearson(violations, draws, 0.95)
    return {
        "certified_skip": float(np.mean([certified_skip(int(k), n, delta)
                                         for k in skipped_cal])),
        "observed_skip_cal": float(skipped_cal.mean() / n),
        "skip_pool": float(skipped_pool.mean()),
        "mean_drop_pool": float(drop.mean()),
        "violation": violations / draws,
        "violation_ci95": [lo, hi],
        "broken": violations / draws > delta,
        "broken_significant": lo > delta,
        "none_certified": float((skipped_cal == 0).mean()),
    }


def run_pool(pool: Pool, n: int, draws: int, epsilons: list[float], delta: float,
             seed: int, gates: list[str] | None = None, check: bool = True,
             keep: bool = False) -> dict[str, Any]:
    """Every method on the same ``draws`` calibration draws of ``n`` rows of ``pool``.
    Returns {gate: {epsilon: {method: summary}}}; with ``keep`` each summary also holds the
    per-draw calibration rows (``rows``), skipped counts and pool drops."""
    rng = np.random.default_rng([seed, n, pool.size])
    cal = np.stack([rng.permutation(pool.size)[:n] for _ in range(draws)])
    u = rng.random(draws)
    u[0] = random_u(0)  # draw 0 uses calibrate()'s uniform, so the check covers it
    loss_cal = pool.loss[cal]
    out: dict[str, Any] = {}
    for gate in gates or list(pool.scores):
        scores = pool.scores[gate]
        p_pool = skip_probability(gate, scores)
        per_gate: dict[str, Any] = {}
        for eps in epsilons:
            t0 = time.perf_counter()
            cuts = ours(scores[cal], loss_cal, scores, eps, delta, u)
            if check:
                check_against_calibrate(pool, gate, cal[0], eps, delta,
                                        {b: int(c[0]) for b, (c, _) in cuts.items()})
            results: dict[str, tuple[NDArray[np.int64], NDArray[np.bool_]]] = dict(cuts)
            for method in MAPIE_METHODS:
                ks = np.zeros(draws, dtype=np.int64)
                pool_skips = np.zeros((draws, pool.size), dtype=bool)
                for d in range(draws):
                    controller = mapie_controller(method, p_pool[cal[d]], loss_cal[d], eps,
                                                  delta)
                    ks[d] = int(mapie_skips(controller, p_pool[cal[d]]).sum())
                    pool_skips[d] = mapie_skips(controller, p_pool)
                results[method] = ks, pool_skips
            per_eps: dict[str, Any] = {}
            for method, (k, skipped) in results.items():
                per_eps[method] = summary(eps, delta, n, np.asarray(k), skipped, pool.loss)
                if keep:
                    per_eps[method]["rows"] = cal
                    per_eps[method]["skipped_cal"] = np.asarray(k)
                    per_eps[method]["drop_pool"] = (skipped * pool.loss).sum(axis=1) / pool.size
            per_eps["seconds"] = time.perf_counter() - t0
            per_gate[str(eps)] = per_eps
        out[gate] = per_gate
    return out


def hindsight(pool: Pool, epsilons: list[float]) -> dict[str, Any]:
    """What the whole pool allows: per gate the largest skip share whose drop is at most
    epsilon (the ceiling any certificate on a sample of it approaches)."""
    per_gate = {}
    for g, s in pool.scores.items():
        pos, ok, _ = cut_table(s[None, :])
        ordered = np.zeros(pool.size)
        np.put_along_axis(ordered, pos[0], pool.loss, axis=0)
        drop = np.concatenate([[0.0], np.cumsum(ordered)]) / pool.size
        per_gate[g] = {str(e): float(np.nonzero(ok[0] & (drop <= e + _TOL))[0].max()
                                     / pool.size) for e in epsilons}
    return {"harm_share": float((pool.loss > 0).mean()),
            "help_share": float((pool.loss < 0).mean()),
            "oracle_skip": float((pool.loss <= 0).mean()),
            "hindsight_skip": per_gate}


def table(result: dict[str, Any]) -> str:
    """Markdown: per data set / epsilon / gate, each method's mean certified skip rate and
    violation rate ("skip / viol"), a broken method marked."""
    delta = result["delta"]
    lines = [f"{result['draws']} draws per row, delta {delta}; skip = mean certified skip "
             "rate (Clopper-Pearson lower end of the calibration draw's skip share, as "
             "calibrate's report); viol = share of draws whose accuracy drop on the whole "
             f"pool exceeds epsilon; **BROKEN** = viol > {delta}.\n",
             "| data set (n_cal / pool) | eps | gate | hindsight | "
             + " | ".join(result["methods"]) + " |",
             "|" + "---|" * (4 + len(result["methods"]))]
    for name, entry in result["pools"].items():
        for eps in map(str, result["epsilons"]):
            for gate, per_gate in entry["gates"].items():
                cells = []
                for m in result["methods"]:
                    r = per_gate[eps][m]
                    flag = " **BROKEN**" if r["broken"] else ""
                    cells.append(f"{r['certified_skip']:.3f} / {r['violation']:.3f}{flag}")
                lines.append(f"| {name} ({entry['n_cal']} / {entry['size']}) | {eps} | {gate} "
                             f"| {entry['hindsight_skip'][gate][eps]:.3f} | "
                             + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None,
         pools: Callable[[], list[Pool]] = load_pools) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.05, 0.02])
    parser.add_argument("--delta", type=float, default=0.1)
    parser.add_argument("--share", type=float, default=0.5,
                        help="n_cal as a share of each pool (default: half)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "calibration_peers.json")
    args = parser.parse_args(argv)
    import mapie

    start = time.perf_counter()
    result: dict[str, Any] = {
        "command": (f"python benchmarks/calibration_peers.py --draws {args.draws} "
                    f"--epsilons {' '.join(map(str, args.epsilons))} --delta {args.delta} "
                    f"--share {args.share} --seed {args.seed} --out {args.out}"),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "numpy": np.__version__,
                    "mapie": mapie.__version__},
        "draws": args.draws, "delta": args.delta, "epsilons": args.epsilons,
        "methods": list(METHODS),
        "mapie": {"controller": "mapie.risk_control.BinaryClassificationController",
                  "risk": "BinaryRisk: skipped (predicted positive) and retrieval would "
                          "have fixed the answer, over every question (the harm rate)",
                  "signed_risk": "ContinuousRisk in a one-element list: (1 + loss) / 2 if "
                                 "skipped, else 1/2; target (1 + epsilon) / 2",
                  "secondary_risk": "BinaryRisk: predicted retrieve (the retrieval share)",
                  "grid": "np.linspace(0, 0.99, 100) (MAPIE's default); mapie-fst-cuts: "
                          "every distinct skip probability of the calibration draw",
                  "skip_probability": "1 - score; exp(-score) for answer-logprob; -1 if "
                                      "unscored"},
        "pools": {}}
    for pool in pools():
        n = int(pool.size * args.share)
        t0 = time.perf_counter()
        entry: dict[str, Any] = {"size": pool.size, "n_cal": n, "source": pool.source,
                                 **hindsight(pool, args.epsilons)}
        entry["gates"] = run_pool(pool, n, args.draws, args.epsilons, args.delta, args.seed)
        entry["seconds"] = time.perf_counter() - t0
        result["pools"][pool.name] = entry
        print(f"{pool.name}: n={n}, {entry['seconds']:.1f} s", flush=True)
    result["wall_s"] = time.perf_counter() - start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps(result, indent=1) + "\n")
    write_text_atomic(args.out.with_suffix(".md"), table(result))
    print(table(result))
    return result


if __name__ == "__main__":
    main()
