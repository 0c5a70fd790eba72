"""SR-RAG's kNN policy lookup in local Qdrant: p50/p95 of ``SourcePolicy.vote`` (k = 30) with
1,000 and 10,000 labelled questions (target p50 <= 5 ms).

The keys are random unit vectors of SmolLM2's hidden size (576): a lookup's cost depends on
the number and size of the vectors, not on what they encode, so no model runs here. Each size
is a fresh on-disk collection (``QdrantClient(path=...)``, the embedded default); the queries
are other random vectors, after ``--warmup`` untimed ones.

    .venv/bin/python benchmarks/srrag_knn.py --out benchmarks/results/srrag_knn.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from pydantic import JsonValue

from rag_gates.srrag.policy import PolicyEntry, SourcePolicy

DIM = 576


class RandomKeys:
    """A key function for stored vectors only (questions are never keyed here)."""

    identity: ClassVar[dict[str, JsonValue]] = {"key": "benchmark-random", "model_id": "none",
                                                "dim": DIM}
    dim = DIM

    def keys(self, questions: Any) -> Any:
        raise NotImplementedError("the benchmark passes vectors directly")


def unit(rng: np.random.Generator, n: int) -> Any:
    x = rng.standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def measure(size: int, queries: int, warmup: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        policy = SourcePolicy.open(RandomKeys(), path=Path(tmp) / "policy")
        entries = [PolicyEntry(id=str(i), question=f"q{i}",
                               source="retrieval" if i % 3 else "parametric")
                   for i in range(size)]
        start = time.perf_counter()
        policy.add(entries, unit(rng, size))
        build_s = time.perf_counter() - start
        probes = unit(rng, warmup + queries)
        for q in probes[:warmup]:
            policy.vote(q)
        times = []
        for q in probes[warmup:]:
            start = time.perf_counter()
            vote = policy.vote(q)
            times.append((time.perf_counter() - start) * 1000)
            assert vote.found == 30
        policy.close()
    times.sort()
    return {"entries": size, "queries": queries, "p50_ms": statistics.median(times),
            "p95_ms": times[int(0.95 * (len(times) - 1))], "mean_ms": statistics.fmean(times),
            "build_s": build_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = [measure(int(s), args.queries, args.warmup, args.seed)
            for s in args.sizes.split(",")]
    for row in rows:
        print(f"{row['entries']:>6} entries: p50 {row['p50_ms']:.2f} ms, p95 "
              f"{row['p95_ms']:.2f} ms (build {row['build_s']:.1f} s)")
    result = {"benchmark": "srrag_knn", "command": "benchmarks/srrag_knn.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items() if k != "out" and v is not None),
        "k": 30, "dim": DIM, "mode": "local path", "target_p50_ms": 5.0,
        "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
        "results": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
