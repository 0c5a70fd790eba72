"""The DeepRAG loop: markers, decisions per mode, the step cap and the malformed-step rules,
on a real BM25 retriever; the model is scripted (tests/deeprag/conftest.py) or the tiny
random-weight Llama."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rag_gates.confidence import FirstTokenProbGate
from rag_gates.deeprag import DeepRAG, DeepRAGResult
from rag_gates.deeprag.gates import MarkerLikelihoodGate
from rag_gates.deeprag.trajectory import FINAL, INTERMEDIATE, RETRIEVE
from rag_gates.gate import UNDECIDED_SCORE
from rag_gates.retrieval.base import BaseRetriever
from rag_gates.types import Passage
from tests.deeprag.conftest import QUESTION, ScriptedLM, jaws_world, last_answer


def kinds(result: DeepRAGResult) -> list[str]:
    """The trace's events (model calls by name), without the closing trajectory note."""
    events = result.trace.events
    assert events[-1].kind == "note" and events[-1].name == "trajectory"
    return [e.kind if e.kind != "llm_call" else e.name for e in events[:-1]]


def test_generate_mode_model_decides_and_retrieval_uses_the_subquery(bm25: Any) -> None:
    lm = ScriptedLM(jaws_world)
    result = DeepRAG(lm, bm25).run(QUESTION)
    t = result.trajectory
    assert [s.subquery for s in t.steps] == ["Who directed Jaws?",
                                             "Who was the father of Steven Spielberg?"]
    assert [d.retrieve for d in result.decisions] == [False, True]
    assert [s.answer for s in t.steps] == ["Steven Spielberg", "Arnold Spielberg"]
    assert result.answer == t.final_answer == "Arnold Spielberg"
    assert t.stop_reason == "answered" and not t.malformed
    # One call writes subquery, marker and direct answer; a retrieval adds an answer call.
    assert kinds(result) == ["step", "decision", "step", "decision", "retrieval",
                             "answer-retrieved", "step"]
    # The closing note puts the steps in the trace, for logs and per-subquery analyses.
    note = result.trace.events[-1]
    assert note.name == "trajectory" and note.data["stop_reason"] == "answered"
    assert note.data["steps"] == [
        {"subquery": "Who directed Jaws?", "retrieve": False, "answer": "Steven Spielberg"},
        {"subquery": "Who was the father of Steven Spielberg?", "retrieve": True,
         "answer": "Arnold Spielberg"}]
    retrieval = next(e for e in result.trace.events if e.kind == "retrieval")
    assert retrieval.data["query"] == "Who was the father of Steven Spielberg?"
    assert retrieval.data["ids"][0] == "arnold"
    assert t.steps[1].passages is not None and t.steps[1].passages[0].id == "arnold"
    assert result.passages[0].id == "arnold" and result.trace.retrievals == 1
    # The answer call saw the passages as Context after the retrieve marker.
    _, so_far = lm.asked[2]
    assert f"{RETRIEVE}\nContext:\n[1] Arnold Spielberg: Arnold Meyer" in so_far
    assert so_far.endswith(INTERMEDIATE)
    assert result.decisions[0].reason.startswith("the model wrote 'Intermediate answer:'")


def test_never_and_always(bm25: Any) -> None:
    never = DeepRAG(ScriptedLM(jaws_world), bm25, mode="never").run(QUESTION)
    assert never.trace.retrievals == 0
    assert [s.answer for s in never.trajectory.steps] == ["Steven Spielberg", "Leah Adler"]
    assert never.answer == "Leah Adler"
    assert kinds(never) == ["step", "decision", "answer-direct", "step", "decision",
                            "answer-direct", "step"]
    always = DeepRAG(ScriptedLM(jaws_world), bm25, mode="always").run(QUESTION)
    assert always.trace.retrievals == 2 and always.answer == "Arnold Spielberg"
    assert {d.gate for d in always.decisions} == {"deeprag-always"}
    # Retrieval needs no retriever only in never mode.
    assert DeepRAG(ScriptedLM(jaws_world), None, mode="never").run(QUESTION).answer \
        == "Leah Adler"
    with pytest.raises(ValueError, match="retriever"):
        DeepRAG(ScriptedLM(jaws_world), None, mode="always")


def test_gate_mode_asks_the_gate_with_each_subquery(bm25: Any, tiny_long: Any) -> None:
    gate = FirstTokenProbGate(tiny_long, threshold=0.0)  # a real gate: here, always retrieve
    result = DeepRAG(ScriptedLM(jaws_world), bm25, gate=gate).run(QUESTION)
    assert result.trajectory.retrievals == 2
    for s in result.trajectory.steps:
        expected = gate.decide(s.subquery)
        assert s.decision.gate == "first-token-prob"
        assert s.decision.score == pytest.approx(expected.score)
    strict = FirstTokenProbGate(tiny_long, threshold=1.0)  # never retrieves (1 - max p < 1)
    assert DeepRAG(ScriptedLM(jaws_world), bm25, gate=strict).run(QUESTION).trace.retrievals == 0
    with pytest.raises(ValueError, match="gate"):
        DeepRAG(ScriptedLM(jaws_world), bm25, mode="gate")


def test_step_cap_forces_the_final_answer(bm25: Any) -> None:
    def endless(question: str, so_far: str) -> str:
        if so_far.endswith(INTERMEDIATE):
            return " something"
        if so_far.endswith("So the final answer is:"):
            return " forced guess"
        return f"Follow up: Question number {so_far.count('Follow up:')}?\n{INTERMEDIATE} x"

    result = DeepRAG(ScriptedLM(endless), bm25, max_steps=3).run(QUESTION)
    t = result.trajectory
    assert len(t.steps) == 3 and t.stop_reason == "step_cap" and t.forced
    assert result.answer == "forced guess" and kinds(result)[-1] == "final-forced"
    assert DeepRAG(ScriptedLM(endless), bm25, max_steps=0).run(QUESTION).trajectory.steps == ()


def wrap(step_text: str,
         first: str = f"Follow up: Who directed Jaws?\n{INTERMEDIATE} Steven Spielberg\n") -> Any:
    """A model that writes ``step_text`` at the second step, after one good step (``first``:
    by default answered from memory)."""
    def reply(question: str, so_far: str) -> str:
        if so_far.endswith(INTERMEDIATE):
            return " Steven Spielberg"
        if so_far.endswith("So the final answer is:"):
            return f" {last_answer(so_far)}"
        if not so_far:
            return first
        return step_text
    return reply


@pytest.mark.parametrize(("text", "kind"), [
    ("Jaws was directed by Spielberg, whose father was Arnold.", "no_marker"),
    (f"Follow up:\n{INTERMEDIATE} x", "empty_subquery"),
    (f"Follow up: who directed JAWS\n{INTERMEDIATE} x", "repeated_subquery"),
])
def test_unreadable_steps_force_the_final_answer_and_are_counted(bm25: Any, text: str,
                                                                  kind: str) -> None:
    """Nothing retrieved before the unreadable step: the run cannot decide, so it retrieves
    with the question (an undecided decision that says why) before the forced answer."""
    result = DeepRAG(ScriptedLM(wrap(text)), bm25, nudge=False).run(QUESTION)
    t = result.trajectory
    assert len(t.steps) == 2 and t.stop_reason == "malformed"
    assert [(m.kind, m.step, m.action) for m in t.malformed] == [(kind, 1, "retrieved")]
    assert t.malformed[0].text == text.split("\nFollow up:")[0]
    last = t.steps[-1]
    assert last.subquery == QUESTION and last.passages is not None
    assert last.decision.gate == "deeprag-unreadable-step" and last.decision.retrieve
    assert last.decision.score == UNDECIDED_SCORE and kind in last.decision.reason
    assert result.trace.retrievals == 1
    assert result.answer == "Steven Spielberg" and kinds(result)[-1] == "final-forced"


@pytest.mark.parametrize("retriever", [None, "bm25"])
@pytest.mark.parametrize(("text", "kind"), [
    (f"Follow up:\n{INTERMEDIATE} x", "empty_subquery"),
    (f"Follow up: who directed JAWS\n{INTERMEDIATE} x", "repeated_subquery"),
])
def test_never_mode_forces_the_final_answer_on_an_unreadable_step_without_retrieving(
        bm25: Any, retriever: str | None, text: str, kind: str) -> None:
    """Never mode retrieves nothing, even when a step cannot be read (before, it asked for
    the missing retriever and raised, or retrieved with one given)."""
    result = DeepRAG(ScriptedLM(wrap(text)), bm25 if retriever else None, mode="never",
                     nudge=False).run(QUESTION)
    t = result.trajectory
    assert [(m.kind, m.step, m.action) for m in t.malformed] == [(kind, 1, "forced_final")]
    assert result.trace.retrievals == 0 and all(s.passages is None for s in t.steps)
    assert t.stop_reason == "malformed" and kinds(result)[-1] == "final-forced"


@pytest.mark.parametrize(("text", "kind"), [
    ("Arnold was his father.", "no_marker"),
    (f"Follow up:\n{INTERMEDIATE} x", "empty_subquery"),
])
def test_an_unreadable_step_after_a_retrieval_forces_the_final_answer(bm25: Any, text: str,
                                                                      kind: str) -> None:
    retrieving = wrap(text, first=f"Follow up: Who directed Jaws?\n{RETRIEVE}\n")
    result = DeepRAG(ScriptedLM(retrieving), bm25, nudge=False).run(QUESTION)
    t = result.trajectory
    assert len(t.steps) == 1 and t.steps[0].passages is not None
    assert [(m.kind, m.step, m.action) for m in t.malformed] == [(kind, 1, "forced_final")]
    assert result.trace.retrievals == 1 and kinds(result)[-1] == "final-forced"


def test_a_step_without_marker_is_nudged_once(bm25: Any) -> None:
    def chatty(question: str, so_far: str) -> str:
        """Answers in free text unless "Follow up:" is already written."""
        if so_far.endswith("Follow up:"):
            return " Who directed Jaws?\nIntermediate answer: Steven Spielberg\n"
        return jaws_world(question, so_far) if so_far else "The director is Spielberg."

    lm = ScriptedLM(chatty)
    result = DeepRAG(lm, bm25).run(QUESTION)
    t = result.trajectory
    assert [(m.kind, m.step, m.action, m.text) for m in t.malformed] == \
        [("no_marker", 0, "nudged", "The director is Spielberg.")]
    assert kinds(result)[:3] == ["step", "step-nudged", "decision"]
    assert lm.asked[1][1] == "Follow up:"
    assert t.steps[0].subquery == "Who directed Jaws?"
    assert t.steps[0].answer == "Steven Spielberg" and t.stop_reason == "answered"
    # A nudge that still gives nothing readable ends the run as before.
    stubborn = DeepRAG(ScriptedLM(lambda q, s: "" if s.endswith("Follow up:") else "Hm."),
                       bm25).run(QUESTION)
    assert [(m.kind, m.action) for m in stubborn.trajectory.malformed] == \
        [("no_marker", "nudged"), ("empty_subquery", "retrieved")]
    assert stubborn.trajectory.steps[0].subquery == QUESTION


def test_missing_decision_marker_retrieves(bm25: Any) -> None:
    lm = ScriptedLM(wrap("Follow up: Who was the father of Steven Spielberg?\nHe was"))
    result = DeepRAG(lm, bm25, max_steps=2).run(QUESTION)
    t = result.trajectory
    assert [(m.kind, m.action) for m in t.malformed] == [("no_decision", "retrieved")]
    d = t.steps[1].decision
    assert d.retrieve and d.score == UNDECIDED_SCORE and "no decision marker" in d.reason
    assert t.steps[1].passages is not None and result.trace.retrievals == 1


def test_authors_rule_answers_a_subquery_without_marker_directly(bm25: Any) -> None:
    """marker_rule="authors": no retrieval marker after the subquery means a direct answer
    (their loop retrieves only at "Let"); the step is still counted, as answered."""
    text = "Follow up: Who was the father of Steven Spielberg?\nHe was"
    lm = ScriptedLM(wrap(text))
    result = DeepRAG(lm, bm25, max_steps=2, marker_rule="authors").run(QUESTION)
    t = result.trajectory
    assert [(m.kind, m.action) for m in t.malformed] == [("no_decision", "answered")]
    d = t.steps[1].decision
    assert not d.retrieve and d.score == 0.0 and "authors' rule" in d.reason
    assert t.steps[1].passages is None and result.trace.retrievals == 0
    # The direct answer is a call of its own, as in the authors' loop (sragsftv2.py:107).
    assert kinds(result) == ["step", "decision", "answer-direct", "step", "decision",
                             "answer-direct", "final-forced"]
    # Fail closed (the default) retrieves on the same text.
    assert DeepRAG(ScriptedLM(wrap(text)), bm25, max_steps=2).run(QUESTION).trace.retrievals == 1


def test_authors_rule_reads_past_a_blank_line(bm25: Any) -> None:
    """The authors' follow-up call runs on through blank lines to their stop words; the
    default step stops at the blank line and so never sees the marker after it."""
    text = f"Follow up: Who was the father of Steven Spielberg?\n\n{RETRIEVE}\nContext:\n"
    authors_lm = ScriptedLM(wrap(text))
    authors = DeepRAG(authors_lm, bm25, max_steps=2, marker_rule="authors").run(QUESTION)
    d = authors.trajectory.steps[1].decision
    assert d.retrieve and d.score == 1.0 and not authors.trajectory.malformed
    assert authors.trajectory.steps[1].subquery == "Who was the father of Steven Spielberg?"
    default = DeepRAG(ScriptedLM(wrap(text)), bm25, max_steps=2).run(QUESTION)
    undecided = default.trajectory.steps[1].decision
    assert undecided.retrieve and undecided.score == UNDECIDED_SCORE
    assert [m.kind for m in default.trajectory.malformed] == ["no_decision"]


def test_authors_rule_retrieves_at_any_word_that_starts_with_let(bm25: Any) -> None:
    """Their stop word is the bare "Let" (sragsftv2.py:137): a subquery naming "Lethal
    Weapon" is cut there and retrieved with what precedes it, as in their loop."""
    lm = ScriptedLM(wrap("Follow up: Who directed Lethal Weapon?\nIntermediate answer: x"))
    result = DeepRAG(lm, bm25, max_steps=2, marker_rule="authors").run(QUESTION)
    step = result.trajectory.steps[1]
    assert step.decision.retrieve and step.subquery == "Who directed"
    retrieval = [e for e in result.trace.events if e.kind == "retrieval"]
    assert [e.data["query"] for e in retrieval] == ["Who directed"]


@pytest.mark.parametrize(("text", "kind"), [
    (f"Follow up:\n{INTERMEDIATE} x", "empty_subquery"),
    (f"Follow up: who directed JAWS\n{INTERMEDIATE} x", "repeated_subquery"),
])
def test_authors_rule_does_not_retrieve_for_an_unreadable_step(bm25: Any, text: str,
                                                               kind: str) -> None:
    result = DeepRAG(ScriptedLM(wrap(text)), bm25, nudge=False,
                     marker_rule="authors").run(QUESTION)
    t = result.trajectory
    assert [(m.kind, m.step, m.action) for m in t.malformed] == [(kind, 1, "forced_final")]
    assert result.trace.retrievals == 0 and kinds(result)[-1] == "final-forced"


def test_authors_rule_asks_for_the_final_answer_after_so_the_final(bm25: Any) -> None:
    """"So the final" without the whole marker ends the decomposition; the final answer is
    then asked for in a call of its own (their _gen_final_answer, sragsftv2.py:86-87)."""
    result = DeepRAG(ScriptedLM(wrap("Follow up: So the final one")), bm25,
                     marker_rule="authors").run(QUESTION)
    t = result.trajectory
    assert len(t.steps) == 1 and t.stop_reason == "answered" and not t.forced
    assert kinds(result)[-1] == "final" and result.answer == "Steven Spielberg"


def test_authors_rule_is_generate_modes() -> None:
    from rag_gates.deeprag import DeepRAGConfig

    with pytest.raises(ValueError, match="only generate mode has"):
        DeepRAGConfig(mode="likelihood", marker_rule="authors")
    with pytest.raises(ValueError, match="marker_rule"):
        DeepRAGConfig(marker_rule="retrieve")  # type: ignore[arg-type]


def test_an_empty_final_answer_at_once_retrieves_before_answering(bm25: Any) -> None:
    """The final-answer marker with nothing after it decides nothing: before, the run
    answered closed book with no decision and no retrieval; now it is an unreadable step."""
    def blank_then_answer(question: str, so_far: str) -> str:
        if not so_far:
            return f"{FINAL}\n"
        return jaws_world(question, so_far)

    result = DeepRAG(ScriptedLM(blank_then_answer), bm25).run(QUESTION)
    t = result.trajectory
    assert [(m.kind, m.step, m.action) for m in t.malformed] == [("empty_final", 0,
                                                                  "retrieved")]
    assert t.stop_reason == "malformed" and result.trace.retrievals == 1
    [step] = t.steps
    assert step.subquery == QUESTION and step.passages is not None
    assert step.decision.retrieve and "empty_final" in step.decision.reason
    assert kinds(result)[-1] == "final-forced"


def test_a_question_with_no_decomposition_is_answered_directly(bm25: Any) -> None:
    # The model writes the final answer at once: no step, no decision, no retrieval.
    lm = ScriptedLM(lambda question, so_far: f"{FINAL} Paris\n")
    result = DeepRAG(lm, bm25).run("In which city is the Eiffel Tower?")
    t = result.trajectory
    assert t.steps == () and result.decisions == [] and result.trace.retrievals == 0
    assert result.answer == t.final_answer == "Paris"
    assert t.stop_reason == "answered" and not t.forced and not t.malformed
    assert kinds(result) == ["step"] and len(lm.asked) == 1


def test_nothing_retrieved_is_said_and_the_loop_goes_on() -> None:
    class Empty(BaseRetriever):
        name = "empty"

        def retrieve(self, query: str, k: int = 3) -> list[Passage]:
            return []

    lm = ScriptedLM(jaws_world)
    result = DeepRAG(lm, Empty(), mode="always").run(QUESTION)
    assert [s.passages for s in result.trajectory.steps] == [(), ()]
    assert result.answer == "Leah Adler"
    assert any("Context: (nothing found)\nIntermediate answer:" in s for _, s in lm.asked)
    assert "Context: (nothing found)" in result.trajectory.render()


def test_async_run_equals_sync(bm25: Any) -> None:
    sync = DeepRAG(ScriptedLM(jaws_world), bm25).run(QUESTION)
    agent = DeepRAG(ScriptedLM(jaws_world), bm25)
    both = asyncio.run(_twice(agent))
    for result in both:
        assert result.trajectory.render() == sync.trajectory.render()
        assert [d.retrieve for d in result.decisions] == [d.retrieve for d in sync.decisions]
        assert kinds(result) == kinds(sync)


async def _twice(agent: DeepRAG) -> list[DeepRAGResult]:
    return list(await asyncio.gather(agent.arun(QUESTION), agent.aanswer(QUESTION)))


def test_bad_question() -> None:
    agent = DeepRAG(ScriptedLM(jaws_world), None, mode="never")
    with pytest.raises(ValueError, match="question"):
        agent.run("   ")


def test_arguments_of_the_wrong_kind_say_what_to_pass(bm25: Any) -> None:
    lm = ScriptedLM(jaws_world)
    for config in (3, {"k": 2}):  # a setting positionally, not a DeepRAGConfig
        with pytest.raises(TypeError, match=r"DeepRAGConfig, got .*DeepRAG\(lm, retriever, k=3\)"):
            DeepRAG(lm, bm25, config)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="as_text_lm"):
        DeepRAG("SmolLM2", bm25)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="LangChainRetrieverAdapter"):
        DeepRAG(lm, object())  # type: ignore[arg-type]


# ---------------------------------------------------------------- likelihood mode
def test_likelihood_gate_compares_the_markers_on_a_real_model(tiny_long: Any) -> None:
    prompt = [{"role": "user", "content": "Question: Who directed Jaws?"},
              {"role": "assistant", "content": "Follow up: Who directed Jaws?\n"}]
    retrieve, direct = tiny_long.score(prompt, [RETRIEVE, INTERMEDIATE])
    margin = retrieve.total - direct.total
    for threshold, expected in ((margin - 0.5, True), (margin + 0.5, False)):
        d = MarkerLikelihoodGate(tiny_long, threshold).decide("Who directed Jaws?",
                                                              prompt=prompt)
        assert d.retrieve is expected and d.score == pytest.approx(margin)
        assert d.evidence["logp_retrieve"] == pytest.approx(retrieve.total)
    with pytest.raises(ValueError, match="prompt"):
        MarkerLikelihoodGate(tiny_long).decide("Who directed Jaws?")


def test_likelihood_mode_scores_after_each_subquery(bm25: Any, tiny_long: Any) -> None:
    class ScriptedWhiteBox(ScriptedLM):
        """Scripted text; log-probabilities from the tiny model (white-box access)."""

        def __getattr__(self, name: str) -> Any:
            return getattr(tiny_long, name)

    lm = ScriptedWhiteBox(jaws_world)
    low = DeepRAG(lm, bm25, mode="likelihood", threshold=-1e6).run(QUESTION)
    high = DeepRAG(lm, bm25, mode="likelihood", threshold=1e6).run(QUESTION)
    assert low.trace.retrievals == 2 and high.trace.retrievals == 0
    d = low.decisions[1]
    prompt = [{"role": "user", "content": DeepRAG(lm, bm25).config.prompt.user_text(QUESTION)},
              {"role": "assistant", "content": low.trajectory.steps[0].render()
               + "Follow up: Who was the father of Steven Spielberg?\n"}]
    r, a = tiny_long.score(prompt, [RETRIEVE, INTERMEDIATE])
    assert d.gate == "deeprag-likelihood" and d.score == pytest.approx(r.total - a.total)


def test_likelihood_needs_log_probabilities(bm25: Any) -> None:
    from rag_gates.errors import WhiteBoxRequiredError

    with pytest.raises(WhiteBoxRequiredError):
        DeepRAG(ScriptedLM(jaws_world), bm25, mode="likelihood")


# ---------------------------------------------------------------- a real (random) model
def test_runs_on_the_tiny_model(bm25: Any, tiny_long: Any) -> None:
    result = DeepRAG(tiny_long, bm25, mode="always", max_steps=2, max_step_tokens=8,
                     max_answer_tokens=4, nudge=False).run(QUESTION)
    t = result.trajectory
    # Random weights write no markers: one unreadable step, a retrieval with the question
    # (nothing was retrieved before it), then the forced final answer.
    assert t.stop_reason == "malformed" and t.malformed[0].kind == "no_marker"
    assert t.malformed[0].action == "retrieved" and t.steps[0].subquery == QUESTION
    assert result.trace.llm_calls == 3 and result.trace.retrievals == 1
    assert result.answer == t.final_answer and "\n" not in result.answer
    nudged = DeepRAG(tiny_long, bm25, mode="always", max_steps=2, max_step_tokens=8,
                     max_answer_tokens=4).run(QUESTION)
    # Nudged, random text becomes subqueries: each step retrieves (mode always) until the
    # cap or an unreadable (empty, repeated) subquery.
    steps = len(nudged.trajectory.steps)
    assert nudged.trajectory.malformed[0].action == "nudged"
    assert nudged.trace.retrievals == steps >= 1
    assert all(s.passages is not None for s in nudged.trajectory.steps)


def test_stream_yields_each_step_then_the_result(bm25: Any) -> None:
    from rag_gates.deeprag import Step

    agent = DeepRAG(ScriptedLM(jaws_world), bm25)
    items = list(agent.stream(QUESTION))
    assert [type(i).__name__ for i in items] == ["Step", "Step", "DeepRAGResult"]
    final = items[-1]
    assert isinstance(final, DeepRAGResult)
    assert list(final.trajectory.steps) == [i for i in items if isinstance(i, Step)]
    assert final.trajectory.render() == agent.run(QUESTION).trajectory.render()

    async def collect() -> list[Any]:
        return [i async for i in agent.astream(QUESTION)]

    async_items = asyncio.run(collect())
    assert [type(i).__name__ for i in async_items] == ["Step", "Step", "DeepRAGResult"]
    assert async_items[-1].trajectory.render() == final.trajectory.render()


class FirstTokenLM(ScriptedLM):
    """A text-only model with log-probabilities (as a served model without prompt scoring):
    its next token's top alternatives are given, the rest of its behaviour scripted."""

    def __init__(self, top: dict[str, float]) -> None:
        super().__init__(jaws_world)
        self.top = top

    @property
    def supports_logprobs(self) -> bool:
        return True

    def generate(self, prompt: Any, **kwargs: Any) -> Any:
        from rag_gates.types import Generation, TokenLogprob, TopLogprob

        alternatives = [TopLogprob(token=t, logprob=v) for t, v in self.top.items()]
        first = max(alternatives, key=lambda t: t.logprob)
        return Generation(text=first.token, finish_reason="length", completion_tokens=1,
                          logprobs=[TokenLogprob(token=first.token, logprob=first.logprob,
                                                 top_logprobs=alternatives)])


def test_likelihood_gate_reads_first_token_alternatives_from_a_text_only_model() -> None:
    prompt = "Question: Who directed Jaws?\nFollow up: Who directed Jaws?\n"
    both = FirstTokenLM({" Let": -1.0, "Let": -3.0, " Intermediate": -2.5, " The": -0.5})
    gate = MarkerLikelihoodGate(both, threshold=0.0)
    assert gate.method == "top_logprobs"
    d = gate.decide("Who directed Jaws?", prompt=prompt)
    # the best alternative that begins each marker: " Let" (-1.0) and " Intermediate" (-2.5)
    assert d.score == pytest.approx(1.5) and d.retrieve
    assert not d.evidence["retrieve_bound"] and not d.evidence["direct_bound"]
    # A marker missing from the alternatives counts at the lowest one shown (an upper bound).
    one = FirstTokenLM({" Intermediate": -0.2, " The": -1.0, " A": -4.0})
    d = MarkerLikelihoodGate(one, threshold=0.0).decide("Who directed Jaws?", prompt=prompt)
    assert d.score == pytest.approx(-4.0 - -0.2) and not d.retrieve
    assert d.evidence["retrieve_bound"] and d.evidence["logp_retrieve"] == -4.0
    # Neither marker: undecided, so it retrieves and says why (fail closed).
    none = FirstTokenLM({" The": -0.1, " A": -2.0})
    d = MarkerLikelihoodGate(none, threshold=0.0).decide("Who directed Jaws?", prompt=prompt)
    assert d.retrieve and "neither marker" in d.reason


def test_completion_style_runs_the_same_loop_on_plain_text(bm25: Any) -> None:
    """For models that continue text (base models): every prompt is one string, the
    instruction and question then the steps so far, and the loop decides as in chat style."""
    from rag_gates.deeprag import DeepRAGPrompt

    class Recording(ScriptedLM):
        def __init__(self) -> None:
            super().__init__(jaws_world)
            self.prompts: list[Any] = []

        def generate(self, prompt: Any, **kwargs: Any) -> Any:
            self.prompts.append(prompt)
            return super().generate(prompt, **kwargs)

    chat, text = Recording(), Recording()
    in_chat = DeepRAG(chat, bm25).run(QUESTION)
    style = DeepRAGPrompt(style="completion")
    as_text = DeepRAG(text, bm25, prompt=style).run(QUESTION)
    assert as_text.trajectory.render() == in_chat.trajectory.render()
    assert [d.retrieve for d in as_text.decisions] == [False, True]
    assert all(isinstance(p, str) for p in text.prompts)
    assert all(not isinstance(p, str) for p in chat.prompts)
    head = style.user_text(QUESTION)
    for prompt, (_, so_far) in zip(text.prompts, text.asked, strict=True):
        assert prompt == f"{head}\n{so_far}"
