"""Per-call state on a shared model (forward hooks that capture hidden states or attention
inputs) is registered under the model's lock, so calls from many threads never see each
other's hooks (issue 32, item 5: ``KeyError: 15`` in 3-10 of 16 calls from 8 threads)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any

import pytest
import torch

from rag_gates.cbdr import CBDRGate, ConfidenceProbe, ProbeConfig
from rag_gates.testing import tiny_lm

QUESTIONS = [f"Who wrote play number {i} of the season?" for i in range(16)]
THREADS = 8
ROUNDS = 6  # 6 x 16 calls from 8 threads: the race showed in about a third of the calls


@pytest.fixture(scope="module")
def lm() -> Any:
    # Eight layers, so the deepest captured layer runs well after the others' hooks went in.
    return tiny_lm(seed=0, num_layers=8)


def _in_threads(call: Callable[[str], Any]) -> list[Any]:
    """``call`` on every question from THREADS threads, ROUNDS times: every result, in order
    (an exception is raised here, naming how many calls failed)."""
    results: list[Any] = []
    failures: list[BaseException] = []
    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        for _ in range(ROUNDS):
            futures = [pool.submit(call, q) for q in QUESTIONS]
            for f in futures:
                try:
                    results.append(f.result())
                except Exception as exc:  # collected: the assertion says how many failed
                    failures.append(exc)
    assert not failures, (f"{len(failures)} of {ROUNDS * len(QUESTIONS)} calls failed, first: "
                          f"{type(failures[0]).__name__}: {failures[0]}")
    return results


@pytest.mark.parametrize("layer", [1, 6])
def test_hidden_states_from_many_threads_are_each_calls_own(lm: Any, layer: int) -> None:
    alone = {q: lm.hidden_states([q], [layer])[0, 0] for q in QUESTIONS}
    got = _in_threads(lambda q: (q, lm.hidden_states([q], [layer])[0, 0]))
    for q, state in got:
        assert torch.equal(state, alone[q]), f"another call's hidden state for {q!r}"


def test_cbdr_gate_decides_from_many_threads(lm: Any) -> None:
    torch.manual_seed(0)
    probe = ConfidenceProbe(ProbeConfig(model_id=lm.model_id, hidden_size=lm.hidden_size,
                                        num_layers=lm.num_layers, layer=6))
    gate = CBDRGate(lm, probe, beta=0.5)
    alone = {q: gate.decide(q).score for q in QUESTIONS}
    got = _in_threads(lambda q: (q, gate.decide(q).score))
    assert all(score == alone[q] for q, score in got)
    prefilled = _in_threads(lambda q: (q, gate.prefill(q, max_new_tokens=2).decision.score))
    assert all(score == pytest.approx(alone[q], abs=1e-5) for q, score in prefilled)


def test_attention_rows_from_many_threads(lm: Any) -> None:
    alone = {q: lm.attention_row(q, 5) for q in QUESTIONS}
    got = _in_threads(lambda q: (q, lm.attention_row(q, 5)))
    for q, row in got:
        assert torch.allclose(row, alone[q], atol=1e-6)
