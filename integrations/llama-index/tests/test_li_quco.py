"""QuCo-RAG as LlamaIndex components, with real parts: a real corpus-statistics index
(``load_corpus_stats`` over the shipped HotpotQA/2Wiki slices, built here into a temporary
RAG_GATES_HOME), a real VectorStoreIndex (embedded MiniLM), the real QuCoGate and
ClaimVerifier, RagGatesLLM over the tiny random-weight Llama, and LlamaIndex
instrumentation.

* LlamaIndexRetrieverAdapter: a LlamaIndex retriever as a rag-gates Retriever;
* GatedQueryEngine: gate yes -> the wrapped engine; gate no -> the LLM answers directly;
* QuCoQueryEngine: the QuCo loop on a LlamaIndex LLM and retriever;
* claim_verifier_tool: the verifier as a FunctionTool.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from llama_index.core import Settings, VectorStoreIndex
from llama_index.core.base.llms.types import CompletionResponse, LLMMetadata
from llama_index.core.instrumentation.events.llm import (
    LLMChatStartEvent,
    LLMPredictEndEvent,
    LLMPredictStartEvent,
)
from llama_index.core.instrumentation.events.retrieval import RetrievalStartEvent
from llama_index.core.llms import CustomLLM
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.prompts import PromptTemplate
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.tools import FunctionTool
from llama_index.llms.rag_gates import RagGatesLLM
from llama_index.query_engine.rag_gates import (
    DEFAULT_DIRECT_PROMPT,
    GatedQueryEngine,
    QuCoQueryEngine,
)
from llama_index.retrievers.rag_gates import (
    ANNOTATION_KEY,
    GateDecisionEvent,
    GatedRetriever,
    LlamaIndexRetrieverAdapter,
    passages_to_nodes,
)
from llama_index.tools.rag_gates import DEFAULT_NAME, claim_verifier_tool
from pydantic import Field, ValidationError

from rag_gates.gate import BaseGate
from rag_gates.quco import ClaimVerifier, QuCoConfig, QuCoGate
from rag_gates.retrieval.base import Retriever
from rag_gates.types import GateDecision, Trace
from rag_gates_lab.corpus import corpus_passages
from rag_gates_lab.plugins.quco import BENCH_TAU_ENTITY

SLICES = Path(__file__).resolve().parents[3] / "examples" / "data"
ASK = "Were Scott Derrickson and Ed Wood of the same nationality?"  # rare in the slices: 7 and 8
SKIP = "What is the capital of the United States?"  # "United States": 115 > 82
FALSE_CLAIM = "Ed Wood was born in Paris."  # never together in the corpus
TOP_K = 3
# A short loop on the tiny model: a chunk of 8 tokens, 16 accepted tokens at most.
SHORT = {"tau_entity": BENCH_TAU_ENTITY, "k": TOP_K, "chunk_tokens": 8, "max_new_tokens": 16}

pytest.importorskip("infini_gram", reason='needs the corpus extra: pip install "rag-gates[corpus]"')


# ---------------------------------------------------------------- real parts
class FixedTextLLM(CustomLLM):
    """A LlamaIndex LLM that always writes ``text`` (a stand-in for a model that
    hallucinates, so the verify -> retrieve -> regenerate path runs deterministically);
    records its prompts."""

    text: str = ""
    prompts: list[str] = Field(default_factory=list)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="fixed-text")

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self.prompts.append(prompt)
        return CompletionResponse(text=self.text)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        yield self.complete(prompt, formatted=formatted)


@pytest.fixture(scope="module")
def index() -> VectorStoreIndex:
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    from rag_gates.lm.defaults import default_embedder_path


    # The first four questions' paragraphs: Scott Derrickson, Ed Wood and their distractors.
    nodes = [n.node for n in passages_to_nodes(corpus_passages("hotpotqa", SLICES)[:40])]
    return VectorStoreIndex(nodes, embed_model=HuggingFaceEmbedding(
        model_name=str(default_embedder_path()), device="cpu"))


@pytest.fixture(scope="module")
def gate(corpus_stats: Any) -> QuCoGate:
    return QuCoGate(corpus_stats, tau_entity=BENCH_TAU_ENTITY)


@pytest.fixture(scope="module")
def tiny_long() -> Any:
    """The tiny random-weight Llama with room for retrieved passages in its prompts."""
    from rag_gates.testing import tiny_lm

    return tiny_lm(seed=0, max_context=4096)


@pytest.fixture
def llm(tiny_long: Any) -> RagGatesLLM:
    return RagGatesLLM(lm=tiny_long, max_new_tokens=8)



def _ids(nodes: Sequence[Any]) -> list[str]:
    return [n.node.node_id for n in nodes]


# ---------------------------------------------------------------- the gate itself
def test_the_quco_gate_decides_both_ways_on_the_real_index(gate: QuCoGate) -> None:
    yes, no = gate.decide(ASK), gate.decide(SKIP)
    assert yes.retrieve and yes.evidence["counts"] == {"Scott Derrickson": 7, "Ed Wood": 8}
    assert not no.retrieve and no.evidence["counts"] == {"United States": 115}


# ---------------------------------------------------------------- retriever adapter
def test_adapter_returns_the_llama_index_nodes_as_passages(index: VectorStoreIndex) -> None:
    inner = index.as_retriever(similarity_top_k=4)
    adapter = LlamaIndexRetrieverAdapter(inner)
    assert isinstance(adapter, Retriever)
    assert adapter.name == "llama-index:VectorIndexRetriever"
    nodes = inner.retrieve(ASK)
    passages = adapter.retrieve(ASK, k=TOP_K)
    assert [p.id for p in passages] == _ids(nodes)[:TOP_K]  # k cuts the retriever's top 4
    assert passages[0].title == "Ed Wood" and passages[0].text == nodes[0].node.get_content()
    assert [p.score for p in passages] == pytest.approx([n.score for n in nodes[:TOP_K]])
    assert len(adapter.retrieve(ASK, k=10)) == 4  # the wrapped retriever's top-k bounds it
    assert [p.id for p in adapter.retrieve_batch([ASK, SKIP], k=1)[0]] == _ids(nodes)[:1]


async def test_adapter_async_path(index: VectorStoreIndex) -> None:
    adapter = LlamaIndexRetrieverAdapter(index.as_retriever(similarity_top_k=TOP_K), name="v")
    assert adapter.name == "v"
    assert [p.id for p in await adapter.aretrieve(ASK, k=2)] == [
        p.id for p in adapter.retrieve(ASK, k=2)
    ]


def test_adapter_rejects_bad_input(index: VectorStoreIndex) -> None:
    with pytest.raises(TypeError, match="LlamaIndex BaseRetriever"):
        LlamaIndexRetrieverAdapter(object())  # type: ignore[arg-type]
    adapter = LlamaIndexRetrieverAdapter(index.as_retriever())
    with pytest.raises(ValueError, match="empty"):
        adapter.retrieve("  ")
    with pytest.raises(ValueError, match="k must be"):
        adapter.retrieve(ASK, k=0)


# ---------------------------------------------------------------- GatedQueryEngine
def test_gated_engine_yes_answers_from_the_inner_engine(
    index: VectorStoreIndex, gate: QuCoGate, llm: RagGatesLLM, collector: Any
) -> None:
    inner = index.as_query_engine(llm=llm, similarity_top_k=TOP_K)
    engine = GatedQueryEngine(inner, gate=gate, llm=llm)
    response = engine.query(ASK)
    decision = engine.last_decision
    assert isinstance(decision, GateDecision) and decision.retrieve
    data = decision.model_dump(mode="json")
    assert response.metadata is not None and response.metadata[ANNOTATION_KEY] == data
    assert data["evidence"]["counts"] == {"Scott Derrickson": 7, "Ed Wood": 8}
    # The inner engine retrieved and synthesised; its source nodes carry the decision.
    assert _ids(response.source_nodes) == _ids(index.as_retriever(similarity_top_k=TOP_K)
                                                .retrieve(ASK))
    assert all(n.node.metadata[ANNOTATION_KEY] == data for n in response.source_nodes)
    assert collector.of(RetrievalStartEvent) and collector.of(LLMPredictStartEvent)
    (event,) = collector.of(GateDecisionEvent)
    assert event.query_str == ASK and event.retrieve and event.gate_decision() == decision
    assert str(response) not in ("", "Empty Response")


def test_gated_engine_no_has_the_llm_answer_directly(
    index: VectorStoreIndex, gate: QuCoGate, llm: RagGatesLLM, collector: Any
) -> None:
    engine = GatedQueryEngine(index.as_query_engine(llm=llm), gate=gate, llm=llm)
    response = engine.query(SKIP)
    assert response.source_nodes == []
    assert response.metadata is not None and response.metadata[ANNOTATION_KEY]["retrieve"] is False
    assert "United States" in response.metadata[ANNOTATION_KEY]["reason"] or \
        response.metadata[ANNOTATION_KEY]["evidence"]["counts"] == {"United States": 115}
    # No retrieval; the LLM was called with the direct prompt and its text is the answer.
    assert collector.of(RetrievalStartEvent) == []
    # (RagGatesLLM is a chat model: predict sends the prompt as one user message.)
    (start,) = collector.of(LLMChatStartEvent)
    assert [m.content for m in start.messages] == [DEFAULT_DIRECT_PROMPT.format(query_str=SKIP)]
    (end,) = collector.of(LLMPredictEndEvent)
    assert response.response == end.output
    assert [e.retrieve for e in collector.of(GateDecisionEvent)] == [False]


def test_the_gated_retriever_in_a_retriever_engine_answers_empty_response(
    index: VectorStoreIndex, gate: QuCoGate, llm: RagGatesLLM
) -> None:
    """The problem GatedQueryEngine solves: synthesizers never call the LLM without nodes."""
    plain = RetrieverQueryEngine.from_args(GatedRetriever(index.as_retriever(), gate=gate),
                                           llm=llm)
    assert str(plain.query(SKIP)) == "Empty Response"
    gated = GatedQueryEngine(index.as_query_engine(llm=llm), gate=gate, llm=llm)
    assert str(gated.query(SKIP)) != "Empty Response"


async def test_gated_engine_async_both_ways(
    index: VectorStoreIndex, gate: QuCoGate, llm: RagGatesLLM, collector: Any
) -> None:
    engine = GatedQueryEngine(index.as_query_engine(llm=llm, similarity_top_k=TOP_K),
                              gate=gate, llm=llm)
    yes = await engine.aquery(ASK)
    no = await engine.aquery(SKIP)
    assert yes.metadata is not None and yes.metadata[ANNOTATION_KEY]["retrieve"] is True
    assert len(yes.source_nodes) == TOP_K
    assert no.metadata is not None and no.metadata[ANNOTATION_KEY]["retrieve"] is False
    assert no.source_nodes == [] and no.response
    assert [e.retrieve for e in collector.of(GateDecisionEvent)] == [True, False]
    sync = engine.query(SKIP)
    assert no.response == sync.response  # greedy: the same direct answer either way


class TimingOutGate(BaseGate):
    """A gate whose model server does not answer (what a served gate meets under load)."""

    name = "timing-out"

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, Any]]:
        raise TimeoutError("no answer from the gate's model in 30 s")


async def test_gated_engine_on_gate_error_retrieves_and_names_the_error(
    index: VectorStoreIndex, llm: RagGatesLLM
) -> None:
    """A QueryEngineTool turns the engine's exception into an error message and the agent
    answers without documents; with on_gate_error="retrieve" the engine fails closed."""
    from llama_index.core.tools import QueryEngineTool

    inner = index.as_query_engine(llm=llm, similarity_top_k=TOP_K)
    strict = GatedQueryEngine(inner, gate=TimingOutGate(0.5), llm=llm)
    with pytest.raises(TimeoutError):
        strict.query(ASK)
    engine = GatedQueryEngine(inner, gate=TimingOutGate(0.5), llm=llm, on_gate_error="retrieve")
    for response in (engine.query(ASK), await engine.aquery(ASK)):
        assert response.metadata is not None
        data = response.metadata[ANNOTATION_KEY]
        assert data["retrieve"] is True and "could not decide" in data["reason"]
        assert data["evidence"]["error"].startswith("TimeoutError")
        assert len(response.source_nodes) == TOP_K
    out = QueryEngineTool.from_defaults(engine, name="docs", description="docs").call(ASK)
    assert not out.is_error and out.raw_output.source_nodes
    with pytest.raises(ValueError, match="on_gate_error"):
        GatedQueryEngine(inner, gate=TimingOutGate(0.5), llm=llm,
                         on_gate_error="skip")  # type: ignore[arg-type]


def test_gated_engine_prompts_are_exposed_and_updatable(
    index: VectorStoreIndex, gate: QuCoGate, llm: RagGatesLLM, collector: Any
) -> None:
    engine = GatedQueryEngine(index.as_query_engine(llm=llm), gate=gate, llm=llm)
    prompts = engine.get_prompts()
    assert prompts["direct_prompt"].get_template() == DEFAULT_DIRECT_PROMPT.get_template()
    assert "query_engine:response_synthesizer:text_qa_template" in prompts
    engine.update_prompts({"direct_prompt": PromptTemplate("Q: {query_str}\nA:")})
    engine.query(SKIP)
    (start,) = collector.of(LLMChatStartEvent)
    assert start.messages[0].content == f"Q: {SKIP}\nA:"


def test_gated_engine_rejects_bad_arguments(
    index: VectorStoreIndex, gate: QuCoGate, llm: RagGatesLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = index.as_query_engine(llm=llm)
    with pytest.raises(TypeError, match="BaseQueryEngine"):
        GatedQueryEngine(index.as_retriever(), gate=gate, llm=llm)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Gate protocol"):
        GatedQueryEngine(engine, gate=object(), llm=llm)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="LlamaIndex LLM"):
        GatedQueryEngine(engine, gate=gate, llm="gpt")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="prompt template"):
        GatedQueryEngine(engine, gate=gate, llm=llm, direct_prompt="Q: {query_str}")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="annotation_key"):
        GatedQueryEngine(engine, gate=gate, llm=llm, annotation_key="")
    # No llm= and no Settings.llm offline: what to pass, not LlamaIndex's OpenAI key error.
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setattr(Settings, "_llm", None)
    with pytest.raises(ValueError, match=r"pass llm= \(the LLM of your query engine"):
        GatedQueryEngine(engine, gate=gate)


# ---------------------------------------------------------------- QuCoQueryEngine
def _check_quco_response(response: Any, retrieve: bool, index: VectorStoreIndex) -> dict[str, Any]:
    meta = response.metadata
    assert meta is not None and set(meta) == {
        ANNOTATION_KEY, "verifications", "rounds", "stop_reason", "trace"}
    json.dumps(meta)  # all JSON
    decision = GateDecision.model_validate(meta[ANNOTATION_KEY])
    assert decision.gate == "quco" and decision.retrieve is retrieve
    trace = Trace.model_validate(meta["trace"])
    assert trace.decisions() == [decision]
    assert trace.llm_calls >= 1
    assert meta["rounds"] == sum(1 for e in trace.events if e.kind == "retrieval") - retrieve
    # Every source node is a node of the index, with its text.
    for n in response.source_nodes:
        assert n.node.get_content() == index.docstore.get_node(n.node.node_id).get_content()
    return meta


def test_quco_engine_retrieves_for_rare_entities(
    index: VectorStoreIndex, corpus_stats: Any, llm: RagGatesLLM, collector: Any
) -> None:
    engine = QuCoQueryEngine(llm, index.as_retriever(similarity_top_k=TOP_K), corpus_stats,
                             **SHORT)
    response = engine.query(ASK)
    meta = _check_quco_response(response, True, index)
    assert meta[ANNOTATION_KEY]["evidence"]["counts"] == {"Scott Derrickson": 7, "Ed Wood": 8}
    first = index.as_retriever(similarity_top_k=TOP_K).retrieve(ASK)
    assert _ids(response.source_nodes)[:TOP_K] == _ids(first)  # the pre-check's passages
    assert isinstance(response.response, str)
    assert [e.retrieve for e in collector.of(GateDecisionEvent)] == [True]
    assert collector.of(RetrievalStartEvent)  # the LlamaIndex retriever really ran
    assert engine.config.k == TOP_K and engine.config.tau_entity == BENCH_TAU_ENTITY


def test_quco_engine_skips_retrieval_for_known_entities(
    index: VectorStoreIndex, corpus_stats: Any, llm: RagGatesLLM
) -> None:
    engine = QuCoQueryEngine(llm, index.as_retriever(similarity_top_k=TOP_K), corpus_stats,
                             **SHORT)
    meta = _check_quco_response(engine.query(SKIP), False, index)
    assert meta[ANNOTATION_KEY]["evidence"]["counts"] == {"United States": 115}


async def test_quco_engine_async_matches_sync(
    index: VectorStoreIndex, corpus_stats: Any, llm: RagGatesLLM
) -> None:
    engine = QuCoQueryEngine(llm, index.as_retriever(similarity_top_k=TOP_K), corpus_stats,
                             **SHORT)
    sync = engine.query(ASK)
    response = await engine.aquery(ASK)
    _check_quco_response(response, True, index)
    assert response.response == sync.response  # greedy decoding
    assert _ids(response.source_nodes) == _ids(sync.source_nodes)


def test_quco_engine_flagged_claim_retrieves_through_the_llama_index_retriever(
    index: VectorStoreIndex, corpus_stats: Any, collector: Any
) -> None:
    llm = FixedTextLLM(text=FALSE_CLAIM)
    engine = QuCoQueryEngine(llm, index.as_retriever(similarity_top_k=TOP_K), corpus_stats,
                             **SHORT)
    response = engine.query(SKIP)  # no pre-check retrieval: only the runtime check retrieves
    meta = _check_quco_response(response, False, index)
    flagged = meta["verifications"][0]["flagged"]
    assert [(f["head"], f["tail"], f["cooccurrence"]) for f in flagged] == [
        ("Ed Wood", "Paris", 0)]
    assert meta["verifications"][0]["queries"] == ["Ed Wood born in"]
    assert meta["rounds"] == 1
    assert [e.str_or_query_bundle for e in collector.of(RetrievalStartEvent)] == [
        "Ed Wood born in"]
    assert _ids(response.source_nodes) == _ids(
        index.as_retriever(similarity_top_k=TOP_K).retrieve("Ed Wood born in"))
    # The regeneration prompt held the retrieved passages; the same text came back, so it
    # was accepted (no progress).
    assert len(llm.prompts) == 2 and response.source_nodes[0].node.get_content() in llm.prompts[1]
    assert response.response == FALSE_CLAIM


def test_quco_engine_takes_rag_gates_parts_and_config(
    index: VectorStoreIndex, corpus_stats: Any, tiny_long: Any
) -> None:
    pytest.importorskip("bm25s")
    from llama_index.llms.rag_gates import as_text_lm

    from rag_gates.retrieval.bm25 import BM25Retriever

    bm25 = BM25Retriever.from_passages(corpus_passages("hotpotqa", SLICES)[:40])
    engine = QuCoQueryEngine(as_text_lm(RagGatesLLM(lm=tiny_long)), bm25, corpus_stats,
                             config=QuCoConfig(**SHORT), pre_check=False)
    response = engine.query(ASK)
    assert response.metadata is not None and response.metadata[ANNOTATION_KEY] is None
    assert engine.config.pre_check is False and engine.config.k == TOP_K


def test_quco_engine_rejects_bad_arguments(
    index: VectorStoreIndex, corpus_stats: Any, llm: RagGatesLLM
) -> None:
    retriever = index.as_retriever()
    with pytest.raises(TypeError, match="LlamaIndex LLM or a rag-gates TextLM"):
        QuCoQueryEngine("gpt", retriever, corpus_stats)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="LlamaIndex BaseRetriever"):
        QuCoQueryEngine(llm, object(), corpus_stats)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="CorpusStats"):
        QuCoQueryEngine(llm, retriever, object())  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        QuCoQueryEngine(llm, retriever, corpus_stats, tau_entitty=3)


# ---------------------------------------------------------------- claim verifier tool
@pytest.fixture(scope="module")
def tool(corpus_stats: Any) -> FunctionTool:
    return claim_verifier_tool(ClaimVerifier(corpus_stats))


def test_tool_metadata(tool: FunctionTool) -> None:
    assert tool.metadata.name == DEFAULT_NAME == "verify_claims"
    assert "flagged ones with counts and the queries to run" in tool.metadata.description
    params = tool.metadata.to_openai_tool()["function"]["parameters"]
    assert params["required"] == ["text"] and set(params["properties"]) == {"text"}


def test_tool_flags_a_false_claim_and_passes_a_supported_one(tool: FunctionTool) -> None:
    out = tool.call(text=FALSE_CLAIM)
    report = json.loads(out.content)
    assert out.raw_output == out.content
    assert [(f["head"], f["relation"], f["tail"], f["cooccurrence"]) for f in report["flagged"]] \
        == [("Ed Wood", "born in", "Paris", 0)]
    assert report["queries"] == ["Ed Wood born in"] and report["sentences"] == 1
    supported = json.loads(tool.call(text="Scott Derrickson is an American director.").content)
    assert supported["flagged"] == [] and supported["claims_checked"] >= 1
    # The agent-facing call path (a dict of arguments, as a tool call carries them).
    assert json.loads(tool(**{"text": FALSE_CLAIM}).content) == report


async def test_tool_async_path(tool: FunctionTool) -> None:
    out = await tool.acall(text=f"{FALSE_CLAIM} Scott Derrickson is an American director.")
    report = json.loads(out.content)
    assert report["sentences"] == 2 and report["queries"] == ["Ed Wood born in"]


def test_tool_options_and_errors(corpus_stats: Any) -> None:
    tool = claim_verifier_tool(ClaimVerifier(corpus_stats), name="check", description="d",
                               return_direct=True)
    assert (tool.metadata.name, tool.metadata.description, tool.metadata.return_direct) == (
        "check", "d", True)
    with pytest.raises(TypeError, match="ClaimVerifier"):
        claim_verifier_tool(corpus_stats)
    with pytest.raises(ValueError, match="name"):
        claim_verifier_tool(ClaimVerifier(corpus_stats), name="")


def test_tools_namespace_package_imports_from_outside_the_repo(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "import llama_index.core.tools\n"
        "core_torch = 'torch' in sys.modules\n"
        "import llama_index.tools.rag_gates as t\n"
        "import llama_index.query_engine.rag_gates as q\n"
        "assert callable(t.claim_verifier_tool) and q.QuCoQueryEngine and q.GatedQueryEngine\n"
        "assert core_torch or 'torch' not in sys.modules, 'the adapters imported torch'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
