"""The validation shape of several testbed builds side by side (issue 35), as the Markdown
table docs/testbed.md shows: one row per criterion, one column per build, from the skills
step's committed reports. No model runs.

Usage (from the repository root)::

    .venv/bin/python benchmarks/testbed_shape_table.py \\
        benchmarks/results/testbed/skills-tb1{2,3,4,5}.json

A build's name is its report's file name without ``skills-`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rag_gates_lab.testbed.skills import shape_table


def build_name(report: Path) -> str:
    """``skills-tb13.json`` -> ``tb13``."""
    return report.stem.removeprefix("skills-")


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("reports", type=Path, nargs="+",
                        help="skills-TB.json files, in the order of the columns")
    args = parser.parse_args(argv)
    table = shape_table({build_name(p): json.loads(p.read_text()) for p in args.reports})
    print(table)
    return table


if __name__ == "__main__":
    main()
