"""Latency of a served corpus index (``rag-gates index serve``) against in-process lookups.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/index_serve.py \
        --out benchmarks/results/index_serve.json

The index is the benchmark's corpus-statistics index (``rag-gates index from-datasets``: every
distinct Wikipedia paragraph of the shared HotpotQA and 2WikiMultihopQA dev files, lower-cased,
the embedded SmolLM2 tokenizer; the one QuCo-RAG counts in). The queries are real: the two
supporting-fact titles of each HotpotQA dev question (the entities a question links, as in
benchmarks/corpus.py), counted alone (``count``) and together (co-occurrence within 1,000
tokens, the hosted protocol's AND query, which is what ``HostedInfiniGram`` sends for
``scope="document"``).

Three ways to ask, each over ``--rounds`` rounds in shuffled order (medians of the per-round
percentiles):

* in process: ``LocalInfiniGram.count`` (both space variants) and, for co-occurrence, the same
  AND query the server computes (``LocalInfiniGram.cnf_occurrences``) and the document
  co-occurrence QuCo uses locally;
* over HTTP, 1 client: ``HostedInfiniGram`` (with the index's tokenizer and ``lowercase=True``:
  the variants of a count go as concurrent requests, a co-occurrence as one) against
  ``rag-gates index serve`` started as its own process;
* over HTTP, 8 clients at once: 8 client processes, each with its own ``HostedInfiniGram``,
  each through the whole list in its own order, started together.

The served answers are checked against the in-process ones (every count; every AND query).
The machine has 2 cores shared with other work: load averages are recorded.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WINDOW = 1000


def _corpus_bench() -> Any:
    """benchmarks/corpus.py (for its HotpotQA pairs and percentile helpers)."""
    spec = importlib.util.spec_from_file_location("corpus_bench", ROOT / "benchmarks" /
                                                  "corpus.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def timed(items: list[Any], run: Any, rounds: int, seed: int) -> list[list[float]]:
    """Per-round lists of per-call latencies (ms), each round in its own shuffled order."""
    return list(_corpus_bench().round_times(items, run, rounds, seed))


def summary(per_round: list[list[float]], wall_s: list[float] | None = None) -> dict[str, Any]:
    bench = _corpus_bench()
    rounds = [bench.percentiles(times) for times in per_round]
    out: dict[str, Any] = {
        "p50_ms": statistics.median(r["p50_ms"] for r in rounds),
        "p99_ms": statistics.median(r["p99_ms"] for r in rounds),
        "max_ms": max(r["max_ms"] for r in rounds), "calls_per_round": rounds[0]["n"],
        "rounds": rounds}
    if wall_s:
        out["queries_per_second"] = statistics.median(
            len(t) / w for t, w in zip(per_round, wall_s, strict=True))
    return out


def client_worker(args: tuple[str, str, str, str, list[Any], int, int, Any]) -> dict[str, Any]:
    """One client process: its own HostedInfiniGram, every item each round, latencies."""
    kind, url, name, tokenizer, items, rounds, seed, barrier = args
    from rag_gates.corpus import HostedInfiniGram, Window

    with HostedInfiniGram(name, tokenizer=tokenizer, url=url, trust_env=False,
                          max_concurrency=2, lowercase=True) as hosted:
        def run(item: Any) -> Any:
            if kind == "count":
                return hosted.count(item)
            return hosted.cooccurrence(item[0], item[1], scope=Window(tokens=WINDOW))

        for item in items[:5]:  # connect, warm the tokenizer
            run(item)
        barrier.wait()
        per_round, walls = [], []
        for r in range(rounds):
            start = time.perf_counter()
            per_round += timed(items, run, 1, seed + 100 * r)
            walls.append(time.perf_counter() - start)
    return {"per_round": per_round, "wall_s": walls}


def over_http(kind: str, url: str, name: str, tokenizer: str, items: list[Any], rounds: int,
              clients: int) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(clients)
        with ctx.Pool(clients) as pool:
            start = time.perf_counter()
            results = pool.map(client_worker, [
                (kind, url, name, tokenizer, items, rounds, 10 * c, barrier)
                for c in range(clients)])
            wall = time.perf_counter() - start
    # Round r of every client ran at about the same time: pool them per round.
    per_round = [[t for res in results for t in res["per_round"][r]] for r in range(rounds)]
    out = summary(per_round)
    out["clients"] = clients
    out["queries_per_second_all_clients"] = statistics.median(
        sum(len(res["per_round"][r]) / res["wall_s"][r] for res in results)
        for r in range(rounds))
    out["wall_s_with_startup"] = wall
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" /
                        "index_serve.json")
    parser.add_argument("--pairs", type=int, default=300, help="HotpotQA questions used.")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--workers", type=int, default=4, help="Server lookups at once.")
    args = parser.parse_args()

    from rag_gates.corpus import HostedInfiniGram, LocalInfiniGram, Window
    from rag_gates_lab.corpus import build_corpus_stats

    bench = _corpus_bench()
    started = time.time()
    build_start = time.perf_counter()
    index = build_corpus_stats(("hotpotqa", "2wiki"))
    build_s = time.perf_counter() - build_start
    local = LocalInfiniGram(index)
    pairs = bench.hotpot_pairs()[:args.pairs]
    entities = list(dict.fromkeys(e for p in pairs for e in p))
    tokenizer = str(index / "tokenizer.json")
    out: dict[str, Any] = {
        "command": "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/index_serve.py "
                   + " ".join(sys.argv[1:]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "load_average_1min_start": os.getloadavg()[0]},
        "index": {**local.stats().model_dump(include={"name", "documents", "tokens",
                                                      "size_bytes", "lowercase"}),
                  "seconds_to_build_or_open": build_s},
        "queries": {"pairs": len(pairs), "entities": len(entities), "window_tokens": WINDOW,
                    "example_pairs": pairs[:3]},
        "server": {"workers": args.workers, "process": "rag-gates index serve (separate)"},
    }

    print("in process", flush=True)
    for w in ("the", "of", "and"):
        local.count(w)
    cnfs = {p: [[list(i) for _, i in local._variants(p[0])[1]],
                [list(i) for _, i in local._variants(p[1])[1]]] for p in pairs}
    inproc: dict[str, Any] = {
        "count": summary(timed(entities, local.count, args.rounds, 1)),
        "cooccurrence_and_query": summary(timed(
            pairs, lambda p: local.cnf_occurrences(cnfs[p], WINDOW, 500_000), args.rounds, 2)),
        "cooccurrence_document": summary(timed(
            pairs, lambda p: local.cooccurrence(p[0], p[1]), args.rounds, 3)),
    }
    out["in_process"] = inproc

    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    server = subprocess.Popen(
        [sys.executable, "-m", "rag_gates.cli", "index", "serve", str(index), "--port",
         str(port), "--name", "bench", "--workers", str(args.workers)],
        stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert server.stderr is not None
        print(server.stderr.readline().strip(), flush=True)
        url = f"http://127.0.0.1:{port}/"
        # Every served answer against the in-process one.
        with HostedInfiniGram("bench", tokenizer=tokenizer, url=url, trust_env=False,
                              lowercase=True) as hosted:
            served_counts = hosted.count_batch(entities)
            served_cooc = hosted.cooccurrence_batch(pairs, scope=Window(tokens=WINDOW))
        out["agreement"] = {
            "counts_equal": sum(s.value == local.count(e).value
                                for s, e in zip(served_counts, entities, strict=True)),
            "counts": len(entities),
            "and_queries_equal": sum(s.value == local.cnf_occurrences(cnfs[p], WINDOW,
                                                                      500_000)[0]
                                     for s, p in zip(served_cooc, pairs, strict=True)),
            "and_queries": len(pairs),
            "entities_found": sum(s.value > 0 for s in served_counts),
            "pairs_within_window": sum(s.value > 0 for s in served_cooc)}
        print(out["agreement"], flush=True)
        http: dict[str, Any] = {}
        for clients in args.clients:
            for kind, items in (("count", entities), ("cooccurrence", pairs)):
                print(f"http {kind} x {clients} clients", flush=True)
                http[f"{kind}_{clients}_clients"] = over_http(
                    kind, url, "bench", tokenizer, items, args.rounds, clients)
        out["http"] = http
    finally:
        server.send_signal(signal.SIGTERM)
        out["server"]["exit_status"] = server.wait(timeout=30)
    out["machine"]["load_average_1min_end"] = os.getloadavg()[0]
    out["wall_s"] = time.time() - started
    table = {name: {"p50_ms": round(v["p50_ms"], 3), "p99_ms": round(v["p99_ms"], 3)}
             for name, v in {**{f"in_process_{k}": v for k, v in inproc.items()},
                             **{f"http_{k}": v for k, v in out["http"].items()}}.items()}
    out["table"] = table
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
