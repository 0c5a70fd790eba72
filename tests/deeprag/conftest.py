"""Fixtures for the DeepRAG tests: a scripted model of a small world, and a real BM25
retriever over its passages.

The scripted model is a test double of the *model* (a dependency): its continuation is a
function of the question and the trajectory written so far, cut at the stop strings the way
any TextLM cuts them (``rag_gates.lm.stops.find_stop``). The loop, the gates, the search and
the exporters under test run for real.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from rag_gates.lm.base import BaseTextLM, Prompt, as_messages
from rag_gates.lm.stops import find_stop
from rag_gates.types import Generation, Passage

Reply = Callable[[str, str], str]


def split_prompt(prompt: Prompt) -> tuple[str, str]:
    """(question, trajectory so far) of a DeepRAG prompt, chat or completion style."""
    if isinstance(prompt, str):
        _, _, rest = prompt.rpartition("Question: ")
        question, _, so_far = rest.partition("\n")
        return question, so_far
    messages = as_messages(prompt)
    question = messages[0].content.rpartition("Question: ")[2]
    so_far = messages[1].content if len(messages) > 1 else ""
    return question, so_far


class ScriptedLM(BaseTextLM):
    """A model whose continuation is ``reply(question, so_far)``; records what it was asked."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.asked: list[tuple[str, str]] = []

    @property
    def model_id(self) -> str:
        return "scripted"

    def generate(self, prompt: Prompt, *, max_new_tokens: int = 128,
                 stop: Sequence[str] | None = None, temperature: float = 0.0,
                 logprobs: int | None = None) -> Generation:
        question, so_far = split_prompt(prompt)
        self.asked.append((question, so_far))
        text = self.reply(question, so_far)
        found = find_stop(text, list(stop or ()))
        finish: Any = "eos"
        if found is not None:
            text, finish = text[: found[0]], "stop"
        return Generation(text=text, finish_reason=finish,
                          completion_tokens=max(1, len(text.split())))


PASSAGES = [
    Passage(id="arnold", title="Arnold Spielberg",
            text="Arnold Meyer Spielberg was an American electrical engineer and the father "
                 "of the film director Steven Spielberg."),
    Passage(id="jaws", title="Jaws (film)",
            text="Jaws is a 1975 American thriller film directed by Steven Spielberg."),
    Passage(id="leah", title="Leah Adler",
            text="Leah Adler was a restaurateur and concert pianist in Los Angeles."),
    Passage(id="tower", title="Eiffel Tower",
            text="The Eiffel Tower is a wrought-iron lattice tower in Paris, France."),
]

QUESTION = "Who was the father of the director of Jaws?"


def last_subquery(so_far: str) -> str:
    lines = [ln for ln in so_far.split("\n") if ln.startswith("Follow up:")]
    return lines[-1][len("Follow up:"):].strip() if lines else ""


def last_answer(so_far: str) -> str:
    lines = [ln for ln in so_far.split("\n") if ln.startswith("Intermediate answer:")]
    return lines[-1][len("Intermediate answer:"):].strip() if lines else ""


def jaws_world(question: str, so_far: str) -> str:
    """Knows who directed Jaws; knows Spielberg's father only from a passage about him.
    Writes the whole next step, as a trained model would, past where the loop stops it."""
    if so_far.endswith("Intermediate answer:"):
        sub = last_subquery(so_far)
        if "directed" in sub:
            return " Steven Spielberg\nFollow up: ignored"
        block = so_far.rpartition("Follow up:")[2]
        return " Arnold Spielberg\n" if "Arnold Meyer Spielberg" in block else " Leah Adler\n"
    if so_far.endswith("So the final answer is:"):
        return f" {last_answer(so_far)}\nQuestion: another"
    done = so_far.count("Follow up:")
    if done == 0:
        return ("Follow up: Who directed Jaws?\nIntermediate answer: Steven Spielberg\n"
                "Follow up: Who was the father of Steven Spielberg?\n")
    if done == 1:
        return ("Follow up: Who was the father of Steven Spielberg?\n"
                "Let's search the question in Wikipedia.\nContext:\n[1] made up\n")
    return f"So the final answer is: {last_answer(so_far)}\n\nQuestion: more"


@pytest.fixture(scope="session")
def bm25() -> Any:
    pytest.importorskip("bm25s")
    from rag_gates.retrieval.bm25 import BM25Retriever

    return BM25Retriever.from_passages(PASSAGES)


@pytest.fixture(scope="session")
def tiny_long() -> Any:
    """The tiny random-weight model with room for DeepRAG's instruction and passages."""
    from rag_gates.testing import tiny_lm

    return tiny_lm(seed=0, max_context=2048)
