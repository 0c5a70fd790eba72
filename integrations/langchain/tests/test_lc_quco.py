"""QuCo-RAG as LangChain components, with real parts: a real corpus-statistics index
(``load_corpus_stats`` over the shipped HotpotQA/2Wiki slices, built here into a temporary
RAG_GATES_HOME), a real InMemoryVectorStore (embedded MiniLM), the real QuCoGate and
ClaimVerifier, ChatRagGates over the tiny random-weight Llama, LangChain callbacks, and
LangChain's standard tool suite.

* LangChainRetrieverAdapter: a LangChain retriever as a rag-gates Retriever;
* QuCoRunnable: the QuCo loop as a runnable (invoke / ainvoke / batch / abatch);
* ClaimVerifierTool: the verifier as a tool;
* the QuCo gate routing an LCEL chain (route_by_gate).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.language_models import FakeListChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_tests.unit_tests import ToolsUnitTests
from pydantic import ValidationError

from langchain_rag_gates import (
    ChatRagGates,
    ClaimVerifierInput,
    ClaimVerifierTool,
    LangChainRetrieverAdapter,
    QuCoRunnable,
    passages_to_documents,
    route_by_gate,
)
from langchain_rag_gates.retrievers import DECISION_EVENT
from rag_gates.quco import ClaimVerifier, QuCoConfig, QuCoGate, Verification
from rag_gates.retrieval.base import Retriever
from rag_gates.types import GateDecision, Trace
from rag_gates_lab.corpus import corpus_passages
from rag_gates_lab.plugins.quco import BENCH_TAU_ENTITY

pytest.importorskip("infini_gram", reason='needs the corpus extra: pip install "rag-gates[corpus]"')

SLICES = Path(__file__).resolve().parents[3] / "examples" / "data"
ASK = "Were Scott Derrickson and Ed Wood of the same nationality?"  # rare in the slices: 7, 8
SKIP = "What is the capital of the United States?"  # "United States": 115 > 82
FALSE_CLAIM = "Ed Wood was born in Paris."  # never together in the corpus
TOP_K = 3
SHORT = {"tau_entity": BENCH_TAU_ENTITY, "k": TOP_K, "chunk_tokens": 8, "max_new_tokens": 16}


# ---------------------------------------------------------------- real parts
@functools.cache
def store() -> InMemoryVectorStore:
    """The first four questions' paragraphs (Scott Derrickson, Ed Wood, distractors)."""
    from langchain_huggingface import HuggingFaceEmbeddings

    from rag_gates.lm.defaults import default_embedder_path

    embeddings = HuggingFaceEmbeddings(model_name=str(default_embedder_path()),
                                       model_kwargs={"device": "cpu"},
                                       encode_kwargs={"normalize_embeddings": True})

    vs = InMemoryVectorStore(embeddings)
    vs.add_documents(passages_to_documents(corpus_passages("hotpotqa", SLICES)[:40]))
    return vs


class Runs(BaseCallbackHandler):
    """Records chain, retriever and chat-model starts and custom events."""

    def __init__(self) -> None:
        self.starts: list[tuple[str, str, UUID, UUID | None]] = []
        self.events: list[tuple[str, Any, UUID]] = []

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID,
                       parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self.starts.append(("chain", kwargs.get("name", ""), run_id, parent_run_id))

    def on_retriever_start(self, serialized: Any, query: str, *, run_id: UUID,
                           parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self.starts.append(("retriever", query, run_id, parent_run_id))

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: UUID,
                            parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self.starts.append(("chat", "", run_id, parent_run_id))

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.events.append((name, data, run_id))


@pytest.fixture(scope="module")
def tiny_long() -> Any:
    """The tiny random-weight Llama with room for retrieved passages in its prompts."""
    from rag_gates.testing import tiny_lm

    return tiny_lm(seed=0, max_context=4096)


@pytest.fixture
def chat(tiny_long: Any) -> ChatRagGates:
    return ChatRagGates(lm=tiny_long, max_tokens=8)


@pytest.fixture
def quco(chat: ChatRagGates, corpus_stats: Any) -> QuCoRunnable:
    retriever = store().as_retriever(search_kwargs={"k": TOP_K})
    return QuCoRunnable(llm=chat, retriever=retriever, stats=corpus_stats, **SHORT)


def _check_output(out: dict[str, Any], retrieve: bool) -> GateDecision:
    assert set(out) == {"answer", "decision", "documents", "rounds", "trace", "verifications",
                        "stop_reason"}
    assert isinstance(out["answer"], str)
    decision = GateDecision.model_validate(out["decision"])
    assert decision.gate == "quco" and decision.retrieve is retrieve
    trace = Trace.model_validate(out["trace"])
    assert trace.decisions() == [decision] and trace.llm_calls >= 1
    assert out["rounds"] == trace.retrievals - retrieve
    assert all(isinstance(d, Document) for d in out["documents"])
    json.dumps({k: v for k, v in out.items() if k != "documents"})  # the rest is JSON
    return decision


# ---------------------------------------------------------------- retriever adapter
def test_adapter_returns_the_langchain_documents_as_passages() -> None:
    inner = store().as_retriever()  # 4 by default
    adapter = LangChainRetrieverAdapter(inner)
    assert isinstance(adapter, Retriever) and adapter.name == "langchain:VectorStoreRetriever"
    docs = inner.invoke(ASK, k=6)
    passages = adapter.retrieve(ASK, k=6)  # k reaches the vector store retriever
    assert [p.id for p in passages] == [d.id for d in docs]
    assert passages[0].title.startswith("Ed Wood") and passages[0].text == docs[0].page_content
    assert [p.id for p in adapter.retrieve(ASK, k=2)] == [d.id for d in docs[:2]]
    assert [len(r) for r in adapter.retrieve_batch([ASK, SKIP], k=1)] == [1, 1]


async def test_adapter_async_path() -> None:
    adapter = LangChainRetrieverAdapter(store().as_retriever(), name="mem")
    assert adapter.name == "mem"
    assert [p.id for p in await adapter.aretrieve(ASK, k=3)] == [
        p.id for p in adapter.retrieve(ASK, k=3)]


def test_adapter_cuts_retrievers_that_ignore_k(corpus_stats: Any) -> None:
    from langchain_rag_gates import GatedRetriever

    # GatedRetriever takes k; the QuCo gate says no to SKIP, yes to ASK.
    gated = GatedRetriever(retriever=store().as_retriever(), gate=QuCoGate(
        corpus_stats, tau_entity=BENCH_TAU_ENTITY))
    adapter = LangChainRetrieverAdapter(gated)
    assert adapter.retrieve(SKIP, k=2) == []
    assert len(adapter.retrieve(ASK, k=2)) == 2


def test_adapter_rejects_bad_input() -> None:
    with pytest.raises(TypeError, match="LangChain BaseRetriever"):
        LangChainRetrieverAdapter(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k must be"):
        LangChainRetrieverAdapter(store().as_retriever()).retrieve(ASK, k=0)


# ---------------------------------------------------------------- QuCoRunnable
def test_quco_runnable_retrieves_for_rare_entities(quco: QuCoRunnable) -> None:
    out = quco.invoke(ASK)
    decision = _check_output(out, True)
    assert decision.evidence["counts"] == {"Scott Derrickson": 7, "Ed Wood": 8}
    first = store().as_retriever(search_kwargs={"k": TOP_K}).invoke(ASK)
    assert [d.id for d in out["documents"]][:TOP_K] == [d.id for d in first]
    assert out["documents"][0].metadata["title"].startswith("Ed Wood")


def test_quco_runnable_skips_retrieval_for_known_entities(quco: QuCoRunnable) -> None:
    out = quco.invoke({"question": SKIP})
    assert _check_output(out, False).evidence["counts"] == {"United States": 115}


def test_quco_runnable_runs_nest_and_the_decision_is_an_event(quco: QuCoRunnable) -> None:
    runs = Runs()
    out = quco.invoke(ASK, config={"callbacks": [runs]})
    (kind, name, root, parent), *children = runs.starts
    assert (kind, name, parent) == ("chain", "QuCoRunnable", None)
    # The retriever and the chat model run as children of the QuCo run.
    assert ("retriever", ASK) in [(k, n) for k, n, _, _ in children]
    assert "chat" in [k for k, _, _, _ in children]
    assert all(p == root for _, _, _, p in children)
    assert [(n, d) for n, d, _ in runs.events] == [(DECISION_EVENT, out["decision"])]
    assert runs.events[0][2] == root


async def test_quco_runnable_async_and_batch_match_invoke(quco: QuCoRunnable) -> None:
    sync = quco.invoke(ASK)
    aout = await quco.ainvoke({"question": ASK})
    assert aout["answer"] == sync["answer"]  # greedy decoding
    assert [d.id for d in aout["documents"]] == [d.id for d in sync["documents"]]
    batch = quco.batch([ASK, {"question": SKIP}], config={"max_concurrency": 1})
    assert [o["decision"]["retrieve"] for o in batch] == [True, False]
    assert batch[0]["answer"] == sync["answer"]
    abatch = await quco.abatch([SKIP, ASK])
    assert [o["decision"]["retrieve"] for o in abatch] == [False, True]


def test_quco_runnable_flagged_claim_retrieves_through_the_langchain_retriever(
    corpus_stats: Any,
) -> None:
    # A model that always states the same false claim (a stand-in for a hallucination).
    llm = FakeListChatModel(responses=[FALSE_CLAIM])
    quco = QuCoRunnable(llm=llm, retriever=store().as_retriever(), stats=corpus_stats, **SHORT)
    runs = Runs()
    out = quco.invoke(SKIP, config={"callbacks": [runs]})
    _check_output(out, False)
    summary = out["verifications"][0]
    assert [(f["head"], f["tail"], f["cooccurrence"]) for f in summary["flagged"]] == [
        ("Ed Wood", "Paris", 0)]
    assert out["rounds"] == 1 and out["answer"] == FALSE_CLAIM
    assert [n for k, n, _, _ in runs.starts if k == "retriever"] == ["Ed Wood born in"]
    assert [d.id for d in out["documents"]] == [
        d.id for d in store().as_retriever(search_kwargs={"k": TOP_K}).invoke("Ed Wood born in")]


def test_quco_runnable_settings(chat: ChatRagGates, corpus_stats: Any) -> None:
    pytest.importorskip("bm25s")
    from rag_gates.retrieval.bm25 import BM25Retriever

    bm25 = BM25Retriever.from_passages(corpus_passages("hotpotqa", SLICES)[:40])
    quco = QuCoRunnable(llm=chat, retriever=bm25, stats=corpus_stats,
                        quco_config=QuCoConfig(**SHORT), pre_check=False)
    assert quco.quco_config.pre_check is False and quco.quco_config.k == TOP_K
    assert quco.pipeline.config == quco.quco_config
    assert quco.invoke(ASK)["decision"] is None
    with pytest.raises(ValidationError):
        QuCoRunnable(llm=chat, retriever=bm25, stats=corpus_stats, tau_entitty=3)
    with pytest.raises(ValidationError):
        QuCoRunnable(llm=chat, retriever=bm25, stats=corpus_stats, k=0)
    with pytest.raises((TypeError, ValidationError), match="chat model or LLM"):
        QuCoRunnable(llm="gpt", retriever=bm25, stats=corpus_stats)
    with pytest.raises((TypeError, ValidationError), match="LangChain BaseRetriever"):
        QuCoRunnable(llm=chat, retriever=object(), stats=corpus_stats)
    with pytest.raises((TypeError, ValidationError), match="CorpusStats"):
        QuCoRunnable(llm=chat, retriever=bm25, stats=object())


def test_quco_runnable_bad_inputs(quco: QuCoRunnable) -> None:
    with pytest.raises(KeyError, match="'question'"):
        quco.invoke({"query": ASK})
    with pytest.raises(TypeError, match="must be a str"):
        quco.invoke({"question": 3})
    with pytest.raises(TypeError, match="takes a str or a dict"):
        quco.invoke(3)
    with pytest.raises(ValueError, match="empty"):
        quco.invoke("  ")


# ---------------------------------------------------------------- ClaimVerifierTool
class TestClaimVerifierToolStandard(ToolsUnitTests):
    @pytest.fixture(autouse=True)
    def _verifier(self, corpus_stats: Any) -> None:
        self.verifier = ClaimVerifier(corpus_stats)

    @property
    def tool_constructor(self) -> type[ClaimVerifierTool]:
        return ClaimVerifierTool

    @property
    def tool_constructor_params(self) -> dict[str, Any]:
        return {"verifier": self.verifier}

    @property
    def tool_invoke_params_example(self) -> dict[str, Any]:
        return {"text": FALSE_CLAIM}


@pytest.fixture
def tool(corpus_stats: Any) -> ClaimVerifierTool:
    return ClaimVerifierTool(verifier=ClaimVerifier(corpus_stats))


def test_tool_schema(tool: ClaimVerifierTool) -> None:
    assert tool.name == "verify_claims"
    assert "flagged ones with counts and the queries to run" in tool.description
    assert tool.args == {"text": ClaimVerifierInput.model_json_schema()["properties"]["text"]}


def test_tool_flags_a_false_claim_and_passes_a_supported_one(tool: ClaimVerifierTool) -> None:
    report = json.loads(tool.invoke({"text": FALSE_CLAIM}))
    assert [(f["head"], f["relation"], f["tail"], f["cooccurrence"]) for f in report["flagged"]] \
        == [("Ed Wood", "born in", "Paris", 0)]
    assert report["queries"] == ["Ed Wood born in"] and report["sentences"] == 1
    supported = json.loads(tool.invoke({"text": "Scott Derrickson is an American director."}))
    assert supported["flagged"] == [] and supported["claims_checked"] >= 1


def test_tool_call_gives_a_tool_message_with_the_verification(tool: ClaimVerifierTool) -> None:
    message = tool.invoke({"type": "tool_call", "id": "call-1", "name": "verify_claims",
                           "args": {"text": FALSE_CLAIM}})
    assert isinstance(message, ToolMessage) and message.tool_call_id == "call-1"
    assert isinstance(message.artifact, Verification)
    assert json.loads(message.content) == message.artifact.summary()  # type: ignore[arg-type]
    assert message.artifact.flagged[0].cooccurrence == 0


async def test_tool_async_path(tool: ClaimVerifierTool) -> None:
    report = json.loads(await tool.ainvoke({"text": f"{FALSE_CLAIM} Scott Derrickson is an "
                                                    "American director."}))
    assert report["sentences"] == 2 and report["queries"] == ["Ed Wood born in"]


def test_tool_rejects_a_non_verifier(corpus_stats: Any) -> None:
    with pytest.raises(TypeError, match="ClaimVerifier"):
        ClaimVerifierTool(verifier=corpus_stats)


# ---------------------------------------------------------------- the gate in an LCEL chain
def test_quco_gate_routes_a_chain_and_the_tool_checks_its_answer(
    chat: ChatRagGates, corpus_stats: Any, tool: ClaimVerifierTool
) -> None:
    from langchain_core.runnables import RunnablePassthrough

    gate = QuCoGate(corpus_stats, tau_entity=BENCH_TAU_ENTITY)
    rag = ChatPromptTemplate.from_template("Context:\n{context}\n\nQuestion: {question}")
    direct = ChatPromptTemplate.from_template("Question: {question}")

    def fmt(docs: list[Document]) -> str:
        return "\n\n".join(d.page_content for d in docs)

    router = route_by_gate(
        gate,
        retrieve={"context": (lambda x: x["question"])
                  | store().as_retriever(search_kwargs={"k": 2}) | fmt,
                  "question": lambda x: x["question"]} | rag | chat,
        direct=RunnablePassthrough() | direct | chat,
    )
    yes, no = router.batch([{"question": ASK}, {"question": SKIP}])
    assert isinstance(yes, AIMessage) and isinstance(no, AIMessage)
    assert yes.response_metadata["rag_gates"]["retrieve"] is True
    assert no.response_metadata["rag_gates"]["retrieve"] is False
    report = json.loads(tool.invoke({"text": str(yes.content) or "."}))
    assert set(report) == {"flagged", "queries", "claims_checked", "sentences"}


# ---------------------------------------------------------------- packaging
@pytest.mark.parametrize("module_name", ["quco", "tools", "retrievers"])
def test_new_modules_export_what_they_define(module_name: str) -> None:
    import importlib
    import inspect

    import langchain_rag_gates

    module = importlib.import_module(f"langchain_rag_gates.{module_name}")
    defined = {
        n for n, obj in vars(module).items()
        if not n.startswith("_") and n.isidentifier()
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and obj.__module__ == module.__name__
    }
    assert defined == set(module.__all__)
    assert set(module.__all__) <= set(langchain_rag_gates.__all__)
