"""A served model in LlamaIndex (issue 58): every gate its replies allow, built by name through
the gate registry or loaded from ``rag-gates calibrate --model openai:URL``'s spec, decides in
``GatedRetriever`` as it does in the core; and LlamaIndex's own ``OpenAILike`` client of the
same server, wrapped with ``as_text_lm``, drives the gates as the core's client does, in
``GatedRetriever`` and in ``GatedQueryEngine`` (where it also answers).

The server is llama-cpp-python's running the embedded SmolLM2 GGUF, replayed
(``tests/lm/served_frameworks.py`` says from what, and how to re-record): calibrate's
recording for ``OpenAICompatibleLM``, ``data/served-openailike-llamacpp-0.3.36.json`` for
``OpenAILike``. The reference decisions are the core gate classes' on
``OpenAICompatibleLM``, computed without the registry or LlamaIndex.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.base.response.schema import Response
from llama_index.core.query_engine import CustomQueryEngine
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.llms.rag_gates import GenerationOptions, as_text_lm
from llama_index.query_engine.rag_gates import GatedQueryEngine
from llama_index.retrievers.rag_gates import ANNOTATION_KEY, GateDecisionEvent, GatedRetriever

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

RECORDING = served.OPENAILIKE_RECORDING
UPSTREAM = os.environ.get("RAG_GATES_RECORD_UPSTREAM")
N_OWN = served.N_FRAMEWORK_QUESTIONS
MODEL_GATES = served.MODEL_GATES


class Passages(BaseRetriever):
    """The retriever under the gate: the shipped corpus's passages that share the most words
    with the query (any retriever would do). It keeps the queries it was asked, so a test
    sees which questions reached it."""

    def __init__(self, nodes: list[TextNode]) -> None:
        super().__init__()
        self.nodes = nodes
        self.asked: list[str] = []

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        self.asked.append(query_bundle.query_str)
        words = set(query_bundle.query_str.lower().split())
        scored = [NodeWithScore(node=n, score=float(len(words & set(n.text.lower().split()))))
                  for n in self.nodes]
        return sorted(scored, key=lambda n: -(n.score or 0.0))[:2]


class Answers(CustomQueryEngine):
    """The query engine behind ``GatedQueryEngine``: answers from its retriever's passages
    (their titles), so a test sees which questions it was asked."""

    retriever: Any

    def custom_query(self, query_str: str) -> Response:
        nodes = self.retriever.retrieve(query_str)
        return Response(response=", ".join(n.node.metadata["title"] for n in nodes),
                        source_nodes=nodes)


def openai_like(url: str, **kwargs: Any) -> Any:
    """LlamaIndex's client of the server (a chat model; greedy unless a call says otherwise;
    no budget of its own, which would override the per-call one)."""
    from llama_index.llms.openai_like import OpenAILike

    return OpenAILike(api_base=url, api_key="none", model="smollm2", is_chat_model=True,
                      temperature=0.0, max_retries=0, **kwargs)


def call_kwargs(o: GenerationOptions) -> dict[str, Any]:
    """What each rag-gates call sends OpenAILike: the budget, the temperature, a sample's
    seed, and log-probabilities when wanted (the OpenAI API's names)."""
    kwargs: dict[str, Any] = {"max_tokens": o.max_new_tokens, "temperature": o.temperature}
    if o.seed is not None:
        kwargs["seed"] = o.seed
    if o.logprobs is not None:
        kwargs.update(logprobs=True, top_logprobs=o.logprobs)
    return kwargs


def own_lm(url: str) -> Any:
    return as_text_lm(openai_like(url), supports_logprobs=True, call_kwargs=call_kwargs)


# ---------------------------------------------------------------- fixtures

# calibrate's server (replayed), its corpus index, the questions and the core's decisions
server, stats, asked, refs = served.server, served.stats, served.asked, served.refs


@pytest.fixture(scope="module")
def own_server() -> Iterator[Any]:
    """The same server as OpenAILike's requests recorded it."""
    with served.replay_server_class()(RECORDING, upstream=UPSTREAM) as s:
        yield s


@pytest.fixture(scope="module")
def quco_spec(server: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``rag-gates calibrate --model openai:URL --gates quco``: a spec that needs the corpus
    index calibrate built of ``--corpus``."""
    return served.calibrate(server.url, tmp_path_factory.mktemp("calibrate"), gates="quco")


@pytest.fixture
def passages() -> Passages:
    from rag_gates.commands.calibrate import read_corpus

    return Passages([TextNode(text=p.text, metadata={"title": p.title})
                     for p in read_corpus(served.CORPUS)[:300]])


def assert_retrieves_as(retriever: GatedRetriever, passages: Passages, questions: list[str],
                        expected: tuple[bool, ...], scores: tuple[float, ...] | None,
                        collector: Any) -> None:
    """The wrapped retriever is asked exactly the questions ``expected`` retrieves for; the
    nodes, the instrumentation events and ``last_decision`` name the gate and its score."""
    start = len(collector.of(GateDecisionEvent))
    found = [retriever.retrieve(q) for q in questions]
    events = collector.of(GateDecisionEvent)[start:]
    name = retriever.gate.name
    assert passages.asked == [q for q, r in zip(questions, expected, strict=True) if r]
    assert [bool(n) for n in found] == list(expected)
    assert [e.query_str for e in events] == questions
    assert [e.retrieve for e in events] == list(expected)
    assert {e.decision["gate"] for e in events} == {name}
    for nodes, event in zip(found, events, strict=True):
        assert all(n.node.metadata[ANNOTATION_KEY] == event.decision for n in nodes)
    if scores is not None:
        assert [e.decision["score"] for e in events] == pytest.approx(list(scores), abs=1e-9)
        assert {e.decision["threshold"] for e in events} == {retriever.gate.threshold}
    assert retriever.last_decision == events[-1].gate_decision()


# ---------------------------------------------------------------- by name, OpenAICompatibleLM


@pytest.mark.parametrize("label", served.LABELS)
def test_each_served_gate_by_name_retrieves_where_the_core_decides(
        server: Any, stats: Any, refs: dict[str, Any], asked: list[str], passages: Passages,
        collector: Any, label: str) -> None:
    ref = refs[label]
    gate = make_gate(ref.expression, GateContext(lm=OpenAICompatibleLM(server.url),
                                                 corpus=stats, options=served.OPTIONS))
    assert gate.name == ref.name
    assert_retrieves_as(GatedRetriever(passages, gate=gate), passages, asked, ref.retrieve,
                        ref.scores, collector)


def test_the_async_path_decides_as_the_sync_one(server: Any, stats: Any,
                                                 refs: dict[str, Any], asked: list[str],
                                                 passages: Passages) -> None:
    """``aretrieve`` (``gate.adecide``): the same decisions, the same questions retrieved."""
    ref = refs[served.CASCADE]
    gate = make_gate(ref.expression, GateContext(lm=OpenAICompatibleLM(server.url),
                                                 corpus=stats, options=served.OPTIONS))
    retriever = GatedRetriever(passages, gate=gate)

    async def run() -> list[list[NodeWithScore]]:
        return [await retriever.aretrieve(q) for q in asked[:10]]

    found = asyncio.run(run())
    assert [bool(n) for n in found] == list(ref.retrieve[:10])
    assert passages.asked == [q for q, r in zip(asked[:10], ref.retrieve, strict=False) if r]


# ---------------------------------------------------------------- calibrate's spec


def test_calibrates_spec_loads_with_its_corpus_index_and_decides_as_in_the_core(
        server: Any, stats: Any, refs: dict[str, Any], asked: list[str], passages: Passages,
        quco_spec: Path, collector: Any) -> None:
    from rag_gates.calibration import GateSpec, load_gate

    loaded = GateSpec.load(quco_spec)
    assert loaded.gate == "quco" and loaded.certified and loaded.model.kind == "endpoint"
    core = load_gate(quco_spec, lm=OpenAICompatibleLM(server.url), corpus=stats)
    expected = [core.decide(q) for q in asked]
    # The certified threshold on the core gate class's own scores.
    assert [d.retrieve for d in expected] == [s >= loaded.threshold
                                              for s in refs["quco"].scores]
    assert 0 < sum(d.retrieve for d in expected) < len(asked)
    gate = load_gate(quco_spec, lm=OpenAICompatibleLM(server.url), corpus=stats)
    assert_retrieves_as(GatedRetriever(passages, gate=gate), passages, asked,
                        tuple(d.retrieve for d in expected),
                        tuple(d.score for d in expected), collector)
    events = collector.of(GateDecisionEvent)[-len(asked):]
    assert all(e.decision["evidence"]["spec"]["certified"] is True for e in events)


def test_a_malformed_reply_retrieves_through_the_framework_and_says_why(
        server: Any, stats: Any, refs: dict[str, Any], asked: list[str],
        passages: Passages) -> None:
    """Fail closed: a reply the server sends malformed leaves each served gate undecided;
    the retriever retrieves (the gate did not raise: no ``on_gate_error`` needed), and the
    decision says why."""
    lm = OpenAICompatibleLM(server.url, max_retries=0)
    for name in MODEL_GATES:
        gate = make_gate(refs[name].expression,
                         GateContext(lm=lm, corpus=stats, options=served.OPTIONS))
        question = next(q for q in asked if not gate.decide(q).retrieve)  # a skip, replayed
        passages.asked.clear()
        server.faults.append(("body", served.MALFORMED))
        nodes = GatedRetriever(passages, gate=gate).retrieve(question)
        assert not server.faults and passages.asked == [question], name
        said = nodes[0].node.metadata[ANNOTATION_KEY]
        assert said["retrieve"] is True and "could not decide" in said["reason"], said
        assert "not an OpenAI reply" in said["reason"], said["reason"]


# ---------------------------------------------------------------- LlamaIndex's own OpenAILike


@pytest.fixture(scope="module")
def own(own_server: Any, refs: dict[str, Any], asked: list[str]) -> dict[str, list[Any]]:
    """The served gates on ``as_text_lm(OpenAILike(...))``: their decisions on the first
    questions, each question's gates in calibrate's order (``served.MODEL_GATES``), so a
    recording made in that order holds the replies calibrate's holds."""
    return served.framework_decisions(own_lm(own_server.url), refs, asked)


@pytest.mark.parametrize("name", MODEL_GATES)
def test_openailike_drives_the_gate_as_the_core_client_does(
        own_server: Any, own: dict[str, list[Any]], refs: dict[str, Any], asked: list[str],
        passages: Passages, collector: Any, name: str) -> None:
    """``as_text_lm(OpenAILike(...), call_kwargs=...)`` as the gate's model: the server's
    replies to the same chat requests as OpenAICompatibleLM's, read to the same scores and
    decisions; in ``GatedRetriever`` it retrieves where the core gate does."""
    ref = refs[name]
    assert [d.score for d in own[name]] == pytest.approx(ref.scores[:N_OWN], abs=1e-9)
    assert [d.retrieve for d in own[name]] == list(ref.retrieve[:N_OWN])
    assert 0 < sum(ref.retrieve[:N_OWN]) < N_OWN
    gate = make_gate(ref.expression, GateContext(lm=own_lm(own_server.url),
                                                 options=served.OPTIONS))
    assert_retrieves_as(GatedRetriever(passages, gate=gate), passages, asked[:N_OWN],
                        ref.retrieve[:N_OWN], ref.scores[:N_OWN], collector)


def test_openailike_samples_are_seeded_call_options(
        own_server: Any, own: dict[str, list[Any]], asked: list[str]) -> None:
    """The adapter takes sample-agreement's ``seed`` and hands it to ``call_kwargs``, so the
    samples reach the server seeded ``seed + i`` at its temperature and a decision
    repeats."""
    lm = own_lm(own_server.url)
    gate = make_gate("sample-agreement", GateContext(lm=lm, options=served.OPTIONS))
    start = len(own_server.requests)
    again = gate.decide(asked[0])
    sent = [body for path, body in own_server.requests[start:]
            if path.endswith("/chat/completions")]
    assert [(b.get("seed"), b["temperature"], b["max_tokens"]) for b in sent] == \
        [(None, 0.0, 8)] + [(i, 0.7, 8) for i in range(5)]
    first = own["sample-agreement"][0]
    assert again.evidence["samples"] == first.evidence["samples"]
    assert len(set(first.evidence["samples"])) > 1  # sampled, not five greedy answers
    assert again.score == first.score


def test_the_written_tokens_log_probabilities_are_read_not_the_likeliest(
        own_server: Any, own: dict[str, list[Any]], asked: list[str]) -> None:
    """llama-cpp-python's server applies a repeat penalty by default, so a greedy reply can
    write a token that is not the likeliest: on "Jürgen W. Falter" it writes "2019" where
    "2" was likelier than "1". LlamaIndex's ``logprobs`` rows list the likeliest tokens
    (spelling "2029"); the adapter reads the written ones from the reply OpenAILike keeps."""
    from rag_gates.prompts import qa_prompt

    question = next(q for q in asked if "Falter" in q)
    lm = own_lm(own_server.url)
    g = lm.generate(qa_prompt(question), max_new_tokens=8, logprobs=5)
    assert g.text == "In 2019, J" and "".join(t.token for t in g.logprobs) == g.text
    fifth = g.logprobs[4]
    assert fifth.token == "1" and fifth.top_logprobs[0].token == "2"
    assert fifth.top_logprobs[0].logprob > fifth.logprob
    assert own["answer-logprob"][asked.index(question)].evidence.get("undecided") is None


def test_gated_query_engine_on_openailike_answers_a_skip_itself(
        own_server: Any, own: dict[str, list[Any]], refs: dict[str, Any], asked: list[str],
        passages: Passages) -> None:
    """GatedQueryEngine with OpenAILike as the gate's model and as the answering LLM: the
    wrapped engine answers exactly the questions the gate retrieves for; a skip is answered
    by the LLM with the gate's own prompt, which is the gate's closed-book answer."""
    ref = refs["answer-logprob"]
    gate = make_gate(ref.expression, GateContext(lm=own_lm(own_server.url),
                                                 options=served.OPTIONS))
    engine = GatedQueryEngine(Answers(retriever=passages), gate=gate,
                              llm=openai_like(own_server.url, max_tokens=8))
    for question, decision in zip(asked[:N_OWN], own["answer-logprob"], strict=False):
        response = engine.query(question)
        said = response.metadata[ANNOTATION_KEY]
        assert said["retrieve"] is decision.retrieve and said["score"] == decision.score
        if decision.retrieve:
            assert response.source_nodes and passages.asked[-1] == question
        else:
            assert response.source_nodes == []
            assert response.response == decision.evidence["closed_book_answer"]
            assert said["answer_once"]["answer_reused"] is False  # the LLM wrote it again
    assert passages.asked == [q for q, r in zip(asked[:N_OWN], ref.retrieve, strict=False)
                              if r]


def test_a_reply_openailike_cannot_read_fails_closed_under_on_gate_error_retrieve(
        own_server: Any, own: dict[str, list[Any]], refs: dict[str, Any], asked: list[str],
        passages: Passages) -> None:
    """A malformed reply reaches the gate as OpenAILike's own error (not a rag-gates
    ServerReplyError: the gate cannot tell it from a bug), so the gate raises; with
    ``on_gate_error="retrieve"`` the retriever retrieves and names the error."""
    gate = make_gate(refs["answer-logprob"].expression,
                     GateContext(lm=own_lm(own_server.url), options=served.OPTIONS))
    question = next(q for q, d in zip(asked, own["answer-logprob"], strict=False)
                    if not d.retrieve)
    own_server.faults.append(("body", served.MALFORMED))
    with pytest.raises(Exception):  # noqa: B017 - whichever error OpenAILike's parser raises
        GatedRetriever(passages, gate=gate).retrieve(question)
    assert passages.asked == []  # never a skip on a reply that was not read
    own_server.faults.append(("body", served.MALFORMED))
    nodes = GatedRetriever(passages, gate=gate, on_gate_error="retrieve").retrieve(question)
    assert not own_server.faults and passages.asked == [question]
    said = nodes[0].node.metadata[ANNOTATION_KEY]
    assert said["retrieve"] is True and "it raised" in said["reason"], said


def test_over_rag_gates_llm_the_seed_reaches_the_model_natively(tiny_li: Any) -> None:
    """The same seed option over RagGatesLLM (no ``call_kwargs`` needed): sample-agreement's
    samples are the in-process model's own seeded generations (a TypeError, "unexpected
    arguments ['seed']", before the adapter took the option)."""
    from llama_index.llms.rag_gates import RagGatesLLM

    from rag_gates.sample_agreement import SampleAgreementGate

    direct = SampleAgreementGate(tiny_li, samples=3, max_new_tokens=4).decide(
        "Who wrote Hamlet?")
    wrapped = SampleAgreementGate(as_text_lm(RagGatesLLM(lm=tiny_li)), samples=3,
                                  max_new_tokens=4).decide("Who wrote Hamlet?")
    samples = direct.evidence["samples"]
    assert wrapped.evidence["samples"] == samples and wrapped.score == direct.score
    assert isinstance(samples, list) and len(set(map(str, samples))) > 1
