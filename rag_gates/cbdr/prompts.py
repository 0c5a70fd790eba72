"""The prompts a CBDR probe reads the model's hidden state after.

A probe is only valid for the prompt it was trained on, so the prompt style is part of the
probe's saved configuration. Two styles:

- ``paper``: the CBDR paper's QA and RAG prompts (the spec card's default).
- ``rag-gates``: the short prompts of ``rag-gates bench`` (:func:`rag_gates.prompts.qa_prompt`),
  so that a probe-gated answer is the very answer the ``no-rag`` baseline gives, and the
  retrieve path the ``single`` baseline's prompt (the shipped probe uses this style).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rag_gates.prompts import format_passages, qa_prompt
from rag_gates.types import Passage

__all__ = ["PAPER_QA", "PAPER_RAG", "ProbePrompts"]

PAPER_QA = ("You need to read the question carefully and answer it based on your own "
            "knowledge.\nQuestion: {question}")
PAPER_RAG = ("You are a rigorous language model. Please answer the question based on the "
             "provided context. If the context does not support reasoning about the answer, "
             "please answer the question based on your own knowledge.\nContexts:\n{contexts}\n"
             "Question: {question}")


class ProbePrompts(BaseModel):
    """Which prompts the probe reads: the question alone (QA) and with passages (RAG)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    style: Literal["paper", "rag-gates"] = Field(
        "paper", description="'paper' (the CBDR paper's prompts) or 'rag-gates' (the bench's).")
    dataset: str | None = Field(
        None, description="rag-gates style only: dataset whose instruction to use (pubmedqa).")

    def qa(self, question: str) -> str:
        """The question-only prompt: ``Conf(q)`` is read after it."""
        if self.style == "paper":
            return PAPER_QA.format(question=question)
        return qa_prompt(question, dataset=self.dataset)

    def rag(self, question: str, passages: Sequence[Passage]) -> str:
        """The prompt with passages: ``Conf(q + c)`` is read after it."""
        if not passages:
            return self.qa(question)
        if self.style == "paper":
            return PAPER_RAG.format(contexts=format_passages(passages), question=question)
        return qa_prompt(question, passages, dataset=self.dataset)
