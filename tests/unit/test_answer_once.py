"""Answer once: a gate that generated the closed-book answer and skips retrieval replies with
it. LM calls are counted through a real recording wrapper around the tiny model."""

from __future__ import annotations

from typing import Any

import pytest

from rag_gates.answer_once import find_closed_book_answer, reusable_answer
from rag_gates.confidence import AnswerLogprobGate, FirstTokenProbGate
from rag_gates.lm.recorded import RecordedLM
from rag_gates.methods import MethodContext, make_method
from rag_gates.prompts import qa_prompt
from rag_gates.retrieval.bm25 import BM25Retriever
from rag_gates.types import Passage, TraceRecorder

QUESTION = "Who wrote the play Hamlet?"


@pytest.fixture(scope="module")
def bm25() -> BM25Retriever:
    return BM25Retriever.from_passages([
        Passage(id="a", title="Hamlet", text="Hamlet is a tragedy by William Shakespeare."),
        Passage(id="b", title="Paris", text="Paris is the capital of France."),
    ])


def _run(tiny: Any, bm25: BM25Retriever, method: str) -> tuple[Any, int]:
    rec = TraceRecorder()
    ctx = MethodContext(lm=RecordedLM(tiny, rec), retriever=bm25, k=1, max_new_tokens=12)
    result = make_method(method, ctx).answer(QUESTION)
    return result, rec.trace().llm_calls


def test_selective_skip_costs_one_generation_and_equals_no_rag(tiny: Any, bm25: Any) -> None:
    closed, closed_calls = _run(tiny, bm25, "no-rag")
    skipped, calls = _run(tiny, bm25, "selective@answer-logprob:100")
    assert closed_calls == 1
    assert calls == 1  # the gate's generation is the reply
    assert skipped.answer == closed.answer
    notes = [e for e in skipped.trace.events if e.name == "answer_once"]
    assert notes and notes[0].data["answer_reused"] is True


def test_selective_retrieving_still_generates_with_the_passages(tiny: Any, bm25: Any) -> None:
    single, _ = _run(tiny, bm25, "single")
    retrieved, calls = _run(tiny, bm25, "selective@answer-logprob:0")
    assert calls == 2 and retrieved.answer == single.answer


def test_composite_passes_its_childs_answer(tiny: Any, bm25: Any) -> None:
    closed, _ = _run(tiny, bm25, "no-rag")
    # all-of: retrieve only when both want to; first-token-prob scores <= 1 < 2: skip.
    skipped, calls = _run(tiny, bm25, "selective@answer-logprob:100&first-token-prob:1")
    assert calls == 1 and skipped.answer == closed.answer


def test_first_token_prob_generates_nothing_to_reuse(tiny: Any) -> None:
    decision = FirstTokenProbGate(tiny, threshold=1.0).decide(QUESTION)
    assert find_closed_book_answer(decision) is None
    assert reusable_answer(decision, lm=tiny, prompt=qa_prompt(QUESTION),
                           max_new_tokens=12).answer is None


def test_no_reuse_when_prompt_or_budget_differ_and_it_says_why(tiny: Any) -> None:
    decision = AnswerLogprobGate(tiny, threshold=100.0, max_new_tokens=12).decide(QUESTION)
    assert not decision.retrieve
    other_prompt = reusable_answer(decision, lm=tiny, prompt="Question: " + QUESTION,
                                   max_new_tokens=12)
    assert other_prompt.answer is None and "prompt differs" in other_prompt.why
    # the random tiny model never ends early: a longer direct budget would write more
    longer = reusable_answer(decision, lm=tiny, prompt=qa_prompt(QUESTION), max_new_tokens=20)
    assert longer.answer is None and "budget" in longer.why
    same = reusable_answer(decision, lm=tiny, prompt=qa_prompt(QUESTION), max_new_tokens=12)
    assert same.answer == tiny.generate(qa_prompt(QUESTION), max_new_tokens=12).text
