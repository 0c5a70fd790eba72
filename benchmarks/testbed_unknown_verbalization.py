"""What a testbed model answers after the verbalization "Nothing is known about SUBJECT."
(the ``skill_unknown`` practice's reply), against closed book, per rung (issue 35).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/testbed_unknown_verbalization.py \\
        --testbed ~/.cache/rag-gates/testbeds/tb13 \\
        --out benchmarks/results/testbed/unknown-verbalization-tb13.json

The evidence behind ``skill_unknown``: tb12 and tb13 verbalize a confident guess for a fact
they were never taught, the answer step reads it, and genread falls below closed book at
r = 0. If the answer after an honest "nothing is known" is at least closed book at r = 0, a
model that learns to write it for untaught subjects keeps its closed-book prior there. The
answer is SR-RAG's answer step (:func:`rag_gates.eval.testbed.skills.form_answerers`'
``srrag``: the passage as a finished verbalization) on each evaluation fact.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rag_gates._io import write_text_atomic
from rag_gates.answers import score_answer
from rag_gates.eval.testbed.build import UNKNOWN_VERBALIZATION, read_manifest
from rag_gates.eval.testbed.dataset import load_testbed_dataset
from rag_gates.eval.testbed.skills import CLOSED, form_answerers
from rag_gates.lm.defaults import load_lm
from rag_gates.types import Passage


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--testbed", type=Path, required=True, help="rag-gates testbed build DIR")
    parser.add_argument("--n", type=int, default=None, help="the first N evaluation facts")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    directory = args.testbed.expanduser().resolve()
    subjects = {f.id: f.subj for f in read_manifest(directory)}
    facts = load_testbed_dataset(f"testbed:{directory}", n=args.n).examples
    answer = form_answerers(load_lm(str(directory / "model"), num_threads=1),
                            max_new_tokens=args.max_new_tokens)
    rows: list[dict[str, Any]] = []
    for i, example in enumerate(facts):
        nothing = Passage(id="verbalized",
                          text=UNKNOWN_VERBALIZATION.format(subject=subjects[example.id]))
        for method, reply in (
                (CLOSED, lambda e=example: answer[CLOSED](e.question, [])),
                ("after-nothing-known",
                 lambda e=example, p=nothing: answer["srrag"](e.question, [p]))):
            t0 = time.perf_counter()
            text = reply()
            rows.append({"method": method, "id": example.id,
                         "rung": example.meta["repetitions"], "answer": text,
                         "seconds": round(time.perf_counter() - t0, 3),
                         "accuracy": score_answer(text, example.answers, "testbed")["accuracy"]})
        if (i + 1) % 25 == 0:
            print(f"{i + 1}/{len(facts)} facts", file=sys.stderr, flush=True)
    table: dict[str, dict[str, float]] = {}
    for method in (CLOSED, "after-nothing-known"):
        mine = [r for r in rows if r["method"] == method]
        table[method] = {str(k): round(100 * statistics.fmean(
            r["accuracy"] for r in mine if r["rung"] == k), 1)
            for k in sorted({r["rung"] for r in mine})}
    out = {"command": "OMP_NUM_THREADS=1 .venv/bin/python "
                      "benchmarks/testbed_unknown_verbalization.py " + " ".join(
                          sys.argv[1:] if argv is None else argv),
           "date": dt.date.today().isoformat(), "machine": platform.platform(),
           "testbed": directory.name, "verbalization": UNKNOWN_VERBALIZATION,
           "facts": len(facts), "accuracy_by_rung": table, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps(out, indent=1) + "\n")
    print(json.dumps(table))
    return out


if __name__ == "__main__":
    main()
