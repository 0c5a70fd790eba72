"""route_by_gate answers once: when a gate that generated the closed-book answer skips
retrieval, that answer is the reply. LM calls are counted through rag-gates' recording
wrapper around the tiny model."""

from __future__ import annotations

from typing import Any

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda

from langchain_rag_gates import ChatRagGates, closed_book_prompt, route_by_gate
from rag_gates.confidence import AnswerLogprobGate
from rag_gates.lm.recorded import RecordedLM
from rag_gates.types import TraceRecorder

QUESTION = "Who wrote the play Hamlet?"


def _router(tiny: Any, rec: TraceRecorder, direct_prompt: Any = None) -> Any:
    lm = RecordedLM(tiny, rec)
    chat = ChatRagGates(lm=lm, max_tokens=12)
    gate = AnswerLogprobGate(lm, threshold=100.0, max_new_tokens=12)  # always skips
    return route_by_gate(gate, retrieve=RunnableLambda(lambda x: "retrieved"),
                         direct=(direct_prompt or closed_book_prompt()) | chat)


def test_a_skip_replies_with_the_gates_answer_in_one_generation(tiny: Any) -> None:
    direct = (closed_book_prompt() | ChatRagGates(lm=tiny, max_tokens=12)).invoke(
        {"question": QUESTION})
    rec = TraceRecorder()
    msg = _router(tiny, rec).invoke({"question": QUESTION})
    assert rec.trace().llm_calls == 1
    assert msg.content == direct.content
    assert msg.response_metadata["rag_gates"]["answer_once"]["answer_reused"] is True


async def test_async_and_stream_answer_once(tiny: Any) -> None:
    rec = TraceRecorder()
    router = _router(tiny, rec)
    await router.ainvoke({"question": QUESTION})
    chunks = list(router.stream({"question": QUESTION}))
    assert rec.trace().llm_calls == 2  # two questions, one generation each
    assert chunks[0].response_metadata["rag_gates"]["answer_once"]["answer_reused"] is True


async def test_async_skip_loads_a_lazy_chat_model_off_the_event_loop(tiny: Any,
                                                                     tiny_dir: Any) -> None:
    """The answer-once check reads the direct model: a lazy ChatRagGates loads it in a worker
    thread on the async paths (before, the coroutine loaded it, stalling the loop)."""
    import threading

    from rag_gates.testing import model_load_threads

    gate = AnswerLogprobGate(tiny, threshold=100.0, max_new_tokens=12)
    for call in ("ainvoke", "astream"):
        router = route_by_gate(gate, retrieve=RunnableLambda(lambda x: "retrieved"),
                               direct=closed_book_prompt()
                               | ChatRagGates(model=str(tiny_dir), max_tokens=12))
        with model_load_threads() as threads:
            if call == "ainvoke":
                msg = await router.ainvoke({"question": QUESTION})
            else:
                chunks = [c async for c in router.astream({"question": QUESTION})]
                msg = chunks[0]
        assert len(threads) == 1 and threads[0] is not threading.current_thread(), call
        assert "answer_once" in msg.response_metadata["rag_gates"]


def test_later_steps_still_run_on_the_reused_answer(tiny: Any) -> None:
    rec = TraceRecorder()
    lm = RecordedLM(tiny, rec)
    gate = AnswerLogprobGate(lm, threshold=100.0, max_new_tokens=12)
    router = route_by_gate(gate, retrieve=RunnableLambda(lambda x: "retrieved"),
                           direct=closed_book_prompt() | ChatRagGates(lm=lm, max_tokens=12)
                           | StrOutputParser())
    out = router.invoke({"question": QUESTION})
    assert isinstance(out, str) and rec.trace().llm_calls == 1


def test_another_direct_prompt_generates_again_and_says_why(tiny: Any) -> None:
    rec = TraceRecorder()
    other = ChatPromptTemplate.from_template("Question: {question}")
    msg = _router(tiny, rec, direct_prompt=other).invoke({"question": QUESTION})
    assert rec.trace().llm_calls == 2
    note = msg.response_metadata["rag_gates"]["answer_once"]
    assert note["answer_reused"] is False and "prompt differs" in note["why"]


def test_a_loaded_spec_serves_in_the_router_and_retriever(tiny: Any, tmp_path: Any) -> None:
    """A spec from rag_gates.calibration goes wherever a gate goes: the router decides with
    its certified threshold, names the spec, and still answers once."""
    from langchain_core.retrievers import BaseRetriever

    from langchain_rag_gates import GatedRetriever
    from rag_gates.calibration import load_gate
    from rag_gates.testing import tiny_gate_spec

    class Everything(BaseRetriever):
        def _get_relevant_documents(self, query: str, **kwargs: Any) -> list[Any]:
            from langchain_core.documents import Document

            return [Document(page_content="Hamlet is a play by Shakespeare.")]

    rec = TraceRecorder()
    lm = RecordedLM(tiny, rec)
    spec = tiny_gate_spec(tiny, tmp_path / "gate.json")
    gate = load_gate(spec, lm=lm)
    router = route_by_gate(gate, retrieve=RunnableLambda(lambda x: "retrieved"),
                           direct=closed_book_prompt() | ChatRagGates(lm=lm, max_tokens=12))
    question = "Who founded the company number 3?"  # scored below the certified threshold
    msg = router.invoke({"question": question})
    decision = msg.response_metadata["rag_gates"]
    assert decision["retrieve"] is False and decision["evidence"]["spec"]["name"] == str(spec)
    assert rec.trace().llm_calls == 1  # the spec's gate generated; reused
    assert GatedRetriever(retriever=Everything(), gate=gate).invoke(question) == []


async def test_async_steps_after_the_model_run_on_the_reused_answer(tiny: Any) -> None:
    """A step after the model that has only an async function: ainvoke and astream run it
    with ainvoke on the reused answer, as they do on a fresh one (before, the reuse path
    called its sync invoke, which LangChain refuses for a coroutine function)."""
    async def shout(message: Any) -> str:
        return str(message.content).upper()

    rec = TraceRecorder()
    lm = RecordedLM(tiny, rec)
    gate = AnswerLogprobGate(lm, threshold=100.0, max_new_tokens=12)  # always skips
    direct = closed_book_prompt() | ChatRagGates(lm=lm, max_tokens=12) | RunnableLambda(shout)
    router = route_by_gate(gate, retrieve=RunnableLambda(lambda x: "retrieved"),
                           direct=direct)
    fresh = await direct.ainvoke({"question": QUESTION})
    out = await router.ainvoke({"question": QUESTION})
    assert out == fresh and out == out.upper() and out.strip()
    streamed = [c async for c in router.astream({"question": QUESTION})]
    assert "".join(streamed) == fresh
    # One generation for the direct run, one for each routed question (the gate's).
    assert rec.trace().llm_calls == 3
