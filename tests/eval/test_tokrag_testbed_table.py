"""benchmarks/tokrag_testbed.py's table: which facts count, per chosen method set."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from rag_gates.types import QAExample

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))  # it imports tokrag_noisy's helpers
    spec = importlib.util.spec_from_file_location("tokrag_testbed",
                                                  ROOT / "benchmarks" / "tokrag_testbed.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fact(i: int, rung: int) -> QAExample:
    return QAExample(id=f"f{i}", dataset="testbed", question=f"q{i}?", answers=["a"],
                     meta={"repetitions": rung})


def test_a_fact_counts_once_every_chosen_method_answered_both_cases() -> None:
    script = _script()
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
    table = script.summarise(rows, facts, methods)
    assert table["facts_complete"] == 1 and table["rungs"] == [0]
    assert set(table["table"]) == {"no-rag", "single", "tokrag@authors"}
    cell = table["table"]["tokrag@authors"]["counterfactual"]
    assert cell == {"n": 1, "accuracy": 0.0, "accuracy_by_rung": {"0": 0.0},
                    "misled": 100.0, "misled_by_rung": {"0": 100.0}}
    # With the default four methods, neither fact is complete (no cad, adacad or tokrag).
    assert script.summarise(rows, facts)["facts_complete"] == 0
