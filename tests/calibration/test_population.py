"""A spec states the population its questions were drawn from (issue 59, item 0): the shipped
spec names it, it is sealed by the checksum, and every decision's evidence carries it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag_gates.calibration import GateSpec
from rag_gates.calibration.load import CertifiedGate
from rag_gates.errors import CalibrationError

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "examples" / "data" / "calibration_gate.json"
SAMPLE_RECORD = ROOT / "benchmarks" / "results" / "calibrate" / "uniform-300" / "sample.json"


def test_the_shipped_spec_names_the_population_its_sample_record_describes() -> None:
    spec = GateSpec.load(SHIPPED)
    sample = json.loads(SAMPLE_RECORD.read_text())
    assert spec.population is not None
    assert "PopQA development rows that have a gold paragraph" in spec.population
    assert f"{sample['population_size']} of" in spec.population
    assert f"random.Random({sample['seed']}).sample" in spec.population
    d = CertifiedGate(None, spec).decide("Who wrote Hamlet?")
    assert d.evidence["spec"]["population"] == spec.population  # type: ignore[index]


def test_the_population_is_sealed(tmp_path: Path) -> None:
    data = json.loads(SHIPPED.read_text())
    data["population"] = "questions from anywhere"
    (tmp_path / "edited.json").write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match="checksum"):
        GateSpec.load(tmp_path / "edited.json")
    spec = GateSpec.load(SHIPPED).with_population("  my tenant's March traffic, uniform  ")
    assert spec.population == "my tenant's March traffic, uniform"
    assert GateSpec.load(spec.save(tmp_path / "gate.json")) == spec
    with pytest.raises(ValueError, match="non-empty"):
        spec.with_population(" ")
