"""``GateRouter`` / :func:`route_by_gate`: send each input through a retrieval chain or
straight to the model, as a rag-gates gate decides."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

from langchain_core.callbacks import adispatch_custom_event, dispatch_custom_event
from langchain_core.messages import BaseMessage
from langchain_core.runnables import (
    Runnable,
    RunnableConfig,
    RunnableSerializable,
    ensure_config,
    patch_config,
)
from langchain_core.runnables.base import coerce_to_runnable
from langchain_core.runnables.config import (
    get_async_callback_manager_for_config,
    get_callback_manager_for_config,
)
from pydantic import ConfigDict, Field, JsonValue, field_validator

from langchain_rag_gates.documents import ANNOTATION_KEY
from langchain_rag_gates.retrievers import DECISION_EVENT, _check_gate, _checked
from rag_gates.types import GateDecision

__all__ = ["GateRouter", "route_by_gate"]

RETRIEVE_TAG = "rag_gates:retrieve"
"""Tag of the child run when the gate sent the input through the retrieval branch."""
DIRECT_TAG = "rag_gates:direct"
"""Tag of the child run when the gate sent the input straight to the model."""


def _branch_config(config: RunnableConfig, callbacks: Any, tag: str) -> RunnableConfig:
    """The branch's config: the router's child callbacks, and ``tag`` inherited by every
    run inside the branch (its retriever, prompt and model runs)."""
    tags = [*config.get("tags", []), tag]
    return patch_config(RunnableConfig(**{**config, "tags": tags}), callbacks=callbacks)


def _annotate(output: Any, key: str, data: dict[str, JsonValue]) -> Any:
    """``output`` with the decision attached: a message's ``response_metadata[key]``, a
    dict's ``[key]`` (both copies); any other output unchanged."""
    if isinstance(output, BaseMessage):
        metadata = {**output.response_metadata, key: data}
        return output.model_copy(update={"response_metadata": metadata})
    if isinstance(output, Mapping):
        return {**output, key: data}
    return output


class GateRouter(RunnableSerializable[Any, Any]):
    """Route each input through a retrieval chain or straight to the model, by a gate.

    The gate decides on the query (the input itself when it is a string, else
    ``input[query_key]``). When it asks for retrieval the input goes to ``retrieve``
    (typically ``{"context": retriever | format_docs, "question": RunnablePassthrough()}
    | rag_prompt | llm``), otherwise to ``direct`` (``prompt | llm``); both get the input
    unchanged. The decision (``GateDecision.model_dump(mode="json")``) is:

    - attached to the output: ``response_metadata["rag_gates"]`` of a message (an
      ``AIMessage`` from a chat model), or the ``"rag_gates"`` key of a dict output; other
      outputs (a string from ``StrOutputParser``, ...) are returned unchanged. When
      streaming, it is attached to the first chunk, so the merged chunks carry it;
    - reported to callback handlers as the custom event ``"rag_gates_decision"`` (also
      seen by ``astream_events``); every run inside the chosen branch (retriever, prompt,
      model) is tagged ``"rag_gates:retrieve"`` or ``"rag_gates:direct"``.

    ``invoke``, ``ainvoke`` (with ``gate.adecide``), ``batch``, ``abatch``, ``stream`` and
    ``astream`` all work, and the router composes in LCEL like any runnable.

    Setup:
        ```bash
        pip install -c constraints.txt -e ".[hf,qdrant]" -e integrations/langchain
        ```

    Key init args:
        gate: rag_gates.gate.Gate
            Any rag-gates gate; it sees the query string.
        retrieve: Runnable
            The chain to run when the gate asks for retrieval.
        direct: Runnable
            The chain to run otherwise (the model without retrieved context).
        query_key: str
            Key of the query in dict inputs (default ``"question"``).

    Instantiate:
        ```python
        from langchain_core.prompts import ChatPromptTemplate
        from langchain_core.runnables import RunnablePassthrough
        from langchain_rag_gates import ChatRagGates, route_by_gate

        llm = ChatRagGates(model="default", max_tokens=64)
        rag_prompt = ChatPromptTemplate.from_template(
            "Context:\\n{context}\\n\\nQuestion: {question}"
        )
        direct_prompt = ChatPromptTemplate.from_template("Question: {question}")
        router = route_by_gate(
            gate,
            retrieve={"context": retriever | format_docs, "question": RunnablePassthrough()}
            | rag_prompt
            | llm,
            direct=direct_prompt | llm,
        )
        ```

    Invoke:
        ```python
        msg = router.invoke("Were Scott Derrickson and Ed Wood of the same nationality?")
        msg.content
        msg.response_metadata["rag_gates"]["retrieve"]  # True: the RAG chain answered
        routers.batch([question_1, question_2])
        ```

    Stream:
        ```python
        for chunk in router.stream(question):
            print(chunk.content, end="")
        ```

    Async:
        ```python
        msg = await router.ainvoke(question)
        async for chunk in router.astream(question):
            print(chunk.content, end="")
        ```
    """

    gate: Any = Field(
        ...,
        exclude=True,
        description="Any rag-gates gate (rag_gates.gate.Gate): decide/adecide on the query.",
    )
    retrieve: Runnable[Any, Any] = Field(
        ..., description="Runnable to call when the gate asks for retrieval."
    )
    direct: Runnable[Any, Any] = Field(
        ..., description="Runnable to call when the gate answers without retrieval."
    )
    query_key: str = Field(
        "question", min_length=1, description="Key of the query when the input is a dict."
    )
    annotation_key: str = Field(
        ANNOTATION_KEY,
        min_length=1,
        description="Key of the decision in message response_metadata or dict outputs.",
    )

    model_config = ConfigDict(arbitrary_types_allowed=True)

    @field_validator("gate")
    @classmethod
    def _check_gate(cls, value: Any) -> Any:
        return _check_gate(value)

    @field_validator("retrieve", "direct", mode="before")
    @classmethod
    def _coerce(cls, value: Any) -> Runnable[Any, Any]:
        if isinstance(value, Runnable):
            return value
        if callable(value) or isinstance(value, dict):
            return coerce_to_runnable(value)
        raise TypeError(
            f"expected a Runnable, a callable or a dict of them, got {type(value).__name__}"
        )

    # ------------------------------------------------------------------ helpers
    def query_of(self, input: Any) -> str:
        """The string the gate decides on: the input itself, or ``input[query_key]``."""
        if isinstance(input, str):
            return input
        if isinstance(input, Mapping):
            if self.query_key not in input:
                raise KeyError(
                    f"GateRouter input has no {self.query_key!r} key (keys: "
                    f"{sorted(map(str, input))}); set query_key to the key holding the query"
                )
            query = input[self.query_key]
            if not isinstance(query, str):
                raise TypeError(
                    f"input[{self.query_key!r}] must be a str, got {type(query).__name__}"
                )
            return query
        raise TypeError(
            f"GateRouter takes a str or a dict with a {self.query_key!r} key, got "
            f"{type(input).__name__}"
        )

    def _route(self, decision: GateDecision) -> tuple[Runnable[Any, Any], str]:
        return (self.retrieve, RETRIEVE_TAG) if decision.retrieve else (self.direct, DIRECT_TAG)

    # ------------------------------------------------------------------ Runnable
    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        config = ensure_config(config)
        run_manager = get_callback_manager_for_config(config).on_chain_start(
            None, input, name=config.get("run_name") or self.get_name(),
            run_id=config.pop("run_id", None),
        )
        try:
            decision = _checked(self.gate, self.gate.decide(self.query_of(input)))
            data = decision.model_dump(mode="json")
            dispatch_custom_event(
                DECISION_EVENT, data, config=RunnableConfig(callbacks=run_manager.get_child())
            )
            branch, tag = self._route(decision)
            output = branch.invoke(
                input, _branch_config(config, run_manager.get_child(), tag), **kwargs
            )
            output = _annotate(output, self.annotation_key, data)
        except BaseException as e:
            run_manager.on_chain_error(e)
            raise
        run_manager.on_chain_end(output)
        return output

    async def ainvoke(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Any:
        config = ensure_config(config)
        run_manager = await get_async_callback_manager_for_config(config).on_chain_start(
            None, input, name=config.get("run_name") or self.get_name(),
            run_id=config.pop("run_id", None),
        )
        try:
            decision = _checked(self.gate, await self.gate.adecide(self.query_of(input)))
            data = decision.model_dump(mode="json")
            await adispatch_custom_event(
                DECISION_EVENT, data, config=RunnableConfig(callbacks=run_manager.get_child())
            )
            branch, tag = self._route(decision)
            output = await branch.ainvoke(
                input, _branch_config(config, run_manager.get_child(), tag), **kwargs
            )
            output = _annotate(output, self.annotation_key, data)
        except BaseException as e:
            await run_manager.on_chain_error(e)
            raise
        await run_manager.on_chain_end(output)
        return output

    def stream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any | None
    ) -> Iterator[Any]:
        config = ensure_config(config)
        run_manager = get_callback_manager_for_config(config).on_chain_start(
            None, input, name=config.get("run_name") or self.get_name(),
            run_id=config.pop("run_id", None),
        )
        final: Any = None
        try:
            decision = _checked(self.gate, self.gate.decide(self.query_of(input)))
            data = decision.model_dump(mode="json")
            dispatch_custom_event(
                DECISION_EVENT, data, config=RunnableConfig(callbacks=run_manager.get_child())
            )
            branch, tag = self._route(decision)
            chunks = branch.stream(
                input, _branch_config(config, run_manager.get_child(), tag), **kwargs
            )
            merge = _Merger()
            for i, chunk in enumerate(chunks):
                out = _annotate(chunk, self.annotation_key, data) if i == 0 else chunk
                merge.add(out)
                yield out
            final = merge.value
        except BaseException as e:
            run_manager.on_chain_error(e)
            raise
        run_manager.on_chain_end(final)

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any | None
    ) -> AsyncIterator[Any]:
        config = ensure_config(config)
        run_manager = await get_async_callback_manager_for_config(config).on_chain_start(
            None, input, name=config.get("run_name") or self.get_name(),
            run_id=config.pop("run_id", None),
        )
        final: Any = None
        try:
            decision = _checked(self.gate, await self.gate.adecide(self.query_of(input)))
            data = decision.model_dump(mode="json")
            await adispatch_custom_event(
                DECISION_EVENT, data, config=RunnableConfig(callbacks=run_manager.get_child())
            )
            branch, tag = self._route(decision)
            chunks = branch.astream(
                input, _branch_config(config, run_manager.get_child(), tag), **kwargs
            )
            merge = _Merger()
            first = True
            async for chunk in chunks:
                out = _annotate(chunk, self.annotation_key, data) if first else chunk
                first = False
                merge.add(out)
                yield out
            final = merge.value
        except BaseException as e:
            await run_manager.on_chain_error(e)
            raise
        await run_manager.on_chain_end(final)


class _Merger:
    """Adds stream chunks up (``+``) for the run's final output, as LangChain does; gives
    up (None) on chunks that do not add."""

    def __init__(self) -> None:
        self.value: Any = None
        self._ok = True
        self._empty = True

    def add(self, chunk: Any) -> None:
        if not self._ok:
            return
        if self._empty:
            self.value, self._empty = chunk, False
            return
        try:
            self.value = self.value + chunk
        except TypeError:
            self.value, self._ok = None, False


def route_by_gate(
    gate: Any,
    *,
    retrieve: Runnable[Any, Any] | Callable[..., Any] | Mapping[str, Any],
    direct: Runnable[Any, Any] | Callable[..., Any] | Mapping[str, Any],
    query_key: str = "question",
) -> GateRouter:
    """A :class:`GateRouter`: ``retrieve`` when ``gate`` asks for retrieval, else ``direct``.

    Example:
        >>> router = route_by_gate(gate, retrieve=rag_chain, direct=prompt | llm)
        >>> msg = router.invoke("Who directed Ed Wood?")
        >>> msg.response_metadata["rag_gates"]["reason"]
    """
    return GateRouter(gate=gate, retrieve=retrieve, direct=direct, query_key=query_key)
