"""The exact test's size by enumeration (no Monte-Carlo): for each (n, epsilon, delta), the
probability that ``exact_p_values`` rejects, summed exactly over every (harms, helps)
outcome, at 1,001 points of the null's boundary (harm = help + epsilon) and at interior
points (harm = help + epsilon + 0.01, + 0.05). Valid means at most delta everywhere.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/calibration_exact_size.py \\
        --out benchmarks/results/calibration_exact_size.json

The randomised test's size averages the 16 tables (u uniform, rounded up to k/16, picks
table k). Written independently of tests/calibration/test_bounds.py: its own trinomial
pmf (log-gamma), its own grid.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from rag_gates.calibration.bounds import EXACT_RANDOM_LEVELS, exact_p_values


def trinomial_pmf(n: int, harm: NDArray[np.float64], help_: NDArray[np.float64]
                  ) -> NDArray[np.float64]:
    """(points, n + 1, n + 1): P(h harms, g helps) at each (harm, help) rate pair."""
    lg = np.array([math.lgamma(k + 1) for k in range(n + 1)])
    h, g = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    z = n - h - g
    valid = z >= 0
    zc = np.where(valid, z, 0)
    log_mult = lg[n] - lg[h] - lg[g] - lg[zc]
    none = 1.0 - harm - help_
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = (log_mult[None] + h[None] * np.log(harm)[:, None, None]
                 + np.where(g[None] > 0, g[None] * np.log(help_)[:, None, None], 0.0)
                 + np.where(zc[None] > 0, zc[None] * np.log(np.maximum(none, 0.0))[:, None,
                                                                                     None],
                            0.0))
    out: NDArray[np.float64] = np.where(valid[None], np.exp(terms), 0.0)
    return out


def sizes(n: int, eps: float, deltas: list[float], randomised: bool) -> dict[str, float]:
    tables = [exact_p_values(n, eps, (k + 1) / EXACT_RANDOM_LEVELS if randomised else 1.0)
              for k in range(EXACT_RANDOM_LEVELS if randomised else 1)]
    out: dict[str, float] = {}
    for shift, label in ((0.0, "boundary"), (0.01, "interior+0.01"), (0.05, "interior+0.05")):
        top = (1.0 - eps - shift) / 2.0
        if top <= 0:
            continue
        help_ = np.linspace(0.0, top, 1001)
        harm = help_ + eps + shift
        worst = {d: 0.0 for d in deltas}
        for start in range(0, help_.size, 50):
            pmf = trinomial_pmf(n, harm[start:start + 50], help_[start:start + 50])
            for d in deltas:
                size = np.mean([(pmf * (t <= d)[None]).sum(axis=(1, 2)) for t in tables],
                               axis=0)
                worst[d] = max(worst[d], float(size.max()))
        for d in deltas:
            out[f"{label} delta={d:g}"] = worst[d]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/results/calibration_exact_size.json")
    args = parser.parse_args()
    deltas = [0.01, 0.05, 0.1, 0.2]
    plan = [(n, e, False) for n in (30, 50, 100, 200, 400)
            for e in (0.01, 0.02, 0.05, 0.1, 0.5, 0.9)]
    plan += [(n, e, True) for n in (30, 50, 100, 200) for e in (0.01, 0.02, 0.05, 0.1, 0.5)]
    plan += [(600, 0.05, False)]
    rows = []
    started = time.perf_counter()
    for n, eps, randomised in plan:
        s = sizes(n, eps, deltas, randomised)
        over = {k: v for k, v in s.items() if v > float(k.split("=")[1]) + 1e-12}
        rows.append({"n": n, "epsilon": eps, "randomised": randomised, "worst_size": s,
                     "above_delta": over})
        print(n, eps, randomised, "max size/delta",
              max(v / float(k.split("=")[1]) for k, v in s.items()), over or "", flush=True)
        Path(args.out).write_text(json.dumps({
            "command": "benchmarks/calibration_exact_size.py", "seconds":
            time.perf_counter() - started, "violations": [r for r in rows if r["above_delta"]],
            "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
