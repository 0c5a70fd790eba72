"""What the CBDR gate costs on its skip path, against plain generation of the same answer.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cbdr_cost.py \\
        --out benchmarks/results/cbdr_cost.json

For each of ``--n`` PopQA questions (rows 0..n-1), three ways to produce the closed-book
answer (greedy, ``--max-new-tokens``), run back to back in a rotating order so drift on a
shared machine hits all three alike:

* ``plain``: ``lm.generate(qa_prompt)``;
* ``gated``: ``CBDRGate.prefill`` (one pass gives hidden state, confidence and the cache) then
  ``ProbedQuestion.generate`` (beta = 0, so every question takes the skip path);
* ``two-pass``: the naive gate: ``probe.confidence(q)`` in its own forward pass, then
  ``lm.generate`` (what the cache reuse avoids).

Reported: the median over questions of each way's time divided by ``plain``'s time on the
same question (target for ``gated``: <= 1.05), and the answers' agreement with ``plain``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from rag_gates.cbdr import CBDRGate, load_default_probe
from rag_gates.lm import load_default_lm
from rag_gates_lab.datasets import load_dataset

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=60)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/cbdr_cost.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lm = load_default_lm()
    probe = load_default_probe(lm)
    gate = CBDRGate(lm, probe, beta=0.0)
    questions = [e.question for e in load_dataset("popqa", n=args.n).examples]
    budget = args.max_new_tokens

    def plain(q: str) -> str:
        return lm.generate(probe.prompts.qa(q), max_new_tokens=budget).text

    def gated(q: str) -> str:
        return gate.prefill(q, max_new_tokens=budget).generate(max_new_tokens=budget).text

    def two_pass(q: str) -> str:
        probe.confidence(lm, [q])
        return lm.generate(probe.prompts.qa(q), max_new_tokens=budget).text

    ways = {"plain": plain, "gated": gated, "two-pass": two_pass}
    plain(questions[0])  # warm-up
    times: dict[str, list[float]] = {w: [] for w in ways}
    same: dict[str, int] = {w: 0 for w in ways}
    names = list(ways)
    for i, q in enumerate(questions):
        answers = {}
        for name in names[i % 3:] + names[: i % 3]:
            start = time.perf_counter()
            answers[name] = ways[name](q)
            times[name].append(time.perf_counter() - start)
        for name in ways:
            same[name] += int(answers[name] == answers["plain"])
    ratios = {name: statistics.median(t / p for t, p in zip(times[name], times["plain"],
                                                             strict=True))
              for name in ways}
    payload = {
        "command": f"OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cbdr_cost.py --n {args.n} "
                   f"--max-new-tokens {budget}",
        "date": dt.date.today().isoformat(), "machine": platform.platform(),
        "model": lm.model_id, "questions": len(questions),
        "median_seconds": {n: round(statistics.median(t), 4) for n, t in times.items()},
        "median_ratio_to_plain": {n: round(r, 3) for n, r in ratios.items()},
        "answers_identical_to_plain": {n: f"{same[n]}/{len(questions)}" for n in ways},
        "probe_training": {k: probe.config.metrics.get(k)
                           for k in ("train_seconds", "collect_seconds", "dev_auroc")},
    }
    args.out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
