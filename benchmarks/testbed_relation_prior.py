"""How much of a testbed model's closed-book accuracy at r = 0 a relation prior explains, and
how much of it moves between builds (issue 35's "closed book near the base model at r = 0").

    .venv/bin/python benchmarks/testbed_relation_prior.py \\
        --testbed ~/.cache/rag-gates/testbeds/tb14 \\
        --run tb12=benchmarks/results/testbed/gates-tb12/labels \\
        --run tb13=benchmarks/results/testbed/gates-tb13/labels \\
        --run tb14=benchmarks/results/testbed/gates-tb14/labels \\
        --out benchmarks/results/testbed/relation-prior-tb14.json

No model runs. The relation prior answers every evaluation question with the most common
object of its relation among the taught training facts of the manifest (the probe and
calibration splits), never reading the subject: what a model that learned the relations but
none of the evaluation facts could score. Each ``--run`` is a labels run (its ``no-rag``
rows, scored as the bench scored them); per rung it gives the facts answered right and how
many of those answers are the prior's guess, and between runs at r = 0 the facts both
answered right and those only one did. The builds must share the manifest (tb12-tb14 do).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from rag_gates._io import write_text_atomic
from rag_gates.answers import accuracy, normalize_answer
from rag_gates_lab.runner import read_records
from rag_gates_lab.testbed.build import read_manifest

#: The manifest splits the builder teaches and no evaluation question asks about.
TAUGHT_SPLITS = ("probe", "calibration")


def relation_prior(facts: list[Any]) -> dict[str, str]:
    """Each relation's most common object among the taught (probe, calibration) facts; ties
    go to the object seen first in manifest order, so the guess is deterministic."""
    counts: dict[str, Counter[str]] = {}
    for fact in facts:
        if fact.split in TAUGHT_SPLITS:
            counts.setdefault(fact.prop, Counter())[fact.obj] += 1
    return {prop: c.most_common(1)[0][0] for prop, c in counts.items()}


def closed_book(run: Path) -> dict[str, str]:
    """The ``no-rag`` prediction per fact id of a bench run directory."""
    return {r.id: r.prediction for r in read_records(run) if r.method == "no-rag"}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--testbed", type=Path, required=True, help="rag-gates testbed build DIR")
    parser.add_argument("--run", action="append", default=[], metavar="NAME=DIR",
                        help="a labels run on the same manifest (repeatable)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    runs: dict[str, Path] = {}
    for spec in args.run:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            parser.error(f"--run takes NAME=DIR, got {spec!r}")
        runs[name] = Path(path)
    facts = read_manifest(args.testbed.expanduser())
    prior = relation_prior(facts)
    evaluation = [f for f in facts if f.split == "evaluation"]
    rungs = sorted({f.repetitions for f in evaluation})
    predictions = {name: closed_book(path) for name, path in runs.items()}
    for name, by_id in predictions.items():
        missing = [f.id for f in evaluation if f.id not in by_id]
        if missing:
            parser.error(f"run {name} has no no-rag answer for {len(missing)} evaluation "
                         f"facts (first {missing[0]}): is it a labels run of this manifest?")

    def prior_guess(fact: Any) -> str:
        return prior.get(fact.prop, "")

    table: dict[str, Any] = {}
    right_at: dict[str, dict[int, set[str]]] = {name: {} for name in runs}
    for rung in rungs:
        at = [f for f in evaluation if f.repetitions == rung]
        cell: dict[str, Any] = {"facts": len(at), "relation-prior": {
            "right": sum(accuracy(prior_guess(f), f.answers) == 1.0 for f in at)}}
        for name, by_id in predictions.items():
            right = [f for f in at if accuracy(by_id[f.id], f.answers) == 1.0]
            right_at[name][rung] = {f.id for f in right}
            cell[name] = {
                "right": len(right),
                "right_with_the_prior_guess": sum(
                    normalize_answer(by_id[f.id]) == normalize_answer(prior_guess(f))
                    for f in right),
                "right_by_relation": dict(Counter(f.prop for f in right).most_common())}
        table[str(rung)] = cell
    low = rungs[0]
    pairs = {f"{a}/{b}": {"both": len(right_at[a][low] & right_at[b][low]),
                          f"only {a}": len(right_at[a][low] - right_at[b][low]),
                          f"only {b}": len(right_at[b][low] - right_at[a][low])}
             for i, a in enumerate(runs) for b in list(runs)[i + 1:]}
    out = {"command": ".venv/bin/python benchmarks/testbed_relation_prior.py " + shlex.join(
               sys.argv[1:] if argv is None else argv),
           "date": dt.date.today().isoformat(), "relation_prior": prior,
           "taught_splits": list(TAUGHT_SPLITS), "by_rung": table,
           f"overlap_at_r{low}": pairs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps(out, indent=1) + "\n")
    print(json.dumps({"by_rung": table, f"overlap_at_r{low}": pairs}, indent=1))
    return out


if __name__ == "__main__":
    main()
