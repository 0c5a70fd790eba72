"""Where QuCo-RAG's time goes: extraction, corpus queries, retrieval, the model.

Reads the per-question traces that ``rag-gates bench --methods quco`` wrote (no new model
runs) and reports, per run directory, the share of each question's wall time spent in
entity/claim extraction and in corpus-statistics queries (the gate's and the verifier's),
as medians over questions and as totals. Targets (issue 5): corpus queries under 2% and the
whole gate (extraction + corpus) under 10% of end-to-end time with the default extractor.

    .venv/bin/python benchmarks/quco_overhead.py benchmarks/results/eval/hotpotqa-200 \
        benchmarks/results/eval/2wiki-200 --out benchmarks/results/quco_overhead.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from rag_gates._io import write_text_atomic
from rag_gates.types import Trace
from rag_gates_lab.runner import read_records


def question_costs(record: Any) -> dict[str, float]:
    """Milliseconds per cost centre for one question's trace."""
    extract = corpus = retrieval = llm = 0.0
    trace = Trace.model_validate(record.trace)
    for event in trace.events:
        data = event.data
        if event.kind == "decision":
            evidence = data.get("evidence", {})
            assert isinstance(evidence, dict)
            extract += float(evidence.get("extract_ms", 0.0))  # type: ignore[arg-type]
            corpus += float(evidence.get("corpus_ms", 0.0))  # type: ignore[arg-type]
        elif event.kind == "verification":
            extract += float(data.get("extract_ms", 0.0))  # type: ignore[arg-type]
            corpus += float(data.get("corpus_ms", 0.0))  # type: ignore[arg-type]
        elif event.kind == "retrieval":
            retrieval += event.latency_ms
        elif event.kind == "llm_call":
            llm += event.latency_ms
    return {"extract_ms": extract, "corpus_ms": corpus, "retrieval_ms": retrieval,
            "llm_ms": llm, "wall_ms": record.wall_s * 1000.0}


def summarise(run_dir: Path, method: str) -> dict[str, Any]:
    records = [r for r in read_records(run_dir) if r.method == method]
    if not records:
        raise SystemExit(f"{run_dir} has no {method!r} records: run rag-gates bench first")
    costs = [question_costs(r) for r in records]
    total = {k: sum(c[k] for c in costs) for k in costs[0]}
    wall = total["wall_ms"]

    def median_share(key: str) -> float:
        return statistics.median(c[key] / c["wall_ms"] for c in costs if c["wall_ms"] > 0)

    gate = [c["extract_ms"] + c["corpus_ms"] for c in costs]
    return {
        "run": str(run_dir), "method": method, "questions": len(records),
        "share_of_wall_time": {
            "corpus_queries": total["corpus_ms"] / wall,
            "extraction": total["extract_ms"] / wall,
            "gate_total": (total["corpus_ms"] + total["extract_ms"]) / wall,
            "retrieval": total["retrieval_ms"] / wall,
            "llm": total["llm_ms"] / wall,
        },
        "median_share_per_question": {
            "corpus_queries": median_share("corpus_ms"),
            "extraction": median_share("extract_ms"),
        },
        "median_ms_per_question": {
            "gate_total": statistics.median(gate),
            "corpus_queries": statistics.median(c["corpus_ms"] for c in costs),
            "extraction": statistics.median(c["extract_ms"] for c in costs),
            "wall": statistics.median(c["wall_ms"] for c in costs),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="bench run directories")
    parser.add_argument("--method", default="quco")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    results = [summarise(run, args.method) for run in args.runs]
    payload = {
        "command": "python benchmarks/quco_overhead.py " + " ".join(map(str, args.runs))
                   + f" --method {args.method} --out {args.out}",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "results": results,
    }
    write_text_atomic(args.out, json.dumps(payload, indent=1) + "\n")
    for r in results:
        share = {k: 100 * v for k, v in r["share_of_wall_time"].items()}
        print(f"{r['run']} ({r['questions']} questions): corpus {share['corpus_queries']:.2f}%, "
              f"extraction {share['extraction']:.2f}%, gate {share['gate_total']:.2f}%, "
              f"model {share['llm']:.1f}% of wall time")


if __name__ == "__main__":
    main()
