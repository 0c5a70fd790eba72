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

from rag_gates.eval.gate_eval import calibrate, threshold_curve
from rag_gates.eval.runner import read_records
from rag_gates.gate import UNDECIDED_SCORE

__all__ = ["cascade_band", "fit_weighted", "fit_weighted_from_runs", "read_decisions"]


def _usable(score: float) -> bool:
    return math.isfinite(score) and score < UNDECIDED_SCORE


def fit_weighted(names: Sequence[str], columns: Sequence[Sequence[float]],
                 closed: Sequence[float], retrieved: Sequence[float], *,
                 target_rate: float | None = None, c: float = 1.0) -> dict[str, Any]:
    """Logistic regression of "closed-book answer wrong" (``closed == 0``) on the gates'
    standardised scores; the probability threshold is calibrated on the same rows (best
    accuracy, or the retrieval rate ``target_rate``). Rows where a gate could not decide
    are left out (counted in ``rows_dropped``). Returns the JSON that
    :meth:`Weighted.from_json` and ``weighted(FILE)`` read.
    """
    from rag_gates._optional import require

    linear_model = require("sklearn.linear_model", "eval")
    if len(columns) != len(names) or not names:
        raise ValueError(f"one score column per gate: {len(names)} names, {len(columns)} "
                         "columns")
    n = len(closed)
    if any(len(col) != n for col in columns) or len(retrieved) != n:
        raise ValueError("every column and the labels must cover the same rows")
    keep = [i for i in range(n) if all(_usable(col[i]) for col in columns)]
    labels = [int(closed[i] == 0.0) for i in keep]
    if len(set(labels)) < 2:
        raise ValueError(f"the {len(keep)} usable rows hold one class only; fit on rows where "
                         "the closed-book answer is sometimes right and sometimes wrong")
    center, scale = [], []
    for col in columns:
        values = [col[i] for i in keep]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        center.append(mean)
        scale.append(std if std > 0 else 1.0)
    x = [[(col[i] - m) / s for col, m, s in zip(columns, center, scale, strict=True)]
         for i in keep]
    model = linear_model.LogisticRegression(C=c, max_iter=1000).fit(x, labels)
    weights = [float(w) for w in model.coef_[0]]
    bias = float(model.intercept_[0])
    probs = [1.0 / (1.0 + math.exp(-(bias + sum(w * v for w, v in zip(weights, row,
                                                                         strict=True)))))
             for row in x]
    chosen = calibrate(threshold_curve(probs, [closed[i] for i in keep],
                                       [retrieved[i] for i in keep]), target_rate)
    return {"gates": list(names), "weights": weights, "bias": bias, "center": center,
            "scale": scale, "threshold": chosen.threshold,
            "fitted_on": {"rows": len(keep), "rows_dropped": n - len(keep),
                          "positives": sum(labels), "C": c,
                          "calibration": "best-accuracy" if target_rate is None
                          else f"target-rate {target_rate}",
                          "expected": {"accuracy": chosen.accuracy,
                                       "retrieval_rate": chosen.retrieval_rate}}}


def cascade_band(cheap_scores: Sequence[float], threshold: float, share: float
                 ) -> tuple[float, float]:
    """The band around the cheap gate's ``threshold`` that holds the ``share`` of
    (calibration) scores nearest to it: the questions the cheap gate is least sure of."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    usable = sorted((abs(s - threshold), s) for s in cheap_scores if _usable(s))
    if not usable:
        raise ValueError("no usable cheap-gate score to place the band")
    nearest = [s for _, s in usable[: max(1, round(share * len(usable)))]]
    return min(min(nearest), threshold), max(max(nearest), threshold)


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
