"""PolygraphGate: LM-Polygraph's estimators as gates, on a tiny random-weight Llama.

The gate's score is checked against lm-polygraph's own ``estimate_uncertainty`` on the same
model and prompt. These tests need lm-polygraph (``bash benchmarks/envs/polygraph.sh`` builds
a venv with it) and skip without it, except the one that checks the install hint, which
hides lm-polygraph and runs anywhere.
"""

from __future__ import annotations

import asyncio
import math
import sys
from typing import Any

import numpy as np
import pytest

from rag_gates.gate import Gate, is_undecided
from rag_gates.prompts import qa_prompt

QUESTIONS = ["Who wrote Hamlet?", "What is the capital of France?",
             "Who directed the film Ed Wood?"]


@pytest.fixture(scope="module")
def polygraph() -> Any:
    return pytest.importorskip("lm_polygraph")


@pytest.fixture(scope="module")
def eager_lm() -> Any:
    """The tiny Llama under eager attention: lm-polygraph's estimate_uncertainty asks every
    model for its attention weights, which transformers returns only then."""
    from rag_gates.lm.hf import HFWhiteBoxLM
    from rag_gates.testing import tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer(seed=1)
    model.set_attn_implementation("eager")
    return HFWhiteBoxLM(model, tok, model_id="tiny-llama-seed1-eager")


def reference(lm: Any, estimator: Any, question: str, *, max_new_tokens: int = 32,
              seed: int = 0) -> Any:
    """lm-polygraph's own estimate: estimate_uncertainty on a WhiteboxModel of the same
    transformers model, the QA prompt in its chat template, torch seeded as the gate seeds
    it."""
    import torch
    from lm_polygraph import WhiteboxModel, estimate_uncertainty
    from lm_polygraph.utils.generation_parameters import GenerationParameters

    model = WhiteboxModel(lm.model, lm.tokenizer, model_path="tiny",
                          generation_parameters=GenerationParameters(
                              max_new_tokens=max_new_tokens), instruct=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return estimate_uncertainty(model, estimator, qa_prompt(question))


def test_without_lm_polygraph_the_error_names_the_extra(tiny: Any,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    from rag_gates.peers import PolygraphGate

    monkeypatch.setitem(sys.modules, "lm_polygraph", None)  # import lm_polygraph fails
    with pytest.raises(ImportError, match=r'pip install "rag-gates\[polygraph\]"'):
        PolygraphGate(tiny, "MaximumSequenceProbability", threshold=1.0)


@pytest.mark.parametrize("name", ["MaximumSequenceProbability", "Perplexity",
                                  "MeanTokenEntropy", "MeanPointwiseMutualInformation",
                                  "RAUQ"])
def test_score_is_lm_polygraphs_own_estimate(polygraph: Any, eager_lm: Any, name: str) -> None:
    from lm_polygraph import estimators

    from rag_gates.peers import PolygraphGate

    gate = PolygraphGate(eager_lm, name, threshold=1.0)
    assert isinstance(gate, Gate)
    assert gate.model.model is eager_lm.model  # the same transformers model, not a copy
    for question in QUESTIONS:
        d = gate.decide(question)
        want = reference(eager_lm, getattr(estimators, name)(), question)
        assert d.score == pytest.approx(want.uncertainty, rel=1e-6, abs=1e-9)
        assert d.evidence["uncertainty"] == d.score
        assert d.evidence["greedy_answer"] == want.generation_text
        assert d.evidence["estimator"] == want.estimator == name
        assert d.gate == f"polygraph-{name}" and not is_undecided(d)
        assert "samples" not in d.evidence  # greedy only: nothing sampled


def test_sampling_estimator_matches_lm_polygraph_with_the_same_seed(polygraph: Any,
                                                                     eager_lm: Any) -> None:
    import torch
    from lm_polygraph.estimators import MonteCarloSequenceEntropy

    from rag_gates.peers import PolygraphGate

    # Monte-Carlo sequence entropy: the mean -log p of 10 sampled answers (lm-polygraph's
    # default count), so the value depends on which answers were drawn.
    gate = PolygraphGate(eager_lm, MonteCarloSequenceEntropy(), threshold=0.5, seed=7)
    before = torch.get_rng_state()
    d = gate.decide(QUESTIONS[0])
    assert torch.equal(torch.get_rng_state(), before)  # the process's random state is kept
    want = reference(eager_lm, MonteCarloSequenceEntropy(), QUESTIONS[0], seed=7)
    assert d.score == pytest.approx(want.uncertainty, rel=1e-6)
    assert d.evidence["samples"] == 10
    assert d.evidence["estimator"] == "MonteCarloSequenceEntropy"
    assert gate.decide(QUESTIONS[0]).score == d.score  # seeded: the same decision again
    other = PolygraphGate(eager_lm, MonteCarloSequenceEntropy(), threshold=0.5, seed=8,
                          samples=4)
    drawn = other.decide(QUESTIONS[0])
    assert drawn.evidence["samples"] == 4 and drawn.score != d.score


def test_the_threshold_decides(polygraph: Any, tiny: Any) -> None:
    from rag_gates.peers import PolygraphGate

    score = PolygraphGate(tiny, "Perplexity", threshold=0.0).decide(QUESTIONS[1]).score
    assert math.isfinite(score) and score > 0
    at = PolygraphGate(tiny, "Perplexity", threshold=score).decide(QUESTIONS[1])
    above = PolygraphGate(tiny, "Perplexity", threshold=math.nextafter(score, math.inf))
    d = above.decide(QUESTIONS[1])
    assert at.retrieve and at.score == score and ">=" in at.reason
    assert not d.retrieve and d.score == score and "answer without retrieval" in d.reason
    # The protocol's other entry points decide the same way.
    assert [x.score for x in above.decide_batch(QUESTIONS[1:2] * 2)] == [score, score]
    assert asyncio.run(above.adecide(QUESTIONS[1])).retrieve is False


def test_a_nan_estimate_fails_closed(polygraph: Any, tiny: Any) -> None:
    from lm_polygraph.estimators import Estimator

    from rag_gates.peers import PolygraphGate

    class NaNMSP(Estimator):
        def __init__(self) -> None:
            super().__init__(["greedy_log_likelihoods"], "sequence")

        def __str__(self) -> str:
            return "NaNMSP"

        def __call__(self, stats: dict[str, Any]) -> np.ndarray:
            return np.array([math.nan for _ in stats["greedy_log_likelihoods"]])

    # A threshold no finite score reaches: only the fail-closed rule can make it retrieve.
    d = PolygraphGate(tiny, NaNMSP(), threshold=1e300).decide(QUESTIONS[0])
    assert d.retrieve and is_undecided(d)
    assert d.evidence["raw_score"] == "nan" and d.evidence["estimator"] == "NaNMSP"
    assert "could not decide" in d.reason and "NaNMSP returned nan" in d.reason


def test_an_estimator_failure_fails_closed_with_the_reason(polygraph: Any, tiny: Any) -> None:
    from rag_gates.peers import PolygraphGate

    # P(True) reads p("True") as one token; the tiny tokenizer splits "True" into several,
    # so lm-polygraph's PromptCalculator fails its assertion.
    assert len(tiny.tokenizer(["True"])["input_ids"][0]) > 1
    d = PolygraphGate(tiny, "PTrue", threshold=1e300).decide(QUESTIONS[0])
    assert d.retrieve and is_undecided(d)
    assert str(d.evidence["error"]).startswith(
        "PromptCalculator raised AssertionError: at prompt.py")
    assert "lm-polygraph's PTrue failed" in d.reason


def test_arguments_are_checked_with_what_to_do(polygraph: Any, tiny: Any) -> None:
    from rag_gates.peers import PolygraphGate

    with pytest.raises(ValueError, match="did you mean MaximumSequenceProbability"):
        PolygraphGate(tiny, "MaximumSequenceProbabilty", threshold=1.0)
    with pytest.raises(ValueError, match="token-level estimator"):
        PolygraphGate(tiny, "TokenEntropy", threshold=1.0)
    with pytest.raises(ValueError, match="training data"):
        PolygraphGate(tiny, "MahalanobisDistanceSeq", threshold=1.0)
    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        PolygraphGate(tiny, "RAUQ", threshold=1.0)  # the tiny model runs sdpa
    with pytest.raises(ValueError, match="needs arguments"):
        PolygraphGate(tiny, "Linguistic1S", threshold=1.0)
    with pytest.raises(TypeError, match="needs an HFWhiteBoxLM"):
        PolygraphGate(object(), "Perplexity", threshold=1.0)
    with pytest.raises(ValueError, match="samples must be an integer >= 2"):
        PolygraphGate(tiny, "LexicalSimilarity", threshold=1.0, samples=1)
    with pytest.raises(ValueError, match="threshold"):
        PolygraphGate(tiny, "Perplexity", threshold=math.nan)


def test_registered_gate_builds_from_an_expression(polygraph: Any, tiny: Any) -> None:
    from rag_gates.peers import PolygraphGate, register_polygraph_gate
    from rag_gates.registry import GateContext, make_gate, unregister_gate

    name = register_polygraph_gate("Perplexity", samples=3)
    try:
        assert name == "polygraph-Perplexity"
        gate = make_gate(f"{name}:1.25", GateContext(lm=tiny))
        assert isinstance(gate, PolygraphGate) and gate.threshold == 1.25
        assert gate.max_new_tokens == GateContext(lm=tiny).max_new_tokens == 48
        direct = PolygraphGate(tiny, "Perplexity", threshold=1.25, max_new_tokens=48)
        assert gate.decide(QUESTIONS[2]).score == direct.decide(QUESTIONS[2]).score
    finally:
        unregister_gate(name)
