"""Certificates per group (issue 59, item 3) against one threshold for every question: per
PopQA relation, what each certifies, what it costs within the group, and how often it breaks.

    .venv/bin/python benchmarks/calibration_by_group.py --draws 1000 \\
        --out benchmarks/results/calibration_by_group.json

No model is run. Two committed sets of labelled questions are the populations, each question
in the group of its PopQA relation (place of birth, occupation;
``tests/calibration/data/popqa_relations.json``, from the development file's ``prop``):

* ``sample-300``: the shipped sample's 300 ``rag-gates calibrate`` records
  (``benchmarks/results/calibrate/sample-300/work``; gates answer-logprob, first-token-prob,
  cbdr);
* ``popqa-500``: PopQA 500 with the embedded model (``benchmarks/results/eval``: the
  ``popqa-500`` run's no-rag and single records joined to the ``gate-*-popqa`` decisions;
  gates answer-logprob, first-token-prob, quco, cbdr).

Each gate is certified alone (``gates=[gate]``, ``family_wise=False``: the comparison is
one gate's one threshold against the same gate's per-group thresholds), exact bound,
delta 0.1:

* ``one``: :func:`rag_gates.calibration.calibrate`, one threshold; its promise is on the
  average over every question.
* ``per-group``: ``calibrate(..., by_group=True)``: one threshold per relation, every group
  at once at delta (Bonferroni: delta / G for the G groups with enough questions; a group
  with too few always retrieves).

``whole``: each certified on every question of the set (what ``rag-gates calibrate`` on these
records gives); since the set is the population, its drops are the realised ones. ``mc``:
``--draws`` times, ``--share`` of the set is drawn without replacement, both certify on the
draw, and the thresholds are judged on the whole set per group: mean skip share and drop
within the group, and *viol*, the share of draws whose drop within the group exceeds
epsilon. The per-group promise is family-wise: ``fw_viol`` (any group over epsilon) must be
at most delta; the one threshold's promise is ``overall_viol``; its per-group violation
rates show the group it hurts (it promised nothing there). Draw 0 of every configuration is
checked against ``calibrate()`` itself (threshold per group, and the one threshold).
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
from numpy.typing import NDArray

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibration_peers import ROOT, Pool, _run_pool, _thresholds, records_pool

from rag_gates._io import write_text_atomic
from rag_gates.calibration import CalibrationRecord, ModelIdentity, calibrate
from rag_gates.calibration.certify import Bound, certified_cut, cut_table
from rag_gates.calibration.groups import tested_groups

RELATIONS = ROOT.parent.parent / "tests" / "calibration" / "data" / "popqa_relations.json"
BOUND: Bound = "exact"
_MODEL = ModelIdentity(name="records", fingerprint="0" * 64)


def load_pools() -> list[Pool]:
    ev = ROOT / "eval"
    gates = ("answer-logprob", "first-token-prob", "quco", "cbdr")
    return [
        records_pool("sample-300", ROOT / "calibrate" / "sample-300" / "work" / "records.jsonl"),
        _run_pool("popqa-500", "benchmarks/results/eval/popqa-500 + gate-*-popqa",
                  {g: [ev / f"gate-{g}-popqa"] for g in gates}, [ev / "popqa-500"]),
    ]


def relations(path: Path = RELATIONS) -> dict[str, str]:
    return dict(json.loads(path.read_text(encoding="utf-8"))["relations"])


def write_relations(popqa_dev: Path, pools: list[Pool], out: Path = RELATIONS) -> None:
    """The relation of every question of ``pools`` from PopQA's ``prop`` (keyed as the
    records key a question: ``popqa-ROW`` and, for a row with a PopQA id, that id)."""
    keyed: dict[str, str] = {}
    for line in popqa_dev.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        prop = row.get("prop") or row.get("prop_inferred_from_template")
        if row.get("popqa_row_index") is not None:
            keyed[f"popqa-{row['popqa_row_index']}"] = prop
        if row.get("id"):
            keyed[str(row["id"])] = prop
    ids = sorted({i for p in pools for i in p.ids})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "source": "PopQA (Mallen et al., ACL 2023, MIT): the 'prop' field (the Wikidata "
                  "relation) of each row of the project's development file popqa_dev.jsonl, "
                  "keyed as the records key it: 'popqa-ROW' (popqa_row_index) and, for a "
                  "row with a PopQA id, that id (as rag_gates_lab.datasets names the "
                  "question). Covers the questions of benchmarks/results/calibrate/"
                  "sample-300 and benchmarks/results/eval/popqa-500; written by "
                  "benchmarks/calibration_by_group.py --relations-from popqa_dev.jsonl.",
        "relations": {i: keyed[i] for i in ids}}, indent=1, ensure_ascii=False) + "\n")


def pool_records(pool: Pool, groups: NDArray[np.str_]) -> list[CalibrationRecord]:
    """The pool as calibration records (for calibrate() itself), each with its group."""
    out = []
    for i, qid in enumerate(pool.ids):
        closed = bool(pool.closed[i])
        out.append(CalibrationRecord(
            id=qid, question=pool.questions[i], closed_book_correct=closed,
            retrieved_correct=bool(pool.closed[i] + pool.loss[i]), group=str(groups[i]),
            scores={g: None if math.isnan(s[i]) else float(s[i])
                    for g, s in pool.scores.items()}))
    return out


def _per_group(skipped: NDArray[np.bool_], loss: NDArray[np.float64],
               groups: NDArray[np.str_], names: list[str]) -> dict[str, dict[str, Any]]:
    """Per group: skip share and drop within the group of each draw's skips ((D, N))."""
    out = {}
    for g in names:
        rows = groups == g
        out[g] = {"skip": skipped[:, rows].mean(axis=1),
                  "drop": (skipped[:, rows] * loss[rows]).sum(axis=1) / rows.sum()}
    return out


def whole(records: list[CalibrationRecord], gate: str, epsilon: float, delta: float,
          groups: NDArray[np.str_], pool: Pool) -> dict[str, Any]:
    """Both certificates on every question of the set; drops within each group on it."""
    names = sorted(set(groups.tolist()))
    one = calibrate(records, max_loss=epsilon, delta=delta, bound=BOUND, model=_MODEL,
                    retriever="-", gates=[gate], composite=False, family_wise=False)
    row = one.row(gate)
    s = np.where(np.isnan(pool.scores[gate]), np.inf, pool.scores[gate])
    threshold = -np.inf if row.threshold is None else row.threshold
    by_one = _per_group((s < threshold)[None, :], pool.loss, groups, names)
    per = calibrate(records, max_loss=epsilon, delta=delta, bound=BOUND, model=_MODEL,
                    retriever="-", gates=[gate], family_wise=False, by_group=True)
    prow = per.row(gate)
    return {
        "one": {"threshold": row.threshold, "skip": row.observed_skip_rate,
                "certified_skip": row.certified_skip_rate, "drop": row.observed_drop,
                "groups": {g: {"skip": float(v["skip"][0]), "drop": float(v["drop"][0])}
                           for g, v in by_one.items()}},
        "per_group": {"skip": prow.observed_skip_rate, "certified_skip":
                      prow.certified_skip_rate, "drop": prow.observed_drop,
                      "tested": per.tested, "group_delta": per.group_delta,
                      "groups": {c.group: {"n": c.n, "threshold": c.threshold,
                                           "delta": c.delta, "skip": c.skip_rate.observed,
                                           "certified_skip": c.skip_rate.lower
                                           if c.certified else 0.0,
                                           "drop": c.observed_drop, "note": c.note}
                                 for c in prow.groups}}}


def monte_carlo(pool: Pool, groups: NDArray[np.str_], n: int, draws: int,
                epsilon: float, delta: float, seed: int) -> dict[str, Any]:
    """Every gate's one threshold and per-group thresholds on the same draws, judged on
    the pool per group."""
    names = sorted(set(groups.tolist()))
    rng = np.random.default_rng([seed, n, pool.size])
    cal = np.stack([rng.permutation(pool.size)[:n] for _ in range(draws)])
    cal_groups = groups[cal]
    # Which groups share delta in each draw, and at what share: from the sizes only.
    tested: list[set[str]] = []
    shares = np.zeros(draws)
    for d in range(draws):
        sizes = {g: int((cal_groups[d] == g).sum()) for g in names}
        kept = tested_groups({g: k for g, k in sizes.items() if k}, epsilon, delta)
        tested.append(set(kept))
        shares[d] = delta / len(kept) if kept else 0.0
    gates = list(pool.scores)
    # Per gate, per group: each draw's threshold (-inf: skip nothing).
    group_thresholds = {gate: {g: np.full(draws, -np.inf) for g in names} for gate in gates}
    for g in names:
        in_g = cal_groups == g
        sizes = in_g.sum(axis=1)
        keys = sorted({(int(sizes[d]), float(shares[d])) for d in range(draws)
                       if g in tested[d]})
        for size, share in keys:   # one exact table per (size, epsilon), shared by the gates
            take = np.array([d for d in range(draws) if g in tested[d]
                             and sizes[d] == size and shares[d] == share])
            rows = np.stack([cal[d][in_g[d]] for d in take])
            for gate in gates:
                pos, ok, ranked = cut_table(pool.scores[gate][rows])
                cut = certified_cut(pos, pool.loss[rows], ok, epsilon=epsilon, delta=share,
                                    bound=BOUND)
                group_thresholds[gate][g][take] = _thresholds(ranked, cut)
    out: dict[str, Any] = {}
    for gate in gates:
        s = np.where(np.isnan(pool.scores[gate]), np.inf, pool.scores[gate])
        pos, ok, ranked = cut_table(pool.scores[gate][cal])
        cut = certified_cut(pos, pool.loss[cal], ok, epsilon=epsilon, delta=delta, bound=BOUND)
        one_skipped = s[None, :] < _thresholds(ranked, cut)[:, None]
        one = _per_group(one_skipped, pool.loss, groups, names)
        one_drop = (one_skipped * pool.loss).sum(axis=1) / pool.size
        per_skipped = np.zeros((draws, pool.size), dtype=bool)
        for g in names:
            rows = groups == g
            per_skipped[:, rows] = s[None, rows] < group_thresholds[gate][g][:, None]
        per = _per_group(per_skipped, pool.loss, groups, names)
        per_any = np.zeros(draws, dtype=bool)
        for g in names:
            per_any |= per[g]["drop"] > epsilon + 1e-12
        out[gate] = {
            "one": {"overall_viol": float((one_drop > epsilon + 1e-12).mean()),
                    "skip": float(one_skipped.mean()), "drop": float(one_drop.mean()),
                    "groups": {g: _stats(v, epsilon) for g, v in one.items()}},
            "per_group": {"fw_viol": float(per_any.mean()), "skip": float(per_skipped.mean()),
                          "drop": float(((per_skipped * pool.loss).sum(axis=1)
                                         / pool.size).mean()),
                          "groups": {g: {**_stats(v, epsilon), "tested": float(np.mean(
                              [g in t for t in tested]))} for g, v in per.items()}}}
        _check_draw_zero(pool, groups, cal[0], gate, epsilon, delta,
                         {g: group_thresholds[gate][g][0] for g in names},
                         float(_thresholds(ranked, cut)[0]))
    return out


def _stats(v: dict[str, NDArray[np.float64]], epsilon: float) -> dict[str, float]:
    return {"skip": float(v["skip"].mean()), "drop": float(v["drop"].mean()),
            "viol": float((v["drop"] > epsilon + 1e-12).mean())}


def _check_draw_zero(pool: Pool, groups: NDArray[np.str_], rows: NDArray[np.int64], gate: str,
                     epsilon: float, delta: float, per: dict[str, float], one: float) -> None:
    """The vectorised thresholds of draw 0 are calibrate()'s own."""
    drawn = pool_records(pool, groups)
    records = [drawn[i] for i in rows]
    report = calibrate(records, max_loss=epsilon, delta=delta, bound=BOUND, model=_MODEL,
                       retriever="-", gates=[gate], family_wise=False, by_group=True)
    for c in report.row(gate).groups:
        expected = -np.inf if c.threshold is None else c.threshold
        assert per[c.group] == expected, (gate, c.group, per[c.group], expected)
    single = calibrate(records, max_loss=epsilon, delta=delta, bound=BOUND, model=_MODEL,
                       retriever="-", gates=[gate], composite=False, family_wise=False)
    threshold = single.row(gate).threshold
    assert one == (-np.inf if threshold is None else threshold), (gate, one, threshold)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.05, 0.1])
    parser.add_argument("--delta", type=float, default=0.1)
    parser.add_argument("--share", type=float, default=0.5,
                        help="n_cal as a share of each set (default: half)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--relations-from", type=Path, default=None,
                        help="rewrite the relation map from PopQA's development file first")
    parser.add_argument("--out", type=Path, default=ROOT / "calibration_by_group.json")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    pools = load_pools()
    if args.relations_from is not None:
        write_relations(args.relations_from, pools)
    relation = relations()
    result: dict[str, Any] = {
        "command": (f"python benchmarks/calibration_by_group.py --draws {args.draws} "
                    f"--epsilons {' '.join(map(str, args.epsilons))} --delta {args.delta} "
                    f"--share {args.share} --seed {args.seed} --out {args.out}"),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "numpy": np.__version__},
        "draws": args.draws, "delta": args.delta, "epsilons": args.epsilons,
        "bound": BOUND, "split": "bonferroni: delta / G over the G groups with enough "
                                 "questions (rag_gates.calibration.groups)",
        "groups": "PopQA relation (tests/calibration/data/popqa_relations.json)",
        "pools": {}}
    for pool in pools:
        groups = np.array([relation[i] for i in pool.ids])
        records = pool_records(pool, groups)
        n = int(pool.size * args.share)
        t0 = time.perf_counter()
        entry: dict[str, Any] = {
            "size": pool.size, "n_cal": n, "source": pool.source,
            "groups": {g: int((groups == g).sum()) for g in sorted(set(groups.tolist()))},
            "epsilons": {}}
        for eps in args.epsilons:
            mc = monte_carlo(pool, groups, n, args.draws, eps, args.delta, args.seed)
            entry["epsilons"][str(eps)] = {
                gate: {"whole": whole(records, gate, eps, args.delta, groups, pool),
                       "mc": mc[gate]} for gate in pool.scores}
        entry["seconds"] = time.perf_counter() - t0
        result["pools"][pool.name] = entry
        print(f"{pool.name}: n={n}, {entry['seconds']:.1f} s", flush=True)
    result["wall_s"] = time.perf_counter() - start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps(result, indent=1) + "\n")
    print(table(result))
    return result


def table(result: dict[str, Any]) -> str:
    """The docs' table: per set, epsilon, gate and group, the one threshold against the
    per-group thresholds (certified on the whole set, then the Monte-Carlo)."""
    pct = "{:.1f}".format
    lines = [
        "| set | eps | gate | group (N) | one: skip / drop in group (whole) | one: viol in "
        "group (MC) | per group: skip / drop (whole) | per group: skip / drop / viol (MC) |",
        "|---|---|---|---|---|---|---|---|"]
    notes = []
    for name, entry in result["pools"].items():
        for eps, gates in entry["epsilons"].items():
            for gate, cell in gates.items():
                w, mc = cell["whole"], cell["mc"]
                for g, size in entry["groups"].items():
                    wo, wp = w["one"]["groups"][g], w["per_group"]["groups"][g]
                    mo, mp = mc["one"]["groups"][g], mc["per_group"]["groups"][g]
                    lines.append(
                        f"| {name} | {eps} | {gate} | {g} ({size}) | "
                        f"{pct(100 * wo['skip'])}% / {100 * wo['drop']:+.1f} | "
                        f"{mo['viol']:.3f} | {pct(100 * wp['skip'])}% / "
                        f"{100 * wp['drop']:+.1f} | {pct(100 * mp['skip'])}% / "
                        f"{100 * mp['drop']:+.1f} / {mp['viol']:.3f} |")
                notes.append(f"{name} eps {eps} {gate}: one threshold overall viol "
                             f"{mc['one']['overall_viol']:.3f}, per-group family-wise viol "
                             f"{mc['per_group']['fw_viol']:.3f}; skip (MC) one "
                             f"{pct(100 * mc['one']['skip'])}% vs per group "
                             f"{pct(100 * mc['per_group']['skip'])}%")
    return "\n".join([*lines, "", *notes])


if __name__ == "__main__":
    main()
