"""benchmarks/calibration_peers.py (issue 57): MAPIE's Learn-then-Test, as the benchmark
calls it, certifies what an independent recomputation of its Hoeffding-Bentkus p-values
and family-wise procedures certifies on the same losses, and a violation is counted as the
docs say."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from numpy.typing import NDArray

from rag_gates.calibration.bounds import binomial_cdf, clopper_pearson

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "benchmarks" / "results" / "calibrate" / "sample-200" / "work" / "records.jsonl"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("calibration_peers",
                                                  ROOT / "benchmarks" / "calibration_peers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def _hb_p_value(k: int, n: int, alpha: float) -> float:
    """Hoeffding-Bentkus p-value of "risk > alpha" for k losses of 1 out of n (Learn then
    Test, arXiv 2110.01052, section 3.2: the binary Bentkus term is the binomial tail)."""
    r = k / n
    kl = (r * math.log(r / alpha) if r > 0 else 0.0) + (1 - r) * math.log((1 - r) / (1 - alpha))
    hoeffding = math.exp(-n * kl) if r < alpha else 1.0
    return min(hoeffding, binomial_cdf(k, n, alpha))


def _independent_skips(p_cal: NDArray[np.float64], harm: NDArray[np.bool_], epsilon: float,
                       delta: float, holm: bool) -> int:
    """Questions skipped at the threshold fixed-sequence testing (from the highest lambda
    down) or Holm's step-down procedure certifies on MAPIE's default grid, picking the
    valid lambda that skips most."""
    grid = np.linspace(0, 0.99, 100)
    n = p_cal.size
    p_values = np.array([_hb_p_value(int((harm & (p_cal >= lam)).sum()), n, epsilon)
                         for lam in grid])
    valid: list[int] = []
    if holm:
        order = np.argsort(p_values, kind="stable")
        for rank, i in enumerate(order):
            if p_values[i] > delta / (grid.size - rank):
                break
            valid.append(int(i))
    else:
        for i in range(grid.size - 1, -1, -1):
            if p_values[i] > delta:
                break
            valid.append(i)
    if not valid:
        return 0
    return int((p_cal >= grid[min(valid)]).sum())


def test_mapie_certifies_what_its_p_values_and_fwer_procedures_say() -> None:
    pytest.importorskip("mapie")
    bench = _bench()
    pool = bench.records_pool("calibrate-sample", RECORDS)
    eps, delta = 0.05, 0.1
    out = bench.run_pool(pool, 150, 12, [eps], delta, seed=3, gates=["cbdr", "answer-logprob"],
                         check=False, keep=True)
    totals = {"fst": 0, "holm": 0}
    for gate in ("cbdr", "answer-logprob"):
        r = out[gate][str(eps)]
        rows = r["mapie-fst"]["rows"]
        p_pool = bench.skip_probability(gate, pool.scores[gate])
        fst = [_independent_skips(p_pool[c], pool.loss[c] > 0, eps, delta, holm=False)
               for c in rows]
        holm = [_independent_skips(p_pool[c], pool.loss[c] > 0, eps, delta, holm=True)
                for c in rows]
        assert list(r["mapie-fst"]["skipped_cal"]) == fst
        assert list(r["mapie-holm"]["skipped_cal"]) == holm
        totals["fst"] += sum(fst)
        totals["holm"] += sum(holm)
        # On every cut the HB p-value is the exact binomial tail on the harm count: MAPIE's
        # fixed-sequence controller over the draw's own scores is our binomial bound.
        assert list(r["mapie-fst-cuts"]["skipped_cal"]) == list(r["binomial"]["skipped_cal"])
    # Something was certified, and Holm's multiplicity cost shows on real records.
    assert totals["fst"] > totals["holm"] > 0


def test_violations_and_certified_skip_are_counted_as_documented() -> None:
    bench = _bench()
    loss = np.array([1.0, 1.0, 1.0, -1.0, 0.0] + [0.0] * 15)      # N = 20
    skipped = np.zeros((4, 20), dtype=bool)
    skipped[0, :2] = True          # drop 0.10 > 0.05: a violation
    skipped[1, [0, 4]] = True      # drop exactly 0.05: not one
    skipped[2, :4] = True          # drop (3 - 1) / 20 = 0.10: a violation
    skipped[3, 3:] = True          # drop -0.05
    got = bench.summary(0.05, 0.1, 10, np.array([0, 3, 10, 5]), skipped, loss)
    assert got["violation"] == 0.5
    assert got["broken"] is True
    assert math.isclose(got["mean_drop_pool"], (0.10 + 0.05 + 0.10 - 0.05) / 4)
    assert got["none_certified"] == 0.25
    expected = np.mean([0.0] + [clopper_pearson(k, 10, 0.9)[0] for k in (3, 10, 5)])
    assert math.isclose(got["certified_skip"], expected)
