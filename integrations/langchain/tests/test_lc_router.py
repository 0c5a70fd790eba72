"""GateRouter in real LCEL chains: a retrieval chain (vector store retriever + prompt +
ChatRagGates on the tiny model) or the model alone, chosen by a real gate."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableLambda, RunnablePassthrough
from test_lc_gated import ASK, SKIP, CapitalisedWordsGate, store

from langchain_rag_gates import ChatRagGates, GateRouter, route_by_gate
from langchain_rag_gates.retrievers import DECISION_EVENT
from langchain_rag_gates.runnables import DIRECT_TAG, RETRIEVE_TAG
from rag_gates.gate import BaseGate
from rag_gates.types import GateDecision

KEY = "rag_gates"
RAG_PROMPT = ChatPromptTemplate.from_messages(
    [("system", "Answer from the context."), ("human", "Context:\n{context}\n\nQ: {question}")]
)
DIRECT_PROMPT = ChatPromptTemplate.from_messages([("human", "Q: {question}")])


def format_docs(docs: list[Document]) -> str:
    return "\n\n".join(d.page_content for d in docs)


class ChatRecorder(BaseCallbackHandler):
    """What reached the chat model (messages, tags) and the custom events."""

    def __init__(self) -> None:
        self.prompts: list[tuple[str, list[str]]] = []
        self.events: list[tuple[str, Any, UUID]] = []
        self.chains: list[tuple[str, UUID]] = []

    def on_chat_model_start(
        self, serialized: dict[str, Any], messages: list[list[BaseMessage]], *,
        run_id: UUID, tags: list[str] | None = None, **kwargs: Any,
    ) -> None:
        text = "\n".join(str(m.content) for m in messages[0])
        self.prompts.append((text, list(tags or [])))

    def on_chain_start(
        self, serialized: dict[str, Any] | None, inputs: Any, *, run_id: UUID, **kwargs: Any
    ) -> None:
        self.chains.append((kwargs.get("name", ""), run_id))

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.events.append((name, data, run_id))


@pytest.fixture(scope="module")
def llm() -> ChatRagGates:
    from rag_gates.testing import tiny_lm

    return ChatRagGates(lm=tiny_lm(seed=0, max_context=4096), max_tokens=4)


@pytest.fixture(scope="module")
def retriever() -> BaseRetriever:
    return store().as_retriever(search_kwargs={"k": 2})


@pytest.fixture(scope="module")
def rag_chain(llm: ChatRagGates, retriever: BaseRetriever) -> Runnable[Any, Any]:
    return (
        {"context": retriever | format_docs, "question": RunnablePassthrough()}
        | RAG_PROMPT
        | llm
    )


@pytest.fixture(scope="module")
def router(llm: ChatRagGates, rag_chain: Runnable[Any, Any]) -> GateRouter:
    return route_by_gate(CapitalisedWordsGate(2), retrieve=rag_chain, direct=DIRECT_PROMPT | llm)


def test_invoke_routes_by_the_decision_and_attaches_it(
    router: GateRouter, rag_chain: Runnable[Any, Any], llm: ChatRagGates
) -> None:
    rec = ChatRecorder()
    msg = router.invoke(ASK, config={"callbacks": [rec]})
    assert isinstance(msg, AIMessage)
    decision = GateDecision.model_validate(msg.response_metadata[KEY])
    assert decision.retrieve and decision.score == 5.0
    # Same answer as the retrieval chain alone (greedy decoding), model metadata kept.
    assert msg.content == rag_chain.invoke(ASK).content
    assert msg.response_metadata["model_provider"] == "rag_gates"
    ((prompt, tags),) = rec.prompts
    assert "Context:\nEd Wood" in prompt and RETRIEVE_TAG in tags

    rec = ChatRecorder()
    msg = router.invoke(SKIP, config={"callbacks": [rec]})
    assert msg.response_metadata[KEY]["retrieve"] is False
    assert msg.content == (DIRECT_PROMPT | llm).invoke(SKIP).content
    ((prompt, tags),) = rec.prompts
    assert prompt == f"Q: {SKIP}" and DIRECT_TAG in tags
    # The retriever never ran on the direct route.
    assert not any(name == "VectorStoreRetriever" for name, _ in rec.chains)


def test_decision_is_a_custom_event_of_the_router_run(router: GateRouter) -> None:
    rec = ChatRecorder()
    router.invoke(SKIP, config={"callbacks": [rec]})
    ((name, data, run_id),) = rec.events
    assert name == DECISION_EVENT and data["retrieve"] is False
    assert run_id == next(r for n, r in rec.chains if n == "GateRouter")


def test_batch_keeps_order_and_routes_each(router: GateRouter) -> None:
    out = router.batch([ASK, SKIP, ASK])
    assert [m.response_metadata[KEY]["retrieve"] for m in out] == [True, False, True]
    assert out[0].content == out[2].content


async def test_ainvoke_abatch_use_adecide(llm: ChatRagGates, rag_chain: Runnable[Any, Any]) -> None:
    calls: list[str] = []

    class AsyncOnlyGate(CapitalisedWordsGate):
        def decide(self, query: str, **signals: Any) -> GateDecision:
            raise AssertionError("the async path must call adecide")

        async def adecide(self, query: str, **signals: Any) -> GateDecision:
            calls.append(query)
            return BaseGate.decide(self, query, **signals)

    router = route_by_gate(AsyncOnlyGate(2), retrieve=rag_chain, direct=DIRECT_PROMPT | llm)
    msg = await router.ainvoke(ASK)
    assert msg.response_metadata[KEY]["retrieve"] is True
    assert msg.content == (await rag_chain.ainvoke(ASK)).content
    out = await router.abatch([SKIP, ASK])
    assert [m.response_metadata[KEY]["retrieve"] for m in out] == [False, True]
    assert sorted(calls) == sorted([ASK, SKIP, ASK])  # abatch may decide in any order


def test_stream_yields_the_branch_chunks_with_the_decision_first(router: GateRouter) -> None:
    for question, retrieve in [(ASK, True), (SKIP, False)]:
        chunks = list(router.stream(question))
        assert all(isinstance(c, AIMessageChunk) for c in chunks)
        assert chunks[0].response_metadata[KEY]["retrieve"] is retrieve
        merged = chunks[0]
        for c in chunks[1:]:
            merged = merged + c
        assert merged.content == router.invoke(question).content
        assert merged.response_metadata[KEY]["retrieve"] is retrieve


async def test_astream_and_astream_events(router: GateRouter) -> None:
    chunks = [c async for c in router.astream(ASK)]
    assert chunks[0].response_metadata[KEY]["retrieve"] is True
    assert "".join(str(c.content) for c in chunks) == router.invoke(ASK).content
    events = [e async for e in router.astream_events(SKIP, version="v2")]
    custom = [e for e in events if e["event"] == "on_custom_event"]
    assert [(e["name"], e["data"]["retrieve"]) for e in custom] == [(DECISION_EVENT, False)]


def test_composes_in_lcel_with_dict_inputs_and_outputs(
    llm: ChatRagGates, retriever: BaseRetriever
) -> None:
    # Dict input: the gate reads input["question"]; both branches get the whole dict.
    rag = (
        RunnablePassthrough.assign(context=(lambda x: x["question"]) | retriever | format_docs)
        | RAG_PROMPT | llm
    )
    chain = route_by_gate(CapitalisedWordsGate(2), retrieve=rag, direct=DIRECT_PROMPT | llm)
    full = RunnableLambda(lambda q: {"question": q}) | chain | StrOutputParser()
    text = full.invoke(ASK)
    assert isinstance(text, str) and text == rag.invoke({"question": ASK}).content

    # Dict outputs carry the decision under "rag_gates"; custom keys and query keys work.
    router = GateRouter(
        gate=CapitalisedWordsGate(2),
        retrieve=lambda x: {"docs": len(retriever.invoke(x["q"]))},
        direct={"answer": DIRECT_PROMPT | llm | StrOutputParser()},
        query_key="q",
        annotation_key="gate",
    )
    out = router.invoke({"q": ASK, "question": ASK})
    assert out["docs"] == 2 and out["gate"]["retrieve"] is True
    out = router.invoke({"q": SKIP, "question": SKIP})
    assert isinstance(out["answer"], str) and out["gate"]["retrieve"] is False


def test_bad_inputs_say_what_to_do(router: GateRouter, llm: ChatRagGates) -> None:
    with pytest.raises(KeyError, match="query_key"):
        router.invoke({"query": ASK})
    with pytest.raises(TypeError, match="str or a dict"):
        router.invoke(3)
    with pytest.raises(TypeError, match="Gate protocol"):
        route_by_gate(object(), retrieve=llm, direct=llm)
    with pytest.raises(TypeError, match="Runnable"):
        route_by_gate(CapitalisedWordsGate(1), retrieve=3, direct=llm)  # type: ignore[arg-type]


def test_a_skip_on_a_score_that_is_no_number_takes_the_retrieval_route(
    llm: ChatRagGates, rag_chain: Runnable[Any, Any]
) -> None:
    """A gate outside BaseGate that skips on NaN: the router fails closed (audit s15 #4)."""
    from rag_gates.testing import NaNSkippingGate

    router = route_by_gate(NaNSkippingGate(), retrieve=rag_chain,
                           direct=DIRECT_PROMPT | llm)
    said = router.invoke(SKIP).response_metadata[KEY]
    assert said["retrieve"] is True and "remote could not decide" in said["reason"]


def test_on_gate_error_retrieve_takes_the_retrieval_route(
    llm: ChatRagGates, rag_chain: Runnable[Any, Any]
) -> None:
    """A gate that raises (a served model's timeout): the router raises by default, and with
    ``on_gate_error="retrieve"`` takes the retrieval route and names the error."""
    from rag_gates.gate import BaseGate

    class TimedOut(BaseGate):
        name = "timed-out"

        def score(self, query: str, **signals: Any) -> tuple[float, dict[str, Any]]:
            raise TimeoutError("the served model did not answer in 30 s")

    with pytest.raises(TimeoutError):
        route_by_gate(TimedOut(0.5), retrieve=rag_chain, direct=DIRECT_PROMPT | llm).invoke(SKIP)
    router = route_by_gate(TimedOut(0.5), retrieve=rag_chain, direct=DIRECT_PROMPT | llm,
                           on_gate_error="retrieve")
    said = router.invoke(SKIP).response_metadata[KEY]
    assert said["retrieve"] is True and "did not answer" in str(said["evidence"]["error"])
