"""QuCo as DeepRAG's per-subquery gate (``deeprag-gate@quco``): each subquery's entities are
counted in a real index, so a subquery about a frequent entity is answered from memory and
one about an entity the corpus never names retrieves."""

from __future__ import annotations

from typing import Any

import pytest

from rag_gates.deeprag import DeepRAG
from rag_gates.quco import QuCoGate
from tests.deeprag.conftest import ScriptedLM, last_subquery

FREQUENT, RARE = "Ed Wood", "Zzyzx Quorvath"


def two_subqueries(question: str, so_far: str) -> str:
    """Asks about Ed Wood, then about an unknown person; answers whatever it is asked."""
    if so_far.endswith("Intermediate answer:"):
        return " Tim Burton\n" if FREQUENT in last_subquery(so_far) else " nobody\n"
    if so_far.endswith("So the final answer is:"):
        return " Tim Burton\n"
    done = so_far.count("Follow up:")
    if done == 0:
        return f"Follow up: Who directed {FREQUENT}?\n"
    if done == 1:
        return f"Follow up: Who is {RARE}?\n"
    return "So the final answer is: Tim Burton\n"


def test_quco_decides_each_subquery_by_its_entities_counts(stats: Any, extractor: Any,
                                                            bm25: Any) -> None:
    frequent = stats.count(FREQUENT).value
    assert frequent > 0 and stats.count(RARE).value == 0  # the premise, on the real index
    gate = QuCoGate(stats, extractor, tau_entity=frequent - 0.5)  # Ed Wood: just above tau
    result = DeepRAG(ScriptedLM(two_subqueries), bm25, gate=gate, nudge=False).run(
        f"Who directed {FREQUENT}, and who is {RARE}?")
    steps = result.trajectory.steps
    assert [s.subquery for s in steps] == [f"Who directed {FREQUENT}?", f"Who is {RARE}?"]
    assert [s.decision.gate for s in steps] == ["quco", "quco"]
    assert [s.decision.retrieve for s in steps] == [False, True]
    assert steps[0].decision.score == pytest.approx(gate.decide(steps[0].subquery).score)
    assert result.trace.retrievals == 1
