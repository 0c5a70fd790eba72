"""Metrics against hand-checked examples, SQuAD's normalisation edge cases included."""

from __future__ import annotations

import itertools
import math

import pytest

from rag_gates.eval.metrics import (
    accuracy,
    auroc,
    exact_match,
    extract_answer,
    extract_decision,
    f1,
    normalize_answer,
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
