"""The validation shape of a skills testbed (issue 35): can the model read in every method's
prompt form, answer DeepRAG's hops from ``Context:``, verbalize without losing what it knows,
and answer two-hop questions from both hops' passages?

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/testbed_skills.py --testbed DIR \\
        --validation benchmarks/results/testbed/validation-tb12.json \\
        --out benchmarks/results/testbed/skills-tb12.json

On the testbed's evaluation facts, each with its own retrieval passage only: `single` in each
prompt form (the benchmark's QA prompt, DeepRAG's ``Context:`` step in the bench's and the
paper's prompt, Tok-RAG's decoder with the default and the authors' ``[Reference]:``
passages, SR-RAG's answer after a verbalization, CBDR's paper prompt), closed book and
GenRead per rung; the two-hop questions over evaluation facts with both hops' passages.
Every prompt is rendered by the method's own code (:mod:`rag_gates_lab.testbed.skills`).
The out file ends with one pass/fail line per criterion; the thresholds are that module's
constants. ``--validation`` (the validate step's table) gives the base model's closed book at
r = 0 for the one criterion this run cannot measure alone.

Resumable: every answer is appended to ``--rows`` (default: next to ``--out``); rerun the same
command to continue; a larger ``--n`` adds only the missing facts. ``--n`` / ``--twohop-n``
cap the facts and two-hop questions (manifest order) for a cheap dry run.

``--shard I/K`` answers the I-th of K shares into a rows file of its own and writes no
``--out``: run K of them at once (one thread each), then the command without ``--shard``,
which gathers their rows and writes the table::

    for i in 0 1; do OMP_NUM_THREADS=1 .venv/bin/python benchmarks/testbed_skills.py \
        --testbed DIR --shard $i/2 --out OUT & done; wait
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/testbed_skills.py --testbed DIR --out OUT
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
from pathlib import Path
from typing import Any

from rag_gates._io import write_text_atomic
from rag_gates_lab.testbed.skills import measure_skills

ROOT = Path(__file__).resolve().parent.parent


def base_closed_book_r0(validation: Path | None) -> float | None:
    """The base model's (``model: default``) closed-book accuracy at r = 0 in a validation
    table written by ``rag-gates testbed table``; None when there is no such file or row."""
    if validation is None or not validation.is_file():
        return None
    for row in json.loads(validation.read_text()):
        cell = row.get("by_repetitions", {}).get("0")
        if row.get("model") == "default" and row.get("method") == "no-rag" and cell:
            return round(float(cell["accuracy"]), 1)
    return None


def parse_shard(text: str) -> tuple[int, int]:
    """``"1/2"`` -> ``(1, 2)``, the second of two shares."""
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard takes I/K, e.g. 0/2, not {text!r}") from None
    if not 0 <= index < count:
        raise argparse.ArgumentTypeError(f"--shard {text}: I must be in 0..K-1")
    return index, count


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--testbed", type=Path, required=True, help="rag-gates testbed build DIR")
    parser.add_argument("--model", default=None, help="an HF directory or 'default' (the "
                        "base model); default: the testbed's own model")
    parser.add_argument("--n", type=int, default=None, help="the first N evaluation facts")
    parser.add_argument("--twohop-n", type=int, default=None,
                        help="the first N two-hop questions over evaluation facts")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--validation", type=Path, default=None,
                        help="the validate step's validation-TB.json (the base model's row)")
    parser.add_argument("--rows", type=Path, default=None,
                        help="answers JSONL (default: next to --out)")
    parser.add_argument("--shard", type=parse_shard, default=None, metavar="I/K",
                        help="answer the I-th of K shares (0 <= I < K) into a rows file of "
                             "its own; no --out is written")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    rows = args.rows or args.out.with_name(args.out.stem + "-rows.jsonl")
    summary = measure_skills(args.testbed, rows, model=args.model, n=args.n,
                             twohop_n=args.twohop_n, max_new_tokens=args.max_new_tokens,
                             base_closed_book_r0=base_closed_book_r0(args.validation),
                             shard=args.shard, progress=lambda s: print(s, flush=True))
    if args.shard is not None:
        print(f"shard {args.shard[0]}/{args.shard[1]} done: run the command without --shard "
              f"to gather the shards' rows into {rows} and write {args.out}")
        return summary
    caps = "".join(f" --{k} {v}" for k, v in (("n", args.n), ("twohop-n", args.twohop_n))
                   if v is not None)
    payload = {
        "command": f"OMP_NUM_THREADS=1 .venv/bin/python benchmarks/testbed_skills.py "
                   f"--testbed {args.testbed}"
                   + (f" --model {args.model}" if args.model else "") + caps +
                   f" --max-new-tokens {args.max_new_tokens}"
                   + (f" --validation {args.validation}" if args.validation else "")
                   + (f" --rows {args.rows}" if args.rows else "") +
                   f" --out {args.out}",
        "date": dt.date.today().isoformat(), "machine": platform.platform(),
        "model": args.model or "the testbed's model", "rows": str(rows), **summary}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps(payload, indent=2) + "\n")
    for line in summary["criteria"]:
        verdict = {True: "PASS", False: "FAIL", None: "n/a "}[line["pass"]]
        print(f"{verdict} {line['criterion']}: {line['measured']} ({line['rule']})")
    for rung, cell in summary["genread_against_closed_book"].items():
        print(f"genread against closed book at r = {rung}: {cell['lost']} facts lost, "
              f"{cell['gained']} gained (sign test p = {cell['sign_test_p']})")
    return payload


if __name__ == "__main__":
    main()
