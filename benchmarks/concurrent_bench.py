"""Two ``rag-gates bench`` processes at once over the same built SR-RAG and SKR policies (issue
36: the second used to die with qdrant-client's "Storage folder ... is already accessed").

Builds the two local datastores once from the shipped SmolLM2 labels (what ``rag-gates srrag
build-policy`` writes, keyed here in Python because the shipped file is a policy-labels file,
not ``srrag label`` output): the SR-RAG one with SmolLM2's hidden states at
``$RAG_GATES_HOME/srrag/policy``, the SKR one with MiniLM embeddings at ``.../skr-policy``.
Then starts two bench runs of the same questions in the background, one thread each, waits
for both, and records their exit codes, wall times and whether their decisions agree.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/concurrent_bench.py \\
        --out benchmarks/results/concurrent_bench.json

``--code DIR`` runs the two bench processes on another checkout of rag-gates (e.g. the
commit before the fix) to see what they did there.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "examples" / "data" / "popqa_dev_sample.jsonl"


def build_stores() -> dict[str, Any]:
    """The two datastores from the shipped labels, unless they are already there."""
    from rag_gates.lm import load_default_lm
    from rag_gates.srrag import EmbeddingKeys, HiddenStateKeys, SourcePolicy
    from rag_gates.srrag.policy import default_policy_path
    from rag_gates.srrag.shipped import read_policy_labels

    header, entries = read_policy_labels()
    built: dict[str, Any] = {}
    for kind in ("hidden", "embedding"):
        path = default_policy_path(kind)  # type: ignore[arg-type]
        if (path / "meta.json").is_file():
            built[kind] = {"path": str(path), "built_s": None}
            continue
        start = time.perf_counter()
        keys = HiddenStateKeys(load_default_lm(num_threads=1)) if kind == "hidden" \
            else EmbeddingKeys()
        policy = SourcePolicy.open(keys, path=path)  # the folder's one writer
        policy.add_questions(entries)
        size = len(policy)
        policy.close()
        built[kind] = {"path": str(path), "questions": size,
                       "built_s": round(time.perf_counter() - start, 1)}
    built["labels"] = header.model_dump()
    return built


def bench(out: Path, methods: str, n: int, env: dict[str, str], code: Path
          ) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "rag_gates.cli", "bench", "--dataset", "popqa",
               "--data", str(DATA), "--methods", methods, "--n", str(n), "--threads", "1",
               "--out", str(out)]
    # Run in the checkout: `python -m` puts the working directory first on sys.path.
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, cwd=code)


def decisions(run: Path) -> dict[str, bool | None]:
    """Each (question, method)'s first gate decision in a run's results."""
    path = run / "results.jsonl"
    if not path.is_file():
        return {}
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    found: dict[str, bool | None] = {}
    for row in rows:
        gates = [e for e in row["trace"]["events"] if e["kind"] == "decision"]
        found[f"{row['id']}|{row['method']}"] = gates[0]["data"]["retrieve"] if gates else None
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--methods", default="srrag,skr")
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/concurrent-bench"))
    parser.add_argument("--code", type=Path, default=None,
                        help="Run the two bench processes on this checkout of rag-gates.")
    parser.add_argument("--out", type=Path,
                        default=Path("benchmarks/results/concurrent_bench.json"))
    args = parser.parse_args()
    stores = build_stores()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    code = (args.code or ROOT).resolve()
    env["PYTHONPATH"] = os.pathsep.join(str(code / p) for p in
                                        ("", "integrations/langchain",
                                         "integrations/llama-index"))
    runs = {name: args.runs_dir.resolve() / name for name in ("a", "b")}
    for run in runs.values():
        if run.exists():
            raise SystemExit(f"{run} exists: pass another --runs-dir")
    start = time.perf_counter()
    started = {name: bench(run, args.methods, args.n, env, code)
               for name, run in runs.items()}
    results: dict[str, Any] = {}
    for name, process in started.items():
        output = process.communicate()[0]
        results[name] = {"exit_code": process.returncode,
                         "wall_s": round(time.perf_counter() - start, 1),
                         "output_tail": output.strip().splitlines()[-12:],
                         "decisions": decisions(runs[name])}
    both = [results[name]["decisions"] for name in runs]
    result = {
        "benchmark": "concurrent_bench", "code": str(code), "stores": stores,
        "bench_command": (f"python -m rag_gates.cli bench --dataset popqa --data {DATA} "
                          f"--methods {args.methods} --n {args.n} --threads 1 --out RUN"),
        "runs": results,
        "both_completed": all(r["exit_code"] == 0 for r in results.values()),
        "decisions_agree": bool(both[0]) and both[0] == both[1],
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_average": os.getloadavg()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    for name, r in results.items():
        print(f"bench {name}: exit {r['exit_code']} after {r['wall_s']} s, "
              f"{len(r['decisions'])} answers")
    print(f"both completed: {result['both_completed']}; decisions agree: "
          f"{result['decisions_agree']}")


if __name__ == "__main__":
    main()
