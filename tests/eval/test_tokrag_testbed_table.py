"""benchmarks/tokrag_testbed.py's table: which facts count, per chosen method set."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from rag_gates.types import Passage, QAExample

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # it imports tokrag_noisy's helpers
    spec = importlib.util.spec_from_file_location("tokrag_testbed",
                                                  ROOT / "benchmarks" / "tokrag_testbed.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fact(i: int, rung: int) -> QAExample:
    return QAExample(id=f"f{i}", dataset="testbed", question=f"q{i}?", answers=["a"],
                     meta={"repetitions": rung})


def test_a_fact_counts_once_every_chosen_method_answered_both_cases(script: ModuleType) -> None:
    facts = [_fact(0, 0), _fact(1, 8)]
    methods = ("single", "tokrag@authors")
    rows = [{"id": "f0", "case": None, "method": "no-rag", "accuracy": 0.0},
            {"id": "f1", "case": None, "method": "no-rag", "accuracy": 1.0}]
    for case, acc, mis in (("gold", 1.0, 0.0), ("counterfactual", 0.0, 1.0)):
        for method in methods:
            rows.append({"id": "f0", "case": case, "method": method, "accuracy": acc,
                         "misled": mis})
    # f1 lacks tokrag@authors' counterfactual answer: not complete, not counted.
    rows += [{"id": "f1", "case": c, "method": m, "accuracy": 1.0, "misled": 0.0}
             for c in ("gold", "counterfactual") for m in methods
             if (c, m) != ("counterfactual", "tokrag@authors")]
    two = ("gold", "counterfactual")
    table = script.summarise(rows, facts, methods, two)
    assert "distractors_passed_over" not in table
    assert table["facts_complete"] == 1 and table["rungs"] == [0]
    assert set(table["table"]) == {"no-rag", "single", "tokrag@authors"}
    cell = table["table"]["tokrag@authors"]["counterfactual"]
    assert cell == {"n": 1, "accuracy": 0.0, "accuracy_by_rung": {"0": 0.0},
                    "misled": 100.0, "misled_by_rung": {"0": 100.0}}
    # With the default four methods, neither fact is complete (no cad, adacad or tokrag);
    # the default cases are these two; with all three neither is (no distractors answer).
    assert script.summarise(rows, facts, cases=two)["facts_complete"] == 0
    assert script.summarise(rows, facts, methods)["facts_complete"] == 1
    assert script.summarise(rows, facts, methods, script.CASES)["facts_complete"] == 0


class _Ranked:
    """A retriever returning fixed passages in rank order (the fact's own among them)."""

    def __init__(self, passages: list[Passage]) -> None:
        self.passages = passages

    def retrieve(self, query: str, k: int) -> list[Passage]:
        return self.passages[:k]


def test_each_case_gets_three_passages_and_distractors_hold_no_answer(
        script: ModuleType) -> None:
    own = Passage(id="f0", title="Kaya Alp", text="Kaya Alp was born in Bursa.")
    same_title = Passage(id="x", title="Kaya Alp", text="Kaya Alp, another passage.")
    others = [Passage(id=f"o{i}", title=f"T{i}", text=f"text {i}") for i in range(4)]
    # A bridge passage about the object holds the answer; another the counterfactual one.
    bridge = Passage(id="b", title="Bursa", text="Bursa is a city in Turkey.")
    izmir = Passage(id="c", title="Izmir", text="Izmir lies on the Aegean.")
    bm25 = _Ranked([own, same_title, others[0], bridge, others[1], izmir, *others[2:]])
    fact = QAExample(id="f0", dataset="testbed", question="Where was Kaya Alp born?",
                     answers=["Bursa"], meta={"repetitions": 0,
                                              "counterfactual": "Kaya Alp was born in Izmir.",
                                              "counterfactual_object": "Izmir"})
    gold, over_gold = script.passages_for(fact, "gold", own, bm25, seed=0)
    cf, over_cf = script.passages_for(fact, "counterfactual", own, bm25, seed=0)
    noise, over = script.passages_for(fact, "distractors", own, bm25, seed=0)
    # gold and counterfactual keep tb5's protocol: the two best others, answers or not.
    assert sorted(p.id for p in gold) == ["b", "f0", "o0"] and over_gold == 0
    assert sorted(p.id for p in cf) == ["b", "f0-cf", "o0"] and over_cf == 0
    assert {p.text for p in cf} >= {"Kaya Alp was born in Izmir."}
    assert sorted(p.id for p in noise) == ["o0", "o1", "o2"] and over == 2
    with pytest.raises(ValueError, match="fewer than 3 of BM25's top 30"):
        script.passages_for(fact, "distractors", own, _Ranked([own, bridge, *others[:2]]),
                            seed=0)
