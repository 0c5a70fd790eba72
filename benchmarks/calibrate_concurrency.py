"""``rag-gates calibrate --concurrency N`` against a batching server: wall time at each N on
the same questions, and whether the records equal the first run's (issue 58).

Starts the engine (vLLM's CPU build from its own environment, ``RAG_GATES_VLLM_PYTHON``,
``bash benchmarks/envs/vllm.sh``; or llama-cpp-python's server, one request at a time, as the
baseline that does not batch), serving the embedded SmolLM2, then runs ``run_calibration``
(--gates auto: answer-logprob, first-token-logprob, sample-agreement, quco) once per
concurrency, each in a fresh work directory, on the first ``--n`` questions of
examples/data/calibration_questions.jsonl with examples/data/calibration_corpus.jsonl. QuCo's
index of the corpus is built before the clock starts (calibrate caches it).

Example:
    RAG_GATES_VLLM_PYTHON=/work/vllmvenv/bin/python OMP_NUM_THREADS=1 \\
        .venv/bin/python benchmarks/calibrate_concurrency.py --engine vllm --n 200 \\
        --concurrency 1 8 --out benchmarks/results/calibrate_concurrency_vllm.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = ROOT / "examples" / "data" / "calibration_questions.jsonl"
CORPUS = ROOT / "examples" / "data" / "calibration_corpus.jsonl"


@contextmanager
def engine(name: str, log: Path) -> Iterator[str]:
    if name == "vllm":
        from rag_gates.lm.vllm_server import vllm_server

        with vllm_server(log=log, eager=True) as url:
            yield url
    else:
        from rag_gates.lm.llamacpp_server import llamacpp_server

        with llamacpp_server(threads=1, log=log) as url:
            yield url


def other_processes() -> list[str]:
    """Other processes using CPU at the start (what shared the cores)."""
    out = subprocess.run(["ps", "-eo", "pcpu,args", "--sort=-pcpu"], capture_output=True,
                         text=True, check=False).stdout.splitlines()[1:8]
    return [line.strip()[:160] for line in out if float(line.split()[0]) >= 10.0]


def compare(records: list[Any], first: list[Any]) -> dict[str, Any]:
    """How a run's records differ from the first run's: the same questions in the same order,
    answers and labels, and the largest score difference (a batching engine's float32 sums
    depend on the batch, so log-probabilities may differ in the last digits)."""
    same = [a.id == b.id and a.closed_book_answer == b.closed_book_answer
            and a.retrieved_answer == b.retrieved_answer
            and a.closed_book_correct == b.closed_book_correct
            and a.retrieved_correct == b.retrieved_correct
            for a, b in zip(records, first, strict=True)]
    largest: dict[str, float] = {}
    for a, b in zip(records, first, strict=True):
        for name, scores in (("", (a.scores, b.scores)),
                             ("with passages: ", (a.retrieved_scores, b.retrieved_scores))):
            for gate, x in scores[0].items():
                y = scores[1].get(gate)
                gap = (0.0 if x == y else float("inf") if x is None or y is None
                       else abs(x - y))
                largest[name + gate] = max(largest.get(name + gate, 0.0), gap)
    return {"records_equal_to_first": sum(a == b for a, b in zip(records, first, strict=True)),
            "same_order_answers_and_labels": sum(same),
            "largest_score_difference": largest}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("vllm", "llamacpp"), default="vllm")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--k", type=int, default=1)
    parser.add_argument("--note", default="")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from rag_gates.calibration import read_records
    from rag_gates.commands.calibrate import (
        _sha,
        corpus_stats_index,
        read_corpus,
        run_calibration,
    )

    corpus_stats_index(read_corpus(CORPUS), _sha(CORPUS))  # built (or cached) off the clock
    where = Path(tempfile.mkdtemp(prefix="calibrate-concurrency-"))
    data = where / "questions.jsonl"
    data.write_text("".join(QUESTIONS.read_text().splitlines(keepends=True)[:args.n]))
    result: dict[str, Any] = {
        "command": "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/calibrate_concurrency.py "
                   + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "python": platform.python_version()},
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "other_processes_at_start": other_processes(), "note": args.note,
        "engine": args.engine, "questions": args.n, "max_new_tokens": args.max_new_tokens,
        "k": args.k, "gates": None, "runs": {}}
    first: list[Any] | None = None
    with engine(args.engine, where / "server.log") as url:
        for concurrency in args.concurrency:
            out = where / f"c{concurrency}" / "gate.json"
            load = os.getloadavg()[0]
            start = time.perf_counter()
            report = run_calibration(data=data, corpus=str(CORPUS), out=out,
                                     model=f"openai:{url}", max_new_tokens=args.max_new_tokens,
                                     k=args.k, max_loss=0.1, concurrency=concurrency)
            wall = time.perf_counter() - start
            records = read_records(out.with_name("gate-work") / "records.jsonl")
            first = first if first is not None else records
            same = compare(records, first)
            result["gates"] = [row.gate for row in report.rows]
            result["runs"][str(concurrency)] = {
                "wall_s": wall, "seconds_per_question": wall / args.n,
                "load_average_1min": [load, os.getloadavg()[0]],
                **same,
                "auroc": {row.gate: row.auroc for row in report.rows},
                "certified_skip_rate": {row.gate: row.certified_skip_rate
                                        for row in report.rows}}
            print(f"concurrency {concurrency}: {wall:.1f} s, "
                  f"{same['same_order_answers_and_labels']}/{args.n} records with the first "
                  f"run's answers and labels ({same['records_equal_to_first']} equal to the "
                  f"digit)", flush=True)
    base = result["runs"][str(args.concurrency[0])]["wall_s"]
    for run in result["runs"].values():
        run["speedup_vs_first"] = base / run["wall_s"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({c: round(r["speedup_vs_first"], 2) for c, r in result["runs"].items()}))


if __name__ == "__main__":
    main()
