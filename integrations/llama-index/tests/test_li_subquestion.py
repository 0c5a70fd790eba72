"""The SubQuestion peer method (LlamaIndex's SubQuestionQueryEngine) on real BM25 over the
shipped HotpotQA slice: registration, the tiny model's garbage (a real parse failure), and a
scripted model under the real engine for the paths a random model never takes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from llama_index.query_engine.rag_gates import SubQuestionMethod
from llama_index.query_engine.rag_gates.subquestion import TOOL_NAME

from rag_gates.errors import ContextLengthError
from rag_gates.methods import MethodContext, available_methods, make_method
from rag_gates.retrieval.bm25 import BM25Retriever
from rag_gates.testing import tiny_lm
from rag_gates.types import Generation
from rag_gates_lab.corpus import corpus_passages

SLICES = Path(__file__).resolve().parents[3] / "examples" / "data"
QUESTION = "Were Scott Derrickson and Ed Wood of the same nationality?"
SUB_QUESTIONS = ["What is the nationality of Scott Derrickson?",
                 "What is the nationality of Ed Wood?"]
# What LLMQuestionGenerator's default prompt asks for (its own example's layout).
PLAN = "```json\n" + json.dumps(
    {"items": [{"sub_question": q, "tool_name": TOOL_NAME} for q in SUB_QUESTIONS]}, indent=4
) + "\n```"


@pytest.fixture(scope="module")
def bm25() -> BM25Retriever:
    return BM25Retriever.from_passages(corpus_passages("hotpotqa", SLICES))


@pytest.fixture(scope="module")
def tiny() -> Any:
    # The sub-question prompt alone is a few hundred tokens: more context than the default.
    return tiny_lm(seed=0, max_context=4096)


class _ScriptedModel:
    """A deterministic model under the real engine: writes ``plan`` for the sub-question
    prompt and ``answer`` for every other prompt (or raises ``plan`` if it is an exception).
    Everything else (tokenizer, chat template, white-box checks) comes from the tiny model,
    which RagGatesLLM requires."""

    def __init__(self, lm: Any, plan: str | Exception,
                 answer: str | Exception = "American") -> None:
        self._lm = lm
        self.plan = plan
        self.answer = answer
        self.calls: list[tuple[str, int]] = []  # (prompt text, max_new_tokens)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._lm, attr)

    def generate(self, prompt: Any, **kwargs: Any) -> Generation:
        text = prompt if isinstance(prompt, str) else "\n".join(m.content for m in prompt)
        self.calls.append((text, kwargs["max_new_tokens"]))
        # "<User Question>" marks LlamaIndex's sub-question prompt (question_gen/prompts.py).
        if "<User Question>" not in text:
            if isinstance(self.answer, Exception):
                raise self.answer
            reply = self.answer
        elif isinstance(self.plan, Exception):
            raise self.plan
        else:
            reply = self.plan
        return Generation(text=reply, finish_reason="eos", completion_tokens=len(reply.split()))


def _scripted(bm25: BM25Retriever, tiny: Any, plan: str | Exception,
              answer: str | Exception = "American") -> tuple[SubQuestionMethod, _ScriptedModel]:
    model = _ScriptedModel(tiny, plan, answer)
    ctx = MethodContext(lm=model, retriever=bm25, dataset="hotpotqa", k=2, max_new_tokens=8)
    method = make_method("subquestion", ctx)
    assert isinstance(method, SubQuestionMethod)
    return method, model


def _notes(result: Any, name: str) -> list[dict[str, Any]]:
    return [e.data for e in result.trace.events if e.kind == "note" and e.name == name]


def test_subquestion_is_a_registered_bench_method(bm25: BM25Retriever, tiny: Any) -> None:
    assert available_methods()["subquestion"] is SubQuestionMethod
    method = make_method("subquestion", MethodContext(lm=tiny, retriever=bm25))
    assert method.name == "subquestion"
    with pytest.raises(ValueError, match="retriever"):
        SubQuestionMethod(MethodContext(lm=tiny))
    with pytest.raises(ValueError, match="question_gen_tokens"):
        SubQuestionMethod(MethodContext(lm=tiny, retriever=bm25), question_gen_tokens=0)


def test_tiny_models_garbage_is_a_recorded_parse_failure(
    bm25: BM25Retriever, tiny: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A random-weight model writes no JSON: LlamaIndex's parser refuses it, and the method
    records that and answers nothing (scored as wrong) instead of failing the run."""
    ctx = MethodContext(lm=tiny, retriever=bm25, dataset="hotpotqa", max_new_tokens=6)
    method = SubQuestionMethod(ctx, question_gen_tokens=24)
    result = method.answer(QUESTION)
    assert result.answer == "" and result.passages == []
    calls = [e for e in result.trace.events if e.kind == "llm_call"]
    # One model call (the sub-question plan, at its own budget); nothing retrieved after it.
    assert [(e.name, e.tokens) for e in calls] == [("subquestion-gen", 24)]
    assert result.trace.retrievals == 0
    [error] = _notes(result, "subquestion-error")
    assert str(error["error"]).startswith(("ValueError", "OutputParserException", "TypeError"))
    assert error["output"] and error["question_gen_tokens"] == 24
    assert capsys.readouterr().out == ""


def test_each_sub_question_is_retrieved_then_answered(
    bm25: BM25Retriever, tiny: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    method, model = _scripted(bm25, tiny, PLAN)
    result = method.answer(QUESTION)
    retrievals = [e.data for e in result.trace.events if e.kind == "retrieval"]
    # One retrieval per sub-question, with the sub-question's own text, k passages each.
    assert [r["query"] for r in retrievals] == SUB_QUESTIONS
    assert all(len(r["ids"]) == 2 for r in retrievals)
    # The plan, one answer per sub-question, the final answer: all recorded, all the model's.
    names = [e.name for e in result.trace.events if e.kind == "llm_call"]
    assert names == ["subquestion-gen", "llm", "llm", "llm"]
    assert len(model.calls) == result.trace.llm_calls == 4
    assert [budget for _, budget in model.calls] == [256, 8, 8, 8]
    # The final prompt holds the sub-answers LlamaIndex composed ("Sub question: ...").
    assert all(f"Sub question: {q}" in model.calls[-1][0] for q in SUB_QUESTIONS)
    [note] = _notes(result, "subquestion")
    assert note["sub_questions"] == SUB_QUESTIONS
    assert (note["generated"], note["answered"], note["failed"]) == (2, 2, [])
    assert result.answer == "American"
    # The passages are the retrieved ones only, not the synthesized sub-answer texts.
    assert [p.id for p in result.passages] == [i for r in retrievals for i in r["ids"]]
    assert capsys.readouterr().out == ""


def test_zero_sub_questions_give_an_empty_answer(bm25: BM25Retriever, tiny: Any) -> None:
    """'{"items": []}' parses to no sub-questions; the engine's synthesizer then answers its
    placeholder "Empty Response" without a model call: the method answers nothing."""
    method, model = _scripted(bm25, tiny, '{"items": []}')
    result = method.answer(QUESTION)
    assert result.answer == "" and result.trace.retrievals == 0
    assert len(model.calls) == result.trace.llm_calls == 1
    [note] = _notes(result, "subquestion")
    assert (note["generated"], note["answered"]) == (0, 0)


def test_a_sub_question_for_an_unknown_tool_is_counted_as_failed(
    bm25: BM25Retriever, tiny: Any
) -> None:
    """The engine drops a sub-question whose tool it does not have (a KeyError it logs); the
    note keeps it, with the error, so the report can count it."""
    plan = json.dumps({"items": [
        {"sub_question": SUB_QUESTIONS[0], "tool_name": "uber_10k"},  # the prompt's example
        {"sub_question": SUB_QUESTIONS[1], "tool_name": TOOL_NAME},
    ]})
    method, _ = _scripted(bm25, tiny, plan)
    result = method.answer(QUESTION)
    assert [e.data["query"] for e in result.trace.events if e.kind == "retrieval"] == \
        SUB_QUESTIONS[1:]
    [note] = _notes(result, "subquestion")
    assert (note["generated"], note["answered"]) == (2, 1)
    [failed] = note["failed"]
    assert failed["tool_name"] == "uber_10k" and failed["error"].startswith("KeyError")
    assert result.answer == "American"


def test_parse_failures_are_told_apart_from_model_errors(bm25: BM25Retriever, tiny: Any) -> None:
    """A ContextLengthError is a ValueError, like the parser's; it must not pass for one."""
    method, _ = _scripted(bm25, tiny, ContextLengthError("prompt too long"))
    with pytest.raises(ContextLengthError):
        method.answer(QUESTION)
    method, _ = _scripted(bm25, tiny, '{"items": null}')  # the parser's TypeError
    [error] = _notes(method.answer(QUESTION), "subquestion-error")
    assert str(error["error"]).startswith("TypeError")


def test_a_server_error_inside_a_sub_question_fails_the_run(bm25: BM25Retriever,
                                                            tiny: Any) -> None:
    """LlamaIndex swallows a sub-question's exception (it only logs it); rag-gates' own
    errors must still stop the run instead of scoring as wrong answers."""
    from rag_gates.errors import ServerUnavailableError

    method, _ = _scripted(bm25, tiny, PLAN, answer=ServerUnavailableError("server down"))
    with pytest.raises(ServerUnavailableError, match="server down"):
        method.answer(QUESTION)


def test_another_error_inside_a_sub_question_is_counted_as_failed(bm25: BM25Retriever,
                                                                 tiny: Any) -> None:
    method, _ = _scripted(bm25, tiny, PLAN, answer=RuntimeError("odd model output"))
    result = method.answer(QUESTION)
    [note] = _notes(result, "subquestion")
    assert note["generated"] == 2 and note["answered"] == 0
    assert [f["sub_question"] for f in note["failed"]] == SUB_QUESTIONS
    assert result.answer == ""
