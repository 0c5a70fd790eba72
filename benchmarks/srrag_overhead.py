"""The routing overhead of SR-RAG and its peers, from a bench run's traces (no model runs).

    python benchmarks/srrag_overhead.py benchmarks/results/srrag/popqa-200 \\
        --out benchmarks/results/srrag/overhead-popqa.json

Per method: the median of each question's decision time over its wall time (the record's
``wall_s``, which counts a verbalization shared with another method at its first cost), the
median decision time, and the medians of the time spent verbalizing and answering.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from rag_gates_lab.runner import read_records


def overhead(run_dir: Path) -> dict[str, dict[str, Any]]:
    by_method: dict[str, list[dict[str, float]]] = defaultdict(list)
    for record in read_records(run_dir):
        events = record.trace.get("events", [])
        decide = sum(e["latency_ms"] for e in events if e["kind"] == "decision")
        verbalize = sum(e["data"].get("reused_ms") or e["latency_ms"] for e in events
                        if e["kind"] == "llm_call" and e["name"] == "verbalize")
        answer = sum(e["latency_ms"] for e in events
                     if e["kind"] == "llm_call" and e["name"] != "verbalize")
        wall_ms = 1000 * record.wall_s
        by_method[record.method].append({"decision_ms": decide, "verbalize_ms": verbalize,
                                         "answer_ms": answer, "wall_ms": wall_ms,
                                         "decision_share": decide / wall_ms})
    return {method: {"questions": len(rows),
                     **{f"median_{k}": statistics.median(r[k] for r in rows)
                        for k in ("decision_share", "decision_ms", "verbalize_ms",
                                  "answer_ms", "wall_ms")}}
            for method, rows in by_method.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    result = overhead(args.run_dir)
    for method, row in result.items():
        print(f"{method}: decision {row['median_decision_ms']:.0f} ms, "
              f"{100 * row['median_decision_share']:.1f}% of {row['median_wall_ms']:.0f} ms "
              f"({row['questions']} questions)")
    args.out.write_text(json.dumps({"run": str(args.run_dir), "methods": result}, indent=2)
                        + "\n")


if __name__ == "__main__":
    main()
