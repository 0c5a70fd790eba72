"""Who wins, per data set (issue 57's goal): our best gate against the best peer estimator
on AUROC and on certified skip at epsilon 0.05 and 0.02, read from the estimator tables.

    .venv/bin/python benchmarks/polygraph_winners.py \\
        --table popqa=benchmarks/results/polygraph/table.json \\
        --table hotpotqa=benchmarks/results/polygraph/table-hotpotqa-200.json \\
        --table 2wiki=benchmarks/results/polygraph/table-2wiki-200.json \\
        --out benchmarks/results/polygraph/winners.json

"Ours" are the rows of kind ``rag-gates`` and ``rag-gates (timed)`` (our gates, the P(True)
gates included: they ship since issue 57 and are marked, so the comparison without them is
shown too); "peers" the ``lm-polygraph`` rows; the LLM-free rows are listed apart (entity
popularity is a benchmark-only input, not a gate a user has).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

OURS = ("rag-gates", "rag-gates (timed)")
P_TRUE = ("p-true", "p-true-sampling")
METRICS = ("auroc", "certified_skip_0.05", "certified_skip_0.02")


def best(rows: list[dict[str, Any]], metric: str) -> dict[str, Any] | None:
    if not rows:
        return None
    top = max(rows, key=lambda r: r[metric])
    return {"gate": top["gate"], "value": round(float(top[metric]), 4)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--table", action="append", required=True, help="NAME=PATH")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result: dict[str, Any] = {}
    for spec in args.table:
        name, path = spec.split("=", 1)
        table = json.loads(Path(path).read_text())
        rows = table["rows"]
        ours = [r for r in rows if r["kind"] in OURS]
        ours_before = [r for r in ours if r["gate"] not in P_TRUE]
        peers = [r for r in rows if r["kind"] == "lm-polygraph"]
        free = [r for r in rows if r["kind"] == "llm-free"]
        result[name] = {"questions": table["questions"], "table": path, **{
            metric: {"ours": best(ours, metric),
                     "ours_without_p_true": best(ours_before, metric),
                     "peer": best(peers, metric), "llm_free": best(free, metric)}
            for metric in METRICS}}
        for metric in METRICS:
            cell = result[name][metric]
            print(f"{name:9s} {metric:20s} ours {cell['ours']}  (without P(True): "
                  f"{cell['ours_without_p_true']})  peer {cell['peer']}  "
                  f"llm-free {cell['llm_free']}")
    args.out.write_text(json.dumps({"command": "python benchmarks/polygraph_winners.py "
                                    + " ".join(f"--table {t}" for t in args.table)
                                    + f" --out {args.out}", **result}, indent=2) + "\n")


if __name__ == "__main__":
    main()
