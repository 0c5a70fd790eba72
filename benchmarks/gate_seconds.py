"""Seconds per decision of our model gates beside LM-Polygraph's, in one process (issue 57).

The estimator table (docs/benchmarks.md) times LM-Polygraph's estimators inside
``polygraph_gates.py``'s shared run; this times whole decisions, ``gate.decide(question)``,
of our gates and of LM-Polygraph gates side by side on the same questions, the same model
object and one thread, so the ratios hold on a shared, noisy machine. Each question runs
every gate in turn (the order rotates per question, so no gate always runs first or after
the same neighbour); the first question is a warm-up and is not counted.

Runs in the venv with lm-polygraph (``bash benchmarks/envs/polygraph.sh``), under a model
slot::

    PYTHONPATH=. model-slot /work/polyvenv/bin/python benchmarks/gate_seconds.py \\
        --n 30 --out benchmarks/results/polygraph/gate-seconds.json

Gates: ours by name through the registry (``first-token-prob``, ``answer-logprob``,
``cbdr`` with the shipped probe, ``sample-agreement`` with 5 samples), and
:class:`rag_gates.peers.PolygraphGate` over ``Perplexity`` (one greedy answer),
``PTrue`` (the answer and one more pass) and ``Eccentricity`` (Jaccard, 10 samples), at the
settings of the estimator table (32 new tokens, seed 0). Written: per gate the median and
mean seconds, and the median of the per-question ratios to ``polygraph-Perplexity`` (the
single-answer estimators' common cost in the table).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT / "examples" / "data" / "calibration_questions.jsonl"
BASELINE = "polygraph-Perplexity"
OURS = ("first-token-prob", "answer-logprob", "cbdr", "sample-agreement")


def build_gates(lm: Any, max_new_tokens: int) -> dict[str, Any]:
    """Our gates by name (the registry, as calibrate builds them) and three LM-Polygraph
    gates, keyed by the name the table uses."""
    from lm_polygraph.estimators import Eccentricity

    from rag_gates.peers import PolygraphGate
    from rag_gates.registry import GateContext, make_gate

    ctx = GateContext(lm=lm, max_new_tokens=max_new_tokens)
    gates: dict[str, Any] = {name: make_gate(name, ctx) for name in OURS}
    for name, estimator in (("Perplexity", "Perplexity"), ("PTrue", "PTrue"),
                            ("Eccentricity_Jaccard_score",
                             Eccentricity(similarity_score="Jaccard_score"))):
        gates[f"polygraph-{name}"] = PolygraphGate(lm, estimator, threshold=0.0, samples=10,
                                                   seed=0, max_new_tokens=max_new_tokens)
    return gates


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--n", type=int, default=30, help="questions timed (after 1 warm-up)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    import torch

    from rag_gates.lm import load_default_lm
    from rag_gates.lm.defaults import DEFAULT_LM_ID

    torch.set_num_threads(1)
    rows = [json.loads(line) for line in args.data.read_text().splitlines() if line.strip()]
    questions = [r["question"] for r in rows[: args.n + 1]]
    lm = load_default_lm()
    gates = build_gates(lm, args.max_new_tokens)
    names = list(gates)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for i, question in enumerate(questions):
        order = names[i % len(names):] + names[: i % len(names)]
        for name in order:
            start = time.perf_counter()
            gates[name].decide(question)
            if i > 0:  # the first question warms the model up
                seconds[name].append(time.perf_counter() - start)
        print(f"[{i}/{len(questions) - 1}] " + " ".join(
            f"{n}={seconds[n][-1]:.2f}" for n in names if seconds[n]), file=sys.stderr)
    base = seconds[BASELINE]
    summary = {
        name: {"median_seconds": statistics.median(v), "mean_seconds": statistics.fmean(v),
               "median_ratio_to_" + BASELINE: statistics.median(
                   s / b for s, b in zip(v, base, strict=True))}
        for name, v in seconds.items()}
    payload = {
        "command": f"PYTHONPATH=. model-slot /work/polyvenv/bin/python "
                   f"benchmarks/gate_seconds.py --n {args.n} --out {args.out}",
        "date": dt.date.today().isoformat(), "machine": platform.platform(),
        "model": DEFAULT_LM_ID, "threads": 1, "questions": len(questions) - 1,
        "max_new_tokens": args.max_new_tokens, "baseline": BASELINE,
        "gates": summary, "seconds": seconds,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    for name, row in summary.items():
        print(f"{name:32s} median {row['median_seconds']:.3f} s  "
              f"x{row['median_ratio_to_' + BASELINE]:.2f}")


if __name__ == "__main__":
    main()
