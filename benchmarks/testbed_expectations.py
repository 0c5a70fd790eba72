"""The per-rung figures the pre-registered expectations of a testbed are judged by
(benchmarks/results/testbed/LOG.md, "tb12: what each paper predicts"), from the committed outputs of
``benchmarks/testbed_steps.sh``'s steps; no model runs.

    .venv/bin/python benchmarks/testbed_expectations.py --tb tb12 \\
        --testbed ~/.cache/rag-gates/testbeds/tb12 \\
        --out benchmarks/results/testbed/expectations-tb12.json

* ``gates``: per gate of the gates step, the share of evaluation facts it retrieves for at
  each rung, at the threshold calibrated on the calibration facts (``cal-GATE/gate.json``,
  retrieve when score >= threshold), and ``rung_auroc``: how well its score ranks the lowest
  rung's facts above the top rung's (1 = every r = 0 fact scores above every top-rung fact).
* ``runs``: per method of the end-to-end runs (``e2e-TB``, ``srrag-TB/e2e``), accuracy and the
  share of questions with a retrieval at each rung (for SR-RAG: the rest were verbalized).
* ``deeprag``: per DeepRAG run on the two-hop questions (``deeprag-TB/twohop``,
  ``twohop-sft``), the share of steps that retrieved, by the rung of the hop each step asks
  about (matched by :func:`rag_gates_lab.boundary.hop_of`, as the per-subquery MCC is).
* ``srrag``: on the evaluation facts' SR-RAG labels (``srrag-TB/labels-eval.jsonl``), the share
  preferring retrieval at each rung and ``rung_auroc``: how well a low rung alone ranks
  "retrieval better" (what a router that knew each fact's rung would reach); per routing
  gate of ``srrag-TB/routing-auroc.json``, its AUROC on the labels and its ``rung_auroc``
  (its score ranking the lowest rung's facts above the top rung's).

A missing input leaves its part out (``missing`` lists it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rag_gates._io import write_text_atomic
from rag_gates_lab.boundary import hop_of
from rag_gates_lab.metrics import auroc
from rag_gates_lab.runner import read_records
from rag_gates_lab.testbed.dataset import twohop_hops

ROOT = Path(__file__).resolve().parent.parent
R = ROOT / "benchmarks" / "results" / "testbed"
GATES = ("first-token-prob", "answer-logprob", "quco", "cbdr")


def _pct(values: Sequence[float]) -> float | None:
    return round(100 * statistics.fmean(values), 1) if values else None


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.open(encoding="utf-8") if line.strip()]


def rung_auroc(scores: dict[str, float], rung_of: dict[str, int]) -> float:
    """How well ``scores`` rank the lowest rung's facts above the top rung's (rounded)."""
    rungs = sorted(set(rung_of.values()))
    ends = [(x, int(rung_of[i] == rungs[0])) for i, x in scores.items()
            if rung_of.get(i) in (rungs[0], rungs[-1])]
    return round(auroc([x for x, _ in ends], [y for _, y in ends]), 3)


def gate_rungs(gates_dir: Path, rung_of: dict[str, int]) -> dict[str, Any]:
    """Per gate: retrieval share by rung at the calibrated threshold, and the rung AUROC."""
    out: dict[str, Any] = {}
    rungs = sorted(set(rung_of.values()))
    for gate in GATES:
        decisions = gates_dir / gate / "decisions.jsonl"
        cal = gates_dir / f"cal-{gate}" / "gate.json"
        if not decisions.is_file() or not cal.is_file():
            continue
        threshold = float(json.loads(cal.read_text())["threshold"])
        scores = {r["id"]: float(r["score"]) for r in _jsonl(decisions) if r["id"] in rung_of}
        by_rung = {str(k): _pct([float(s >= threshold) for i, s in scores.items()
                                 if rung_of[i] == k]) for k in rungs}
        out[gate] = {"threshold": threshold, "retrieval_by_rung": by_rung,
                     "rung_auroc": rung_auroc(scores, rung_of)}
    return out


def run_rungs(run: Path) -> dict[str, Any]:
    """Per method of a bench run on testbed facts: accuracy and retrieval share by rung."""
    cells: dict[str, dict[int, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for r in read_records(run):
        cells[r.method][int(r.meta["repetitions"])].append(r)
    return {method: {"accuracy_by_rung": {str(k): _pct([x.accuracy for x in v])
                                          for k, v in sorted(by.items())},
                     "retrieval_by_rung": {str(k): _pct([float(x.retrievals > 0) for x in v])
                                           for k, v in sorted(by.items())}}
            for method, by in cells.items()}


def deeprag_hop_rungs(run: Path, testbed: Path) -> dict[str, Any]:
    """Per DeepRAG method of a two-hop run: share of steps that retrieved, by the rung of the
    hop the step asks about (steps naming neither hop are counted apart)."""
    hops = twohop_hops(testbed)
    steps: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    unmatched: dict[str, int] = defaultdict(int)
    for r in read_records(run):
        events = (r.trace or {}).get("events") or []
        note = next((e for e in reversed(events)
                     if e.get("kind") == "note" and e.get("name") == "trajectory"), None)
        row = hops.get(r.id)
        if note is None or row is None:
            continue
        rungs = list(r.meta["repetitions"])
        for step in note["data"]["steps"]:
            hop = hop_of(str(step["subquery"]), [subject for _, subject in row])
            if hop is None:
                unmatched[r.method] += 1
                continue
            steps[r.method][int(rungs[hop])].append(float(bool(step["retrieve"])))
    return {method: {"retrieval_by_hop_rung": {str(k): _pct(v) for k, v in sorted(by.items())},
                     "steps_by_hop_rung": {str(k): len(v) for k, v in sorted(by.items())},
                     "unmatched_steps": unmatched[method]}
            for method, by in steps.items()}


def srrag_label_rungs(labels: Path, routing: Path | None,
                      rung_of: dict[str, int]) -> dict[str, Any]:
    """The SR-RAG labels' preference by rung, and each routing gate's AUROC and decisions."""
    rows = [r for r in _jsonl(labels) if "header" not in r and r["id"] in rung_of]
    rungs = sorted({rung_of[r["id"]] for r in rows})
    prefers = {r["id"]: float(r["source"] == "retrieval") for r in rows}
    out: dict[str, Any] = {
        "questions": len(rows),
        "retrieval_preferred_by_rung": {str(k): _pct([y for i, y in prefers.items()
                                                      if rung_of[i] == k]) for k in rungs},
        # A lower rung should mean "retrieval better": score each fact by minus its rung.
        "rung_auroc": round(auroc([-float(rung_of[i]) for i in prefers],
                                  [int(y) for y in prefers.values()]), 3),
        "gates": {},
    }
    if routing is None:
        return out
    report = json.loads(routing.read_text())
    ids = [str(i) for _, i in report["ids"]]
    for gate, g in report["gates"].items():
        scores = dict(zip(ids, (float(x) for x in g["scores"]), strict=True))
        out["gates"][gate] = {"auroc": round(float(g["auroc"]), 3),
                              "rung_auroc": rung_auroc(scores, rung_of)}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tb", required=True, help="the build's name (tb12)")
    parser.add_argument("--testbed", type=Path, required=True, help="its directory")
    parser.add_argument("--results", type=Path, default=R,
                        help="benchmarks/results/testbed (where the steps wrote)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    testbed, res, tb = args.testbed.expanduser(), args.results, args.tb
    manifest = _jsonl(testbed / "manifest.jsonl")
    rung_of = {f["id"]: int(f["repetitions"]) for f in manifest if f["split"] == "evaluation"}
    payload: dict[str, Any] = {"date": dt.date.today().isoformat(), "tb": tb, "missing": []}
    gates = gate_rungs(res / f"gates-{tb}", rung_of)
    payload["gates"] = gates
    payload["missing"] += [g for g in GATES if g not in gates]
    payload["runs"] = {}
    for name in (f"e2e-{tb}", f"srrag-{tb}/e2e"):
        if (res / name / "results.jsonl").is_file():
            payload["runs"][name] = run_rungs(res / name)
        else:
            payload["missing"].append(name)
    payload["deeprag"] = {}
    for name in (f"deeprag-{tb}/twohop", f"deeprag-{tb}/twohop-sft"):
        if (res / name / "results.jsonl").is_file():
            payload["deeprag"][name] = deeprag_hop_rungs(res / name, testbed)
        else:
            payload["missing"].append(name)
    labels = res / f"srrag-{tb}" / "labels-eval.jsonl"
    routing = res / f"srrag-{tb}" / "routing-auroc.json"
    if labels.is_file():
        payload["srrag"] = srrag_label_rungs(labels, routing if routing.is_file() else None,
                                             rung_of)
    else:
        payload["missing"].append(f"srrag-{tb}/labels-eval")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps(payload, indent=2) + "\n")
    return payload


if __name__ == "__main__":
    main()
