"""What an extractor gives QuCo-RAG: the key entities of a question, the claims of a sentence.

Two questions, one protocol (:class:`Extractor`):

* ``entities(question)``: the question's key entities (``["Kumbasaram", "Mystery of the 13th
  Guest"]``), whose corpus frequency decides the pre-generation gate;
* ``claims(sentence)``: the ``(head, relation, tail)`` claims a generated sentence makes. A
  question yields partial claims ``(head, relation)`` with ``tail=None``; a non-factual
  sentence ("Thus, X came out first.") yields none.

:class:`BaseExtractor` gives batch and async forms for free; implement ``entities`` and
``claims``. The heuristic and spaCy extractors never raise on odd text; ``LLMExtractor``
raises :class:`~rag_gates.errors.ExtractionError` for a model reply it cannot read (by
default), so that a gate retrieves instead of reading "no entity".

Example:
    >>> from rag_gates.extract.base import Claim
    >>> Claim(head="Kumbasaram", relation="released in", tail="2017").is_partial
    False
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["BaseExtractor", "Claim", "Extractor", "unique_claims", "unique_names"]


class Claim(BaseModel):
    """One ``(head, relation, tail)`` claim; ``tail`` is None for a question's partial claim."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    head: str = Field(..., min_length=1, description="Head entity, as written in the text.")
    relation: str = Field("", description="Relation words ('directed by'); may be empty.")
    tail: str | None = Field(
        None, description="Tail entity or value; None for a question's (head, relation) item.")

    @field_validator("head", "relation", "tail")
    @classmethod
    def _strip(cls, value: str | None) -> str | None:
        return value.strip() if isinstance(value, str) else value

    @property
    def is_partial(self) -> bool:
        """True for a two-element (head, relation) item, as extracted from questions."""
        return self.tail is None

    def query(self) -> str:
        """The semantic query QuCo-RAG retrieves with for this claim: ``head + " " + relation``."""
        return f"{self.head} {self.relation}".strip()


def unique_names(names: Iterable[str]) -> list[str]:
    """``names`` de-duplicated without regard to case, in order, each as first written: what
    an extractor's ``entities`` returns.

    Example:
        >>> unique_names(["Ed Wood", "Tim Burton", "ED WOOD"])
        ['Ed Wood', 'Tim Burton']
    """
    seen: dict[str, str] = {}
    for name in names:
        seen.setdefault(name.lower(), name)
    return list(seen.values())


def unique_claims(claims: Iterable[Claim]) -> list[Claim]:
    """``claims`` de-duplicated without regard to case, in order (the first of each kept)."""
    seen: set[tuple[str, str, str | None]] = set()
    out = []
    for c in claims:
        key = (c.head.lower(), c.relation.lower(), c.tail.lower() if c.tail else None)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


@runtime_checkable
class Extractor(Protocol):
    """Entities of questions and claims of sentences."""

    @property
    def name(self) -> str: ...

    def entities(self, question: str) -> list[str]: ...

    def claims(self, sentence: str) -> list[Claim]: ...

    def entities_batch(self, questions: Sequence[str]) -> list[list[str]]: ...

    def claims_batch(self, sentences: Sequence[str]) -> list[list[Claim]]: ...

    async def aentities(self, question: str) -> list[str]: ...

    async def aclaims(self, sentence: str) -> list[Claim]: ...


class BaseExtractor(ABC):
    """Implement :meth:`entities` and :meth:`claims`; batch and async forms come free."""

    name: str = "extractor"

    @abstractmethod
    def entities(self, question: str) -> list[str]:
        """Key entities of ``question``, de-duplicated, in order of appearance."""

    @abstractmethod
    def claims(self, sentence: str) -> list[Claim]:
        """Claims of one sentence; ``[]`` for a non-factual sentence (an extractor that
        cannot read its model's reply may raise ``ExtractionError``)."""

    def entities_batch(self, questions: Sequence[str]) -> list[list[str]]:
        return [self.entities(q) for q in questions]

    def claims_batch(self, sentences: Sequence[str]) -> list[list[Claim]]:
        return [self.claims(s) for s in sentences]

    async def aentities(self, question: str) -> list[str]:
        return await asyncio.to_thread(self.entities, question)

    async def aclaims(self, sentence: str) -> list[Claim]:
        return await asyncio.to_thread(self.claims, sentence)
