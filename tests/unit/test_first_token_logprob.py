"""first-token-logprob (issue 58): the first-token gate from a generated reply, for models
that return log-probabilities but not logits (served ones). On a white-box model it must equal
first-token-prob, which reads the logits."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from rag_gates.confidence import FirstTokenLogprobGate, FirstTokenProbGate
from rag_gates.errors import WhiteBoxRequiredError
from rag_gates.lm.base import BaseTextLM, Prompt
from rag_gates.registry import GateContext, make_gate
from rag_gates.testing import tiny_lm
from rag_gates.types import Generation

QUESTIONS = ["Who wrote Hamlet?", "In what city was Marie Curie born?",
             "What is the capital of Australia?", "Who directed Jaws?"]


class TextOnly(BaseTextLM):
    """A model seen only through generate() with log-probabilities, as a server shows it."""

    def __init__(self, lm: Any) -> None:
        self.inner = lm

    @property
    def model_id(self) -> str:
        return str(self.inner.model_id)

    @property
    def supports_logprobs(self) -> bool:
        return True

    def generate(self, prompt: Prompt, *, max_new_tokens: int = 128,
                 stop: Sequence[str] | None = None, temperature: float = 0.0,
                 logprobs: int | None = None) -> Generation:
        return self.inner.generate(prompt, max_new_tokens=max_new_tokens, stop=stop,
                                   temperature=temperature, logprobs=logprobs)

    def stream(self, prompt: Prompt, **kwargs: Any) -> Iterator[str]:
        yield self.generate(prompt, **kwargs).text


@pytest.fixture(scope="module")
def lm() -> Any:
    return tiny_lm(seed=3)


def test_it_equals_the_white_box_gate_on_the_same_model(lm: Any) -> None:
    white = FirstTokenProbGate(lm, threshold=0.5)
    served = FirstTokenLogprobGate(TextOnly(lm), threshold=0.5, max_new_tokens=4)
    for question in QUESTIONS:
        a, b = white.decide(question), served.decide(question)
        assert b.score == pytest.approx(a.score, abs=1e-5), question
        assert b.evidence["first_token_max_prob"] == pytest.approx(
            a.evidence["first_token_max_prob"], abs=1e-5)
        assert b.evidence["closed_book_answer"] == lm.generate(
            b.evidence["closed_book_prompt"], max_new_tokens=4).text


def test_the_registry_builds_it_where_first_token_prob_is_refused(lm: Any) -> None:
    text_only = TextOnly(lm)
    with pytest.raises(WhiteBoxRequiredError):
        make_gate("first-token-prob", GateContext(lm=text_only))
    gate = make_gate("first-token-logprob:0.3", GateContext(lm=text_only, max_new_tokens=4))
    assert isinstance(gate, FirstTokenLogprobGate) and gate.threshold == 0.3
    assert gate.max_new_tokens == 4


def test_a_model_without_log_probabilities_is_refused_at_construction(lm: Any) -> None:
    class NoLogprobs(TextOnly):
        @property
        def supports_logprobs(self) -> bool:
            return False

    with pytest.raises(TypeError, match="needs token log-probabilities"):
        FirstTokenLogprobGate(NoLogprobs(lm))
    with pytest.raises(ValueError, match="top_alternatives"):
        FirstTokenLogprobGate(TextOnly(lm), top_alternatives=0)
