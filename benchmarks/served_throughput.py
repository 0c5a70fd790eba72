"""Questions per second of ``rag-gates bench`` with a served model at several concurrencies,
against the in-process model.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/served_throughput.py \
        --out benchmarks/results/served_throughput.json

The method is ``single`` (one BM25 retrieval of k=3 HotpotQA paragraphs, one answer of at most
48 tokens), on the first ``--n`` HotpotQA dev questions of the shared data. The served model is
the embedded SmolLM2-135M-Instruct GGUF (Q4_1) behind llama-cpp-python's OpenAI-compatible
server (``llamacpp_server()``, ``--server-threads`` threads), asked through
``OpenAICompatibleLM`` by ``run_bench(..., concurrency=N)``; the in-process model is
``HFWhiteBoxLM`` on the same weights (dequantized to float32), ``--hf-threads`` torch threads,
concurrency 1 (the only one it accepts). The model is loaded (or connected and probed) and the
BM25 index opened before the clock starts; each configuration answers the same questions into
a fresh run directory. Answers are compared with the sequential served run's.

The machine has 2 cores shared with other work (load averages recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def answers(run: Path) -> dict[tuple[str, str], str]:
    from rag_gates_lab.runner import read_records

    return {(r.id, r.method): r.prediction for r in read_records(run)}


def timed_run(config: Any, run: Path, lm: Any, retriever: Any) -> dict[str, Any]:
    from rag_gates_lab.runner import read_records, run_bench

    shutil.rmtree(run, ignore_errors=True)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    summary = run_bench(config, run, lm=lm, retriever=retriever)
    wall = time.perf_counter() - start
    records = read_records(run)
    return {"questions": len(records), "wall_s": wall,
            "questions_per_second": len(records) / wall,
            "seconds_per_question_median": statistics.median(r.wall_s for r in records),
            "accuracy": summary["single"]["accuracy"],
            "tokens_per_question": summary["single"]["tokens_per_question"],
            "load_average_1min": [load, os.getloadavg()[0]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" /
                        "served_throughput.json")
    parser.add_argument("--work", type=Path, default=Path("/work/runs/served-throughput"))
    parser.add_argument("--n", type=int, default=24)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--server-threads", type=int, default=1)
    parser.add_argument("--hf-threads", type=int, default=1)
    parser.add_argument("--skip-hf", action="store_true")
    args = parser.parse_args()

    from rag_gates.lm.llamacpp_server import llamacpp_server
    from rag_gates_lab.corpus import load_retriever
    from rag_gates_lab.runner import BenchConfig, load_bench_lm

    started = time.time()
    retriever = load_retriever("hotpotqa", "bm25", None)
    out: dict[str, Any] = {
        "command": "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/served_throughput.py "
                   + " ".join(sys.argv[1:]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "python": platform.python_version()},
        "method": "single", "dataset": "hotpotqa", "n": args.n, "k": 3,
        "max_new_tokens": 48,
        "server": {"software": "llama-cpp-python[server] 0.3.36",
                   "model": "SmolLM2-135M-Instruct.Q4_1.gguf", "threads": args.server_threads},
        "served": {}}
    args.work.mkdir(parents=True, exist_ok=True)
    log = args.work / "llama-server.log"
    with llamacpp_server(threads=args.server_threads, log=log) as url:
        base = BenchConfig(dataset="hotpotqa", methods=["single"], n=args.n,
                           model=f"openai:{url}", concurrency=max(args.concurrency))
        lm = load_bench_lm(base)  # connect and probe once, outside the clock
        out["server"]["url"] = url
        out["server"]["model_name"] = lm.model_name
        for c in args.concurrency:
            print(f"served, concurrency {c}", flush=True)
            cfg = base.model_copy(update={"concurrency": c})
            out["served"][str(c)] = timed_run(cfg, args.work / f"served-c{c}", lm, retriever)
            print(out["served"][str(c)], flush=True)
        lm.close()
    first = answers(args.work / f"served-c{args.concurrency[0]}")
    for c in args.concurrency:
        other = answers(args.work / f"served-c{c}")
        out["served"][str(c)]["answers_equal_to_first"] = sum(
            other.get(k) == v for k, v in first.items())
    if not args.skip_hf:
        print("in process (HFWhiteBoxLM)", flush=True)
        from rag_gates.lm.defaults import load_lm

        hf = load_lm("default", num_threads=args.hf_threads)
        cfg = BenchConfig(dataset="hotpotqa", methods=["single"], n=args.n, model="default")
        out["in_process"] = {"threads": args.hf_threads, "concurrency": 1,
                             **timed_run(cfg, args.work / "hf", hf, retriever)}
        print(out["in_process"], flush=True)
    out["wall_s"] = time.time() - started
    table = {f"served c={c}": round(v["questions_per_second"], 3)
             for c, v in out["served"].items()}
    if "in_process" in out:
        table["in-process HF c=1"] = round(out["in_process"]["questions_per_second"], 3)
    out["questions_per_second"] = table
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
