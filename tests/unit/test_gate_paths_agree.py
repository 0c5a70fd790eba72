"""A gate scores a question the same on every path a deployment may take (``decide``,
``adecide``, ``decide_batch``, inside a composite, behind a loaded spec), bit for bit: a
certified threshold is compared with the score ``decide`` gave during calibration, so a
path whose arithmetic differs by one ulp can flip a decision at the threshold.

The CBDR case runs the embedded SmolLM2 with its shipped probe: batched forward passes pad
the prompts, and padding changed the probe's confidence by up to 2e-6 on 7 of 8 questions
(issue 54, case 5)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from rag_gates.gate import AllOf, AnyOf, Cascade, Gate, Weighted
from rag_gates.types import GateDecision

QUESTIONS = [
    "Who wrote Hamlet?",
    "What is the capital of the small country of Liechtenstein?",
    "In which year did the first crewed Moon landing happen?",
    "Who painted the ceiling of the Sistine Chapel?",
    "What is the occupation of Marguerite Duras?",
    "Where was the composer Carl Nielsen born?",
    "Which river flows through Vienna?",
    "What genre is the novel Dune?",
]


def _paths(gate: Gate, queries: Sequence[str]) -> dict[str, list[GateDecision]]:
    async def each() -> list[GateDecision]:
        return [await gate.adecide(q) for q in queries]

    return {"decide": [gate.decide(q) for q in queries],
            "adecide": asyncio.run(each()),
            "decide_batch": gate.decide_batch(list(queries)),
            "decide_batch in twos": [d for i in range(0, len(queries), 2)
                                     for d in gate.decide_batch(list(queries[i:i + 2]))]}


def _assert_same(gate: Gate, queries: Sequence[str]) -> None:
    paths = _paths(gate, queries)
    want = [d.score for d in paths["decide"]]
    for name, decisions in paths.items():
        got = [d.score for d in decisions]
        # Exact equality on purpose: a threshold compares these floats.
        assert got == want, f"{gate.name}: {name} scores {got} != decide's {want}"
        assert [d.retrieve for d in decisions] == [d.retrieve for d in paths["decide"]]


@pytest.fixture(scope="module")
def cbdr(smol: Any) -> Any:
    from rag_gates.cbdr.gate import CBDRGate
    from rag_gates.cbdr.shipped import load_default_probe

    return CBDRGate(smol, load_default_probe(smol))


def test_cbdr_scores_the_same_on_every_path(cbdr: Any) -> None:
    _assert_same(cbdr, QUESTIONS)


def test_cbdr_prefill_scores_as_decide(cbdr: Any) -> None:
    """The skip path (one forward pass, its KV cache kept) is the path GatedQueryEngine and
    the pipeline take: its confidence is decide's."""
    for q in QUESTIONS[:4]:
        assert cbdr.prefill(q, max_new_tokens=8).decision.score == cbdr.decide(q).score


def test_composites_score_the_same_on_every_path(cbdr: Any, smol: Any) -> None:
    from rag_gates.confidence import FirstTokenProbGate

    first = FirstTokenProbGate(smol)
    for gate in (AllOf(first, cbdr), AnyOf(first, cbdr),
                 Weighted([first, cbdr], [1.0, 1.0], 0.0, threshold=0.5),
                 Cascade(first, cbdr, (0.1, 0.9))):
        _assert_same(gate, QUESTIONS[:2])


def test_text_gates_score_the_same_on_every_path(tiny: Any) -> None:
    from rag_gates.confidence import AnswerLogprobGate, FirstTokenProbGate

    for gate in (FirstTokenProbGate(tiny), AnswerLogprobGate(tiny, max_new_tokens=4)):
        _assert_same(gate, QUESTIONS[:4])
