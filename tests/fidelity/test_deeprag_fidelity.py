"""DeepRAG as the paper and the authors' code write it (docs/fidelity.md, DeepRAG section):
string rules compared exactly, and the per-step decision against the authors' inference loop
re-written here from their code (gxy-gxy/DeepRAG, src/algorithms/sragsftv2.py; file:line in
each comment), on what the embedded model really wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rag_gates.deeprag import DeepRAG
from rag_gates.deeprag.trajectory import INSTRUCTION, _context_lines
from rag_gates.types import Passage

# Appendix A.1 (the authors' ICL-prompt/instruction.txt carries it after "Instruction: ").
PAPER_INSTRUCTION = (
    'You are a helpful Retrieve-Augmented Generation (RAG) model. Your task is to answer '
    'questions by logically decomposing them into clear sub-questions and iteratively '
    'addressing each one. Use "Follow up:" to introduce each sub-question and "Intermediate '
    'answer:" to provide answers. For each sub-question, decide whether you can provide a '
    'direct answer or if additional information is required. If additional information is '
    'needed, state, "Let\'s search the question in Wikipedia." and then use the retrieved '
    'information to respond comprehensively. If a direct answer is possible, provide it '
    'immediately without searching.')


def test_instruction_is_the_authors() -> None:
    assert INSTRUCTION == PAPER_INSTRUCTION


def test_context_block_format() -> None:
    """The authors' ``_try_retrieval_path``: "Context:" then "[i] doc" lines, 1-based."""
    docs = [Passage(title="Jaws", text="Jaws is a 1975 film."), Passage(text="Second.")]
    assert "\n".join(_context_lines(docs)) == "Context:\n[1] Jaws: Jaws is a 1975 film.\n" \
                                              "[2] Second."


# ---------------------------------------------------------------- the step decision
# The authors' reading of a step, re-written from their inference loop (gxy-gxy/DeepRAG at
# 26e5fcd, src/algorithms/sragsftv2.py), not from rag_gates: what the follow-up call returns,
# how it is cleaned and what the loop then does.
THEIR_STOP_WORDS = ("Intermediate answer:", "So the final", "Let")  # :137 (and chat ends)


def their_generation(continuation: str) -> str:
    """What their follow-up call returns for a model that would write ``continuation``:
    decoding ends once a stop word is complete (:137), and the word stays in the text
    (src/algorithms/basic.py:123, ``include_stop_str_in_output=True``)."""
    for end in range(1, len(continuation) + 1):
        if any(continuation[:end].endswith(word) for word in THEIR_STOP_WORDS):
            return continuation[:end]
    return continuation


def their_follow_up(text: str) -> str:
    """Their ``_clean_generated_text`` (:217-224): strip, drop a leading "Follow up:", keep
    what precedes the next "Follow up:", "Intermediate answer:", "So the final answer"."""
    kept = text.strip()
    if kept.startswith("Follow up:"):
        kept = kept[len("Follow up:"):]
    for marker in ("Follow up:", "Intermediate answer:", "So the final answer"):
        kept = kept.partition(marker)[0]
    return kept.strip()


def their_step(continuation: str) -> tuple[str, str]:
    """(what their loop does, the follow-up): "final" when "So the final" is in the
    follow-up (:86), "retrieve" with the follow-up less its "Let" when it ends with "Let"
    (:94-97), else "direct" (:105-107)."""
    follow_up = their_follow_up(their_generation(continuation))
    if "So the final" in follow_up:
        return "final", follow_up
    if follow_up.endswith("Let"):
        return "retrieve", " ".join(follow_up[: -len("Let")].split())
    return "direct", follow_up


# What the embedded SmolLM2 wrote at the first step and after "Follow up:" (training rows;
# benchmarks/deeprag_step_texts.py records them).
STEP_TEXTS = Path(__file__).parent / "data" / "deeprag_step_texts.json"

# Constructed continuations for rules the recorded texts may not reach (each comment says
# which); the expectation is still their_step's.
CONSTRUCTED = [
    # a blank line before the retrieve marker: their call runs on through it (:137)
    ("Follow up: Who directed Jaws?\n\nLet's search the question in Wikipedia.\nContext:", ""),
    # no marker at all within the budget: answered directly (:105)
    ("Follow up: Who directed Jaws?\nSteven Spielberg directed it in 1975.\n\nHe", ""),
    # a word that starts with "Let": their stop word, so a retrieval with what precedes it
    ("Follow up: Who wrote Lethal Weapon?\nIntermediate answer: Shane Black", ""),
    # a second follow-up before the marker: their cleaning keeps the first (:219)
    ("Follow up: Who directed Jaws?\nFollow up: Who is his father?\nLet's search", ""),
    # the final-answer marker after a subquery: the decomposition ends (:86)
    ("Follow up: Who directed Jaws?\nSo the final answer is: Steven Spielberg\n", ""),
    # the nudged form: "Follow up:" was written for the model (the authors' prefill, :126)
    (" Who directed Jaws?\nIntermediate answer: Steven Spielberg", "Follow up:"),
    (" Who directed Jaws? Let's search the question in Wikipedia.", "Follow up:"),
    # the model writes "Follow up:" again after the prefilled one: dropped once (:219)
    (" Follow up: Who directed Jaws?\nLet's search the question in Wikipedia.", "Follow up:"),
]


def replay(texts: dict[str, str], **settings: Any) -> Any:
    """Run the loop for one step on a model that writes ``texts[so_far]`` (cut at the stop
    strings the loop asks for, as any model is) and a one-word answer elsewhere."""
    from tests.deeprag.conftest import PASSAGES, ScriptedLM

    pytest.importorskip("bm25s")
    from rag_gates.retrieval.bm25 import BM25Retriever

    def reply(question: str, so_far: str) -> str:
        return texts.get(so_far, " x")

    return DeepRAG(ScriptedLM(reply), BM25Retriever.from_passages(PASSAGES), max_steps=1,
                   **settings).run("Who was the father of the director of Jaws?")


def cases() -> list[tuple[str, str, str]]:
    """(first text, nudged text, label): recorded rows, then the constructed ones."""
    rows = json.loads(STEP_TEXTS.read_text())["rows"]
    pairs: dict[str, dict[str, str]] = {}
    for row in rows:
        pairs.setdefault(f"{row['dataset']}:{row['id']}", {})[row["so_far"]] = row["text"]
    out = [(p[""], p["Follow up:"], key) for key, p in pairs.items()]
    for i, (text, so_far) in enumerate(CONSTRUCTED):
        out.append((text, "", f"constructed-{i}") if so_far == "" else
                   ("I think so.", text, f"constructed-{i}"))
    return out


def expected(first: str, nudged: str) -> tuple[str, str]:
    """Their step for the text our loop reads: the first text when it starts with a marker,
    else the nudged text (after "Follow up:", as their first step is prefilled)."""
    body = first.lstrip()
    return their_step(first if body.startswith(("Follow up:", "So the final answer is:"))
                      else nudged)


@pytest.mark.parametrize(("first", "nudged", "label"), cases())
def test_step_decision_is_the_authors_rule(first: str, nudged: str, label: str) -> None:
    """marker_rule="authors" retrieves exactly where their loop does, with their follow-up
    as the query, on what the model really wrote (and on the constructed cases)."""
    what, follow_up = expected(first, nudged)
    result = replay({"": first, "Follow up:": nudged}, marker_rule="authors")
    queries = [e.data["query"] for e in result.trace.events if e.kind == "retrieval"]
    if what == "retrieve":
        assert queries == [follow_up], label
    else:
        assert queries == [], label
        if what == "final":
            assert result.trajectory.steps == () and not result.trajectory.forced, label


def test_fail_closed_retrieves_where_the_authors_answer_without_a_marker() -> None:
    """The library default differs from the authors' rule exactly on a subquery the model
    follows with no marker at all: the default retrieves, theirs answers directly."""
    checked = 0
    for first, nudged, label in cases():
        what, _ = expected(first, nudged)
        read = first if first.lstrip().startswith("Follow up:") else f"Follow up:{nudged}"
        marker_free = their_generation(read) == read and what == "direct"
        if not marker_free or not their_follow_up(read):
            continue
        checked += 1
        assert replay({"": first, "Follow up:": nudged}).trace.retrievals == 1, label
        assert replay({"": first, "Follow up:": nudged},
                      marker_rule="authors").trace.retrievals == 0, label
    assert checked >= 2  # recorded and constructed (in the committed runs: 154 such steps)


def test_recorded_texts_reach_each_reading() -> None:
    """The recorded model texts are not all of one kind: the test above sees subqueries with
    no marker and with the direct marker."""
    kinds = {expected(first, nudged)[0] for first, nudged, label in cases()
             if not label.startswith("constructed")}
    assert "direct" in kinds
