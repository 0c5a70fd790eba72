"""What a testbed model answers after the verbalization "There is no information about
SUBJECT." (the ``skill_unknown`` practice's reply), against closed book, per rung (issue 35).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/testbed_unknown_verbalization.py \\
        --testbed ~/.cache/rag-gates/testbeds/tb13 \\
        --out benchmarks/results/testbed/unknown-verbalization-tb13.json

The evidence behind ``skill_unknown``: tb12 and tb13 verbalize a confident guess for a fact
they were never taught, the answer step reads it, and genread falls below closed book at
r = 0. If the answer after an honest "no information" is at least closed book at r = 0, a
model that learns to write it for untaught subjects keeps its closed-book prior there. The
answer is SR-RAG's answer step (:func:`rag_gates_lab.testbed.skills.form_answerers`'
``srrag``: the passage as a finished verbalization) on each evaluation fact. ``--verbalize``
also asks whether the model writes the sentence itself, per rung (on a ``--skill-unknown``
build it should at r = 0 and not at r = 64).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from rag_gates._io import write_text_atomic
from rag_gates.answers import score_answer
from rag_gates.lm.defaults import load_lm
from rag_gates.srrag.verbalizer import Verbalizer
from rag_gates.types import Passage
from rag_gates_lab.testbed.build import UNKNOWN_VERBALIZATION, read_manifest
from rag_gates_lab.testbed.dataset import load_testbed_dataset
from rag_gates_lab.testbed.skills import CLOSED, accuracy_cell, form_answerers

#: The table's rows besides closed book: the answer after the sentence, and (``--verbalize``)
#: the % of facts whose verbalization is the sentence.
AFTER, SAYS = "after-no-information", "verbalizes-no-information"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--testbed", type=Path, required=True, help="rag-gates testbed build DIR")
    parser.add_argument("--n", type=int, default=None, help="the first N evaluation facts")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--verbalize", action="store_true",
                        help="also verbalize each fact greedily (SR-RAG's GenRead, 150 tokens) "
                             "and report, per rung, the share of verbalizations that are the "
                             "sentence: whether the model says it where it was never taught")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.n is not None and args.n < 1:
        parser.error(f"--n must be at least 1, got {args.n}")
    directory = args.testbed.expanduser().resolve()
    subjects = {f.id: f.subj for f in read_manifest(directory)}
    facts = load_testbed_dataset(f"testbed:{directory}", n=args.n).examples
    lm = load_lm(str(directory / "model"), num_threads=1)
    answer = form_answerers(lm, max_new_tokens=args.max_new_tokens)
    verbalizer = Verbalizer(lm)
    opening = UNKNOWN_VERBALIZATION.split("{")[0]  # "There is no information about "
    methods = [CLOSED, AFTER, *([SAYS] if args.verbalize else [])]
    rows: list[dict[str, Any]] = []
    for i, example in enumerate(facts):
        nothing = Passage(id="verbalized",
                          text=UNKNOWN_VERBALIZATION.format(subject=subjects[example.id]))
        # Closed book, then SR-RAG's answer step with the sentence as the verbalization.
        for method, form, passages in ((CLOSED, CLOSED, []),
                                       (AFTER, "srrag", [nothing])):
            t0 = time.perf_counter()
            text = answer[form](example.question, passages)
            rows.append({"method": method, "id": example.id,
                         "rung": example.meta["repetitions"], "answer": text,
                         "seconds": round(time.perf_counter() - t0, 3),
                         "accuracy": score_answer(text, example.answers, "testbed")["accuracy"]})
        if args.verbalize:
            t0 = time.perf_counter()
            text = verbalizer.verbalize(example.question).text
            # "accuracy" here: 1 when the verbalization is the practised sentence.
            rows.append({"method": SAYS, "id": example.id, "rung": example.meta["repetitions"],
                         "answer": text, "seconds": round(time.perf_counter() - t0, 3),
                         "accuracy": float(text.strip().startswith(opening))})
        if (i + 1) % 25 == 0:
            print(f"{i + 1}/{len(facts)} facts", file=sys.stderr, flush=True)
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for method in methods:
        mine = [r for r in rows if r["method"] == method]
        table[method] = {str(k): accuracy_cell([r for r in mine if r["rung"] == k])
                         for k in sorted({r["rung"] for r in mine})}
    out = {"command": "OMP_NUM_THREADS=1 .venv/bin/python "
                      "benchmarks/testbed_unknown_verbalization.py " + shlex.join(
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
