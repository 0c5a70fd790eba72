"""Fitting composed gates from the committed eval-gate decisions of the embedded model on
PopQA, and replaying them through the composites."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rag_gates.gate import BaseGate, Cascade, Weighted, parse_gate_expression
from rag_gates_lab.compose import cascade_band, fit_weighted, fit_weighted_from_runs
from rag_gates_lab.metrics import auroc
from rag_gates_lab.runner import read_records

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "eval"


class Replay(BaseGate):
    """A gate that answers with the scores an eval-gate run recorded (the composites are
    under test, not the gates)."""

    def __init__(self, name: str, scores: dict[str, float], threshold: float) -> None:
        super().__init__(threshold)
        self.name, self.scores = name, scores

    def score(self, query, **signals):
        return self.scores[query], {}


@pytest.fixture(scope="module")
def popqa():
    records = {(r.id, r.method): r for r in read_records(RESULTS / "popqa-500")}
    ids = [key for key, method in records if method == "no-rag"]
    return records, ids


def test_weighted_fit_on_calibration_rows_replays_exactly(popqa, tmp_path):
    records, ids = popqa
    runs = [RESULTS / "gate-quco-popqa", RESULTS / "gate-answer-logprob-popqa"]
    fitted = fit_weighted_from_runs(runs, RESULTS / "popqa-500")
    assert fitted["gates"] == ["quco", "answer-logprob"]
    assert fitted["fitted_on"]["questions"] == 500 and len(fitted["weights"]) == 2
    # The same fit from the columns directly (what the CLI does, minus the files).
    scores = [{json.loads(x)["id"]: json.loads(x)["score"]
               for x in (run / "decisions.jsonl").read_text().splitlines()} for run in runs]
    closed = [records[(i, "no-rag")].accuracy for i in ids]
    retrieved = [records[(i, "single")].accuracy for i in ids]
    again = fit_weighted(["quco", "answer-logprob"], [[s[i] for i in ids] for s in scores],
                         closed, retrieved)
    assert again["weights"] == pytest.approx(fitted["weights"])
    # The Weighted gate rebuilt from the file gives the probabilities the fit was made on,
    # and its calibrated threshold reproduces the fit's expected accuracy.
    path = tmp_path / "w.json"
    path.write_text(json.dumps(fitted))
    gates = {n: Replay(n, s, 0.0) for n, s in zip(fitted["gates"], scores, strict=True)}
    weighted = parse_gate_expression(f"weighted({path})", lambda n, t: gates[n])
    assert isinstance(weighted, Weighted)
    decisions = [weighted.decide(i) for i in ids]
    acc = sum(r if d.retrieve else c for d, r, c in zip(decisions, retrieved, closed,
                                                      strict=True)) / len(ids)
    assert acc == pytest.approx(fitted["fitted_on"]["expected"]["accuracy"])
    wrong = [int(c == 0.0) for c in closed]
    assert auroc([d.score for d in decisions], wrong) > 0.5


def test_fit_refuses_one_class_and_mismatched_columns():
    with pytest.raises(ValueError, match="one class only"):
        fit_weighted(["a"], [[0.1, 0.2, 0.3]], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="one score column per gate"):
        fit_weighted(["a", "b"], [[0.1, 0.2]], [0.0, 1.0], [1.0, 1.0])
    fitted = fit_weighted(["a"], [[0.1, math.nan, 0.9, 0.2]], [1.0, 0.0, 0.0, 1.0],
                          [1.0, 1.0, 1.0, 1.0])
    assert fitted["fitted_on"]["rows_dropped"] == 1


def test_cascade_band_holds_the_share_nearest_the_threshold():
    scores = [float(i) for i in range(100)]
    lo, hi = cascade_band(scores, 50.0, 0.2)
    inside = [s for s in scores if lo <= s <= hi]
    assert len(inside) == 20 and lo <= 50.0 <= hi
    cheap = Replay("cheap", {str(i): s for i, s in enumerate(scores)}, 50.0)
    expensive = Replay("expensive", {str(i): 0.0 for i in range(100)}, 0.5)
    gate = Cascade(cheap, expensive, (lo, hi))
    called = sum(gate.decide(str(i)).evidence["expensive_called"] for i in range(100))
    assert called == 20


def test_the_fit_weighted_command_writes_the_fit_the_docs_use(tmp_path: Path) -> None:
    """docs/composition.md: `rag-gates fit-weighted --run ... --labels ... --out weights.json`
    writes the fit `weighted(FILE)` reads (the API's, for the same runs) and says how to use
    it; a run directory that does not exist is refused with exit code 2, nothing written."""
    from typer.testing import CliRunner

    from rag_gates.cli import app

    runs = [RESULTS / "gate-quco-popqa", RESULTS / "gate-answer-logprob-popqa"]
    out = tmp_path / "weights.json"
    result = CliRunner().invoke(app, ["fit-weighted", "--run", str(runs[0]), "--run",
                                      str(runs[1]), "--labels", str(RESULTS / "popqa-500"),
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text())
    expected = fit_weighted_from_runs(runs, RESULTS / "popqa-500")
    assert written["gates"] == expected["gates"] == ["quco", "answer-logprob"]
    assert written["weights"] == pytest.approx(expected["weights"])
    assert written["threshold"] == pytest.approx(expected["threshold"])
    assert "selective@weighted(" in result.output
    gate = parse_gate_expression(f"weighted({out})",
                                 lambda n, t: Replay(n, {"q": 0.5}, 0.0))
    assert isinstance(gate, Weighted)
    missing = tmp_path / "other.json"
    refused = CliRunner().invoke(app, ["fit-weighted", "--run", str(tmp_path / "nosuch"),
                                       "--labels", str(RESULTS / "popqa-500"),
                                       "--out", str(missing)])
    assert refused.exit_code == 2 and "nosuch" in " ".join(refused.output.split())
    assert not missing.exists()
