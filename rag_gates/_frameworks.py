"""What the framework shells share when they take a user's framework objects: a framework's
model or retriever becomes a rag-gates ``TextLM`` / ``Retriever`` through that framework's
adapter, a rag-gates one passes as it is, anything else is refused naming both kinds; the
question is read from a runnable's input. Each integration binds :class:`FrameworkInputs` to
its own types (``_inputs.py``), so the rules and their messages are written once."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, overload

from rag_gates.lm.base import TextLM
from rag_gates.retrieval.base import BaseRetriever, Retriever, check_query
from rag_gates.types import Passage

__all__ = ["FrameworkInputs", "FrameworkRetrieverAdapter", "question_of", "retriever_from",
           "text_lm_from"]


def text_lm_from(llm: object, native: type, adapt: Callable[[Any], TextLM],
                 framework: str) -> TextLM:
    """``adapt(llm)`` for an instance of the framework's ``native`` model type; a TextLM
    as it is; else a TypeError naming both."""
    if isinstance(llm, native):
        return adapt(llm)
    if isinstance(llm, TextLM):
        return llm
    raise TypeError(f"llm must be a {framework} or a rag-gates TextLM, got "
                    f"{type(llm).__name__}")


def retriever_from(retriever: object, native: type, adapt: Callable[[Any], Retriever],
                   framework: str, *, optional: bool = False) -> Retriever | None:
    """``adapt(retriever)`` for an instance of the framework's ``native`` retriever type; a
    rag-gates Retriever as it is; None when ``optional`` and None is given; else a
    TypeError naming both."""
    if isinstance(retriever, native):
        return adapt(retriever)
    if isinstance(retriever, Retriever) or (optional and retriever is None):
        return retriever
    raise TypeError(f"retriever must be a {framework} or a rag-gates Retriever, got "
                    f"{type(retriever).__name__}")


@dataclass(frozen=True)
class FrameworkInputs:
    """One framework's model and retriever types, their adapters and how its messages name
    them: :meth:`text_lm` and :meth:`retriever` are :func:`text_lm_from` and
    :func:`retriever_from` bound to them."""

    lm_type: type
    as_text_lm: Callable[[Any], TextLM]
    lm_kind: str
    retriever_type: type
    as_retriever: Callable[[Any], Retriever]
    retriever_kind: str

    def text_lm(self, llm: object) -> TextLM:
        """The framework's model through its adapter; a rag-gates TextLM as it is."""
        return text_lm_from(llm, self.lm_type, self.as_text_lm, self.lm_kind)

    @overload
    def retriever(self, retriever: object, *, optional: Literal[False] = False
                  ) -> Retriever: ...

    @overload
    def retriever(self, retriever: object, *, optional: bool) -> Retriever | None: ...

    def retriever(self, retriever: object, *, optional: bool = False) -> Retriever | None:
        """The framework's retriever through its adapter; a rag-gates Retriever as it is;
        None when ``optional``."""
        return retriever_from(retriever, self.retriever_type, self.as_retriever,
                              self.retriever_kind, optional=optional)


def question_of(input: Any, key: str, owner: str, what: str = "question") -> str:
    """The question a runnable's input holds: the input itself when it is a str, else
    ``input[key]``; errors name ``owner`` and say to set ``query_key``."""
    if isinstance(input, str):
        return input
    if isinstance(input, Mapping):
        if key not in input:
            raise KeyError(
                f"{owner} input has no {key!r} key (keys: {sorted(map(str, input))}); set "
                f"query_key to the key holding the {what}"
            )
        question = input[key]
        if not isinstance(question, str):
            raise TypeError(f"input[{key!r}] must be a str, got {type(question).__name__}")
        return question
    raise TypeError(f"{owner} takes a str or a dict with a {key!r} key, got "
                    f"{type(input).__name__}")


class FrameworkRetrieverAdapter(BaseRetriever):
    """A framework's retriever as a rag-gates ``Retriever``: the type check, the name used
    in traces (``"<prefix>:<class name>"``), the query check and the cut to ``k``, once. A
    shell names its framework (:attr:`native`, :attr:`kind`, :attr:`prefix`) and says how to
    fetch (:meth:`_fetch`, :meth:`_afetch`) and convert (:meth:`_passages`)."""

    native: ClassVar[type]
    """The framework's retriever type."""
    kind: ClassVar[str]
    """How the type check's message names it (with an example of how to get one)."""
    prefix: ClassVar[str]
    """The default name's prefix."""

    def __init__(self, retriever: Any, name: str | None = None) -> None:
        if not isinstance(retriever, self.native):
            raise TypeError(f"retriever must be a {self.kind}, got {type(retriever).__name__}")
        self.retriever = retriever
        self._name = name or f"{self.prefix}:{type(retriever).__name__}"

    @property
    def name(self) -> str:
        return self._name

    @abstractmethod
    def _fetch(self, query: str, k: int) -> Sequence[Any]:
        """The framework's items for ``query`` (``k`` where the retriever takes it)."""

    @abstractmethod
    async def _afetch(self, query: str, k: int) -> Sequence[Any]:
        """:meth:`_fetch` through the framework's async path."""

    @abstractmethod
    def _passages(self, items: Sequence[Any]) -> list[Passage]:
        """The framework's items as passages."""

    def retrieve(self, query: str, k: int = 3) -> list[Passage]:
        query, k = check_query(query, k)
        return self._passages(self._fetch(query, k)[:k])

    async def aretrieve(self, query: str, k: int = 3) -> list[Passage]:
        query, k = check_query(query, k)
        return self._passages((await self._afetch(query, k))[:k])
