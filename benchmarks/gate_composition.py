"""Composed gates on the embedded model: AUROC, accuracy vs retrieval rate, and the calls a
cascade saves, from the committed ``eval-gate`` decisions (no new model runs).

    .venv/bin/python benchmarks/gate_composition.py --out benchmarks/results/gate_composition

Every gate's decisions come from ``benchmarks/results/eval/gate-<gate>-<dataset>/`` and the
labels (closed-book and single-retrieval correctness per question) from the bench runs
``popqa-500`` and ``hotpotqa-200``. A replaying gate returns each question's recorded score
(and recorded latency), and the composites of :mod:`rag_gates.gate` run over them, so what
is measured is the composition itself.

Rows (never tune on evaluation rows):

* PopQA: evaluation rows = the first 200 questions; calibration rows = the other 300
  (sub-gate thresholds, cascade bands, the weighted fit and its threshold).
* HotpotQA: only 200 questions have decisions, so two folds (even / odd positions): each
  fold is calibrated on the other, and the evaluation figures pool both folds'
  out-of-fold decisions.

Sub-gate thresholds: each gate's best-accuracy threshold on the calibration rows. Votes
(``&``, ``|``) combine margins (score - threshold); a cascade's band holds the 25% or 50% of
calibration scores of the cheap gate nearest its threshold. AUROC is for "closed-book answer
wrong"; for votes it uses every gate's margin (no short-circuit), while calls and latency
count what the short-circuited gate consults.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rag_gates._io import write_text_atomic
from rag_gates.gate import AllOf, AnyOf, BaseGate, Cascade, Gate, Weighted
from rag_gates.types import GateDecision
from rag_gates_lab.compose import cascade_band, fit_weighted
from rag_gates_lab.gate_eval import calibrate, threshold_curve
from rag_gates_lab.metrics import auroc
from rag_gates_lab.report import pareto_front
from rag_gates_lab.runner import read_records

RESULTS = Path(__file__).resolve().parent / "results" / "eval"
GATES = ("quco", "cbdr", "answer-logprob", "first-token-prob")
#: Cheap to expensive: corpus counts (no model), one forward pass, a greedy answer.
CASCADES = (("quco", "cbdr"), ("quco", "answer-logprob"), ("cbdr", "answer-logprob"))
SHARES = (0.25, 0.5)


class Replay(BaseGate):
    """Answers with the recorded decision's score, evidence-free, at its recorded latency."""

    def __init__(self, name: str, rows: dict[str, dict[str, Any]], threshold: float) -> None:
        super().__init__(threshold)
        self.name, self.rows = name, rows
        self.calls = 0

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, Any]]:
        return float(self.rows[query]["score"]), {}

    def decide(self, query: str, **signals: Any) -> GateDecision:
        self.calls += 1
        value, evidence = self.score(query)
        return self.decision(value, evidence, latency_ms=float(self.rows[query]["latency_ms"]))


def load(runs: dict[str, Path], labels: Path
         ) -> tuple[list[str], dict[str, dict[str, dict[str, Any]]],
                    dict[str, tuple[float, float]]]:
    """Question ids (in dataset order), each gate's recorded decisions by id, and each
    question's (closed-book, single-retrieval) accuracy; ``runs``: gate -> eval-gate dir."""
    records = {(r.id, r.method): r for r in read_records(labels)}
    decisions: dict[str, dict[str, dict[str, Any]]] = {}
    order: list[str] = []
    for gate, run in runs.items():
        rows = [json.loads(x) for x in (run / "decisions.jsonl").read_text().splitlines()]
        decisions[gate] = {r["id"]: r for r in rows}
        order = order or [r["id"] for r in rows]
    ids = [i for i in order if all(i in decisions[g] for g in runs)
           and (i, "no-rag") in records and (i, "single") in records]
    outcomes = {i: (records[(i, "no-rag")].accuracy, records[(i, "single")].accuracy)
                for i in ids}
    return ids, decisions, outcomes


def _committed(dataset: str) -> dict[str, Path]:
    return {g: RESULTS / f"gate-{g}-{dataset}" for g in GATES}


def build(calibration: Sequence[str], decisions: dict[str, dict[str, dict[str, Any]]],
          outcomes: dict[str, tuple[float, float]]) -> dict[str, tuple[Gate, list[Replay]]]:
    """Every gate and composite, calibrated on ``calibration`` rows."""
    closed = [outcomes[i][0] for i in calibration]
    retrieved = [outcomes[i][1] for i in calibration]

    def replay(name: str) -> Replay:
        scores = [float(decisions[name][i]["score"]) for i in calibration]
        threshold = calibrate(threshold_curve(scores, closed, retrieved), None).threshold
        return Replay(name, decisions[name], threshold)

    out: dict[str, tuple[Gate, list[Replay]]] = {}
    for g in GATES:
        r = replay(g)
        out[g] = (r, [r])
    for a, b in CASCADES:
        for joiner, cls in (("&", AllOf), ("|", AnyOf)):
            subs = [replay(a), replay(b)]
            out[f"{a}{joiner}{b}"] = (cls(*subs), subs)
        for share in SHARES:
            cheap, expensive = replay(a), replay(b)
            band = cascade_band([float(decisions[a][i]["score"]) for i in calibration],
                                cheap.threshold, share)
            out[f"cascade({a},{b},{int(share * 100)}%)"] = (
                Cascade(cheap, expensive, band), [cheap, expensive])
    for names in (("quco", "cbdr", "answer-logprob"), GATES):
        subs = [replay(n) for n in names]
        fit = fit_weighted(list(names), [[float(decisions[n][i]["score"]) for i in calibration]
                                         for n in names], closed, retrieved)
        gate = Weighted(subs, fit["weights"], fit["bias"], center=fit["center"],
                        scale=fit["scale"], threshold=fit["threshold"])
        out[f"weighted({','.join(names)})"] = (gate, subs)
    return out


def full_score(gate: Gate, query: str) -> float:
    """The score used for AUROC: votes over every gate's margin (no short-circuit)."""
    if isinstance(gate, AllOf | AnyOf):
        return type(gate)(*gate.gates, short_circuit=False).decide(query).score
    return gate.decide(query).score


def evaluate(rows: Sequence[str], gates: dict[str, tuple[Gate, list[Replay]]],
             outcomes: dict[str, tuple[float, float]]) -> dict[str, dict[str, Any]]:
    """Per gate: the decisions (short-circuited), the AUROC scores and the calls, on rows."""
    out: dict[str, dict[str, Any]] = {}
    for name, (gate, subs) in gates.items():
        for s in subs:
            s.calls = 0
        decisions = [gate.decide(i) for i in rows]
        calls = {s.name: s.calls for s in subs}
        latency = [_consulted_latency(d) for d in decisions]
        scores = [full_score(gate, i) for i in rows]
        out[name] = {"retrieve": [d.retrieve for d in decisions], "scores": scores,
                     "calls": calls, "latency_ms": latency}
    return out


def _consulted_latency(d: GateDecision) -> float:
    subs = d.evidence.get("decisions")
    if subs is None and "cheap" in d.evidence:
        subs = [x for x in (d.evidence["cheap"], d.evidence["expensive"]) if x]
    if not subs:
        return d.latency_ms
    return sum(float(s["latency_ms"]) for s in subs)  # type: ignore[index,arg-type]


def summarise(rows: Sequence[str], results: dict[str, dict[str, Any]],
              outcomes: dict[str, tuple[float, float]]) -> dict[str, Any]:
    closed = [outcomes[i][0] for i in rows]
    retrieved = [outcomes[i][1] for i in rows]
    wrong = [int(c == 0.0) for c in closed]
    table: dict[str, Any] = {}
    for name, r in results.items():
        acc = sum(s if u else c for u, s, c in zip(r["retrieve"], retrieved, closed,
                                                   strict=True)) / len(rows)
        curve = threshold_curve(r["scores"], closed, retrieved)
        table[name] = {
            "auroc": auroc(r["scores"], wrong),
            "accuracy": acc, "retrieval_rate": sum(r["retrieve"]) / len(rows),
            "calls_per_question": {g: c / len(rows) for g, c in r["calls"].items()},
            "median_latency_ms": statistics.median(r["latency_ms"]),
            "mean_latency_ms": statistics.fmean(r["latency_ms"]),
            "curve": [[p.retrieval_rate, p.accuracy] for p in curve],
        }
    front = pareto_front([(n, t["retrieval_rate"], t["accuracy"]) for n, t in table.items()]
                         + [("no-rag", 0.0, sum(closed) / len(rows)),
                            ("single", 1.0, sum(retrieved) / len(rows))])
    return {"questions": len(rows), "closed_book_accuracy": sum(closed) / len(rows),
            "single_accuracy": sum(retrieved) / len(rows),
            "wrong_without_retrieval": sum(wrong) / len(rows), "gates": table,
            "pareto_front_at_calibrated_points": front}


def _pooled(parts: Sequence[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    merged: dict[str, dict[str, Any]] = {}
    for part in parts:
        for name, r in part.items():
            m = merged.setdefault(name, {"retrieve": [], "scores": [], "calls": {},
                                         "latency_ms": []})
            for key in ("retrieve", "scores", "latency_ms"):
                m[key] += r[key]
            for g, c in r["calls"].items():
                m["calls"][g] = m["calls"].get(g, 0) + c
    return merged


def run_dataset(dataset: str, labels: str) -> dict[str, Any]:
    ids, decisions, outcomes = load(_committed(dataset), RESULTS / labels)
    if dataset == "popqa":
        evaluation, calibration = ids[:200], ids[200:]
        results = evaluate(evaluation, build(calibration, decisions, outcomes), outcomes)
        protocol = f"evaluation rows = first 200; calibration rows = the other {len(calibration)}"
        rows = evaluation
    else:
        folds = [ids[0::2], ids[1::2]]
        results = _pooled([evaluate(folds[k], build(folds[1 - k], decisions, outcomes),
                                    outcomes) for k in (0, 1)])
        rows = folds[0] + folds[1]
        protocol = "two folds (even/odd positions), each calibrated on the other; pooled"
    return {"protocol": protocol, **summarise(rows, results, outcomes)}


def run_testbed(directory: Path) -> dict[str, Any]:
    """A testbed's gates: evaluation facts in ``DIR/<gate>`` (labels ``DIR/labels``),
    calibration facts in ``DIR/cal-<gate>`` (labels ``DIR/cal-labels``)."""
    evaluation, decisions, outcomes = load({g: directory / g for g in GATES},
                                           directory / "labels")
    calibration, cal_decisions, cal_outcomes = load({g: directory / f"cal-{g}" for g in GATES},
                                                    directory / "cal-labels")
    if set(evaluation) & set(calibration):
        raise SystemExit("the testbed's evaluation and calibration facts overlap")
    for g in GATES:
        decisions[g].update(cal_decisions[g])
    outcomes.update(cal_outcomes)
    results = evaluate(evaluation, build(calibration, decisions, outcomes), outcomes)
    return {"protocol": f"evaluation facts ({len(evaluation)}); calibration facts "
                        f"({len(calibration)}) for every threshold, band and fit",
            **summarise(evaluation, results, outcomes)}


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(report["datasets"]), figsize=(6 * len(report["datasets"]), 4.5),
                             squeeze=False)
    for ax, (dataset, data) in zip(axes[0], report["datasets"].items(), strict=True):
        best = sorted(data["gates"].items(), key=lambda kv: -kv[1]["auroc"])[:5]
        for name, t in best:
            xs, ys = zip(*sorted(t["curve"]), strict=True)
            ax.plot(xs, ys, label=f"{name} (AUROC {t['auroc']:.2f})")
            ax.scatter([t["retrieval_rate"]], [t["accuracy"]], s=18)
        ax.axhline(data["single_accuracy"], ls="--", c="grey", lw=0.8)
        ax.set_title(f"{dataset}: accuracy vs retrieval rate (top 5 by AUROC)")
        ax.set_xlabel("retrieval rate")
        ax.set_ylabel("accuracy")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gate_composition"))
    parser.add_argument("--testbed", type=Path, default=None,
                        help="A testbed's eval-gate directory (gates-tbN: <gate>/, cal-<gate>/, "
                             "labels/, cal-labels/) instead of the embedded model's runs.")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/gate_composition.py --out " + str(args.out)
    if args.testbed is not None:
        model = f"testbed model ({args.testbed.name})"
        datasets = {"testbed": run_testbed(args.testbed)}
        command += f" --testbed {args.testbed}"
    else:
        model = "embedded SmolLM2-135M-Instruct"
        datasets = {"popqa": run_dataset("popqa", "popqa-500"),
                    "hotpotqa": run_dataset("hotpotqa", "hotpotqa-200")}
    report = {"command": command, "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
              "machine": platform.platform(), "model": model, "datasets": datasets}
    write_text_atomic(args.out / "gate_composition.json", json.dumps(report, indent=1))
    plot(report, args.out / "gate_composition.png")
    for dataset, data in report["datasets"].items():
        print(f"\n{dataset} ({data['questions']} questions; closed "
              f"{data['closed_book_accuracy']:.3f}, single {data['single_accuracy']:.3f}): "
              f"{data['protocol']}")
        print(f"{'gate':44s} AUROC  acc   rate  calls/q                      lat ms")
        for name, t in data["gates"].items():
            calls = " ".join(f"{g}:{c:.2f}" for g, c in t["calls_per_question"].items())
            print(f"{name:44s} {t['auroc']:.3f} {t['accuracy']:.3f} {t['retrieval_rate']:.2f} "
                  f"{calls:28s} {t['median_latency_ms']:.1f}")
        print("front:", ", ".join(data["pareto_front_at_calibrated_points"]))


if __name__ == "__main__":
    main()
