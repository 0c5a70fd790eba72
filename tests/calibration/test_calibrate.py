"""calibrate(): certified thresholds, the composite's split, and every kind of bad input
getting a typed error or an "always retrieve" spec (never a silent threshold)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from rag_gates.calibration import (
    CalibrationError,
    CalibrationRecord,
    GateSpec,
    ModelIdentity,
    calibrate,
    skip_curve,
)
from tests.calibration.conftest import synthetic_records


def _drop(records: list[CalibrationRecord], gate: str, threshold: float | None) -> float:
    if threshold is None:
        return 0.0
    return sum(r.signed_loss_if_skipped for r in records
               if r.scores.get(gate) is not None and r.scores[gate] < threshold) / len(records)


def test_a_good_gate_is_certified_and_skips(model: ModelIdentity) -> None:
    records = synthetic_records(600)
    for bound in ("wsr", "binomial"):
        report = calibrate(records, max_loss=0.05, delta=0.1, bound=bound, model=model,
                           retriever="bm25 over test docs", composite=False)
        good = report.row("good")
        assert good.threshold is not None and good.observed_skip_rate > 0.2
        # Skips are the rows below the threshold, and their drop is what the row says.
        skipped = sum(r.scores["good"] < good.threshold for r in records) / len(records)
        assert good.observed_skip_rate == pytest.approx(skipped)
        assert good.observed_drop == pytest.approx(_drop(records, "good", good.threshold))
        assert good.skip_rate.lower <= good.observed_skip_rate <= good.skip_rate.upper
        assert good.certified_skip_rate == good.skip_rate.lower
        assert report.best.gate == "good"


def test_a_tighter_epsilon_skips_less(model: ModelIdentity) -> None:
    records = synthetic_records(600)
    curve = skip_curve(records, "good", [0.01, 0.02, 0.05, 0.1], delta=0.1, bound="wsr")
    rates = [r for _, r in curve]
    assert rates == sorted(rates) and rates[-1] > rates[0]
    report = calibrate(records, max_loss=0.05, model=model, retriever="-", gates=["good"],
                       bound="wsr")
    assert report.family == 1
    assert curve[2][1] == report.row("good").observed_skip_rate


def test_picking_the_best_of_several_gates_divides_delta(model: ModelIdentity) -> None:
    """Each of G rows is certified at delta / G, so the one `best` picks keeps delta; the
    spec records the family. Without it each row holds at delta alone."""
    records = synthetic_records(600)
    report = calibrate(records, max_loss=0.05, delta=0.1, model=model, retriever="-")
    # good, noise, the weighted and the cascade composites.
    assert report.family == 4 and {r.delta for r in report.rows} == {0.1 / 4}
    spec = report.best
    assert spec.delta == 0.1 and spec.family == 4 and "each of 4 gates" in spec.note
    alone = calibrate(records, max_loss=0.05, delta=0.1, model=model, retriever="-",
                      family_wise=False)
    assert alone.family == 1 and {r.delta for r in alone.rows} == {0.1}
    assert alone.row("good").observed_skip_rate >= report.row("good").observed_skip_rate


def test_the_composite_is_fitted_on_one_half_and_certified_on_the_other(
        model: ModelIdentity) -> None:
    records = synthetic_records(400)
    report = calibrate(records, max_loss=0.05, model=model, retriever="-")
    name = "weighted(good,noise)"
    row = report.row(name)
    assert report.composite is not None and report.composite_name == name
    assert row.n_fit == report.composite.fit_rows == 200 and row.n == 200
    assert row.n + row.n_fit == len(records)
    # The good gate carries the weight.
    assert abs(report.composite.weights[0]) > abs(report.composite.weights[1])
    spec = report.spec_for(name)
    assert spec.composite == report.composite and spec.n == 200


def test_the_cascade_is_fitted_on_one_half_and_certified_on_the_other(
        model: ModelIdentity) -> None:
    """The cascade (pair, order, band, each gate's logistic scale) is chosen on the fitting
    half only: relabelling every certification-half question leaves the fit unchanged,
    relabelling the fitting half changes it; the row is certified on the other half."""
    records = synthetic_records(400)
    report = calibrate(records, max_loss=0.05, model=model, retriever="-")
    name = "cascade(good,noise)"
    row = report.row(name)
    fit = report.cascade
    assert fit is not None and report.cascade_name == name
    assert row.n_fit == fit.fit_rows == 200 and row.n == 200
    assert {fit.cheap.gates[0], fit.expensive.gates[0]} == {"good", "noise"}
    assert fit.band[0] <= fit.band[1]
    spec = report.spec_for(name)
    assert spec.cascade == fit and spec.composite is None and spec.n == 200
    # Which rows were the fitting half: calibrate's seeded order, first half.
    order = np.random.default_rng(0).permutation(len(records))
    fit_ids = {records[i].id for i in order[:200]}

    def flipped(rows: set[str]) -> list[CalibrationRecord]:
        return [r.model_copy(update={"closed_book_correct": not r.closed_book_correct,
                                     "retrieved_correct": not r.retrieved_correct})
                if r.id in rows else r for r in records]

    cert_ids = {r.id for r in records} - fit_ids
    same = calibrate(flipped(cert_ids), max_loss=0.05, model=model, retriever="-")
    assert same.cascade == fit
    other = calibrate(flipped(fit_ids), max_loss=0.05, model=model, retriever="-")
    assert other.cascade != fit


def test_the_randomised_exact_bound_is_reproducible_from_the_seed(
        model: ModelIdentity) -> None:
    """bound="exact-random" draws its uniform from the seed: the same seed gives the same
    threshold, and it skips at least as much as the deterministic test with that seed
    (a smaller u can only lower a p-value)."""
    records = synthetic_records(300)
    kw: dict[str, object] = {"max_loss": 0.05, "model": model, "retriever": "-",
                             "gates": ["good"]}
    a = calibrate(records, bound="exact-random", seed=3, **kw)  # type: ignore[arg-type]
    b = calibrate(records, bound="exact-random", seed=3, **kw)  # type: ignore[arg-type]
    fixed = calibrate(records, bound="exact", seed=3, **kw)     # type: ignore[arg-type]
    assert a.row("good").threshold == b.row("good").threshold
    assert a.row("good").observed_skip_rate >= fixed.row("good").observed_skip_rate
    assert a.best.bound == "exact-random"


def test_unscorable_rows_count_as_retrieve(model: ModelIdentity) -> None:
    """The rows the gate could not score (None, NaN) are never skipped, even where the
    score would be lowest: the skip rate counts only scored rows below the threshold."""
    records = synthetic_records(400)
    broken = [r.model_copy(update={"scores": {**r.scores, "good": None if i % 4 == 0 else
                                              (math.nan if i % 4 == 1 else r.scores["good"])}})
              for i, r in enumerate(records)]
    report = calibrate(broken, max_loss=0.05, model=model, retriever="-", composite=False)
    row = report.row("good")
    assert row.unscored == 200
    assert row.threshold is not None
    skipped = sum(r.scores["good"] is not None and not math.isnan(r.scores["good"])
                  and r.scores["good"] < row.threshold for r in broken)
    assert row.observed_skip_rate == pytest.approx(skipped / 400)


def test_a_gate_that_never_scores_gets_always_retrieve(model: ModelIdentity) -> None:
    records = [r.model_copy(update={"scores": {**r.scores, "dead": None}})
               for r in synthetic_records(200)]
    report = calibrate(records, max_loss=0.05, model=model, retriever="-", composite=False)
    row = report.row("dead")
    assert row.threshold is None and "could not score" in row.note
    spec = report.spec_for("dead")
    assert spec.certified is False and spec.note.startswith("no threshold certified")


def test_nothing_certified_gives_an_always_retrieve_best(model: ModelIdentity,
                                                         tmp_path: Path) -> None:
    """30 questions cannot certify epsilon 0.01: the best spec says so and has no
    threshold; saved and loaded it still says so."""
    report = calibrate(synthetic_records(30), max_loss=0.01, model=model, retriever="-")
    assert all(row.threshold is None for row in report.rows)
    best = report.best
    assert best.threshold is None and not best.certified
    assert "no threshold certified: always retrieve" in best.note
    assert GateSpec.load(best.save(tmp_path / "gate.json")) == best


@pytest.mark.parametrize("n", [0, 1, 29])
def test_fewer_than_30_questions_are_refused(model: ModelIdentity, n: int) -> None:
    with pytest.raises(CalibrationError, match="at least 30"):
        calibrate(synthetic_records(n), model=model, retriever="-")


@pytest.mark.parametrize("closed", [True, False])
def test_one_class_labels_are_refused(model: ModelIdentity, closed: bool) -> None:
    records = [r.model_copy(update={"closed_book_correct": closed})
               for r in synthetic_records(100)]
    with pytest.raises(CalibrationError, match="one class"):
        calibrate(records, model=model, retriever="-")


@pytest.mark.parametrize("field", ["max_loss", "delta"])
@pytest.mark.parametrize("value", [0.0, 1.0, -0.1, 1.5, math.nan, True])
def test_epsilon_and_delta_outside_0_1_are_refused(model: ModelIdentity, field: str,
                                                   value: float) -> None:
    kwargs = {"max_loss": 0.05, "delta": 0.1, field: value}
    with pytest.raises(CalibrationError, match="strictly between 0 and 1"):
        calibrate(synthetic_records(100), model=model, retriever="-", **kwargs)


def test_other_bad_input(model: ModelIdentity) -> None:
    records = synthetic_records(100)
    with pytest.raises(CalibrationError, match="bound"):
        calibrate(records, bound="hoeffding", model=model, retriever="-")  # type: ignore[arg-type]
    with pytest.raises(CalibrationError, match="appears more than once"):
        calibrate([*records, records[0]], model=model, retriever="-")
    with pytest.raises(CalibrationError, match="no record holds a score for missing"):
        calibrate(records, gates=["missing"], model=model, retriever="-")


def _saved(tmp_path: Path, model: ModelIdentity) -> tuple[Path, GateSpec]:
    report = calibrate(synthetic_records(400), max_loss=0.05, model=model,
                       retriever="bm25 over test docs")
    spec = report.best
    return spec.save(tmp_path / "gate.json"), spec


def test_spec_round_trip_records_the_guarantee(tmp_path: Path, model: ModelIdentity) -> None:
    path, spec = _saved(tmp_path, model)
    loaded = GateSpec.load(path)
    assert loaded == spec and loaded.certified
    data = json.loads(path.read_text())
    for key in ("gate", "threshold", "epsilon", "delta", "bound", "n", "skip_rate",
                "retrieval_rate", "model", "retriever", "versions", "created", "assumption",
                "checksum"):
        assert key in data
    assert "exchangeable" in data["assumption"] and data["model"]["fingerprint"] == "f" * 64
    assert data["retrieval_rate"]["observed"] == pytest.approx(
        1 - data["skip_rate"]["observed"])


def test_a_hand_edited_spec_is_refused(tmp_path: Path, model: ModelIdentity) -> None:
    path, spec = _saved(tmp_path, model)
    data = json.loads(path.read_text())
    data["threshold"] = (spec.threshold or 0.0) * 2
    path.write_text(json.dumps(data, indent=2))
    with pytest.raises(CalibrationError, match="checksum mismatch"):
        GateSpec.load(path)


def test_a_truncated_spec_is_refused(tmp_path: Path, model: ModelIdentity) -> None:
    path, _ = _saved(tmp_path, model)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(CalibrationError, match="truncated"):
        GateSpec.load(path)


def test_other_files_are_refused(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(CalibrationError, match="no such gate spec") as refused:
        GateSpec.load(missing)
    assert f"rag-gates calibrate --out {missing}" in str(refused.value)  # the path, filled in
    with pytest.raises(CalibrationError, match="is a directory; pass the gate spec file"):
        GateSpec.load(tmp_path)
    (tmp_path / "eval.json").write_text(json.dumps({"gate": "quco", "threshold": 0.3}))
    with pytest.raises(CalibrationError, match="not a rag-gates gate spec"):
        GateSpec.load(tmp_path / "eval.json")


def test_a_cascade_spec_round_trips_and_its_band_is_sealed(tmp_path: Path,
                                                           model: ModelIdentity) -> None:
    report = calibrate(synthetic_records(400), max_loss=0.05, model=model, retriever="-")
    assert report.cascade_name is not None
    spec = report.spec_for(report.cascade_name)
    path = spec.save(tmp_path / "cascade.json")
    assert GateSpec.load(path) == spec and GateSpec.load(path).cascade == report.cascade
    data = json.loads(path.read_text())
    data["cascade"]["band"][1] += 0.1                      # widen the band by hand
    path.write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match="checksum mismatch"):
        GateSpec.load(path)


def test_a_spec_without_checksum_is_refused(tmp_path: Path, model: ModelIdentity) -> None:
    path, _ = _saved(tmp_path, model)
    data = json.loads(path.read_text())
    data["checksum"] = ""
    path.write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match="no checksum"):
        GateSpec.load(path)
