"""Algorithm 1 (uniform-cost search by retrieval count) on a constructed world whose
cheapest matching trajectory is known, checked against every decision sequence the loop can
take; the resumable synthesis file; the SFT and DPO exports."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from rag_gates.deeprag import DeepRAG
from rag_gates.deeprag.export import (
    dpo_pairs,
    export_dpo,
    export_sft,
    sft_example,
    tokenize_sft,
)
from rag_gates.deeprag.search import TrajectorySearch, answer_matches
from rag_gates.deeprag.synthesis import given_decomposition, read_rows, synthesize
from rag_gates.deeprag.trajectory import INTERMEDIATE, RETRIEVE, DeepRAGPrompt
from rag_gates.errors import ArtifactError
from rag_gates.gate import BaseGate
from rag_gates.types import QAExample
from tests.deeprag.conftest import ScriptedLM, last_answer, last_subquery

QUESTION = "Where was the father of the director of Jaws born?"
GOLD = ["Cincinnati"]


def three_hops(question: str, so_far: str) -> str:
    """Each subquery is built from the previous answer, so a wrong answer changes the path.
    Direct answers: knows who directed Jaws, guesses Spielberg's father wrong (Leah Adler),
    knows Arnold Spielberg was born in Cincinnati. From passages: finds the director and the
    father, but passages that do not give the birthplace mislead that answer."""
    if so_far.endswith(INTERMEDIATE):
        sub = last_subquery(so_far)
        context = so_far.rpartition("Follow up:")[2] if RETRIEVE in \
            so_far.rpartition("Follow up:")[2] else ""
        if sub == "Who directed Jaws?":
            return " Steven Spielberg"
        if sub.startswith("Who was the father of"):
            return " Arnold Spielberg" if "father of the film director" in context \
                else " Leah Adler"
        if sub == "Where was Arnold Spielberg born?":  # the passages do not say: misled
            return " Los Angeles" if context and "born in Cincinnati" not in context \
                else " Cincinnati"
        return " Los Angeles"
    if so_far.endswith("So the final answer is:"):
        return f" {last_answer(so_far)}"
    done = so_far.count("Follow up:")
    if done == 0:
        return "Follow up: Who directed Jaws?\n"
    if done == 1:
        return f"Follow up: Who was the father of {last_answer(so_far)}?\n"
    if done == 2:
        return f"Follow up: Where was {last_answer(so_far)} born?\n"
    return f"So the final answer is: {last_answer(so_far)}\n"


class Scripted(BaseGate):
    """Takes the decisions of a given sequence, one per subquery (for enumerating paths)."""

    name = "scripted"

    def __init__(self, decisions: Sequence[bool]) -> None:
        super().__init__(threshold=0.5)
        self.decisions = list(decisions)

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, Any]]:
        return float(self.decisions.pop(0)), {}


def test_search_finds_the_cheapest_matching_trajectory(bm25: Any) -> None:
    # Every decision sequence the loop can take, run for real: the matching ones and their
    # retrieval counts.
    matching = {}
    for decisions in itertools.product([False, True], repeat=3):
        run = DeepRAG(ScriptedLM(three_hops), bm25, gate=Scripted(decisions)).run(QUESTION)
        if answer_matches(run.answer, GOLD):
            matching[decisions] = run
    assert set(matching) == {(False, True, False), (True, True, False)}
    best = min(matching.values(), key=lambda r: r.trajectory.retrievals)
    found = TrajectorySearch(ScriptedLM(three_hops), bm25).run(QUESTION, GOLD)
    assert found.status == "found" and found.trajectory is not None
    t = found.trajectory
    assert t.retrievals == best.trajectory.retrievals == 1
    assert [s.decision.retrieve for s in t.steps] == [False, True, False]
    assert [(s.subquery, s.answer) for s in t.steps] == \
        [(s.subquery, s.answer) for s in best.trajectory.steps]
    assert t.final_answer == "Cincinnati" and t.stop_reason == "answered"
    # Popped in order (retrievals, steps, insertion): root, D, DD, DDD (wrong), R, DR, RD,
    # DDR (wrong), DRD (right): 9 expansions; a retrieval for each retrieved child popped (R,
    # DR, DDR); a step call per pop plus an answer call per child (the final answers were
    # written in the step calls): 9 + 8 model calls.
    assert found.expansions == 9 and found.max_expansions == 64
    assert found.retrievals == 3 and found.llm_calls == 17


def test_expansion_cap_and_exhaustion(bm25: Any) -> None:
    capped = TrajectorySearch(ScriptedLM(three_hops), bm25, max_expansions=8).run(QUESTION,
                                                                                  GOLD)
    assert capped.status == "expansion_cap" and capped.trajectory is None
    assert capped.expansions == 8 and capped.max_expansions == 8
    none = TrajectorySearch(ScriptedLM(three_hops), bm25).run(QUESTION, ["Tokyo"])
    # Every node of the 3-level binary tree popped once (1 + 2 + 4 + 8), nothing matched.
    assert none.status == "exhausted" and none.expansions == 15
    with pytest.raises(ValueError, match="answers"):
        TrajectorySearch(ScriptedLM(three_hops), bm25).run(QUESTION, [])


def test_step_cap_forces_final_answers_in_the_search(bm25: Any) -> None:
    found = TrajectorySearch(ScriptedLM(three_hops), bm25, max_steps=2).run(
        QUESTION, ["Arnold Spielberg"])
    assert found.trajectory is not None and found.trajectory.stop_reason == "step_cap"
    assert [s.decision.retrieve for s in found.trajectory.steps] == [False, True]


def test_search_on_the_tiny_model(bm25: Any, tiny_long: Any) -> None:
    found = TrajectorySearch(tiny_long, bm25, max_step_tokens=8, max_answer_tokens=4,
                             nudge=False).run(QUESTION, GOLD)
    # Random weights write no marker: the root is forced to a (wrong) final answer.
    assert found.status == "exhausted" and found.expansions == 1 and found.llm_calls == 2


@pytest.mark.parametrize(("prediction", "golds", "rule", "expected"), [
    ("Spielberg", ["Steven Spielberg"], "containment", True),
    ("Spielberg", ["Steven Spielberg"], "accuracy", False),
    ("It was Steven Spielberg.", ["steven spielberg"], "accuracy", True),
    ("Spiel", ["Spielberg"], "containment", False),
    ("the", ["the Beatles"], "containment", False),
    ("Paris", ["paris"], "exact", True),
])
def test_answer_matches(prediction: str, golds: list[str], rule: Any, expected: bool) -> None:
    assert answer_matches(prediction, golds, rule) is expected


def examples() -> list[QAExample]:
    return [QAExample(id=str(i), dataset="toy", question=QUESTION, answers=answers)
            for i, answers in enumerate([GOLD, ["Tokyo"], ["Los Angeles"]])]


def test_synthesis_file_resumes_and_refuses_other_settings(bm25: Any, tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl"
    lm = ScriptedLM(three_hops)
    search = TrajectorySearch(lm, bm25, max_expansions=20)
    seen: list[tuple[int, int, int]] = []
    stats = synthesize(search, examples()[:2], out, progress=lambda *a: seen.append(a))
    assert (stats.questions, stats.written, stats.found) == (2, 2, 1)
    assert seen == [(1, 2, 1), (2, 2, 1)]
    calls = len(lm.asked)
    # Interrupted mid-line, then resumed with one more question: only that one is searched.
    with out.open("a", encoding="utf-8") as handle:
        handle.write('{"id": "2", "half')
    stats = synthesize(search, examples(), out)
    assert (stats.written, stats.already_written, stats.found) == (1, 2, 2)
    assert stats.mean_retrievals == pytest.approx((1 + 0) / 2)  # DRD, and DDD misled
    assert len(lm.asked) > calls
    rows = read_rows(out)
    assert [r.id for r in rows] == ["0", "1", "2"]
    assert [r.status for r in rows] == ["found", "exhausted", "found"]
    assert all(r.max_expansions == 20 and r.seconds >= 0 for r in rows)
    assert rows[0].trajectory is not None and rows[0].trajectory.retrievals == 1
    assert rows[2].trajectory is not None and rows[2].expansions == 4
    with pytest.raises(ArtifactError, match="other settings"):
        synthesize(TrajectorySearch(lm, bm25, max_expansions=5), examples(), out)


# ---------------------------------------------------------------- given decomposition
HOPS = [("Who directed Jaws?", ["Steven Spielberg"]),
        ("Who was the father of Steven Spielberg?", ["Arnold Spielberg"]),
        ("Where was Arnold Spielberg born?", ["Cincinnati"])]


def test_given_decomposition_prunes_wrong_intermediate_answers(bm25: Any) -> None:
    lm = ScriptedLM(three_hops)
    found = TrajectorySearch(lm, bm25).run(QUESTION, GOLD, decomposition=HOPS)
    assert found.status == "found" and found.trajectory is not None
    t = found.trajectory
    # The given third subquery names Arnold Spielberg whatever the second answer was, so
    # direct-direct-direct reaches "Cincinnati" with the second answer wrong (Leah Adler):
    # the pruning must not take that 0-retrieval path.
    assert [s.subquery for s in t.steps] == [q for q, _ in HOPS]
    assert [s.decision.retrieve for s in t.steps] == [False, True, False]
    assert [s.answer for s in t.steps] == ["Steven Spielberg", "Arnold Spielberg", "Cincinnati"]
    assert t.final_answer == "Cincinnati" and t.stop_reason == "answered"
    # Popped: root, D, DD (pruned), R, DR, RD (pruned), DRD (found): no step calls, an
    # answer call per popped child; the last answer is the final one (no final-line call).
    assert found.expansions == 7 and found.retrievals == 2 and found.llm_calls == 6
    assert not any(so_far.endswith("So the final answer is:") for _, so_far in lm.asked)
    # Every branch's answer to the first hop wrong: nothing is found.
    wrong = [("Who directed Jaws?", ["Martin Scorsese"]), *HOPS[1:]]
    none = TrajectorySearch(ScriptedLM(three_hops), bm25).run(QUESTION, GOLD,
                                                              decomposition=wrong)
    assert none.status == "exhausted" and none.expansions == 3


@pytest.mark.parametrize(("decomposition", "message"), [
    ([], "non-empty list"),
    ([("Who directed Jaws?",)], "pair"),
    ([("", ["Steven Spielberg"])], "subquery"),
    ([("Who directed Jaws?", [])], r"decomposition\[0\] answers"),
])
def test_given_decomposition_is_checked(bm25: Any, decomposition: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrajectorySearch(ScriptedLM(three_hops), bm25).run(QUESTION, GOLD,
                                                           decomposition=decomposition)


def test_synthesis_with_given_decompositions(bm25: Any, tmp_path: Path) -> None:
    subqueries = [{"question": q, "answers": a} for q, a in HOPS]
    rows = [QAExample(id="0", dataset="toy", question=QUESTION, answers=GOLD,
                      meta={"subqueries": subqueries}),
            # No subqueries: the question is its one subquery (answered "Los Angeles").
            QAExample(id="1", dataset="toy", question=QUESTION, answers=["Los Angeles"])]
    assert given_decomposition(rows[1]) == [(QUESTION, ["Los Angeles"])]
    out = tmp_path / "given.jsonl"
    search = TrajectorySearch(ScriptedLM(three_hops), bm25)
    stats = synthesize(search, rows, out, decomposition="given")
    assert (stats.questions, stats.found) == (2, 2)
    found = read_rows(out)
    assert found[0].trajectory is not None and found[1].trajectory is not None
    assert [s.decision.retrieve for s in found[0].trajectory.steps] == [False, True, False]
    assert [s.subquery for s in found[1].trajectory.steps] == [QUESTION]
    assert json.loads(out.read_text().splitlines()[0])["header"]["decomposition"] == "given"
    with pytest.raises(ArtifactError, match="other settings"):  # never mixed in one file
        synthesize(search, rows, out)
    with pytest.raises(ArtifactError, match="subquery must be"):
        given_decomposition(QAExample(id="2", dataset="toy", question=QUESTION, answers=GOLD,
                                      meta={"subqueries": [{"question": QUESTION}]}))
    with pytest.raises(ValueError, match="'model' or 'given'"):
        synthesize(search, rows, tmp_path / "x.jsonl", decomposition="gold")  # type: ignore[arg-type]


# ---------------------------------------------------------------- exports
def found_trajectory(bm25: Any) -> Any:
    found = TrajectorySearch(ScriptedLM(three_hops), bm25).run(QUESTION, GOLD)
    assert found.trajectory is not None
    return found.trajectory


def test_sft_masks_exactly_the_passages(bm25: Any, tiny_long: Any) -> None:
    t = found_trajectory(bm25)
    example = sft_example(t)
    assert example.completion == t.render().split("\n", 1)[1]
    (begin, end), = example.masked
    hidden = example.completion[begin:end]
    assert hidden.startswith("\n[1] ") and hidden.endswith("\n")
    assert example.completion[:begin].endswith(f"{RETRIEVE}\nContext:")
    assert example.completion[end:].startswith(f"{INTERMEDIATE} Arnold Spielberg")
    record = tokenize_sft(example, tiny_long)
    ids, labels = record["input_ids"], record["labels"]
    prompt_len = len(tiny_long.encode(example.prompt))
    assert len(ids) == len(labels) and labels[:prompt_len] == [-100] * prompt_len
    assert ids[prompt_len:-1] == tiny_long.token_ids(example.completion)
    assert ids[-1] == labels[-1] == tiny_long.tokenizer.eos_token_id
    trained = tiny_long.tokenizer.decode([i for i, lab in zip(ids, labels, strict=True)
                                          if lab != -100])
    assert "Arnold Meyer" not in trained and "Context:" in trained
    assert "Who directed Jaws?" in trained and "So the final answer is: Cincinnati" in trained
    masked = tiny_long.tokenizer.decode([i for i, lab in zip(ids[prompt_len:],
                                                             labels[prompt_len:], strict=True)
                                         if lab == -100])
    assert "Arnold Meyer" in masked and "Intermediate" not in masked


def test_dpo_pairs_share_the_history_and_differ_in_the_decision(bm25: Any,
                                                                tiny_long: Any) -> None:
    t = found_trajectory(bm25)
    pairs = dpo_pairs(t, tiny_long)
    assert [(p.chosen, p.rejected) for p in pairs] == [
        (INTERMEDIATE, RETRIEVE), (RETRIEVE, INTERMEDIATE), (INTERMEDIATE, RETRIEVE)]
    last = pairs[2].prompt
    assert last.startswith("<|im_start|>user\n") and not last.endswith("<|im_end|>\n")
    assert last.endswith("Follow up: Where was Arnold Spielberg born?\n")
    assert "Arnold Meyer" in last  # the passages are in the shared prompt
    plain = dpo_pairs(t, tiny_long, DeepRAGPrompt(style="completion"))
    assert plain[0].prompt.endswith("Question: " + QUESTION + "\nFollow up: Who directed Jaws?\n")


def test_exports_write_one_record_per_trajectory(bm25: Any, tiny_long: Any,
                                                 tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl"
    synthesize(TrajectorySearch(ScriptedLM(three_hops), bm25), examples(), out)
    rows = read_rows(out)
    sft = export_sft(rows, tmp_path / "sft.jsonl", tiny_long)
    assert (sft.rows, sft.trajectories, sft.records) == (3, 2, 2)
    lines = [json.loads(x) for x in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert sorted(lines[0]) == ["input_ids", "labels"]
    dpo = export_dpo(rows, tmp_path / "dpo.jsonl", tiny_long)
    steps = sum(len(r.trajectory.steps) for r in rows if r.trajectory)
    assert dpo.records == steps
    pair = json.loads((tmp_path / "dpo.jsonl").read_text().splitlines()[0])
    assert sorted(pair) == ["chosen", "prompt", "rejected"]
