"""Loading the shipped SR-RAG policy with the embedded SmolLM2: cold (the keys computed, one
forward pass per labelled question, then cached) against warm (the keys read from the cache
under ``$RAG_GATES_HOME/srrag/key-cache``), on one thread.

The model is loaded once (not timed); the key cache lives in a temporary folder, so the first
load is cold whatever the user's cache holds. One cold load (it costs minutes), then ``--runs``
warm loads; the JSON keeps every time, the medians, the model forward calls counted during
each load, and whether the warm loads' vectors equal the cold one's. ``--limit N`` keys only
the first N labelled questions (a subset file with the shipped header), for a busy machine.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/srrag_policy_cache.py \\
        --out benchmarks/results/srrag_policy_cache.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from rag_gates.srrag.shipped import (
    DEFAULT_POLICY_LABELS,
    POLICY_ENV,
    load_default_policy,
    read_policy_labels,
    write_policy_labels,
)


def vectors(policy: Any) -> Any:
    points, _ = policy.client.scroll(policy.collection, limit=100_000, with_vectors=True)
    return np.asarray([p.vector for p in sorted(points, key=lambda p: (p.payload["dataset"],
                                                                       p.payload["id"]))])


def timed_load(lm: Any, labels: Path, calls: list[int]) -> tuple[float, int, Any]:
    """Seconds for one load_default_policy, the forward calls it made, its vectors."""
    before = len(calls)
    start = time.perf_counter()
    policy = load_default_policy(lm, labels=labels)
    seconds = time.perf_counter() - start
    found = vectors(policy)
    policy.close()
    return seconds, len(calls) - before, found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5, help="warm loads")
    parser.add_argument("--limit", type=int, default=None,
                        help="key only the first N labelled questions")
    parser.add_argument("--out", type=Path,
                        default=Path("benchmarks/results/srrag_policy_cache.json"))
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    os.environ.pop(POLICY_ENV, None)
    from rag_gates.lm import load_default_lm

    lm = load_default_lm()  # from the user's RAG_GATES_HOME, before it is moved below
    calls: list[int] = []
    lm.model.register_forward_pre_hook(lambda *_: calls.append(1))
    with tempfile.TemporaryDirectory() as tmp:
        labels = DEFAULT_POLICY_LABELS
        header, entries = read_policy_labels(labels)
        if args.limit is not None:
            entries = entries[: args.limit]
            labels = write_policy_labels(Path(tmp) / "subset.jsonl", entries, header.model_id,
                                         header.made_with, header.tau, header.calibration,
                                         header.k)
        os.environ["RAG_GATES_HOME"] = str(Path(tmp) / "home")  # an empty key cache
        cold_s, cold_calls, cold = timed_load(lm, labels, calls)
        print(f"cold: {cold_s:.1f} s, {cold_calls} forward calls", flush=True)
        warm = [timed_load(lm, labels, calls) for _ in range(args.runs)]
    warm_s = [s for s, _, _ in warm]
    median = statistics.median(warm_s)
    result = {
        "benchmark": "srrag_policy_cache", "model": lm.model_id, "questions": len(entries),
        "cold_s": cold_s, "cold_forward_calls": cold_calls, "warm_s": warm_s,
        "warm_median_s": median, "warm_forward_calls": [c for _, c, _ in warm],
        "speedup_cold_over_warm_median": cold_s / median,
        "warm_vectors_equal_cold": all(np.array_equal(v, cold) for _, _, v in warm),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_average": os.getloadavg(), "torch_threads": torch.get_num_threads(),
                    "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
        "command": "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/srrag_policy_cache.py "
                   f"--runs {args.runs}" + (f" --limit {args.limit}" if args.limit else ""),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"{len(entries)} questions: cold {cold_s:.1f} s, warm median {median:.2f} s "
          f"(x{result['speedup_cold_over_warm_median']:.0f}); warm forward calls "
          f"{result['warm_forward_calls']}, vectors equal: {result['warm_vectors_equal_cold']}")


if __name__ == "__main__":
    main()
