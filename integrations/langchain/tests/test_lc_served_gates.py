"""A served model in LangChain (issue 58): every gate its replies allow, built by name through
the gate registry or loaded from ``rag-gates calibrate --model openai:URL``'s spec, decides in
``GatedRetriever`` and ``route_by_gate`` as it does in the core; and LangChain's own
``ChatOpenAI`` of the same server, wrapped with ``as_text_lm``, drives the gates as the core's
client does.

The server is llama-cpp-python's running the embedded SmolLM2 GGUF, replayed
(``tests/lm/served_frameworks.py`` says from what, and how to re-record): calibrate's
recording for ``OpenAICompatibleLM``, ``data/served-chatopenai-llamacpp-0.3.36.json`` for
``ChatOpenAI``. The reference decisions are the core gate classes' on ``OpenAICompatibleLM``,
computed without the registry or LangChain.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableLambda
from pydantic import Field

from langchain_rag_gates import GatedRetriever, as_text_lm, route_by_gate
from langchain_rag_gates.retrievers import DECISION_EVENT
from rag_gates.lm.openai_compat import OpenAICompatibleLM
from rag_gates.registry import GateContext, make_gate

HERE = Path(__file__).resolve().parent


def _load_served() -> Any:
    """``tests/lm/served_frameworks.py``, loaded by path (``tests`` is no package here)."""
    name = "rag_gates_tests_served_frameworks"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, HERE.parents[2] / "tests" / "lm" / "served_frameworks.py")
        assert spec is not None and spec.loader is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


served = _load_served()

RECORDING = served.CHATOPENAI_RECORDING
UPSTREAM = os.environ.get("RAG_GATES_RECORD_UPSTREAM")
N_OWN = served.N_FRAMEWORK_QUESTIONS
MODEL_GATES = served.MODEL_GATES


class Passages(BaseRetriever):
    """The retriever under the gate: the shipped corpus's passages that share the most words
    with the query (any retriever would do). It keeps the queries it was asked, so a test
    sees which questions reached it."""

    passages: list[Document]
    asked: list[str] = Field(default_factory=list)

    def _get_relevant_documents(self, query: str, *, run_manager: Any, k: int = 2,
                                **kwargs: Any) -> list[Document]:
        self.asked.append(query)
        words = set(query.lower().split())
        return sorted(self.passages,
                      key=lambda d: -len(words & set(d.page_content.lower().split())))[:k]


class Decisions(BaseCallbackHandler):
    """The decisions reported to LangChain's callbacks (the ``rag_gates_decision`` event)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kwargs: Any) -> None:
        if name == DECISION_EVENT:
            self.seen.append(data)


# ---------------------------------------------------------------- fixtures

# calibrate's server (replayed), its corpus index, the questions and the core's decisions
server, stats, asked, refs = served.server, served.stats, served.asked, served.refs


@pytest.fixture(scope="module")
def own_server() -> Iterator[Any]:
    """The same server as ChatOpenAI's requests recorded it."""
    with served.replay_server_class()(RECORDING, upstream=UPSTREAM) as s:
        yield s


@pytest.fixture(scope="module")
def spec(server: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``rag-gates calibrate --model openai:URL --gates auto`` on the recorded questions."""
    return served.calibrate(server.url, tmp_path_factory.mktemp("calibrate"))


@pytest.fixture
def passages() -> Passages:
    from rag_gates.commands.calibrate import read_corpus

    return Passages(passages=[Document(page_content=p.text, metadata={"title": p.title})
                              for p in read_corpus(served.CORPUS)[:300]])


def chat_openai(url: str, *, budget: int | None = served.MAX_NEW_TOKENS) -> Any:
    """LangChain's client of the server. llama-cpp-python's server reads ``max_tokens`` only,
    and ChatOpenAI sends the budget as ``max_completion_tokens``: the gates' budget is given
    as the server reads it too (``budget=None``: not)."""
    from langchain_openai import ChatOpenAI

    extra = {"extra_body": {"max_tokens": budget}} if budget is not None else {}
    return ChatOpenAI(base_url=url, api_key="none", model="smollm2", max_retries=0, **extra)


def run_gated(retriever: GatedRetriever, questions: list[str]) -> tuple[list[list[Document]],
                                                                        list[dict[str, Any]]]:
    """Each question through the retriever: its documents, and the decisions reported."""
    events = Decisions()
    docs = [retriever.invoke(q, config={"callbacks": [events]}) for q in questions]
    return docs, events.seen


def assert_retrieves_as(retriever: GatedRetriever, passages: Passages, questions: list[str],
                        expected: tuple[bool, ...], scores: tuple[float, ...] | None) -> None:
    """The wrapped retriever is asked exactly the questions ``expected`` retrieves for; the
    documents, the reported decisions and ``last_decision`` name the gate and its score."""
    docs, events = run_gated(retriever, questions)
    name = retriever.gate.name
    assert passages.asked == [q for q, r in zip(questions, expected, strict=True) if r]
    assert [bool(d) for d in docs] == list(expected)
    assert [e["retrieve"] for e in events] == list(expected)
    assert {e["gate"] for e in events} == {name}
    for found, event in zip(docs, events, strict=True):
        assert all(d.metadata["rag_gates"] == event for d in found)
    if scores is not None:
        assert [e["score"] for e in events] == pytest.approx(list(scores), abs=1e-9)
        assert [e["threshold"] for e in events] == [retriever.gate.threshold] * len(questions)
    assert retriever.last_decision is not None
    assert retriever.last_decision.model_dump(mode="json") == events[-1]


# ---------------------------------------------------------------- by name, OpenAICompatibleLM


@pytest.mark.parametrize("label", served.LABELS)
def test_each_served_gate_by_name_retrieves_where_the_core_decides(
        server: Any, stats: Any, refs: dict[str, Any], asked: list[str], passages: Passages,
        label: str) -> None:
    ref = refs[label]
    gate = make_gate(ref.expression, GateContext(lm=OpenAICompatibleLM(server.url),
                                                 corpus=stats, options=served.OPTIONS))
    assert gate.name == ref.name
    assert_retrieves_as(GatedRetriever(retriever=passages, gate=gate, k=2), passages, asked,
                        ref.retrieve, ref.scores)


def test_the_async_path_decides_as_the_sync_one(server: Any, stats: Any,
                                                 refs: dict[str, Any], asked: list[str],
                                                 passages: Passages) -> None:
    """``ainvoke`` (``gate.adecide``): the same decisions, the same questions retrieved."""
    ref = refs[served.ANY_OF]
    gate = make_gate(ref.expression, GateContext(lm=OpenAICompatibleLM(server.url),
                                                 corpus=stats, options=served.OPTIONS))
    retriever = GatedRetriever(retriever=passages, gate=gate, k=2)

    async def run() -> list[list[Document]]:
        return [await retriever.ainvoke(q) for q in asked[:10]]

    docs = asyncio.run(run())
    assert [bool(d) for d in docs] == list(ref.retrieve[:10])
    assert passages.asked == [q for q, r in zip(asked[:10], ref.retrieve, strict=False) if r]


def test_route_by_gate_sends_exactly_the_questions_the_gate_retrieves_for(
        server: Any, refs: dict[str, Any], asked: list[str]) -> None:
    ref = refs["sample-agreement"]
    gate = make_gate(ref.expression, GateContext(lm=OpenAICompatibleLM(server.url),
                                                 options=served.OPTIONS))
    router = route_by_gate(gate, retrieve=RunnableLambda(lambda q: {"branch": "retrieve"}),
                           direct=RunnableLambda(lambda q: {"branch": "direct"}))
    out = [router.invoke(q) for q in asked]
    assert [o["branch"] == "retrieve" for o in out] == list(ref.retrieve)
    assert [o["rag_gates"]["score"] for o in out] == pytest.approx(list(ref.scores), abs=1e-9)
    assert {o["rag_gates"]["gate"] for o in out} == {"sample-agreement"}


# ---------------------------------------------------------------- calibrate's spec


def test_calibrates_spec_loads_and_decides_as_in_the_core(
        server: Any, stats: Any, refs: dict[str, Any], asked: list[str], passages: Passages,
        spec: Path) -> None:
    from rag_gates.calibration import GateSpec, load_gate

    loaded = GateSpec.load(spec)
    assert loaded.certified and loaded.model.kind == "endpoint"
    core = load_gate(spec, lm=OpenAICompatibleLM(server.url), corpus=stats)
    expected = [core.decide(q) for q in asked]
    if loaded.gate in refs and refs[loaded.gate].scores is not None:
        # The certified threshold on the core gate class's own scores.
        scores = refs[loaded.gate].scores
        assert [d.retrieve for d in expected] == [s >= loaded.threshold for s in scores]
    assert 0 < sum(d.retrieve for d in expected) < len(asked)
    gate = load_gate(spec, lm=OpenAICompatibleLM(server.url), corpus=stats)
    retriever = GatedRetriever(retriever=passages, gate=gate, k=2)
    docs, events = run_gated(retriever, asked)
    assert passages.asked == [q for q, d in zip(asked, expected, strict=True) if d.retrieve]
    assert [e["score"] for e in events] == pytest.approx([d.score for d in expected], abs=1e-9)
    assert {e["gate"] for e in events} == {core.name}
    assert all(e["threshold"] == loaded.threshold for e in events)
    # The spec's guarantee travels with each decision: its certificate is in the evidence.
    assert all(e["evidence"]["spec"]["certified"] is True for e in events)
    assert {e["evidence"]["spec"]["epsilon"] for e in events} == {loaded.epsilon}
    assert all(docs[i][0].metadata["rag_gates"] == events[i] for i in range(len(asked))
               if docs[i])


def test_a_malformed_reply_retrieves_through_the_framework_and_says_why(
        server: Any, stats: Any, refs: dict[str, Any], asked: list[str], passages: Passages,
        spec: Path) -> None:
    """Fail closed: a reply the server sends malformed leaves each served gate (and the
    certified spec) undecided; the retriever retrieves, and the decision says why."""
    from rag_gates.calibration import load_gate

    lm = OpenAICompatibleLM(server.url, max_retries=0)
    gates = {name: make_gate(refs[name].expression,
                             GateContext(lm=lm, corpus=stats, options=served.OPTIONS))
             for name in MODEL_GATES}
    gates["spec"] = load_gate(spec, lm=lm, corpus=stats)
    for name, gate in gates.items():
        question = next(q for q in asked if not gate.decide(q).retrieve)  # a skip, replayed
        passages.asked.clear()
        server.faults.append(("body", served.MALFORMED))
        docs = GatedRetriever(retriever=passages, gate=gate, k=2).invoke(question)
        assert not server.faults, name  # the malformed reply was the one read
        assert passages.asked == [question], name
        said = docs[0].metadata["rag_gates"]
        assert said["retrieve"] is True and "could not decide" in said["reason"], said
        assert "not an OpenAI reply" in said["reason"], said["reason"]


# ---------------------------------------------------------------- LangChain's own ChatOpenAI


@pytest.fixture(scope="module")
def own(own_server: Any, refs: dict[str, Any], asked: list[str]) -> dict[str, list[Any]]:
    """The served gates on ``as_text_lm(ChatOpenAI(...))``: their decisions on the first
    questions, each question's gates in calibrate's order (``served.MODEL_GATES``), so a
    recording made in that order holds the replies calibrate's holds."""
    lm = as_text_lm(chat_openai(own_server.url))
    assert lm.supports_logprobs  # ChatOpenAI declares logprobs / top_logprobs
    return served.framework_decisions(lm, refs, asked)


@pytest.mark.parametrize("name", MODEL_GATES)
def test_chatopenai_drives_the_gate_as_the_core_client_does(
        own_server: Any, own: dict[str, list[Any]], refs: dict[str, Any], asked: list[str],
        passages: Passages, name: str) -> None:
    """``as_text_lm(ChatOpenAI(...))`` as the gate's model: the server's replies to the same
    chat requests as OpenAICompatibleLM's, read to the same scores and decisions; in
    ``GatedRetriever`` it retrieves where the core gate does."""
    ref = refs[name]
    assert [d.score for d in own[name]] == pytest.approx(ref.scores[:N_OWN], abs=1e-9)
    assert [d.retrieve for d in own[name]] == list(ref.retrieve[:N_OWN])
    assert 0 < sum(ref.retrieve[:N_OWN]) < N_OWN
    lm = as_text_lm(chat_openai(own_server.url))
    gate = make_gate(ref.expression, GateContext(lm=lm, options=served.OPTIONS))
    assert_retrieves_as(GatedRetriever(retriever=passages, gate=gate, k=2), passages,
                        asked[:N_OWN], ref.retrieve[:N_OWN], ref.scores[:N_OWN])


def test_chatopenai_samples_are_seeded_call_options(
        own_server: Any, own: dict[str, list[Any]], asked: list[str]) -> None:
    """sample-agreement's samples reach the server seeded ``seed + i`` at its temperature
    (the adapter passes ``seed`` on as a ChatOpenAI call option), so a decision repeats."""
    lm = as_text_lm(chat_openai(own_server.url))
    gate = make_gate("sample-agreement", GateContext(lm=lm, options=served.OPTIONS))
    start = len(own_server.requests)
    again = gate.decide(asked[0])
    sent = [body for path, body in own_server.requests[start:]
            if path.endswith("/chat/completions")]
    assert [(b.get("seed"), b["temperature"]) for b in sent] == \
        [(None, 0.0)] + [(i, 0.7) for i in range(5)]
    assert {(b["max_tokens"], b["max_completion_tokens"]) for b in sent} == \
        {(served.MAX_NEW_TOKENS, served.MAX_NEW_TOKENS)}
    first = own["sample-agreement"][0]
    assert again.evidence["samples"] == first.evidence["samples"]
    assert len(set(first.evidence["samples"])) > 1  # sampled, not five greedy answers
    assert again.score == first.score


def test_a_reply_chatopenai_cannot_read_fails_closed_under_the_retrieve_policy(
        own_server: Any, own: dict[str, list[Any]], refs: dict[str, Any], asked: list[str],
        passages: Passages) -> None:
    """A malformed reply reaches the gate as ChatOpenAI's own error (not a rag-gates
    ServerReplyError: the gate cannot tell it from a bug), so the gate raises and the
    retriever with it; under ``gate_error_policy("retrieve")`` it retrieves instead and
    names the error."""
    from rag_gates.gated import gate_error_policy

    lm = as_text_lm(chat_openai(own_server.url))
    gate = make_gate(refs["answer-logprob"].expression, GateContext(lm=lm, options=served.OPTIONS))
    question = next(q for q, d in zip(asked, own["answer-logprob"], strict=False)
                    if not d.retrieve)
    retriever = GatedRetriever(retriever=passages, gate=gate, k=2)
    own_server.faults.append(("body", served.MALFORMED))
    with pytest.raises(Exception):  # noqa: B017 - whichever error ChatOpenAI's parser raises
        retriever.invoke(question)
    assert passages.asked == []  # never a skip on a reply that was not read
    own_server.faults.append(("body", served.MALFORMED))
    with gate_error_policy("retrieve"):
        docs = retriever.invoke(question)
    assert not own_server.faults and passages.asked == [question]
    said = docs[0].metadata["rag_gates"]
    assert said["retrieve"] is True and said["gate"] == "answer-logprob"
    assert "it raised" in said["reason"] and said["evidence"]["error"], said


def test_a_budget_the_server_ignores_is_warned_about(
        own_server: Any, own: dict[str, list[Any]], asked: list[str],
        caplog: pytest.LogCaptureFixture) -> None:
    """Without the budget as llama-cpp-python's server reads it, ChatOpenAI's
    ``max_completion_tokens`` is ignored: the answer runs past 8 tokens, and the adapter
    says so, naming the fix."""
    from rag_gates.prompts import qa_prompt

    lm = as_text_lm(chat_openai(own_server.url, budget=None))
    with caplog.at_level(logging.WARNING, logger="langchain_rag_gates.language_models"):
        long = lm.generate(qa_prompt(asked[0]), max_new_tokens=served.MAX_NEW_TOKENS)
    assert long.completion_tokens > served.MAX_NEW_TOKENS
    assert "extra_body={'max_tokens': 8}" in caplog.text
    assert own["answer-logprob"][0].evidence["closed_book_answer"] != long.text
