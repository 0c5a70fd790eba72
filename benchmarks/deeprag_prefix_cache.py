"""What prompt-prefix reuse saves DeepRAG's data synthesis (Algorithm 1) and its loop.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/deeprag_prefix_cache.py --n 6 \\
        --out benchmarks/results/deeprag_prefix_cache.json

For ``--n`` HotpotQA training rows (offset ``--offset``, 900: beyond the rows the synthesis
run uses), each question is searched twice with the embedded model, once with the prefix
cache (256 MB) and once without, in alternating order (so drift on a shared machine hits both
alike), with the synthesis settings (one-shot prompt, 48 expansions, BM25 top 3). Reported:
per question the seconds of each and whether both searches ended alike (status, expansions,
the trajectory found: its rendered text and its decisions); the median of the per-question
time ratios (cached / plain) and the ratio of the total times; the share of prompt tokens
the cache reused.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from rag_gates.deeprag.agent import DeepRAGConfig
from rag_gates.deeprag.search import TrajectorySearch
from rag_gates.deeprag.trajectory import DEMONSTRATION, DeepRAGPrompt
from rag_gates.lm import load_default_lm
from rag_gates_lab.corpus import load_retriever
from rag_gates_lab.datasets import load_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=6)
    parser.add_argument("--offset", type=int, default=900)
    parser.add_argument("--max-expansions", type=int, default=48)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    lm = load_default_lm()
    retriever = load_retriever("hotpotqa", "bm25")
    config = DeepRAGConfig(prompt=DeepRAGPrompt(demonstration=DEMONSTRATION))
    search = TrajectorySearch(lm, retriever, config, max_expansions=args.max_expansions)
    examples = load_dataset("hotpotqa", n=args.n, offset=args.offset).examples
    rows: list[dict[str, Any]] = []
    reused = prefilled = 0
    for i, example in enumerate(examples):
        timings: dict[str, float] = {}
        outcomes = {}
        for way in (("cached", "plain") if i % 2 == 0 else ("plain", "cached")):
            cache = lm.enable_prefix_cache(256 if way == "cached" else 0)
            start = time.perf_counter()
            outcome = search.run(example.question, example.answers)
            timings[way] = time.perf_counter() - start
            outcomes[way] = outcome
            if cache is not None:
                reused += cache.stats["reused_tokens"]
                prefilled += cache.stats["prefilled_tokens"]
        a, b = outcomes["cached"], outcomes["plain"]
        # Rendered trajectories and the decisions taken (a decision also records its latency).
        same = (a.status, a.expansions) == (b.status, b.expansions) and (
            a.trajectory is None) == (b.trajectory is None) and (
            a.trajectory is None or b.trajectory is None or (
                a.trajectory.render() == b.trajectory.render()
                and [s.decision.retrieve for s in a.trajectory.steps]
                == [s.decision.retrieve for s in b.trajectory.steps]))
        rows.append({"id": example.id, "cached_s": round(timings["cached"], 2),
                     "plain_s": round(timings["plain"], 2),
                     "ratio": round(timings["cached"] / timings["plain"], 3),
                     "status": a.status, "expansions": a.expansions,
                     "llm_calls": a.llm_calls, "same_outcome": same})
        print(rows[-1], flush=True)
    result = {
        "command": "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/deeprag_prefix_cache.py "
                   f"--n {args.n} --offset {args.offset} --max-expansions "
                   f"{args.max_expansions} --out {args.out}",
        "date": dt.date.today().isoformat(), "machine": platform.platform(),
        "model": lm.model_id, "rows": rows,
        "time_ratio_median": statistics.median(r["ratio"] for r in rows),
        "total_time_ratio": sum(r["cached_s"] for r in rows) / sum(r["plain_s"] for r in rows),
        "reused_token_share": reused / max(1, reused + prefilled),
        "same_outcome": sum(r["same_outcome"] for r in rows),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print({k: v for k, v in result.items() if k != "rows"})


if __name__ == "__main__":
    main()
