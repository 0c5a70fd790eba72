"""Our ``p-true`` and ``p-true-sampling`` gates on the PopQA calibration sample (issue 57,
item 4): the scores the estimator table joins beside LM-Polygraph's ``PTrue`` /
``PTrueSampling``, and their seconds per decision beside ``answer-logprob``'s in the same run.

    OMP_NUM_THREADS=1 model-slot .venv/bin/python benchmarks/p_true_gates.py \\
        --out benchmarks/results/polygraph/p-true-popqa-calibration.jsonl

Per question (one JSON line, appended as it is done; a rerun skips the ids in ``--out``):
``scores`` (each gate's ``-log p("True")``, ``"nan"`` when undecided), ``seconds`` (each
gate's whole ``decide``, timed one after the other on one thread), ``closed_book_answer``
(the greedy answer the gates judged, from ``p-true``'s evidence; ``polygraph_table.py``
checks it against calibrate's records) and ``p_true_samples`` (the sampled answers). The
gates are built by name through the registry with their defaults (``p-true-sampling``: 10
samples at temperature 1.0, seed 0), the estimator table's 32 new tokens.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT / "examples" / "data" / "calibration_questions.jsonl"
GATES = ("p-true", "p-true-sampling", "answer-logprob")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args(argv)

    import torch

    from rag_gates.lm import load_default_lm
    from rag_gates.registry import GateContext, make_gate

    torch.set_num_threads(1)
    rows = [json.loads(line) for line in args.data.read_text().splitlines() if line.strip()]
    rows = rows[: args.limit] if args.limit else rows
    done = set()
    if args.out.exists():
        done = {json.loads(line)["id"] for line in args.out.read_text().splitlines() if line}
    lm = load_default_lm()
    ctx = GateContext(lm=lm, max_new_tokens=args.max_new_tokens)
    gates = {name: make_gate(name, ctx) for name in GATES}
    todo = [r for r in rows if r["id"] not in done]
    print(f"{len(done)} done, {len(todo)} to go", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as out:
        for k, row in enumerate(todo):
            scores: dict[str, float | str] = {}
            seconds: dict[str, float] = {}
            evidence = {}
            for name, gate in gates.items():
                start = time.perf_counter()
                decision = gate.decide(row["question"])
                seconds[name] = time.perf_counter() - start
                value = decision.score
                scores[name] = value if value is not None and math.isfinite(value) else "nan"
                evidence[name] = decision.evidence
            line = {"id": row["id"], "question": row["question"],
                    "closed_book_answer": evidence["p-true"].get("closed_book_answer"),
                    "p_true_samples": evidence["p-true-sampling"].get("samples"),
                    "scores": {n: scores[n] for n in ("p-true", "p-true-sampling")},
                    "seconds": seconds}
            out.write(json.dumps(line) + "\n")
            out.flush()
            print(f"[{k + 1}/{len(todo)}] {row['id']} " + " ".join(
                f"{n}={seconds[n]:.1f}s" for n in GATES), file=sys.stderr)


if __name__ == "__main__":
    main()
