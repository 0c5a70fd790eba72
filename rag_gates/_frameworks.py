"""What the framework shells share when they take a user's framework objects: a framework's
model or retriever becomes a rag-gates ``TextLM`` / ``Retriever`` through that framework's
adapter, a rag-gates one passes as it is, anything else is refused naming both kinds. Each
integration binds these to its own types (``_inputs.py``), so the rule and its messages are
written once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rag_gates.lm.base import TextLM
from rag_gates.retrieval.base import Retriever

__all__ = ["retriever_from", "text_lm_from"]


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
