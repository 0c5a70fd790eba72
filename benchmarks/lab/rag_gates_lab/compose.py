"""Fitting composed gates from recorded decisions: the weights of a
:class:`~rag_gates.gate.Weighted` gate (a logistic regression of "closed-book answer wrong" on
the gates' scores) and the band of a :class:`~rag_gates.gate.Cascade`.

Both read what ``rag-gates eval-gate`` wrote (``decisions.jsonl`` per gate) and the bench
labels of the same questions (``no-rag`` and ``single`` runs), so fitting costs no model call.
Fit on calibration rows, never on the rows you report.

Example (the CLI: ``rag-gates fit-weighted``)::

    rag-gates eval-gate --gate quco --dataset popqa --n 300 --offset 200 --out runs/q --labels L
    rag-gates eval-gate --gate cbdr --dataset popqa --n 300 --offset 200 --out runs/c --labels L
    rag-gates fit-weighted --run runs/q --run runs/c --labels L --out weights.json
    rag-gates bench --dataset popqa --n 200 --methods "selective@weighted(weights.json)" ...
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rag_gates.calibration.fit import cascade_band, fit_weighted
from rag_gates_lab.runner import read_records

__all__ = ["cascade_band", "fit_weighted", "fit_weighted_from_runs", "read_decisions"]


def read_decisions(run_dir: str | Path) -> tuple[str, float, dict[str, float]]:
    """An ``eval-gate`` directory's gate name, calibrated threshold and score per question
    id."""
    run = Path(run_dir)
    path = run / "decisions.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: run rag-gates eval-gate --out {run}")
    meta = json.loads((run / "gate.json").read_text()) if (run / "gate.json").is_file() else {}
    scores = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            scores[row["id"]] = float(row["score"])
    name = meta.get("gate") or json.loads(
        (run / "decisions.config.json").read_text())["config"]["gate"]
    return str(name), float(meta.get("threshold", math.nan)), scores


def fit_weighted_from_runs(run_dirs: Sequence[str | Path], labels_dir: str | Path, *,
                           target_rate: float | None = None) -> dict[str, Any]:
    """:func:`fit_weighted` over the questions every run and the labels share."""
    if not run_dirs:
        raise ValueError("give at least one eval-gate run directory")
    runs = [read_decisions(d) for d in run_dirs]
    records = {(r.id, r.method): r for r in read_records(labels_dir)}
    if not records:
        raise FileNotFoundError(f"{labels_dir} holds no bench records (the no-rag and single "
                                "runs of these questions)")
    ids = [i for i in runs[0][2] if all(i in r[2] for r in runs)
           and (i, "no-rag") in records and (i, "single") in records]
    if not ids:
        raise ValueError("the runs and the labels share no question; fit on the same "
                         "dataset, offset and n")
    fitted = fit_weighted([r[0] for r in runs], [[r[2][i] for i in ids] for r in runs],
                          [records[(i, "no-rag")].accuracy for i in ids],
                          [records[(i, "single")].accuracy for i in ids],
                          target_rate=target_rate)
    fitted["gate_thresholds"] = [r[1] if math.isfinite(r[1]) else None for r in runs]
    fitted["fitted_on"]["runs"] = [str(d) for d in run_dirs]
    fitted["fitted_on"]["questions"] = len(ids)
    return fitted
