"""QuCoPipeline's loop on real corpus counts and a real BM25 retriever; the model is scripted
so that each branch of the loop (flag, retrieve, regenerate, accept) is reached on purpose."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rag_gates.quco import QuCoConfig, QuCoPipeline, QuCoResult
from rag_gates.retrieval.base import BaseRetriever
from rag_gates.types import Passage
from tests.quco.conftest import GazetteerExtractor, ScriptedLM

QUESTION = "Who was the spouse of Scott Derrickson?"
WRONG = "Scott Derrickson was married to Tim Burton."
RIGHT = "Scott Derrickson is an American director. The answer is unknown."


def grounded_reply(prompt: str) -> str:
    """Hallucinates until Scott Derrickson's own paragraph is in the context."""
    return RIGHT if "Scott Derrickson (born July 16, 1966)" in prompt else WRONG


def kinds(result: QuCoResult) -> list[str]:
    return [e.kind for e in result.trace.events]


def test_flagged_claim_triggers_retrieval_and_a_verified_rewrite(
        stats: Any, bm25: Any, extractor: GazetteerExtractor) -> None:
    lm = ScriptedLM(grounded_reply)
    pipeline = QuCoPipeline(lm, bm25, stats, extractor, tau_entity=0)  # pre-check: no
    result = pipeline.run(QUESTION)
    assert result.decision is not None and result.decision.retrieve is False
    assert result.answer == RIGHT and result.rounds == 1
    assert result.stop_reason == "answer given"
    assert kinds(result) == ["decision", "llm_call", "verification", "retrieval", "llm_call",
                             "verification"]
    first, second = result.verifications
    assert first.queries == ["Scott Derrickson was married to"]
    assert not second.flagged
    retrieval = next(e for e in result.trace.events if e.kind == "retrieval")
    assert retrieval.data["query"] == "Scott Derrickson was married to"
    assert "Scott Derrickson" in retrieval.data["ids"]
    assert any(p.id == "Scott Derrickson" for p in result.passages)
    assert "Scott Derrickson (born July 16, 1966)" in lm.prompts[1]


def test_rare_question_retrieves_before_generating(stats: Any, bm25: Any,
                                                   extractor: GazetteerExtractor) -> None:
    lm = ScriptedLM(grounded_reply)
    result = QuCoPipeline(lm, bm25, stats, extractor, tau_entity=1e9).run(QUESTION)
    assert result.decision is not None and result.decision.retrieve is True
    assert kinds(result)[:3] == ["decision", "retrieval", "llm_call"]
    assert result.rounds == 0 and result.answer == RIGHT


def test_ablations_switch_each_check_off(stats: Any, bm25: Any,
                                         extractor: GazetteerExtractor) -> None:
    no_runtime = QuCoPipeline(ScriptedLM(grounded_reply), bm25, stats, extractor,
                              tau_entity=0, runtime_check=False).run(QUESTION)
    assert no_runtime.answer == WRONG and "verification" not in kinds(no_runtime)
    no_pre = QuCoPipeline(ScriptedLM(grounded_reply), bm25, stats, extractor,
                          tau_entity=1e9, pre_check=False).run(QUESTION)
    assert no_pre.decision is None and "decision" not in kinds(no_pre)
    assert no_pre.rounds == 1


def test_rounds_are_bounded_and_no_progress_is_accepted(stats: Any, bm25: Any,
                                                        extractor: GazetteerExtractor) -> None:
    stubborn = ScriptedLM(lambda prompt: WRONG)
    result = QuCoPipeline(stubborn, bm25, stats, extractor, tau_entity=0).run(QUESTION)
    # The rewrite after retrieval is identical: accepted as is, with a note, no third try.
    assert result.rounds == 1 and result.answer == WRONG and len(stubborn.prompts) == 2
    notes = [e for e in result.trace.events if e.kind == "note"]
    assert notes and notes[0].data["why"] == "no progress"
    capped = QuCoPipeline(ScriptedLM(lambda p: WRONG), bm25, stats, extractor, tau_entity=0,
                          max_rounds=0).run(QUESTION)
    assert capped.rounds == 0 and capped.trace.retrievals == 0
    assert next(e for e in capped.trace.events if e.kind == "note").data["why"] == \
        "max_rounds reached"


def test_long_answers_continue_in_chunks_within_the_budget(stats: Any, bm25: Any,
                                                           extractor: GazetteerExtractor) -> None:
    sentence = "Ed Wood was directed by Tim Burton."

    def reply(prompt: str) -> str:
        return " ".join([sentence] * 10)

    lm = ScriptedLM(reply)
    result = QuCoPipeline(lm, bm25, stats, extractor, tau_entity=0, chunk_tokens=14,
                          max_new_tokens=28).run("Who directed Ed Wood?")
    assert result.stop_reason == "budget" and len(lm.prompts) == 2
    assert result.answer.count(sentence) == 4
    assert "Answer so far: " + sentence in lm.prompts[1]


def test_empty_generation_ends_with_what_was_accepted(stats: Any, bm25: Any,
                                                      extractor: GazetteerExtractor) -> None:
    result = QuCoPipeline(ScriptedLM(lambda p: ""), bm25, stats, extractor).run(QUESTION)
    assert result.answer == "" and result.stop_reason == "empty generation"


class BrokenRetriever(BaseRetriever):
    @property
    def name(self) -> str:
        return "broken"

    def retrieve(self, query: str, k: int = 3) -> list[Passage]:
        raise ConnectionError("vector store unreachable")


def test_a_retriever_that_raises(stats: Any, extractor: GazetteerExtractor) -> None:
    raising = QuCoPipeline(ScriptedLM(grounded_reply), BrokenRetriever(), stats, extractor,
                           tau_entity=0)
    with pytest.raises(ConnectionError, match="unreachable"):
        raising.run(QUESTION)
    lenient = QuCoPipeline(ScriptedLM(grounded_reply), BrokenRetriever(), stats, extractor,
                           tau_entity=0, on_retriever_error="continue")
    result = lenient.run(QUESTION)
    assert result.answer == WRONG  # nothing retrieved, the rewrite is the same: accepted
    errors = [e for e in result.trace.events if e.name == "retriever-error"]
    assert errors and "unreachable" in str(errors[0].data["error"])


def test_config_is_validated(stats: Any, bm25: Any, extractor: GazetteerExtractor) -> None:
    lm = ScriptedLM(grounded_reply)
    with pytest.raises(ValueError, match="tau_entitty"):
        QuCoPipeline(lm, bm25, stats, extractor, tau_entitty=3)
    with pytest.raises(ValueError, match="max_rounds"):
        QuCoPipeline(lm, bm25, stats, extractor, max_rounds=-1)
    with pytest.raises(TypeError, match="TextLM"):
        QuCoPipeline(object(), bm25, stats, extractor)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        QuCoPipeline(lm, bm25, stats, extractor).run("   ")
    config = QuCoConfig(tau_entity=5, max_rounds=2)
    assert QuCoPipeline(lm, bm25, stats, extractor, config).config == config


def test_async_and_method_protocol(stats: Any, bm25: Any,
                                   extractor: GazetteerExtractor) -> None:
    pipeline = QuCoPipeline(ScriptedLM(grounded_reply), bm25, stats, extractor, tau_entity=0)
    result = asyncio.run(pipeline.arun(QUESTION))
    assert result.answer == RIGHT
    method_result = pipeline.answer(QUESTION)
    assert method_result.answer == RIGHT and method_result.trace.retrievals == 1


def test_runs_on_a_real_tiny_model(stats: Any, bm25: Any, extractor: GazetteerExtractor) -> None:
    pytest.importorskip("torch")
    from rag_gates.testing import tiny_lm

    result = QuCoPipeline(tiny_lm(seed=0, max_context=4096), bm25, stats, extractor, tau_entity=1e9,
                          chunk_tokens=8, max_new_tokens=16).run(QUESTION)
    assert result.trace.llm_calls >= 1 and result.trace.retrievals >= 1
    assert QuCoResult.model_validate_json(result.model_dump_json()) == result
