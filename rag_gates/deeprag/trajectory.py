"""DeepRAG's trajectory: typed steps that render to, and parse from, the card's text format.

The format (plain-text markers, no special tokens; one marker per line)::

    Question: Who was the father of the director of Jaws?
    Follow up: Who directed Jaws?
    Intermediate answer: Steven Spielberg
    Follow up: Who was the father of Steven Spielberg?
    Let's search the question in Wikipedia.
    Context:
    [1] Arnold Spielberg: Arnold Meyer Spielberg was an American electrical engineer ...
    Intermediate answer: Arnold Spielberg
    So the final answer is: Arnold Spielberg

A retrieval that found nothing is written ``Context: (nothing found)``. Text inside a line
(subqueries, answers, passages) is kept on one line (whitespace runs become one space), so
the markers stay at line starts. Passages are written ``[i] Title: text``; parsing keeps that
whole string as the passage text (the text format does not carry titles, ids or scores
apart), so ``Trajectory.parse(t.render()).render() == t.render()``.

:class:`DeepRAGPrompt` turns a question and the steps so far into a model prompt: ``chat``
(the instruction and question as the user turn, the steps as an assistant message the model
continues: assistant prefill) or ``completion`` (one plain text to continue).

Example:
    >>> t = Trajectory.parse("Question: Who wrote Hamlet?\\n"
    ...                      "Follow up: Who wrote Hamlet?\\n"
    ...                      "Intermediate answer: Shakespeare\\n"
    ...                      "So the final answer is: Shakespeare")
    >>> t.retrievals, t.steps[0].decision.retrieve, t.final_answer
    (0, False, 'Shakespeare')
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

from rag_gates.answers import normalize_answer
from rag_gates.deeprag.markers import (
    CONTEXT,
    FINAL,
    FOLLOW_UP,
    INTERMEDIATE,
    NOTHING_FOUND,
    QUESTION,
    RETRIEVE,
)
from rag_gates.lm.base import Prompt
from rag_gates.lm.stops import find_stop
from rag_gates.types import ChatMessage, GateDecision, Passage

__all__ = [
    "AUTHORS_STOP_WORDS",
    "CONTEXT",
    "DEMONSTRATION",
    "FINAL",
    "FOLLOW_UP",
    "INSTRUCTION",
    "INTERMEDIATE",
    "NOTHING_FOUND",
    "QUESTION",
    "RETRIEVE",
    "DeepRAGPrompt",
    "MalformedStep",
    "Step",
    "StepText",
    "Trajectory",
    "one_line",
    "read_step",
    "read_step_authors",
    "render_steps",
    "retrieval_block",
    "same_subquery",
    "step_problem",
]

# What a model writes to retrieve: the paper's own text says "on Wikipedia" in places, and
# the authors' inference loop reads a follow-up that stops at "Let" as a retrieval.
_RETRIEVE_CUE = "Let's search"
#: Where the authors' follow-up call stops, besides the chat end tokens (gxy-gxy/DeepRAG,
#: src/algorithms/sragsftv2.py:137); their vLLM call keeps the stop word in the text
#: (src/algorithms/basic.py:123), and the first one written decides the step (:86, :94).
AUTHORS_STOP_WORDS = (INTERMEDIATE, "So the final", "Let")

INSTRUCTION = (
    "You are a helpful Retrieve-Augmented Generation (RAG) model. Your task is to answer "
    "questions by logically decomposing them into clear sub-questions and iteratively "
    'addressing each one. Use "Follow up:" to introduce each sub-question and "Intermediate '
    'answer:" to provide answers. For each sub-question, decide whether you can provide a '
    "direct answer or if additional information is required. If additional information is "
    "needed, state, \"Let's search the question in Wikipedia.\" and then use the retrieved "
    "information to respond comprehensively. If a direct answer is possible, provide it "
    "immediately without searching."
)
"""The paper's instruction (appendix A.1), verbatim."""

DEMONSTRATION = (
    "Example:\n"
    "Question: Who was the father of the director of the film Jaws?\n"
    "Follow up: Who directed the film Jaws?\n"
    "Intermediate answer: Steven Spielberg\n"
    "Follow up: Who was the father of Steven Spielberg?\n"
    f"{RETRIEVE}\n"
    f"{CONTEXT}\n"
    "[1] Arnold Spielberg: Arnold Meyer Spielberg was an American electrical engineer, the "
    "father of the film director Steven Spielberg.\n"
    "Intermediate answer: Arnold Spielberg\n"
    "So the final answer is: Arnold Spielberg"
)
"""A one-shot example of the format, for models not trained on it (small untrained models
rarely write the markers from the instruction alone). Not part of the paper's prompt."""

_SPACE = re.compile(r"\s+")


def one_line(text: str) -> str:
    """``text`` with every whitespace run (newlines included) made one space, stripped."""
    return _SPACE.sub(" ", text).strip()


def same_subquery(a: str, b: str) -> bool:
    """Whether two subqueries ask the same thing (equal after SQuAD normalisation)."""
    return normalize_answer(a) == normalize_answer(b)


class MalformedStep(BaseModel):
    """A step the loop could not read, and what it did instead.

    ``kind``: ``no_marker`` (the text starts with neither ``Follow up:`` nor ``So the final
    answer is:``; asked again with ``Follow up:`` written for the model when the loop nudges,
    ``action="nudged"``), ``empty_subquery``, ``repeated_subquery`` (asked before: a loop),
    ``empty_final`` (the final-answer marker with no answer after it) --
    each ends the decomposition with a forced final answer -- or ``no_decision`` (generate
    mode: a subquery followed by neither decision marker), which retrieves (the fail-closed
    rule, ``action="retrieved"``) or, under the authors' rule (``marker_rule="authors"``), is
    answered without retrieval (``action="answered"``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["no_marker", "empty_subquery", "repeated_subquery", "empty_final",
                  "no_decision"]
    step: int = Field(..., ge=0, description="Index of the step it happened at.")
    text: str = Field(..., description="What the model wrote.")
    action: Literal["forced_final", "retrieved", "nudged", "answered"]


class Step(BaseModel):
    """One subquery: the decision on it, the passages retrieved (None when answered from
    the model's own knowledge; empty when retrieval found nothing) and the intermediate
    answer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    subquery: str = Field(..., min_length=1)
    decision: GateDecision
    passages: tuple[Passage, ...] | None = Field(
        None, description="Retrieved with the subquery; None for a direct answer.")
    answer: str = Field("", description="The intermediate answer (one line).")

    @model_validator(mode="after")
    def _consistent(self) -> Step:
        if self.decision.retrieve != (self.passages is not None):
            raise ValueError("a step retrieves (passages is a list, possibly empty) exactly "
                             "when its decision says retrieve")
        return self

    @property
    def retrieved(self) -> bool:
        return self.passages is not None

    def render(self) -> str:
        """The step's lines, each ending with a newline."""
        lines = [f"{FOLLOW_UP} {one_line(self.subquery)}"]
        if self.passages is not None:
            lines.append(RETRIEVE)
            lines.extend(_context_lines(self.passages))
        lines.append(f"{INTERMEDIATE} {one_line(self.answer)}".rstrip())
        return "\n".join(lines) + "\n"


def _passage_line(p: Passage) -> str:
    return one_line(f"{p.title}: {p.text}" if p.title else p.text)


def _context_lines(passages: Sequence[Passage]) -> list[str]:
    if not passages:
        return [f"{CONTEXT} {NOTHING_FOUND}"]
    return [CONTEXT, *(f"[{i}] {_passage_line(p)}" for i, p in enumerate(passages, start=1))]


def render_steps(steps: Sequence[Step]) -> str:
    """The steps' lines (what follows the question line), each ending with a newline."""
    return "".join(s.render() for s in steps)


def retrieval_block(passages: Sequence[Passage]) -> str:
    """The lines that follow a subquery whose decision is to retrieve, up to (not
    including) the intermediate answer."""
    return "\n".join([RETRIEVE, *_context_lines(passages)]) + "\n"


class Trajectory(BaseModel):
    """A whole DeepRAG run on one question: steps, final answer, and how it ended.

    ``stop_reason``: ``answered`` (the model wrote the final-answer marker), ``step_cap``
    (``max_steps`` subqueries: the final answer was forced) or ``malformed`` (a step could not
    be read: forced, see :class:`MalformedStep`). ``forced`` is True for the last two.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    question: str = Field(..., min_length=1)
    steps: tuple[Step, ...] = ()
    final_answer: str = ""
    stop_reason: Literal["answered", "step_cap", "malformed"] = "answered"
    malformed: tuple[MalformedStep, ...] = ()

    @property
    def forced(self) -> bool:
        """True when the loop, not the model, ended the decomposition."""
        return self.stop_reason != "answered"

    @property
    def retrievals(self) -> int:
        return sum(1 for s in self.steps if s.retrieved)

    @property
    def decisions(self) -> list[GateDecision]:
        return [s.decision for s in self.steps]

    @property
    def passages(self) -> list[Passage]:
        """Every retrieved passage, first occurrence kept, in order."""
        seen: dict[tuple[str | None, str], Passage] = {}
        for s in self.steps:
            for p in s.passages or ():
                seen.setdefault((p.id, p.text), p)
        return list(seen.values())

    def render(self) -> str:
        """The whole trajectory in the card's text format (no trailing newline)."""
        final = f"{FINAL} {one_line(self.final_answer)}".rstrip()
        return f"{QUESTION} {one_line(self.question)}\n{render_steps(self.steps)}{final}"

    def summary(self) -> dict[str, JsonValue]:
        """Counts for logs and benchmark rows."""
        return {"steps": len(self.steps), "retrievals": self.retrievals,
                "stop_reason": self.stop_reason, "malformed": len(self.malformed),
                "malformed_kinds": [m.kind for m in self.malformed]}

    @classmethod
    def parse(cls, text: str) -> Trajectory:
        """Read a trajectory written in the card's format; ValueError names the line that
        breaks it. Decisions come from the markers (gate ``deeprag-text``)."""
        from rag_gates.deeprag.gates import MarkerGate

        gate = MarkerGate(name="deeprag-text")
        lines = text.strip("\n").split("\n")
        pos = 0

        def expect(prefix: str, what: str) -> str:
            nonlocal pos
            if pos >= len(lines) or not lines[pos].startswith(prefix):
                found = repr(lines[pos]) if pos < len(lines) else "the end of the text"
                raise ValueError(f"trajectory line {pos + 1}: expected {what} "
                                 f"({prefix!r}), found {found}")
            pos += 1
            return lines[pos - 1][len(prefix):].strip()

        question = expect(QUESTION, "the question")
        steps: list[Step] = []
        while pos < len(lines) and lines[pos].startswith(FOLLOW_UP):
            subquery = expect(FOLLOW_UP, "a subquery")
            passages: tuple[Passage, ...] | None = None
            if pos < len(lines) and lines[pos].startswith(_RETRIEVE_CUE):
                pos += 1
                if expect(CONTEXT, "the retrieved context") == NOTHING_FOUND:
                    passages = ()
                else:
                    found: list[Passage] = []
                    while pos < len(lines) and lines[pos].startswith(f"[{len(found) + 1}] "):
                        found.append(Passage(text=lines[pos].split("] ", 1)[1]))
                        pos += 1
                    passages = tuple(found)
            answer = expect(INTERMEDIATE, "the intermediate answer")
            written = "retrieve" if passages is not None else "direct"
            steps.append(Step(subquery=subquery, decision=gate.decide(subquery, written=written),
                              passages=passages, answer=answer))
        final = expect(FINAL, "a subquery or the final answer")
        if pos < len(lines):
            raise ValueError(f"trajectory line {pos + 1}: text after the final answer: "
                             f"{lines[pos]!r}")
        return cls(question=question, steps=tuple(steps), final_answer=final)


class StepText(BaseModel):
    """What the model wrote at the start of a step, read by :func:`read_step`.

    ``kind`` is ``subquery`` (``Follow up: ...``, possibly followed by a decision marker and,
    for a direct answer, the answer), ``final`` (``So the final answer is: ...``) or ``none``
    (neither marker at the start).
    """

    model_config = ConfigDict(frozen=True)

    kind: Literal["subquery", "final", "none"]
    subquery: str = ""
    decision: Literal["retrieve", "direct"] | None = None
    answer: str | None = Field(None, description="A direct answer written in the same text.")
    final: str | None = None


def _first_line(text: str) -> str:
    return text.split("\n", 1)[0].strip()


def _follow_up(text: str) -> StepText | str:
    """A step's text after "Follow up:", or the step itself when it is a final answer or no
    step at all (both readers begin alike)."""
    body = text.lstrip()
    if body.startswith(FINAL):
        return StepText(kind="final", final=_first_line(body[len(FINAL):]))
    if not body.startswith(FOLLOW_UP):
        return StepText(kind="none")
    return body[len(FOLLOW_UP):]


def read_step(text: str) -> StepText:
    """Read the model's text at the start of a step (see :class:`StepText`).

    The subquery ends at the end of its line or at a marker written on the same line, so
    ``Follow up: X Intermediate answer: Y`` reads as subquery X answered directly with Y.

    Example:
        >>> st = read_step("Follow up: Who directed Jaws?\\nLet's search the question in ...")
        >>> st.kind, st.subquery, st.decision
        ('subquery', 'Who directed Jaws?', 'retrieve')
    """
    rest = _follow_up(text)
    if isinstance(rest, StepText):
        return rest
    ends = [i for i in (rest.find(m) for m in ("\n", _RETRIEVE_CUE, INTERMEDIATE, FINAL, CONTEXT))
            if i >= 0]
    cut = min(ends, default=len(rest))
    subquery = one_line(rest[:cut])
    after = rest[cut:].lstrip()
    if after.startswith(_RETRIEVE_CUE):
        return StepText(kind="subquery", subquery=subquery, decision="retrieve")
    if after.startswith(INTERMEDIATE):
        return StepText(kind="subquery", subquery=subquery, decision="direct",
                        answer=_first_line(after[len(INTERMEDIATE):]))
    return StepText(kind="subquery", subquery=subquery)


def read_step_authors(text: str) -> StepText:
    """Read the model's text at the start of a step as the authors' inference loop does
    (gxy-gxy/DeepRAG, ``src/algorithms/sragsftv2.py``), the reading of
    ``DeepRAGConfig(marker_rule="authors")``.

    Their follow-up call stops at the first of :data:`AUTHORS_STOP_WORDS` to be written
    (``:137``; ``find_stop``'s complete-first rule, as a stop-string decoder) and keeps it in
    the text; their cleaning keeps what precedes a second ``Follow up:`` (``:219``). The step
    then retrieves only when that follow-up ends with ``Let`` (``:94``; any word that starts
    with "Let" counts, as there), ends the decomposition at ``So the final`` (``:86``), and
    anything else -- ``Intermediate answer:``, no marker at all, the end of the text -- is
    answered without retrieval by a separate call (``:105-107``; ``answer`` is None). The
    subquery may span lines there; here its whitespace runs become one space.

    As in :func:`read_step`, the text must start with ``Follow up:`` or the final-answer
    marker (the authors prefill ``Follow up:`` at the first step, ``:126``; the loop's nudge
    stands in for it, docs/fidelity.md row D5). ``final`` is None when the final-answer
    marker is not written out whole: the loop then asks for the final answer, as the
    authors' ``_gen_final_answer`` does.

    Example:
        >>> read_step_authors("Follow up: Who directed Jaws?\\nLet's search ...").decision
        'retrieve'
        >>> st = read_step_authors("Follow up: Who directed Jaws?\\n\\nSteven Spielberg")
        >>> st.subquery, st.decision
        ('Who directed Jaws? Steven Spielberg', None)
    """
    rest = _follow_up(text)
    if isinstance(rest, StepText):
        return rest
    found = find_stop(rest, AUTHORS_STOP_WORDS)
    head = rest if found is None else rest[:found[0]]
    word = None if found is None else rest[found[0]:found[1]]
    if FOLLOW_UP in head:  # their cleaning drops the second follow-up and the stop word
        return StepText(kind="subquery", subquery=one_line(head.split(FOLLOW_UP)[0]))
    if word == "Let":
        return StepText(kind="subquery", subquery=one_line(head), decision="retrieve")
    if word == INTERMEDIATE:
        return StepText(kind="subquery", subquery=one_line(head), decision="direct")
    if found is not None:  # "So the final"
        after = rest[found[0]:]
        final = _first_line(after[len(FINAL):]) if after.startswith(FINAL) else ""
        return StepText(kind="final", final=final or None)
    return StepText(kind="subquery", subquery=one_line(head))


Problem = Literal["no_marker", "empty_subquery", "repeated_subquery", "empty_final"]


def step_problem(st: StepText, steps: Sequence[Step]) -> Problem | None:
    """Why a step cannot be taken as written (see :class:`MalformedStep`), or None."""
    if st.kind == "none":
        return "no_marker"
    if st.kind == "final":
        return None if st.final else "empty_final"
    if not st.subquery:
        return "empty_subquery"
    if any(same_subquery(st.subquery, s.subquery) for s in steps):
        return "repeated_subquery"
    return None


class DeepRAGPrompt(BaseModel):
    """How a question and the steps so far become a model prompt.

    ``chat``: a user turn (instruction, optional demonstration, ``Question: ...``) and the
    steps so far as an assistant message the model continues (assistant prefill;
    ``HFWhiteBoxLM`` continues a final assistant message, API models vary). ``completion``:
    the same text as one plain string, for models that continue text (base models,
    ``HFWhiteBoxLM(chat_template=False)``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    style: Literal["chat", "completion"] = "chat"
    instruction: str = Field(INSTRUCTION, min_length=1)
    demonstration: str | None = Field(
        None, description="An example trajectory shown before the question (DEMONSTRATION "
                          "for untrained small models); None for the paper's prompt.")

    def user_text(self, question: str) -> str:
        """The instruction, the demonstration and the question line."""
        parts = [self.instruction]
        if self.demonstration:
            parts.append(self.demonstration)
        parts.append(f"{QUESTION} {one_line(question)}")
        return "\n\n".join(parts)

    def build(self, question: str, so_far: str) -> Prompt:
        """The prompt that asks the model to continue ``so_far`` (the steps' text)."""
        if self.style == "completion":
            return f"{self.user_text(question)}\n{so_far}"
        messages = [ChatMessage(role="user", content=self.user_text(question))]
        if so_far:
            messages.append(ChatMessage(role="assistant", content=so_far))
        return messages
