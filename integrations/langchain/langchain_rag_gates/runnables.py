"""``GateRouter`` / :func:`route_by_gate`: send each input through a retrieval chain or
straight to the model, as a rag-gates gate decides."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.prompts import BasePromptTemplate, ChatPromptTemplate
from langchain_core.runnables import (
    Runnable,
    RunnableConfig,
    RunnableSequence,
    RunnableSerializable,
    ensure_config,
    patch_config,
)
from langchain_core.runnables.base import coerce_to_runnable
from langchain_core.runnables.config import (
    get_async_callback_manager_for_config,
    get_callback_manager_for_config,
)
from pydantic import ConfigDict, Field, JsonValue, field_validator, model_validator

from langchain_rag_gates.chat_models import ChatRagGates
from langchain_rag_gates.documents import ANNOTATION_KEY, documents_to_passages
from langchain_rag_gates.retrievers import (
    DECISION_EVENT,
    _adecide_in_run,
    _adispatch_in_run,
    _decide_in_run,
    _dispatch_in_run,
)
from rag_gates._frameworks import question_of
from rag_gates.answer_once import Reuse, find_closed_book_answer, reusable_answer
from rag_gates.gated import GateErrorPolicy, annotation, check_gate
from rag_gates.prompts import qa_prompt
from rag_gates.types import GateDecision

__all__ = ["DEFAULT_ABSTAIN_MESSAGE", "GateRouter", "closed_book_prompt", "route_by_gate"]

DEFAULT_ABSTAIN_MESSAGE = (
    "I don't know: the retrieved passages do not support an answer I can give reliably.")
"""The reply of a three-way spec's abstention (``rag-gates calibrate --abstain``) when the
router has no ``abstain`` branch."""
ABSTAIN_TAG = "rag_gates:abstain"


def closed_book_prompt(query_key: str = "question", dataset: str | None = None
                       ) -> ChatPromptTemplate:
    """The closed-book prompt the confidence gates generate with (:func:`qa_prompt`), as a
    chat prompt over ``{query_key}``: with it as the direct branch (``closed_book_prompt()
    | llm``), a gate that generated the answer to decide has it reused (answer once).

    Example:
        >>> router = route_by_gate(gate, retrieve=rag_chain, direct=closed_book_prompt() | llm)
    """
    text = qa_prompt("{" + query_key + "}", dataset=dataset)
    return ChatPromptTemplate.from_messages([("human", text)])


def _split_direct(direct: Runnable[Any, Any]
                  ) -> tuple[BasePromptTemplate, ChatRagGates, list[Runnable[Any, Any]]] | None:
    """``prompt | ChatRagGates | rest...`` as its parts; None for any other shape."""
    if not isinstance(direct, RunnableSequence):
        return None
    steps = direct.steps
    if (len(steps) >= 2 and isinstance(steps[0], BasePromptTemplate)
            and isinstance(steps[1], ChatRagGates)):
        return steps[0], steps[1], list(steps[2:])
    return None


def _reuse(direct: Runnable[Any, Any], decision: GateDecision, input: Any
           ) -> tuple[Reuse, list[Runnable[Any, Any]], ChatRagGates | None]:
    """Whether ``direct`` would write exactly the gate's closed-book answer for ``input``."""
    found = find_closed_book_answer(decision)
    name = found.gate if found else None
    parts = _split_direct(direct)
    if parts is None:
        return (Reuse(None, "direct is not prompt | ChatRagGates: cannot check it would "
                            "write the gate's answer", name), [], None)
    prompt, chat, rest = parts
    lm = chat.get_lm()
    options = chat._options(None, {})
    messages = prompt.invoke(input).to_messages()
    reuse = reusable_answer(decision, lm=lm, prompt=chat._prompt(messages, lm),
                            max_new_tokens=options.max_tokens, temperature=options.temperature,
                            stop=options.stop)
    return reuse, rest, chat

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

    Answer once: a gate that generated the closed-book answer to decide
    (``AnswerLogprobGate``, or a composite or loaded spec holding one) has written the direct
    reply already. When ``direct`` is ``prompt | ChatRagGates [| more]`` and would send the
    gate's prompt (:func:`closed_book_prompt`) to the gate's model, greedily, without stop
    strings and with a budget that cannot change the text, the gate's answer goes through the
    steps after the model instead of a second generation. The decision's ``"answer_once"``
    entry says whether it was reused, and why not when it was not (``answer_once=False``
    turns this off).

    Three-way specs (``rag-gates calibrate --abstain``, loaded with ``load_gate``) need
    ``retriever``: when the spec retrieves, the router retrieves with it, the spec's model
    answers from those documents with the calibration prompt (the answer its error bound
    covers; the ``retrieve`` chain is not run), and when that answer's with-passages score is
    at or above the certified threshold the input goes to the third branch, ``abstain``
    (default: an ``AIMessage`` saying it does not know; runs tagged
    ``"rag_gates:abstain"``). The :class:`~rag_gates.types.AbstainDecision` is in the
    decision's ``"abstain"`` entry either way.

    Setup:
        ```bash
        pip install -c constraints.txt -e ".[hf,qdrant]" -e integrations/langchain
        ```

    Key init args:
        gate: rag_gates.gate.Gate
            Any rag-gates gate; it sees the query string.
        retriever: Runnable | None
            A three-way spec's retriever (query -> documents).
        abstain: Runnable | None
            The third branch: what a three-way spec's abstention runs on the input.
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
    answer_once: bool = Field(
        True,
        description="Reply with the gate's own closed-book answer on a skip when the direct "
                    "branch would write exactly it (see the class docstring).",
    )
    retriever: Runnable[Any, Any] | None = Field(
        None, description="A three-way spec's retriever (query string -> documents): needed "
                          "when the gate can abstain (see the class docstring).")
    abstain: Runnable[Any, Any] | None = Field(
        None, description="The third branch: run on the input when a three-way spec "
                          "abstains (default: an AIMessage saying it does not know).")
    on_gate_error: GateErrorPolicy = Field(
        "raise", description="When gate.decide raises: 'raise' the gate's error, or "
                             "'retrieve' (fail closed: take the retrieve branch, the "
                             "decision's reason and evidence['error'] name the error).")

    model_config = ConfigDict(arbitrary_types_allowed=True)

    @model_validator(mode="after")
    def _three_way_needs_a_retriever(self) -> GateRouter:
        if getattr(self.gate, "abstains", False) and self.retriever is None:
            raise ValueError("this gate is a three-way spec (it can abstain after retrieval): "
                             "pass retriever= (the retriever of your retrieve chain), so the "
                             "router answers from its documents with the answer the spec "
                             "covers")
        return self

    @field_validator("gate")
    @classmethod
    def _check_gate(cls, value: Any) -> Any:
        return check_gate(value)

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
        return question_of(input, self.query_key, "GateRouter", what="query")

    def _decided(self, input: Any, run_manager: Any) -> tuple[GateDecision,
                                                              dict[str, JsonValue]]:
        """The gate's decision inside the router's run, reported as the custom event."""
        decision = _decide_in_run(self.gate, self.query_of(input), run_manager.get_child(),
                                  self.on_gate_error)
        data = annotation(decision)
        _dispatch_in_run(DECISION_EVENT, data, run_manager)
        return decision, data

    async def _adecided(self, input: Any, run_manager: Any
                        ) -> tuple[GateDecision, dict[str, JsonValue]]:
        decision = await _adecide_in_run(self.gate, self.query_of(input),
                                         run_manager.get_child(), self.on_gate_error)
        data = annotation(decision)
        await _adispatch_in_run(DECISION_EVENT, data, run_manager)
        return decision, data

    def _three_way(self, decision: GateDecision) -> bool:
        return decision.retrieve and self.retriever is not None and bool(
            getattr(self.gate, "abstains", False))

    def _verdict(self, input: Any, docs: Any, data: dict[str, JsonValue], *, chunk: bool
                 ) -> tuple[Any, bool, dict[str, JsonValue]]:
        """(the certified answer as a message or None, abstain?, data with the verdict)."""
        answer, verdict = self.gate.answer_or_abstain(self.query_of(input),
                                                      documents_to_passages(docs))
        data = {**data, "abstain": verdict.model_dump(mode="json")}
        if verdict.abstain:
            return None, True, data
        return (AIMessageChunk if chunk else AIMessage)(content=answer.answer), False, data

    def _answer_or_abstain(self, input: Any, data: dict[str, JsonValue],
                           config: RunnableConfig, run_manager: Any, *, chunk: bool = False
                           ) -> tuple[Any, dict[str, JsonValue]]:
        """A three-way spec's reply after retrieval (the core step:
        ``CertifiedGate.answer_or_abstain``), or the ``abstain`` branch's output."""
        assert self.retriever is not None
        docs = self.retriever.invoke(self.query_of(input),
                                     _branch_config(config, run_manager.get_child(),
                                                    RETRIEVE_TAG))
        message, abstained, data = self._verdict(input, docs, data, chunk=chunk)
        if not abstained:
            return message, data
        if self.abstain is None:
            cls = AIMessageChunk if chunk else AIMessage
            return cls(content=DEFAULT_ABSTAIN_MESSAGE), data
        return self.abstain.invoke(input, _branch_config(config, run_manager.get_child(),
                                                         ABSTAIN_TAG)), data

    async def _aanswer_or_abstain(self, input: Any, data: dict[str, JsonValue],
                                  config: RunnableConfig, run_manager: Any, *,
                                  chunk: bool = False) -> tuple[Any, dict[str, JsonValue]]:
        assert self.retriever is not None
        docs = await self.retriever.ainvoke(self.query_of(input),
                                            _branch_config(config, run_manager.get_child(),
                                                           RETRIEVE_TAG))
        # The answer is a model call: off the event loop.
        message, abstained, data = await asyncio.to_thread(self._verdict, input, docs, data,
                                                           chunk=chunk)
        if not abstained:
            return message, data
        if self.abstain is None:
            cls = AIMessageChunk if chunk else AIMessage
            return cls(content=DEFAULT_ABSTAIN_MESSAGE), data
        return await self.abstain.ainvoke(input, _branch_config(
            config, run_manager.get_child(), ABSTAIN_TAG)), data

    def _route(self, decision: GateDecision) -> tuple[Runnable[Any, Any], str]:
        return (self.retrieve, RETRIEVE_TAG) if decision.retrieve else (self.direct, DIRECT_TAG)

    def _reuse_plan(self, input: Any, decision: GateDecision, data: dict[str, JsonValue],
                    *, chunk: bool) -> tuple[Any, list[Runnable[Any, Any]], dict[str, JsonValue]]:
        """(message, steps, data): the gate's answer as the model's message and the direct
        branch's steps after the model, when it is reusable (else message None), and
        ``data`` with the ``answer_once`` note when a gate generated an answer."""
        if (not self.answer_once or decision.retrieve
                or find_closed_book_answer(decision) is None):
            return None, [], data
        reuse, rest, chat = _reuse(self.direct, decision, input)
        data = {**data, "answer_once": reuse.as_json()}
        if reuse.answer is None or chat is None:
            return None, [], data
        cls = AIMessageChunk if chunk else AIMessage
        return (cls(content=reuse.answer, response_metadata=chat._response_metadata()),
                list(rest), data)

    def _reused(self, input: Any, decision: GateDecision, data: dict[str, JsonValue],
                config: RunnableConfig, *, chunk: bool = False
                ) -> tuple[Any, dict[str, JsonValue]]:
        """(output, data): the reused answer through the steps after the model (else
        output None); see :meth:`_reuse_plan`."""
        output, rest, data = self._reuse_plan(input, decision, data, chunk=chunk)
        for step in rest if output is not None else []:
            output = step.invoke(output, config)
        return output, data

    async def _areused(self, input: Any, decision: GateDecision, data: dict[str, JsonValue],
                       config: RunnableConfig, *, chunk: bool = False
                       ) -> tuple[Any, dict[str, JsonValue]]:
        """:meth:`_reused` with each step's ``ainvoke`` (a step may be async only)."""
        parts = _split_direct(self.direct)
        if self.answer_once and not decision.retrieve and parts is not None:
            await parts[1].aget_lm()  # a first load in a worker thread: the check reads it
        output, rest, data = self._reuse_plan(input, decision, data, chunk=chunk)
        for step in rest if output is not None else []:
            output = await step.ainvoke(output, config)
        return output, data

    # ------------------------------------------------------------------ Runnable
    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        config = ensure_config(config)
        run_manager = get_callback_manager_for_config(config).on_chain_start(
            None, input, name=config.get("run_name") or self.get_name(),
            run_id=config.pop("run_id", None),
        )
        try:
            decision, data = self._decided(input, run_manager)
            branch, tag = self._route(decision)
            child = _branch_config(config, run_manager.get_child(), tag)
            if self._three_way(decision):
                output, data = self._answer_or_abstain(input, data, config, run_manager)
            else:
                output, data = self._reused(input, decision, data, child)
                if output is None:
                    output = branch.invoke(input, child, **kwargs)
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
            decision, data = await self._adecided(input, run_manager)
            branch, tag = self._route(decision)
            child = _branch_config(config, run_manager.get_child(), tag)
            if self._three_way(decision):
                output, data = await self._aanswer_or_abstain(input, data, config, run_manager)
            else:
                output, data = await self._areused(input, decision, data, child)
                if output is None:
                    output = await branch.ainvoke(input, child, **kwargs)
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
            decision, data = self._decided(input, run_manager)
            branch, tag = self._route(decision)
            child = _branch_config(config, run_manager.get_child(), tag)
            if self._three_way(decision):
                reused, data = self._answer_or_abstain(input, data, config, run_manager,
                                                       chunk=True)
            else:
                reused, data = self._reused(input, decision, data, child, chunk=True)
            chunks = iter([reused]) if reused is not None else branch.stream(
                input, child, **kwargs)
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
            decision, data = await self._adecided(input, run_manager)
            branch, tag = self._route(decision)
            child = _branch_config(config, run_manager.get_child(), tag)
            if self._three_way(decision):
                reused, data = await self._aanswer_or_abstain(input, data, config,
                                                              run_manager, chunk=True)
            else:
                reused, data = await self._areused(input, decision, data, child, chunk=True)
            merge = _Merger()
            first = True
            async for chunk in (_one(reused) if reused is not None
                                else branch.astream(input, child, **kwargs)):
                out = _annotate(chunk, self.annotation_key, data) if first else chunk
                first = False
                merge.add(out)
                yield out
            final = merge.value
        except BaseException as e:
            await run_manager.on_chain_error(e)
            raise
        await run_manager.on_chain_end(final)


async def _one(item: Any) -> AsyncIterator[Any]:
    yield item


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
    answer_once: bool = True,
    retriever: Runnable[Any, Any] | None = None,
    abstain: Runnable[Any, Any] | Callable[..., Any] | None = None,
    on_gate_error: GateErrorPolicy = "raise",
) -> GateRouter:
    """A :class:`GateRouter`: ``retrieve`` when ``gate`` asks for retrieval, else ``direct``.

    Example:
        >>> router = route_by_gate(gate, retrieve=rag_chain, direct=prompt | llm)
        >>> msg = router.invoke("Who directed Ed Wood?")
        >>> msg.response_metadata["rag_gates"]["reason"]
    """
    return GateRouter(gate=gate, retrieve=retrieve, direct=direct, query_key=query_key,
                      answer_once=answer_once, retriever=retriever,
                      abstain=None if abstain is None else coerce_to_runnable(abstain),
                      on_gate_error=on_gate_error)
