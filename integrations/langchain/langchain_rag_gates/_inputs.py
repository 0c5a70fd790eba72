"""What the method runnables (QuCo, DeepRAG) share: their LangChain arguments as rag-gates
parts (the core rule, :class:`rag_gates._frameworks.FrameworkInputs`, bound to LangChain's
types), the question read from the input, config fields given directly (gathered into the
runnable's config field), and the runnable shell itself (:class:`MethodRunnable`)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from langchain_core.callbacks import AsyncCallbackManagerForChainRun, CallbackManagerForChainRun
from langchain_core.language_models import BaseLanguageModel
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig, RunnableSerializable
from pydantic import BaseModel, ConfigDict, Field, model_validator

from langchain_rag_gates.language_models import as_text_lm
from langchain_rag_gates.retrievers import LangChainRetrieverAdapter
from rag_gates._frameworks import FrameworkInputs, question_of

__all__ = ["MethodRunnable", "gather_config", "question_of", "rag_gates_retriever",
           "rag_gates_text_lm"]

C = TypeVar("C", bound=BaseModel)

_LANGCHAIN = FrameworkInputs(
    lm_type=BaseLanguageModel, as_text_lm=as_text_lm, lm_kind="LangChain chat model or LLM",
    retriever_type=BaseRetriever, as_retriever=LangChainRetrieverAdapter,
    retriever_kind="LangChain BaseRetriever (store.as_retriever())")

rag_gates_text_lm = _LANGCHAIN.text_lm
"""A LangChain chat model or LLM through :func:`as_text_lm`; a TextLM as it is."""
rag_gates_retriever = _LANGCHAIN.retriever
"""A LangChain retriever through :class:`LangChainRetrieverAdapter`; a rag-gates Retriever as
it is; None when ``optional``."""


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


class MethodRunnable(RunnableSerializable[Any, dict[str, Any]]):
    """The shell of a method's runnable (QuCo, DeepRAG): the model field, the question read
    from the input (the input itself, or ``input[query_key]``), the method's config fields
    given directly gathered into its config field (:attr:`config_type`, :attr:`config_field`),
    and ``invoke`` / ``ainvoke`` through LangChain's run (callbacks, tracing) into
    :meth:`_run` / :meth:`_arun`."""

    #: The method's config model and the field holding it (``QuCoConfig``, ``"quco_config"``).
    config_type: ClassVar[type[BaseModel]]
    config_field: ClassVar[str]

    llm: Any = Field(
        ..., exclude=True, description="A LangChain chat model or LLM, or a rag-gates TextLM."
    )
    query_key: str = Field(
        "question", min_length=1, description="Key of the question when the input is a dict."
    )

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _gather_config(cls, data: Any) -> Any:
        """Move config fields given directly (``tau_entity=82``) into :attr:`config_field`."""
        return gather_config(data, cls.config_type, cls.config_field)

    def question_of(self, input: Any) -> str:
        """The question: the input itself, or ``input[query_key]``."""
        return question_of(input, self.query_key, type(self).__name__)

    @abstractmethod
    def _run(self, input: Any, run_manager: CallbackManagerForChainRun, config: RunnableConfig
             ) -> dict[str, Any]:
        """The method's output for one input, inside the runnable's run."""

    @abstractmethod
    async def _arun(self, input: Any, run_manager: AsyncCallbackManagerForChainRun,
                    config: RunnableConfig) -> dict[str, Any]:
        """:meth:`_run` on the async path."""

    def invoke(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        return self._call_with_config(self._run, input, config)

    async def ainvoke(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        return await self._acall_with_config(self._arun, input, config)
