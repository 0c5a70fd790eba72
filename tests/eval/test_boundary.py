"""Knowledge-boundary agreement (DeepRAG's Table 3) on constructed cases, against
scikit-learn's scores, and on the committed HotpotQA bench records."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from sklearn.metrics import balanced_accuracy_score, f1_score, matthews_corrcoef

from rag_gates_lab.boundary import boundary_agreement, boundary_by_method
from rag_gates_lab.report import collect
from rag_gates_lab.runner import read_records

EVAL = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "eval"


def test_scores_match_scikit_learn_on_random_choices() -> None:
    rng = random.Random(7)
    for _ in range(20):
        n = rng.randint(5, 60)
        retrieved = [rng.random() < 0.6 for _ in range(n)]
        needed = [rng.random() < 0.7 for _ in range(n)]
        if len(set(retrieved)) < 2 or len(set(needed)) < 2:
            continue
        a = boundary_agreement(retrieved, needed)
        assert a.mcc == pytest.approx(matthews_corrcoef(needed, retrieved))
        assert a.f1 == pytest.approx(f1_score(needed, retrieved))
        assert a.balanced_accuracy == pytest.approx(balanced_accuracy_score(needed, retrieved))
        assert a.accuracy == pytest.approx(sum(r == x for r, x in zip(retrieved, needed,
                                                                         strict=True)) / n)


def test_a_method_that_always_retrieves_has_no_mcc() -> None:
    a = boundary_agreement([True] * 4, [True, True, True, False])
    assert a.accuracy == 0.75  # high accuracy when most questions need retrieval ...
    assert a.mcc is None and a.balanced_accuracy == 0.5  # ... and no boundary at all


def test_perfect_and_inverted_boundaries() -> None:
    assert boundary_agreement([True, False, True], [True, False, True]).mcc == 1.0
    assert boundary_agreement([False, True, False], [True, False, True]).mcc == -1.0


def test_lengths_must_match() -> None:
    with pytest.raises(ValueError, match="pair them per question"):
        boundary_agreement([True], [True, False])


def test_by_method_on_the_committed_hotpotqa_run() -> None:
    records = read_records(EVAL / "hotpotqa-200")
    table = boundary_by_method(records)
    closed_book_wrong = {r.id: r.accuracy < 1 for r in records if r.method == "no-rag"}
    assert "no-rag" not in table
    single = table["single"]
    assert single.questions == 200 and single.mcc is None  # retrieves for every question
    assert single.true_positive == sum(closed_book_wrong.values())
    for method, a in table.items():
        mine = [r for r in records if r.method == method]
        assert a.true_positive + a.false_positive == sum(r.retrievals > 0 for r in mine)
        assert a.true_positive + a.false_negative == sum(closed_book_wrong[r.id] for r in mine)


def test_by_method_needs_the_closed_book_reference() -> None:
    records = [r for r in read_records(EVAL / "hotpotqa-200") if r.method != "no-rag"]
    with pytest.raises(ValueError, match="add no-rag"):
        boundary_by_method(records)


def test_report_pools_no_rag_from_another_run() -> None:
    # FLARE ran in its own directory; the no-rag answers to the same questions are elsewhere.
    data = collect([EVAL / "hotpotqa-200", EVAL / "hotpotqa-200-flare"])
    text = "\n".join(data.markdown)
    section = text[text.index("### knowledge boundary on hotpotqa"):]
    assert "| flare | 200 |" in section
    assert "| single |" not in section  # not adaptive: left out of the table


def test_report_never_pools_two_models(tmp_path: Path) -> None:
    import json
    import shutil

    other = tmp_path / "flare-other-model"
    shutil.copytree(EVAL / "hotpotqa-200-flare", other)
    stored = json.loads((other / "config.json").read_text())
    stored["config"]["model"] = "some/other-model"
    (other / "config.json").write_text(json.dumps(stored))
    text = "\n".join(collect([EVAL / "hotpotqa-200", other]).markdown)
    section = text[text.index("### knowledge boundary on hotpotqa"):]
    assert "| flare |" not in section  # its no-rag truth would be another model's
    assert "| quco |" in section
