"""Metrics against hand-checked examples, SQuAD's normalisation edge cases included."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from rag_gates_lab.metrics import (
    accuracy,
    auroc,
    exact_match,
    extract_answer,
    extract_decision,
    f1,
    normalize_answer,
    rankdata,
    roc_curve,
    score_answer,
    spearman,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  an   apple, a pear!  ", "apple pear"),
        ("Theatre of the Absurd", "theatre of absurd"),  # 'the' inside a word stays
        ("U.S.A.", "usa"),
        ("3,677 seated", "3677 seated"),
        ("", ""),
        ("A", ""),
    ],
)
def test_squad_normalisation(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


def test_exact_match_takes_the_best_gold() -> None:
    assert exact_match("the Mask of Fu Manchu", ["Mask of Fu Manchu", "x"]) == 1.0
    assert exact_match("Fu Manchu", ["The Mask of Fu Manchu"]) == 0.0


def test_f1_hand_computed() -> None:
    # prediction tokens: in paris france (3), gold: paris (1): P=1/3, R=1 -> F1=0.5
    assert f1("in Paris, France", ["Paris"]) == pytest.approx(0.5)
    # shared: greenwich village (2) of pred 2, gold 4 (new york city -> 5 tokens? no:
    # 'greenwich village new york city' = 5): P=1, R=2/5 -> F1 = 2*0.4/1.4
    assert f1("Greenwich Village", ["Greenwich Village, New York City"]) == pytest.approx(
        2 * 0.4 / 1.4)
    assert f1("", ["Paris"]) == 0.0
    # Repeated tokens count once per occurrence in both.
    assert f1("paris paris", ["paris"]) == pytest.approx(2 * 0.5 * 1 / 1.5)


def test_f1_yes_no_must_match_exactly() -> None:
    assert f1("yes", ["no"]) == 0.0
    assert f1("yes it is", ["yes"]) == 0.0  # HotpotQA's rule: 'yes it is' is not 'yes'
    assert f1("no", ["no"]) == 1.0


def test_accuracy_is_word_containment() -> None:
    assert accuracy("The capital of France is Paris.", ["Paris"]) == 1.0
    assert accuracy("Parisian food", ["Paris"]) == 0.0  # whole words only
    assert accuracy("It is 3,677 seated.", ["3,677 seated"]) == 1.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Both were born in 1950. So the answer is: Paris.", "Paris"),
        ("The answer is 3.5 million. Done.", "3.5 million"),
        ("so the answer is \"Kansas Song\".", "Kansas Song"),
        ("Paris", "Paris"),
        ("The answer is A. The answer is B.", "B"),
    ],
)
def test_extract_answer(text: str, expected: str) -> None:
    assert extract_answer(text) == expected


def test_pubmedqa_decisions() -> None:
    assert extract_decision("Yes, the data suggest so.") == "yes"
    assert extract_decision("The answer is maybe.") == "maybe"
    assert extract_decision("It is unclear") is None
    assert score_answer("No.", ["no"], "pubmedqa") == {"em": 1.0, "f1": 1.0, "accuracy": 1.0}
    assert score_answer("I think so", ["yes"], "pubmedqa")["accuracy"] == 0.0


def test_auroc_and_roc() -> None:
    assert auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert auroc([1, 2, 3], [0, 1, 1]) == 1.0
    assert auroc([1, 1, 1, 1], [0, 1, 0, 1]) == 0.5  # ties count half
    assert math.isnan(auroc([1, 2], [1, 1]))
    curve = roc_curve([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1])
    assert curve[0] == (0.0, 0.0) and curve[-1] == (1.0, 1.0)
    # Trapezoid area under the curve equals the rank-based AUROC.
    area = sum((x2 - x1) * (y1 + y2) / 2 for (x1, y1), (x2, y2) in itertools.pairwise(curve))
    assert area == pytest.approx(0.75)


def test_spearman() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_ranking_metrics_edge_cases() -> None:
    assert rankdata([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]
    assert rankdata([]) == []
    assert auroc([0.2, float("inf"), 0.1], [0, 1, 0]) == 1.0  # +inf ranks first
    assert auroc([0.1, 0.9], [False, True]) == 1.0
    assert math.isnan(auroc([], []))
    assert roc_curve([1, 2], [0, 0]) == []
    with pytest.raises(ValueError, match="2 scores but 3 labels"):
        auroc([1, 2], [0, 1, 1])
    with pytest.raises(ValueError, match="NaN"):
        auroc([float("nan"), 1.0], [0, 1])
    assert math.isnan(spearman([1.0], [2.0]))
    with pytest.raises(ValueError, match="2 x values but 1 y values"):
        spearman([1, 2], [1])


# ------------------------------------------------ the library metrics on the committed runs
# REFERENCE ONLY: the hand-written AUROC / ROC / rank / Spearman that rag_gates_lab.metrics
# used before it called scikit-learn and SciPy (copied verbatim from commit f11d933), kept
# here to prove the library versions give the same numbers on the committed gate evaluations.
def _old_rankdata(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _old_auroc(scores: Sequence[float], labels: Sequence[int]) -> float:
    n_pos = sum(1 for y in labels if y)
    n_neg = len(labels) - n_pos
    if not n_pos or not n_neg:
        return float("nan")
    rank_sum = sum(r for r, y in zip(_old_rankdata(scores), labels, strict=True) if y)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def _old_spearman(x: Sequence[float], y: Sequence[float]) -> float:
    rx, ry = _old_rankdata(x), _old_rankdata(y)
    n = len(rx)
    if n < 2:
        return float("nan")
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    if vx == 0 or vy == 0:
        return float("nan")
    return float(cov / (vx * vy) ** 0.5)


def _old_roc_curve(scores: Sequence[float], labels: Sequence[int]) -> list[tuple[float, float]]:
    n_pos = sum(1 for y in labels if y)
    n_neg = len(labels) - n_pos
    if not n_pos or not n_neg:
        return []
    points = [(0.0, 0.0)]
    tp = fp = 0
    pairs = sorted(zip(scores, labels, strict=True), key=lambda p: -p[0])
    for i, (score, label) in enumerate(pairs):
        tp += bool(label)
        fp += not label
        if i + 1 == len(pairs) or pairs[i + 1][0] != score:
            points.append((fp / n_neg, tp / n_pos))
    return points
# END OF REFERENCE


RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "eval"
DECISIONS = sorted(RESULTS.glob("*/decisions.jsonl"))
_RUN_KEYS = ("dataset", "n", "offset", "model", "retriever", "k", "max_new_tokens")


def _closed_book_run(gate_config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The committed bench run the gate evaluation took its labels from: same dataset,
    questions and settings, with the closed-book (no-rag) method; its no-rag records by id."""
    for config_file in sorted(RESULTS.glob("*/config.json")):
        bench = json.loads(config_file.read_text())["config"]
        if "no-rag" in bench["methods"] and all(
                bench[key] == gate_config[key] for key in _RUN_KEYS):
            lines = (config_file.parent / "results.jsonl").read_text().splitlines()
            records = [json.loads(line) for line in lines]
            return {r["id"]: r for r in records if r["method"] == "no-rag"}
    raise AssertionError(f"no committed no-rag run matches {gate_config}")


def test_committed_decisions_are_all_found() -> None:
    assert len(DECISIONS) >= 9, DECISIONS


@pytest.mark.parametrize("path", DECISIONS, ids=lambda p: p.parent.name)
def test_library_metrics_match_the_hand_written_ones(path: Path) -> None:
    """scikit-learn's AUROC and ROC curve and SciPy's Spearman give the old numbers (to
    1e-12) on every committed gate evaluation, and reproduce its stored AUROC and curve."""
    report = json.loads((path.parent / "gate_eval.json").read_text())
    decisions = [json.loads(line) for line in path.read_text().splitlines()]
    closed_book = _closed_book_run(report["config"])
    # As rag_gates_lab.gate_eval does: a non-finite score ranks above every finite one.
    scores = [d["score"] if math.isfinite(d["score"]) else 1e300 for d in decisions]
    labels = [int(closed_book[d["id"]]["accuracy"] == 0.0) for d in decisions]
    assert 0 < sum(labels) < len(labels)

    old, new = _old_auroc(scores, labels), auroc(scores, labels)
    assert new == pytest.approx(old, abs=1e-12, rel=0)
    assert new == pytest.approx(report["auroc"], abs=1e-12, rel=0)

    old_curve, new_curve = _old_roc_curve(scores, labels), roc_curve(scores, labels)
    assert len(new_curve) == len(old_curve) == len(report["roc"])
    flat = [v for point in new_curve for v in point]
    assert flat == pytest.approx([v for point in old_curve for v in point], abs=1e-12, rel=0)
    assert flat == pytest.approx([v for point in report["roc"] for v in point], abs=1e-12,
                                 rel=0)

    # Spearman against the closed-book F1 (many ties): the same as the hand-written one.
    f1s = [closed_book[d["id"]]["f1"] for d in decisions]
    assert spearman(scores, f1s) == pytest.approx(_old_spearman(scores, f1s), abs=1e-12,
                                                  rel=0)
    assert rankdata(scores) == _old_rankdata(scores)
