"""Opening a local SR-RAG policy for serving: the read-only private copy (any number of
processes at once) against the on-disk client (one process per folder), each timed to its
first vote, at 1,000 and 10,000 labelled questions.

The keys are random unit vectors of SmolLM2's hidden size (576) and the questions 60
characters long: opening costs depend on the number and size of the points, not on what they
encode, so no model runs here. Both ways are timed alternately in one run on one datastore
(built once per size), ``--runs`` times each; the JSON keeps every time and the medians.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/srrag_policy_open.py \\
        --out benchmarks/results/srrag_policy_open.json
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
from srrag_knn import DIM, RandomKeys, unit  # the same random keys as the lookup benchmark

from rag_gates.srrag.policy import PolicyEntry, SourcePolicy


def first_vote_s(path: Path, query: Any, *, read_only: bool) -> tuple[float, int]:
    """Seconds from nothing to the first vote (opening, identity check, key matrix)."""
    start = time.perf_counter()
    policy = SourcePolicy.open(RandomKeys(), path=path, create=False, read_only=read_only)
    found = policy.vote(query).found
    seconds = time.perf_counter() - start
    policy.close()
    return seconds, found


def measure(size: int, runs: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "policy"
        writer = SourcePolicy.open(RandomKeys(), path=path)
        writer.add([PolicyEntry(id=str(i), dataset="popqa", question=f"{i:>8} " + "x" * 51,
                                source="retrieval" if i % 3 else "parametric")
                    for i in range(size)], unit(rng, size))
        writer.close()
        query = unit(rng, 1)[0]
        times: dict[str, list[float]] = {"on_disk": [], "read_only": []}
        for _ in range(runs):  # alternated, so load on the machine falls on both alike
            for way in times:
                seconds, found = first_vote_s(path, query, read_only=way == "read_only")
                assert found == 30, found
                times[way].append(seconds)
    medians = {way: statistics.median(t) for way, t in times.items()}
    return {"size": size, "runs": runs, "seconds": times,
            "median_s": medians, "ratio_read_only_to_on_disk":
                medians["read_only"] / medians["on_disk"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/"
                                                         "srrag_policy_open.json"))
    args = parser.parse_args()
    rows = [measure(size, args.runs, args.seed) for size in args.sizes]
    import qdrant_client

    result = {"benchmark": "srrag_policy_open", "rows": rows,
              "dim": DIM, "qdrant_client": qdrant_client.__version__ if hasattr(
                  qdrant_client, "__version__") else "unknown",
              "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                          "load_average": os.getloadavg(),
                          "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
              "command": "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/srrag_policy_open.py "
                         f"--sizes {' '.join(map(str, args.sizes))} --runs {args.runs}"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    for row in rows:
        m = row["median_s"]
        print(f"{row['size']:>6} questions: on disk {m['on_disk']:.2f} s, read-only copy "
              f"{m['read_only']:.2f} s (x{row['ratio_read_only_to_on_disk']:.2f})")


if __name__ == "__main__":
    main()
