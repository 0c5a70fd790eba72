"""``GatedRetriever``: any LangChain retriever behind any rag-gates gate;
``LangChainRetrieverAdapter``: any LangChain retriever as a rag-gates ``Retriever``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    AsyncParentRunManager,
    CallbackManagerForRetrieverRun,
    ParentRunManager,
    adispatch_custom_event,
    dispatch_custom_event,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import run_in_executor, set_config_context
from langchain_core.runnables.utils import coro_with_context
from pydantic import ConfigDict, Field, JsonValue, PrivateAttr, field_validator

from langchain_rag_gates.documents import annotate_document, documents_to_passages
from rag_gates._frameworks import FrameworkRetrieverAdapter
from rag_gates.gated import (
    GateErrorPolicy,
    adecide,
    agated_retrieve,
    annotation,
    check_gate,
    decide,
    gated_retrieve,
)
from rag_gates.types import GateDecision, Passage

__all__ = ["GatedRetriever", "LangChainRetrieverAdapter"]

DECISION_EVENT = "rag_gates_decision"
"""Name of the LangChain custom event carrying each gate decision."""


def _decide_in_run(gate: Any, query: str, callbacks: Any,
                   on_error: GateErrorPolicy = "raise") -> GateDecision:
    """The gate's decision (:func:`rag_gates.gated.decide`, ``on_error`` when the gate
    raises), made inside the calling run's context: a LangChain model the gate calls
    (``as_text_lm(chat)`` behind ``answer-logprob``, say) is traced as a child of the
    retriever's or router's run, not as a run of its own."""
    with set_config_context(RunnableConfig(callbacks=callbacks)) as context:
        return decide(gate, query, on_error, call=context.run)


async def _adecide_in_run(gate: Any, query: str, callbacks: Any,
                          on_error: GateErrorPolicy = "raise") -> GateDecision:
    """:func:`_decide_in_run` with ``gate.adecide``."""
    with set_config_context(RunnableConfig(callbacks=callbacks)) as context:
        return await adecide(gate, query, on_error,
                             call=lambda coro: coro_with_context(coro, context))


def _dispatch_in_run(event: str, data: Any, run_manager: ParentRunManager) -> None:
    """Send the custom ``event`` to the calling run's handlers (its child callbacks), so
    they and tracing see it under that run."""
    dispatch_custom_event(event, data, config=RunnableConfig(callbacks=run_manager.get_child()))


async def _adispatch_in_run(event: str, data: Any, run_manager: AsyncParentRunManager) -> None:
    """:func:`_dispatch_in_run` on the async path."""
    await adispatch_custom_event(event, data,
                                 config=RunnableConfig(callbacks=run_manager.get_child()))


async def _ainvoke_retriever(retriever: BaseRetriever, query: str,
                            config: RunnableConfig | None, **kwargs: Any) -> list[Document]:
    """``retriever.ainvoke(query, config, **kwargs)``, except for a retriever whose keyword
    arguments only its sync method takes: LangChain's default async method (the base
    class's, which such a retriever keeps) accepts none and raises ``TypeError``; it is then
    invoked synchronously in a worker thread, with the same arguments and callbacks."""
    if kwargs and type(retriever)._aget_relevant_documents is \
            BaseRetriever._aget_relevant_documents:
        docs: list[Document] = await run_in_executor(config, retriever.invoke, query, config,
                                                     **kwargs)
        return docs
    return await retriever.ainvoke(query, config=config, **kwargs)


class GatedRetriever(BaseRetriever):
    """Any LangChain retriever that only retrieves when a rag-gates gate says so.

    For each query the gate decides (``gate.decide``; ``gate.adecide`` on the async path):

    - no retrieval: the wrapped retriever is not called and the result is ``[]``;
    - retrieval: the wrapped retriever's documents come back as copies with
      ``metadata["rag_gates"] = decision.model_dump(mode="json")``; the wrapped
      retriever's documents are never modified.

    Every decision is also reported to the callback handlers as a custom event named
    ``"rag_gates_decision"`` (``on_custom_event(name, data, run_id=<retriever run>)``;
    ``astream_events`` shows it as ``on_custom_event``), and kept in :attr:`last_decision`.

    Setup:
        ```bash
        pip install -c constraints.txt -e ".[hf,qdrant]" -e integrations/langchain
        ```

    Key init args:
        retriever: BaseRetriever
            The retriever to gate (a vector store's ``as_retriever()``, BM25, ...).
        gate: rag_gates.gate.Gate
            Any rag-gates gate; it sees the query string.
        k: int | None
            Number of documents to return. Passed on to the wrapped retriever as ``k``
            (vector store retrievers read it; retrievers that take no extra arguments
            ignore it) and the result is cut to ``k``. ``None`` = the wrapped
            retriever's own number.
        on_gate_error: "raise" | "retrieve"
            When ``gate.decide`` raises: the gate's error (default), or fail closed:
            retrieve, with the error named in the decision.

    Instantiate:
        ```python
        from langchain_core.vectorstores import InMemoryVectorStore
        from langchain_rag_gates import GatedRetriever
        from rag_gates.confidence import FirstTokenProbGate
        from rag_gates.lm import load_lm

        store = InMemoryVectorStore.from_texts(texts, embedding=embeddings)
        gate = FirstTokenProbGate(load_lm("default"), threshold=0.5)
        retriever = GatedRetriever(retriever=store.as_retriever(), gate=gate, k=3)
        ```

    Invoke:
        ```python
        docs = retriever.invoke("Were Scott Derrickson and Ed Wood of the same nationality?")
        docs[0].metadata["rag_gates"]  # {'gate': ..., 'retrieve': True, 'score': ..., ...}
        retriever.invoke("what is two plus two?")  # [] when the gate says no
        retriever.last_decision.reason
        retriever.invoke(question, k=1)  # per-call number of documents
        ```

    Async:
        ```python
        docs = await retriever.ainvoke(question)
        ```

    Decision events:
        ```python
        from langchain_core.callbacks import BaseCallbackHandler

        class Log(BaseCallbackHandler):
            def on_custom_event(self, name, data, *, run_id, **kwargs):
                if name == "rag_gates_decision":
                    print(data["retrieve"], data["reason"])

        retriever.invoke(question, config={"callbacks": [Log()]})
        ```

    Use within a chain:
        ```python
        from langchain_core.output_parsers import StrOutputParser
        from langchain_core.prompts import ChatPromptTemplate
        from langchain_core.runnables import RunnablePassthrough

        prompt = ChatPromptTemplate.from_template(
            "Context: {context}\\n\\nQuestion: {question}"
        )
        chain = (
            {"context": retriever | format_docs, "question": RunnablePassthrough()}
            | prompt
            | llm
            | StrOutputParser()
        )
        ```

        To skip the context prompt altogether when the gate says no, route with
        :func:`langchain_rag_gates.route_by_gate`.
    """

    retriever: BaseRetriever = Field(..., description="The LangChain retriever to gate.")
    gate: Any = Field(
        ...,
        exclude=True,
        description="Any rag-gates gate (rag_gates.gate.Gate): decide/adecide on the query.",
    )
    k: int | None = Field(
        None,
        ge=1,
        strict=True,  # k="3" is refused here as it is by invoke(k=...)
        description=(
            "Number of documents to return: passed on to the wrapped retriever as `k` and "
            "the result cut to it. None = the wrapped retriever's own number."
        ),
    )

    on_gate_error: GateErrorPolicy = Field(
        "raise",
        description=(
            "When gate.decide raises (a served model's timeout or unreadable reply through "
            "a framework client, a prompt too long for the gate's model): 'raise' the "
            "gate's error, or 'retrieve' (fail closed: retrieve, the decision's reason and "
            "evidence['error'] name the error, and a warning is logged)."
        ),
    )

    model_config = ConfigDict(arbitrary_types_allowed=True)

    _last_decision: GateDecision | None = PrivateAttr(None)

    @field_validator("retriever", mode="before")
    @classmethod
    def _check_retriever(cls, value: Any) -> Any:
        if isinstance(value, BaseRetriever):
            return value
        llama = any(c.__module__.startswith("llama_index") for c in type(value).__mro__)
        raise ValueError(
            f"retriever must be a LangChain retriever (e.g. vectorstore.as_retriever()), got "
            f"{type(value).__name__}" + (
                "; for a LlamaIndex retriever use llama_index.retrievers.rag_gates."
                "GatedRetriever" if llama else ""))

    @field_validator("gate")
    @classmethod
    def _check_gate(cls, value: Any) -> Any:
        return check_gate(value)

    @property
    def last_decision(self) -> GateDecision | None:
        """The most recent decision of this instance (per call: the custom events)."""
        return self._last_decision

    def _inner_kwargs(
        self, k: int | None, kwargs: dict[str, Any]
    ) -> tuple[int | None, dict[str, Any]]:
        k = self.k if k is None else k
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"k must be a positive int, got {k!r}")
        return k, ({**kwargs, "k": k} if k is not None else dict(kwargs))

    def _annotated(
        self, docs: list[Document], data: dict[str, JsonValue], k: int | None
    ) -> list[Document]:
        kept = docs if k is None else docs[:k]
        return [annotate_document(d, data) for d in kept]

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        k: int | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        k, inner_kwargs = self._inner_kwargs(k, kwargs)
        config = RunnableConfig(callbacks=run_manager.get_child())
        return gated_retrieve(
            _decide_in_run(self.gate, query, run_manager.get_child(), self.on_gate_error),
            record=lambda decision: self._report(decision, config),
            skipped=lambda decision, data: self._skipped(query, decision, data),
            retrieve=lambda: self.retriever.invoke(query, config=config, **inner_kwargs),
            annotate=lambda docs, data: self._annotated(docs, data, k))

    def _report(self, decision: GateDecision, config: RunnableConfig) -> dict[str, JsonValue]:
        """Keep ``decision`` as the last one and send it to the callbacks; its JSON."""
        self._last_decision = decision
        data = annotation(decision)
        dispatch_custom_event(DECISION_EVENT, data, config=config)
        return data

    async def _areport(self, decision: GateDecision, config: RunnableConfig
                       ) -> dict[str, JsonValue]:
        self._last_decision = decision
        data = annotation(decision)
        await adispatch_custom_event(DECISION_EVENT, data, config=config)
        return data

    def _skipped(self, query: str, decision: GateDecision, data: dict[str, JsonValue]
                 ) -> list[Document] | GateDecision:
        """The documents when the gate says no: none. Subclasses may answer otherwise, or
        return a decision to retrieve instead (it is reported, and the retrieval runs)."""
        return []

    async def _askipped(self, query: str, decision: GateDecision, data: dict[str, JsonValue]
                        ) -> list[Document] | GateDecision:
        return self._skipped(query, decision, data)

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        k: int | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        k, inner_kwargs = self._inner_kwargs(k, kwargs)
        config = RunnableConfig(callbacks=run_manager.get_child())
        return await agated_retrieve(
            await _adecide_in_run(self.gate, query, run_manager.get_child(),
                                  self.on_gate_error),
            record=lambda decision: self._areport(decision, config),
            skipped=lambda decision, data: self._askipped(query, decision, data),
            retrieve=lambda: _ainvoke_retriever(self.retriever, query, config, **inner_kwargs),
            annotate=lambda docs, data: self._annotated(docs, data, k))


class LangChainRetrieverAdapter(FrameworkRetrieverAdapter):
    """Any LangChain retriever as a rag-gates :class:`~rag_gates.retrieval.base.Retriever`.

    rag-gates pipelines (QuCo, and the later method pipelines) then retrieve from whatever a
    LangChain application already has: a vector store's ``as_retriever()``, BM25, an
    ensemble, a :class:`GatedRetriever`, ...

    ``retrieve(query, k)`` calls ``retriever.invoke(query, k=k)`` (``aretrieve``:
    ``ainvoke``): vector store retrievers read ``k``, retrievers that take no extra
    arguments ignore it, and the result is cut to ``k`` either way. Documents become
    passages with :func:`~langchain_rag_gates.document_to_passage`. Called inside a
    LangChain run (a runnable's ``invoke``), the retriever run nests under it: LangChain
    passes the parent's callbacks through its context.

    Args:
        retriever: any LangChain ``BaseRetriever``.
        name: name used in traces (default ``"langchain:<class name>"``).

    Example:
        >>> from langchain_core.vectorstores import InMemoryVectorStore
        >>> from langchain_rag_gates import LangChainRetrieverAdapter
        >>> store = InMemoryVectorStore.from_texts(texts, embedding=embeddings)
        >>> retriever = LangChainRetrieverAdapter(store.as_retriever())
        >>> retriever.retrieve("Who directed Ed Wood?", k=3)[0].text
    """

    native = BaseRetriever
    kind = "LangChain BaseRetriever (e.g. store.as_retriever())"
    prefix = "langchain"
    retriever: BaseRetriever

    def __init__(self, retriever: BaseRetriever, name: str | None = None) -> None:
        super().__init__(retriever, name)

    def _fetch(self, query: str, k: int) -> list[Document]:
        return self.retriever.invoke(query, k=k)

    async def _afetch(self, query: str, k: int) -> list[Document]:
        return await _ainvoke_retriever(self.retriever, query, None, k=k)

    def _passages(self, items: Sequence[Any]) -> list[Passage]:
        return documents_to_passages(items)
