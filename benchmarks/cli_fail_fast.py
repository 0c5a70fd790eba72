"""How fast the CLI refuses a wrong name, and what a first ``index build`` spends where.

Each refusal runs in a fresh process with an empty ``RAG_GATES_HOME`` (so nothing cached
helps), ``--repeat`` times; medians of wall and CPU time (user + system: on a shared machine
the wall time includes waiting for a core), against ``rag-gates --help`` in the same run (the
cost of starting the CLI at all). Then six documents are indexed twice with the default
tokenizer in a fresh cache: the first build converts the embedded model, the second reuses
the copy.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cli_fail_fast.py \
        --out benchmarks/results/cli_fail_fast.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CASES = {
    "help (baseline)": ["--help"],
    "eval-gate --gate nosuch": ["eval-gate", "--gate", "nosuch", "--dataset", "popqa",
                                "--out", "{tmp}/out"],
    "bench --dataset nosuch": ["bench", "--dataset", "nosuch", "--out", "{tmp}/out"],
    "bench --methods selective@quco|nosuch": ["bench", "--dataset", "popqa", "--methods",
                                              "no-rag,selective@quco|nosuch", "--out",
                                              "{tmp}/out"],
    "bench --methods cbdr@2": ["bench", "--dataset", "popqa", "--methods", "no-rag,cbdr@2",
                               "--out", "{tmp}/out"],
}
SIX = ["Ed Wood was an American filmmaker.", "Scott Derrickson is an American director.",
       "Steven Spielberg directed Jaws.", "Washington is the capital of the United States.",
       "Hamlet is a tragedy by William Shakespeare.", "Paris is the capital of France."]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


CODE = ROOT  # the tree whose CLI runs (--code: another checkout, for a before/after pair)


def _env(home: Path) -> dict[str, str]:
    paths = [str(CODE), str(CODE / "integrations" / "langchain"),
             str(CODE / "integrations" / "llama-index")]
    return dict(os.environ, RAG_GATES_HOME=str(home), OMP_NUM_THREADS="1",
                MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                PYTHONPATH=os.pathsep.join(paths))


def _timed(args: list[str], env: dict[str, str]) -> tuple[float, float, int, str, str]:
    cpu, start = _cpu(), time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "rag_gates.cli", *args], cwd=CODE, env=env,
                          capture_output=True, text=True, check=False)
    return (time.perf_counter() - start, _cpu() - cpu, done.returncode, done.stdout,
            done.stderr)


def refusals(repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, template in CASES.items():
        walls, cpus = [], []
        for _ in range(repeat):
            with tempfile.TemporaryDirectory(prefix="rag-gates-fail-fast-") as tmp:
                args = [a.replace("{tmp}", tmp) for a in template]
                wall, cpu, code, stdout, stderr = _timed(args, _env(Path(tmp) / "home"))
                text = stdout + stderr
                written = sorted(str(p.relative_to(tmp)) for p in Path(tmp).rglob("*"))
            walls.append(wall)
            cpus.append(cpu)
        out[name] = {"returncode": code, "wall_s": round(statistics.median(walls), 2),
                     "cpu_s": round(statistics.median(cpus), 2), "files_written": written,
                     "message": text.strip().splitlines()[0][:300] if code else ""}
    base = out["help (baseline)"]
    for row in out.values():
        row["cpu_vs_help"] = round(row["cpu_s"] / base["cpu_s"], 2)
    return out


def index_builds() -> list[dict[str, Any]]:
    reports = []
    with tempfile.TemporaryDirectory(prefix="rag-gates-index-") as tmp:
        docs = Path(tmp) / "six.jsonl"
        docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in SIX), encoding="utf-8")
        env = _env(Path(tmp) / "home")
        for run in ("first", "second"):
            wall, cpu, code, stdout, stderr = _timed(
                ["index", "build", str(docs), "--out", f"{tmp}/{run}", "--cpus", "1", "--json"],
                env)
            if code:
                raise SystemExit(f"index build failed: {stderr[-2000:]}")
            report = json.loads(stdout)
            reports.append({"build": run, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
                            **{k: report[k] for k in ("documents", "tokens", "seconds",
                                                      "setup_seconds", "index_seconds",
                                                      "tokens_per_second",
                                                      "converted_model")}})
    return reports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-index", action="store_true",
                        help="only the refusals (the index builds convert the model: minutes)")
    parser.add_argument("--code", type=Path, default=ROOT,
                        help="the checkout whose CLI runs (default: this one)")
    args = parser.parse_args()
    global CODE
    CODE = args.code.resolve()
    load = os.getloadavg()[0]
    payload = {"command": " ".join(["python", "benchmarks/cli_fail_fast.py", *sys.argv[1:]]),
               "code": str(CODE),
               "cpus": os.cpu_count(), "load_before": round(load, 2),
               "refusals": refusals(args.repeat),
               "index_build": [] if args.no_index else index_builds(),
               "load_after": round(os.getloadavg()[0], 2)}
    args.out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
