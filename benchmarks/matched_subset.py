"""Compare methods on the questions every one of them answered (e.g. a peer run that is
still resuming): accuracy, EM, F1 and retrievals per question over the common question ids.

    .venv/bin/python benchmarks/matched_subset.py benchmarks/results/eval/hotpotqa-200 \
        benchmarks/results/eval/hotpotqa-200-flare
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from rag_gates_lab.runner import read_records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="bench run directories (one dataset)")
    args = parser.parse_args()
    by_method: dict[str, dict[str, object]] = defaultdict(dict)
    for run in args.runs:
        for r in read_records(run):
            by_method[r.method][r.id] = r
    common = set.intersection(*(set(rs) for rs in by_method.values()))
    print(f"{len(common)} questions answered by every method of {', '.join(map(str, args.runs))}")
    print("| method | n | EM | F1 | acc | retrievals/q |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for method, records in by_method.items():
        rows = [records[i] for i in sorted(common)]
        n = len(rows)

        def mean(attr: str, rows: list[object] = rows, n: int = n) -> float:
            return sum(float(getattr(r, attr)) for r in rows) / n

        print(f"| {method} | {n} | {100 * mean('em'):.1f} | {100 * mean('f1'):.1f} | "
              f"{100 * mean('accuracy'):.1f} | {mean('retrievals'):.2f} |")


if __name__ == "__main__":
    main()
