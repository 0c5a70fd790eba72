"""What the method runnables (QuCo, DeepRAG) share: turning their LangChain arguments into
rag-gates parts, reading the question from the input, and gathering config fields given
directly."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeVar, overload

from langchain_core.language_models import BaseLanguageModel
from langchain_core.retrievers import BaseRetriever
from pydantic import BaseModel

from langchain_rag_gates.language_models import as_text_lm
from langchain_rag_gates.retrievers import LangChainRetrieverAdapter
from rag_gates._frameworks import retriever_from, text_lm_from
from rag_gates.lm.base import TextLM
from rag_gates.retrieval.base import Retriever

__all__ = ["gather_config", "question_of", "rag_gates_retriever", "rag_gates_text_lm"]

C = TypeVar("C", bound=BaseModel)


def rag_gates_text_lm(llm: object) -> TextLM:
    """A LangChain chat model or LLM through :func:`as_text_lm`; a TextLM as it is."""
    return text_lm_from(llm, BaseLanguageModel, as_text_lm, "LangChain chat model or LLM")


@overload
def rag_gates_retriever(retriever: object, *, optional: Literal[False] = False) -> Retriever: ...


@overload
def rag_gates_retriever(retriever: object, *, optional: bool) -> Retriever | None: ...


def rag_gates_retriever(retriever: object, *, optional: bool = False) -> Retriever | None:
    """A LangChain retriever through :class:`LangChainRetrieverAdapter`; a rag-gates
    Retriever as it is; None when ``optional``."""
    return retriever_from(retriever, BaseRetriever, LangChainRetrieverAdapter,
                          "LangChain BaseRetriever (store.as_retriever())", optional=optional)


def question_of(input: Any, key: str, owner: str) -> str:
    """The question: the input itself, or ``input[key]``; errors name ``owner``."""
    if isinstance(input, str):
        return input
    if isinstance(input, Mapping):
        if key not in input:
            raise KeyError(
                f"{owner} input has no {key!r} key (keys: {sorted(map(str, input))}); set "
                "query_key to the key holding the question"
            )
        question = input[key]
        if not isinstance(question, str):
            raise TypeError(f"input[{key!r}] must be a str, got {type(question).__name__}")
        return question
    raise TypeError(f"{owner} takes a str or a dict with a {key!r} key, got "
                    f"{type(input).__name__}")


def gather_config(data: Any, config: type[C], field: str) -> Any:
    """Move fields of ``config`` given directly among a runnable's arguments into its
    ``field`` (validated), merged over a config given there."""
    if not isinstance(data, dict):
        return data
    direct = {k: data[k] for k in config.model_fields if k in data}
    if not direct:
        return data
    rest = {k: v for k, v in data.items() if k not in direct}
    base = rest.get(field) or config()
    if isinstance(base, Mapping):
        base = config(**base)
    rest[field] = config(**{**dict(base), **direct})
    return rest
