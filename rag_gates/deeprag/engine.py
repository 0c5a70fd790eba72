"""The moves DeepRAG makes, written once for the sync and the async loop.

A DeepRAG procedure (the agent loop, the trajectory search) is a generator that *yields
requests* -- :class:`Call` (a model call), :class:`Search` (a retrieval), :class:`Ask` (a gate
decision) -- and receives their results. :class:`Executor` carries the requests out, with a
blocking model and retriever (:meth:`Executor.run`) or their async forms
(:meth:`Executor.arun`), and records each one in a :class:`~rag_gates.types.TraceRecorder`. So
the logic exists once, and both forms leave the same trace.

The step moves (:func:`next_step`, :func:`direct_answer`, :func:`retrieved_answer`,
:func:`final_answer`) are small generators the procedures compose with ``yield from``.

Example:
    >>> def two_calls():
    ...     a = yield Call("Who wrote Hamlet?", ("\\n",), 8, "first")
    ...     b = yield Call("Who wrote Macbeth?", ("\\n",), 8, "second")
    ...     return a.text, b.text
    >>> Executor(lm, retriever, TraceRecorder()).run(two_calls())    # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeAlias, TypeVar

from rag_gates.deeprag.trajectory import (
    CONTEXT,
    FINAL,
    FOLLOW_UP,
    INTERMEDIATE,
    QUESTION,
    DeepRAGPrompt,
    StepText,
    one_line,
    read_step,
    read_step_authors,
    retrieval_block,
)
from rag_gates.gate import Gate
from rag_gates.lm.base import Prompt, TextLM
from rag_gates.retrieval.base import Retriever
from rag_gates.retrieval.recorded import retrieve_recorded
from rag_gates.types import GateDecision, Generation, Passage, TraceRecorder

__all__ = [
    "ANSWER_STOPS",
    "AUTHORS_GENERATE_STOPS",
    "GENERATE_STOPS",
    "SUBQUERY_STOPS",
    "Ask",
    "Call",
    "Driving",
    "Emit",
    "Executor",
    "Program",
    "Request",
    "Search",
    "direct_answer",
    "final_answer",
    "next_step",
    "retrieved_answer",
]

T = TypeVar("T")

# Generate mode: one call writes the subquery, the decision marker and a direct answer; it
# stops where the loop must act (retrieve) or where the next step would begin.
GENERATE_STOPS = (CONTEXT, f"\n{FOLLOW_UP}", f"\n{FINAL}", f"\n{QUESTION}", "\n\n")
# Generate mode under the authors' rule (marker_rule="authors"): their follow-up call runs on
# through blank lines and stops at "Intermediate answer:", "So the final" or "Let", keeping
# the stop word (gxy-gxy/DeepRAG src/algorithms/sragsftv2.py:137, basic.py:123). A stop
# string is cut from our text, so with several of them which one matched would be lost: the
# call stops at "Intermediate answer:" only (put back in the text for the reading), and
# read_step_authors finds "Let" and "So the final" in the text. Greedy decoding writes the
# same text up to their stop either way; ours may run on past it, never to another reading.
AUTHORS_GENERATE_STOPS = (INTERMEDIATE,)
# Other modes: the subquery line only; the decision is not the model's text.
SUBQUERY_STOPS = ("\n", "Let's search", INTERMEDIATE, CONTEXT)
# An intermediate or final answer: one line.
ANSWER_STOPS = ("\n", FOLLOW_UP, FINAL, CONTEXT, QUESTION)


@dataclass(frozen=True)
class Call:
    """Generate from ``prompt`` (greedy) until a stop string or ``max_new_tokens``."""

    prompt: Prompt
    stop: tuple[str, ...]
    max_new_tokens: int
    name: str


@dataclass(frozen=True)
class Search:
    """Retrieve ``k`` passages for ``query``."""

    query: str
    k: int


@dataclass(frozen=True)
class Ask:
    """Ask ``gate`` whether to retrieve for ``query``."""

    gate: Gate
    query: str
    signals: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Emit:
    """Hand ``item`` (a finished step) to whoever streams the run; the reply is None."""

    item: Any


Request: TypeAlias = Call | Search | Ask | Emit
Program: TypeAlias = Generator[Request, Any, T]


class Driving(Generic[T]):
    """Steps a program: :meth:`send` gives its next request, or None once it has returned
    (then :attr:`result` holds what it returned)."""

    def __init__(self, program: Program[T]) -> None:
        self.program = program
        self.result: T

    def send(self, reply: Any) -> Request | None:
        try:
            return self.program.send(reply)
        except StopIteration as done:
            self.result = done.value
            return None


class Executor:
    """Carries out a program's requests with ``lm``, ``retriever`` and the gates it names,
    recording every model call, retrieval and decision in ``rec``."""

    def __init__(self, lm: TextLM, retriever: Retriever | None, rec: TraceRecorder) -> None:
        self.lm = lm
        self.retriever = retriever
        self.rec = rec

    def _need_retriever(self) -> Retriever:
        if self.retriever is None:
            raise ValueError("this DeepRAG run decided to retrieve but has no retriever; "
                             "pass one, or use mode='never'")
        return self.retriever

    def run(self, program: Program[T]) -> T:
        """Drive ``program`` with blocking calls; return its result."""
        driving = Driving(program)
        for _ in self.iterate(driving):
            pass
        return driving.result

    async def arun(self, program: Program[T]) -> T:
        """Drive ``program`` with the model's, retriever's and gates' async forms."""
        driving = Driving(program)
        async for _ in self.aiterate(driving):
            pass
        return driving.result

    def iterate(self, driving: Driving[T]) -> Iterator[Any]:
        """Drive a program with blocking calls, yielding what it emits; its result is then
        ``driving.result``."""
        reply: Any = None
        while (request := driving.send(reply)) is not None:
            if isinstance(request, Emit):
                reply = yield request.item
            elif isinstance(request, Call):
                with self.rec.timed("llm_call", request.name) as data:
                    reply = self._note(data, self.lm.generate(
                        request.prompt, max_new_tokens=request.max_new_tokens,
                        stop=list(request.stop)))
            elif isinstance(request, Search):
                reply = retrieve_recorded(self.rec, self._need_retriever(), request.query,
                                          request.k)
            else:
                reply = self._decided(request.gate.decide(request.query, **request.signals))

    async def aiterate(self, driving: Driving[T]) -> AsyncIterator[Any]:
        """:meth:`iterate` with the model's, retriever's and gates' async forms."""
        reply: Any = None
        while (request := driving.send(reply)) is not None:
            if isinstance(request, Emit):
                yield request.item
                reply = None
            elif isinstance(request, Call):
                with self.rec.timed("llm_call", request.name) as data:
                    reply = self._note(data, await self.lm.agenerate(
                        request.prompt, max_new_tokens=request.max_new_tokens,
                        stop=list(request.stop)))
            elif isinstance(request, Search):
                retriever = self._need_retriever()
                with self.rec.timed("retrieval", retriever.name) as data:
                    found: list[Passage] = await retriever.aretrieve(request.query, request.k)
                    data["query"] = request.query
                    data["ids"] = [p.id for p in found]
                reply = found
            else:
                reply = self._decided(
                    await request.gate.adecide(request.query, **request.signals))

    @staticmethod
    def _note(data: dict[str, Any], g: Generation) -> Generation:
        data["tokens"] = g.completion_tokens
        data["finish_reason"] = g.finish_reason
        return g

    def _decided(self, decision: GateDecision) -> GateDecision:
        self.rec.add_decision(decision)
        return decision


# ---------------------------------------------------------------- the step moves
def next_step(fmt: DeepRAGPrompt, question: str, so_far: str, *, generate: bool,
              max_new_tokens: int, nudge: bool, authors: bool = False
              ) -> Program[tuple[StepText, str, bool]]:
    """The model's next step after ``so_far``: read, the raw text, and whether it was
    nudged. ``generate``: the model also writes the decision marker (and a direct answer) in
    the same call. ``authors`` (generate mode): the authors' stops and reading
    (:data:`AUTHORS_GENERATE_STOPS`, :func:`~rag_gates.deeprag.trajectory.read_step_authors`).
    ``nudge``: a text with no marker is asked again once with ``Follow up:`` written for
    the model, which then writes a subquery."""
    if authors and not generate:
        raise ValueError("the authors' step reading is generate mode's (the model writes the "
                         "decision marker); use generate=True")
    stops = AUTHORS_GENERATE_STOPS if authors else GENERATE_STOPS if generate else SUBQUERY_STOPS
    read = read_step_authors if authors else read_step

    def written(g: Generation) -> str:
        # The authors' call keeps its stop word; ours has only the one (see above).
        return g.text + INTERMEDIATE if authors and g.finish_reason == "stop" else g.text

    g: Generation = yield Call(fmt.build(question, so_far), stops, max_new_tokens, "step")
    st = read(written(g))
    if st.kind != "none" or not nudge:
        return st, g.text, False
    again: Generation = yield Call(fmt.build(question, f"{so_far}{FOLLOW_UP}"), stops,
                                   max_new_tokens, "step-nudged")
    text = written(again)
    if authors and text.lstrip().startswith(FOLLOW_UP):
        # After their prefilled "Follow up:" a second one is dropped once (their cleaning,
        # sragsftv2.py:219), not read as a new follow-up.
        text = text.lstrip()[len(FOLLOW_UP):]
    return read(f"{FOLLOW_UP}{text}"), g.text, True


def subquery_line(subquery: str) -> str:
    return f"{FOLLOW_UP} {one_line(subquery)}\n"


def direct_answer(fmt: DeepRAGPrompt, question: str, so_far: str, subquery: str,
                  max_new_tokens: int) -> Program[str]:
    """The model's answer to ``subquery`` from its own knowledge."""
    prompt = fmt.build(question, f"{so_far}{subquery_line(subquery)}{INTERMEDIATE}")
    g: Generation = yield Call(prompt, ANSWER_STOPS, max_new_tokens, "answer-direct")
    return one_line(g.text)


def retrieved_answer(fmt: DeepRAGPrompt, question: str, so_far: str, subquery: str, k: int,
                     max_new_tokens: int) -> Program[tuple[tuple[Passage, ...], str]]:
    """Retrieve with ``subquery`` and the model's answer from those passages."""
    found: list[Passage] = yield Search(subquery, k)
    passages = tuple(found)
    text = f"{so_far}{subquery_line(subquery)}{retrieval_block(passages)}{INTERMEDIATE}"
    g: Generation = yield Call(fmt.build(question, text), ANSWER_STOPS, max_new_tokens,
                               "answer-retrieved")
    return passages, one_line(g.text)


def final_answer(fmt: DeepRAGPrompt, question: str, so_far: str, max_new_tokens: int, *,
                 forced: bool) -> Program[str]:
    """The final answer after ``so_far`` (``forced``: the loop, not the model, ended it)."""
    g: Generation = yield Call(fmt.build(question, f"{so_far}{FINAL}"), ANSWER_STOPS,
                               max_new_tokens, "final-forced" if forced else "final")
    return one_line(g.text)
