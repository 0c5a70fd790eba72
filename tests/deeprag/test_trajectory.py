"""The typed trajectory renders to the card's text format and reads back from it."""

from __future__ import annotations

import pytest

from rag_gates.deeprag import DEMONSTRATION, DeepRAGPrompt, Step, Trajectory
from rag_gates.deeprag.gates import MarkerGate
from rag_gates.deeprag.trajectory import read_step
from rag_gates.types import ChatMessage, Passage

CARD_TEXT = """Question: Who was the father of the director of Jaws?
Follow up: Who directed Jaws?
Intermediate answer: Steven Spielberg
Follow up: Who was the father of Steven Spielberg?
Let's search the question in Wikipedia.
Context:
[1] Arnold Spielberg: Arnold Meyer Spielberg was an American electrical engineer.
[2] Jaws (film): Jaws is a 1975 film.
Intermediate answer: Arnold Spielberg
Follow up: Where was he born?
Let's search the question in Wikipedia.
Context: (nothing found)
Intermediate answer:
So the final answer is: Arnold Spielberg"""


def step(subquery: str, answer: str, passages: list[Passage] | None = None) -> Step:
    written = "direct" if passages is None else "retrieve"
    return Step(subquery=subquery, decision=MarkerGate().decide(subquery, written=written),
                passages=None if passages is None else tuple(passages), answer=answer)


def test_card_text_round_trips() -> None:
    t = Trajectory.parse(CARD_TEXT)
    assert t.render() == CARD_TEXT
    assert [s.subquery for s in t.steps] == ["Who directed Jaws?",
                                             "Who was the father of Steven Spielberg?",
                                             "Where was he born?"]
    assert [s.decision.retrieve for s in t.steps] == [False, True, True]
    assert t.retrievals == 2 and t.steps[2].passages == () and t.steps[2].answer == ""
    assert t.steps[1].passages is not None
    assert t.steps[1].passages[0].text.startswith("Arnold Spielberg: Arnold Meyer")
    assert t.final_answer == "Arnold Spielberg" and t.stop_reason == "answered"


def test_typed_trajectory_renders_on_single_lines_and_reads_back() -> None:
    passages = [Passage(id="a", title="Arnold Spielberg", text="An engineer.\nBorn 1917.",
                        score=3.2),
                Passage(text="  Untitled   passage  ")]
    t = Trajectory(question="Who was the\nfather?",
                   steps=(step("Who directed\nJaws?", "Steven Spielberg"),
                          step("Father of Spielberg?", "Arnold", passages)),
                   final_answer="Arnold Spielberg")
    text = t.render()
    assert "Who directed Jaws?" in text and "[1] Arnold Spielberg: An engineer. Born 1917." \
        in text and "[2] Untitled passage\n" in text
    back = Trajectory.parse(text)
    assert back.render() == text
    assert back.retrievals == t.retrievals == 1
    assert [s.answer for s in back.steps] == ["Steven Spielberg", "Arnold"]
    # Titles, ids and scores are not in the text format: the passage line is the text.
    assert back.steps[1].passages == (Passage(text="Arnold Spielberg: An engineer. Born 1917."),
                                      Passage(text="Untitled passage"))


@pytest.mark.parametrize(("text", "line"), [
    ("Follow up: x\nSo the final answer is: y", 1),
    ("Question: q\nFollow up: x\nSo the final answer is: y", 3),
    ("Question: q\nFollow up: x\nLet's search the question in Wikipedia.\nIntermediate "
     "answer: a\nSo the final answer is: y", 4),
    ("Question: q\nSo the final answer is: y\nFollow up: late", 3),
])
def test_broken_text_names_the_line(text: str, line: int) -> None:
    with pytest.raises(ValueError, match=f"line {line}:"):
        Trajectory.parse(text)


def test_step_decision_must_match_passages() -> None:
    decision = MarkerGate().decide("q", written="retrieve")
    with pytest.raises(ValueError, match="retrieves"):
        Step(subquery="q", decision=decision, passages=None, answer="a")


@pytest.mark.parametrize(("text", "kind", "subquery", "decision", "answer"), [
    ("Follow up: Who directed Jaws?\nLet's search the question in Wikipedia.\nContext:",
     "subquery", "Who directed Jaws?", "retrieve", None),
    ("  Follow up: Who directed Jaws? Intermediate answer: Spielberg\nFollow up: more",
     "subquery", "Who directed Jaws?", "direct", "Spielberg"),
    ("Follow up: Who directed Jaws?\n", "subquery", "Who directed Jaws?", None, None),
    ("Follow up:\nIntermediate answer: x", "subquery", "", "direct", "x"),
    ("Jaws was directed by Spielberg.", "none", "", None, None),
])
def test_read_step(text: str, kind: str, subquery: str, decision: str | None,
                   answer: str | None) -> None:
    st = read_step(text)
    assert (st.kind, st.subquery, st.decision, st.answer) == (kind, subquery, decision, answer)


def test_read_final() -> None:
    st = read_step("So the final answer is: Paris\nQuestion: next")
    assert st.kind == "final" and st.final == "Paris"


def test_prompt_styles() -> None:
    chat = DeepRAGPrompt(demonstration=DEMONSTRATION)
    first = chat.build("Who?", "")
    assert isinstance(first, list) and len(first) == 1
    assert isinstance(first[0], ChatMessage)
    assert first[0].content.endswith("Example:\n" + DEMONSTRATION[len("Example:\n"):]
                                     + "\n\nQuestion: Who?")
    later = chat.build("Who?", "Follow up: x\n")
    assert isinstance(later, list) and later[1] == ChatMessage(role="assistant",
                                                               content="Follow up: x\n")
    plain = DeepRAGPrompt(style="completion").build("Who?", "Follow up: x\n")
    assert isinstance(plain, str) and plain.endswith("\n\nQuestion: Who?\nFollow up: x\n")
