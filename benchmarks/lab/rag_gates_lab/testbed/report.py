"""The testbed's validation table: accuracy by repetition count, read from bench runs.

Example:
    >>> from rag_gates_lab.testbed.report import ladder_table
    >>> rows = ladder_table(["runs/tb-base", "runs/tb-model"])          # doctest: +SKIP
    >>> rows[0]["by_repetitions"]["16"]["accuracy"]                      # doctest: +SKIP
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rag_gates_lab.runner import read_records

__all__ = ["ladder_table"]


def _cell(values: list[float]) -> dict[str, Any]:
    correct = sum(1 for v in values if v > 0)
    return {"n": len(values), "correct": correct,
            "accuracy": 100 * sum(values) / len(values) if values else float("nan")}


def ladder_table(runs: Sequence[str | Path]) -> list[dict[str, Any]]:
    """One row per (run, method): accuracy overall and per repetition count (two-hop runs:
    per pair of counts, e.g. ``"4+16"``; runs on other datasets: overall only)."""
    rows = []
    for run in runs:
        directory = Path(run)
        config_path = directory / "config.json"
        if not config_path.is_file():
            raise FileNotFoundError(f"{directory} is not a bench directory (no config.json)")
        config = json.loads(config_path.read_text())["config"]
        records = read_records(directory)
        if not records:
            raise ValueError(f"{directory} has no results yet")
        by_method: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for r in records:
            reps = r.meta.get("repetitions")
            # A run on another dataset (the HotpotQA check) has only the overall cell.
            key = ("all" if reps is None else "+".join(str(x) for x in reps)
                   if isinstance(reps, list) else str(reps))
            by_method[r.method][key].append(r.accuracy)
        for method, cells in by_method.items():
            every = [v for values in cells.values() for v in values]
            rows.append({"run": str(directory), "dataset": config["dataset"],
                         "model": config["model"], "method": method,
                         "by_repetitions": {k: _cell(cells[k]) for k in sorted(
                             (k for k in cells if k != "all"),
                             key=lambda k: [int(x) for x in k.split("+")])},
                         "all": _cell(every)})
    return rows
