"""Wall time of ``rag-gates calibrate`` on the shipped sample questions with the embedded
model (one torch thread), from an empty work directory; writes
benchmarks/results/calibrate/walltime.json (and the run's spec, records and plot beside it).

    python benchmarks/calibrate_walltime.py --limit 200 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "calibrate"


def _rel(path: Path) -> Path:
    """A path relative to the repository when it is inside it (the commands in the JSON)."""
    resolved = path.resolve()
    return resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else resolved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--run", type=Path, default=OUT / "smollm2-200")
    args = parser.parse_args()
    if args.run.exists():
        shutil.rmtree(args.run)  # from scratch: the wall time of a first run
    command = [sys.executable, "-m", "rag_gates.cli", "calibrate",
               "--data", "examples/data/calibration_questions.jsonl",
               "--corpus", "examples/data/calibration_corpus.jsonl",
               "--limit", str(args.limit), "--threads", str(args.threads),
               "--out", str(_rel(args.run / "gate.json")),
               "--work-dir", str(_rel(args.run / "work"))]
    start = time.perf_counter()
    cpu_start = os.times()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    cpu_end = os.times()
    (args.run / "stdout.txt").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"calibrate failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    report = json.loads((args.run / "work" / "report.json").read_text())
    result = {
        "command": " ".join(command[1:]),
        "questions": args.limit, "threads": args.threads,
        "wall_s": round(wall, 1),
        "cpu_s_children": round((cpu_end.children_user - cpu_start.children_user)
                                + (cpu_end.children_system - cpu_start.children_system), 1),
        "wall_s_per_question": round(wall / args.limit, 2),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores shared with other jobs",
        "rows": [{"gate": r["gate"], "auroc": r["auroc"], "threshold": r["threshold"],
                  "skip_rate": r["skip_rate"], "observed_drop": r["observed_drop"], "n": r["n"]}
                 for r in report["rows"]],
    }
    (OUT / "walltime.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
