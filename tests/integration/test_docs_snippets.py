"""The Python blocks of ``docs/agents.md``, ``docs/composition.md`` and ``docs/scaling.md``
run as written, on real objects.

As ``test_integration_readmes.py`` (the runner is ``tests/integration/snippets.py``): each
block is read verbatim from its document, by order; nothing is copied here. A document's
namespace starts from its *prelude*, which binds only the names the document leaves to the
reader, each to a real object; after each block, ``CHECKS`` asserts what the block did.

* ``agents.md``: its two blocks are alternatives (one per framework), so each starts from the
  prelude alone and must import what it uses. The chat models are the scripted tool callers of
  the agent tests (``integrations/*/tests/test_l?_agent.py``, loaded from there), whose turns
  come from ``rag_gates.testing.VerifyReviseScript``: the agent loop, the tools, the verifier,
  the gate and the vector store are real.
* ``composition.md`` and ``scaling.md``: the tiny random-weight Llama of ``rag_gates.testing``
  wherever the reader supplies a model (plumbing only), a CBDR probe of random weights for it,
  and an infini-gram index of the reader's documents (``workdir``; ``scaling.md``'s served
  index is lower-cased, as its comment says, built with ``--lowercase``). ``scaling.md``'s
  served model is llama-cpp-python's server replayed from the recordings of
  ``tests/lm/served_frameworks.py`` (calibrate's, ChatOpenAI's, OpenAILike's), with the
  reader's ``gate.json`` written by ``calibrate`` against it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import shutil
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.install.run_readme import ROOT
from tests.integration.snippets import SCOTT, Session, build_index_cli, check_block_counts

pytestmark = pytest.mark.integration

DOCS = {name: ROOT / "docs" / f"{name}.md" for name in ("agents", "composition", "scaling")}
#: How many ``python`` blocks each document has: the ones ``CHECKS`` knows.
BLOCKS = {"agents": 2, "composition": 1, "scaling": 5}
#: Blocks that are alternatives rather than one session.
CHAINED = {"agents": False, "composition": True, "scaling": True}
#: Blocks not runnable here, with why.
SKIPPED = {("scaling", 5): "docs/scaling.md's last block, SourcePolicy.open_existing(lm, "
                           "url='http://localhost:6333', read_only=False), needs a Qdrant server "
                           "(docker run qdrant/qdrant); none here, as the document says"}

KEPT = "Scott Derrickson is an American director."
FLAGGED = "Ed Wood was born in Paris."  # 'Ed Wood' and 'Paris' never share a document
DRAFT = f"{KEPT} {FLAGGED}"
#: ``scaling.md``'s served index, as its ``rag-gates index serve ... --port 8765 --name wiki``
SERVED_PORT, SERVED_NAME = 8765, "wiki"


# ---------------------------------------------------------------- the reader's side


def load_test_module(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pydantic resolves the models' annotations through it
    spec.loader.exec_module(module)
    return module


def agents_prelude(workdir: Path, documents: list[dict[str, str]]) -> dict[str, Any]:
    """The names docs/agents.md leaves to the reader.

    * ``stats``: a ``LocalInfiniGram`` of the reader's index; ``question``: the Scott
      Derrickson / Ed Wood question;
    * LangChain: ``store``, an ``InMemoryVectorStore`` of the documents under
      ``DeterministicFakeEmbedding``; ``chat_model``, ``ScriptedToolCaller`` drafting
      :data:`DRAFT`;
    * LlamaIndex: ``index``, a ``VectorStoreIndex`` under ``MockEmbedding``; ``llm``,
      ``ScriptedFunctionCaller`` drafting :data:`DRAFT`; ``SYSTEM_PROMPT``, a string.
    """
    from langchain_core.documents import Document
    from langchain_core.embeddings import DeterministicFakeEmbedding
    from langchain_core.vectorstores import InMemoryVectorStore
    from llama_index.core import Document as Node
    from llama_index.core import VectorStoreIndex
    from llama_index.core.embeddings import MockEmbedding

    from rag_gates.corpus import LocalInfiniGram
    from rag_gates.testing import VerifyReviseScript

    lc = load_test_module(ROOT / "integrations" / "langchain" / "tests" / "test_lc_agent.py",
                          "docs_snippets_lc_agent")
    li = load_test_module(ROOT / "integrations" / "llama-index" / "tests" / "test_li_agent.py",
                          "docs_snippets_li_agent")
    store = InMemoryVectorStore.from_documents(
        [Document(page_content=d["text"], metadata={"title": d["title"]}) for d in documents],
        DeterministicFakeEmbedding(size=32))
    index = VectorStoreIndex.from_documents(
        [Node(text=d["text"], metadata={"title": d["title"]}) for d in documents],
        embed_model=MockEmbedding(embed_dim=8))
    return {"stats": LocalInfiniGram(workdir / "indexes" / "docs"), "question": SCOTT,
            "store": store, "chat_model": lc.ScriptedToolCaller(
                script=VerifyReviseScript(draft=DRAFT)),
            "index": index, "llm": li.ScriptedFunctionCaller(
                script=VerifyReviseScript(draft=DRAFT)),
            "SYSTEM_PROMPT": "Answer in one sentence, then check it with verify_claims."}


def composition_prelude(tiny: Any, probe: Any, workdir: Path) -> dict[str, Any]:
    """``stats`` (the reader's index), ``lm`` (the tiny model), ``probe`` (random weights)."""
    from rag_gates.corpus import LocalInfiniGram

    return {"stats": LocalInfiniGram(workdir / "indexes" / "docs"), "lm": tiny, "probe": probe}


def scaling_prelude(tiny: Any, probe_dir: Path, served: Path, url: str,
                    documents: list[dict[str, str]]) -> dict[str, Any]:
    """``index_dir`` (the lower-cased index, served on port 8765 as ``wiki`` by the
    fixture), ``lm`` (the tiny model), ``store`` (LangChain's in-memory store), ``probe_dir``
    (a saved random probe), ``url`` (the served model), ``question`` (the first recorded
    calibration question), ``index`` (a LlamaIndex index under ``MockEmbedding``). The SR-RAG
    policy the block opens at ``~/.cache/rag-gates/srrag/policy`` is built by the fixture
    under a temporary ``HOME``."""
    from langchain_core.embeddings import DeterministicFakeEmbedding
    from langchain_core.vectorstores import InMemoryVectorStore
    from llama_index.core import Document as Node
    from llama_index.core import VectorStoreIndex
    from llama_index.core.embeddings import MockEmbedding

    from tests.lm.served_frameworks import questions

    store = InMemoryVectorStore.from_texts([d["text"] for d in documents[:40]],
                                           embedding=DeterministicFakeEmbedding(size=16))
    index = VectorStoreIndex.from_documents([Node(text=d["text"]) for d in documents[:40]],
                                            embed_model=MockEmbedding(embed_dim=8))
    return {"index_dir": served, "lm": tiny, "store": store, "probe_dir": probe_dir,
            "url": url, "question": questions(1)[0], "index": index}


@pytest.fixture(scope="module")
def tiny() -> Any:
    from rag_gates.testing import tiny_lm

    return tiny_lm(seed=0, max_context=4096)


@pytest.fixture(scope="module")
def probe_dir(tiny: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CBDR probe for the tiny model (random weights, seed 0), saved as the reader's."""
    import torch

    from rag_gates.cbdr import ConfidenceProbe, ProbeConfig

    torch.manual_seed(0)
    probe = ConfidenceProbe(ProbeConfig(model_id=tiny.model_id, hidden_size=tiny.hidden_size,
                                        num_layers=tiny.num_layers, layer=2, hidden_dims=(16,),
                                        dropout=0.0))
    path = tmp_path_factory.mktemp("probe")
    probe.save(path)
    return path


@pytest.fixture(scope="module")
def served(workdir: Path) -> Iterator[Path]:
    """scaling.md's served index: a lower-cased index of the documents (``rag-gates index
    build docs/ --out indexes/wiki --lowercase``), served at 127.0.0.1:8765 as ``wiki``."""
    from rag_gates.corpus import serve_index

    index_dir = build_index_cli(workdir, "indexes/wiki", "--lowercase")
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", SERVED_PORT)) == 0:
            pytest.skip(f"port {SERVED_PORT} (the port docs/scaling.md serves on) is in use")
    with serve_index(index_dir, port=SERVED_PORT, index_name=SERVED_NAME):
        yield index_dir


@pytest.fixture(scope="module")
def served_model(workdir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """scaling.md's served model (its ``url``): llama-cpp-python's server as recorded for
    calibrate, ChatOpenAI and OpenAILike; and the reader's ``gate.json`` in the project:
    ``rag-gates calibrate --model openai:URL --gates answer-logprob --max-new-tokens 8``
    against it."""
    from tests.lm import served_frameworks

    with served_frameworks.replay_every_client() as server:
        spec = served_frameworks.calibrate(server.url, tmp_path_factory.mktemp("calibrate"),
                                           gates="answer-logprob")
        shutil.copy(spec, workdir / "gate.json")
        yield server.url


@pytest.fixture(scope="module")
def user_home(tiny: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A temporary ``HOME`` holding the reader's SR-RAG policy for the tiny model at
    ``~/.cache/rag-gates/srrag/policy`` (four labelled questions)."""
    from rag_gates.srrag import HiddenStateKeys, PolicyEntry, SourcePolicy

    root = tmp_path_factory.mktemp("user-home")
    policy = SourcePolicy.open(HiddenStateKeys(tiny), k=3,
                               path=root / ".cache" / "rag-gates" / "srrag" / "policy")
    policy.add_questions([PolicyEntry(id=str(i), question=q, source=source) for i, (q, source)
                          in enumerate([("Who wrote Macbeth?", "retrieval"),
                                        ("What is the capital of Italy?", "retrieval"),
                                        ("What colour is the sky?", "parametric"),
                                        ("Who painted the Mona Lisa?", "parametric")])])
    policy.close()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(root))
        yield root


@pytest.fixture(scope="module")
def sessions(request: pytest.FixtureRequest, workdir: Path, documents: list[dict[str, str]]
             ) -> Iterator[Callable[[str], Session]]:
    """Each document's :class:`Session`, made on first use (fixtures by name, lazily)."""
    made: dict[str, Session] = {}

    def prelude(doc: str) -> dict[str, Any]:
        get = request.getfixturevalue
        if doc == "agents":
            return agents_prelude(workdir, documents)
        if doc == "composition":
            from rag_gates.cbdr import ConfidenceProbe

            tiny = get("tiny")
            return composition_prelude(tiny, ConfidenceProbe.load(get("probe_dir"), lm=tiny),
                                       workdir)
        get("user_home")
        return scaling_prelude(get("tiny"), get("probe_dir"), get("served"),
                               get("served_model"), documents)

    def session(doc: str) -> Session:
        if doc not in made:
            made[doc] = Session(DOCS[doc], prelude(doc), workdir, BLOCKS[doc], __file__,
                                chained=CHAINED[doc])
        return made[doc]

    yield session
    for each in made.values():
        each.close()


# ---------------------------------------------------------------- what each block did


def check_agents_1(ns: dict[str, Any], values: list[Any]) -> None:
    """create_agent with both tools: the draft is verified, the Ed Wood / Paris claim
    flagged, searched with the verifier's query (the gate retrieves: 'Ed Wood' is in 6
    documents <= 10), the revision verified; the verdicts are the real verifier's."""
    from langchain_core.messages import AIMessage, SystemMessage, ToolMessage

    from langchain_rag_gates import GatedRetrieval
    from rag_gates.quco import ClaimVerifier, Verification

    assert [t.name for t in ns["tools"]] == ["verify_claims", "search_documents"]
    messages = ns["state"]["messages"]
    calls = [(c["name"], c["args"]) for m in messages if isinstance(m, AIMessage)
             for c in m.tool_calls]
    assert [n for n, _ in calls] == ["verify_claims", "search_documents", "verify_claims"]
    assert calls[0][1] == {"text": DRAFT} and calls[1][1] == {"query": "Ed Wood born in"}
    first, search, second = [m for m in messages if isinstance(m, ToolMessage)]
    verifier = ClaimVerifier(ns["stats"])
    assert json.loads(str(first.content)) == verifier.verify(DRAFT).summary()
    assert isinstance(first.artifact, Verification)
    assert ("Ed Wood", "Paris", 0) in [(c.claim.head, c.claim.tail, c.cooccurrence)
                                       for c in first.artifact.flagged]
    found, artifact = json.loads(str(search.content)), search.artifact
    assert isinstance(artifact, GatedRetrieval)
    assert artifact.decision.gate == "quco" and artifact.decision.retrieve
    assert "rare in the corpus" in found["reason"] and found["retrieved"] is True
    assert len(artifact.documents) == 3 == len(found["documents"])
    revised = calls[2][1]["text"]
    assert revised != DRAFT and revised.startswith(KEPT)
    assert json.loads(str(second.content)) == verifier.verify(revised).summary()
    assert messages[-1].content == revised and not messages[-1].tool_calls
    system = ns["chat_model"].seen[0][0]
    assert isinstance(system, SystemMessage) and "call verify_claims" in system.content


def check_agents_2(ns: dict[str, Any], values: list[Any]) -> None:
    """FunctionAgent with both tools, its first call forced to verify_claims: the same loop
    (verify, search with the verifier's query, verify the revision), the answer the revision,
    the reader's system prompt sent."""
    from llama_index.core.agent.workflow import AgentOutput

    output = ns["output"]
    assert isinstance(output, AgentOutput)
    assert ns["agent"].initial_tool_choice == "verify_claims"
    assert [t.metadata.name for t in ns["agent"].tools] == ["verify_claims",
                                                             "search_documents"]
    calls = [(c.tool_name, c.tool_kwargs) for c in output.tool_calls]
    assert [n for n, _ in calls] == ["verify_claims", "search_documents", "verify_claims"]
    assert calls[0][1] == {"text": DRAFT} and calls[1][1] == {"query": "Ed Wood born in"}
    revised = calls[2][1]["text"]
    assert revised != DRAFT and revised.startswith(KEPT)
    assert output.response.content == revised
    llm = ns["llm"]
    assert llm.seen[0][0].content == ns["SYSTEM_PROMPT"]
    # The search tool's result, as the model read it: the gate retrieved 3 nodes.
    search = next(json.loads(str(m.content)) for m in llm.seen[-1]
                  if m.role.value == "tool" and '"retrieved"' in str(m.content))
    assert search["retrieved"] is True and search["gate"] == "quco"
    assert len(search["documents"]) == 3


def check_composition_1(ns: dict[str, Any], values: list[Any]) -> None:
    """'Ed Wood' is in 6 documents: QuCo's rarity 1/7 is below the band 0.2..0.8, so the
    cheap gate decides (retrieve, at tau_entity 1000) and the probe is never asked."""
    from rag_gates.quco import QuCoGate

    ((retrieve, reason, called),) = values
    decision = ns["decision"]
    cheap = decision.evidence["cheap"]
    assert called is False and decision.evidence["expensive"] is None
    assert math.isclose(cheap["score"], 1 / 7)
    assert retrieve is True is QuCoGate(ns["stats"]).decide("Who directed Ed Wood?").retrieve
    assert reason == "quco decided outside its band 0.2..0.8: retrieve"
    # The expensive gate works on this model and probe: a finite score in [0, 1].
    expensive = ns["gate"].gates[1].decide("Who directed Ed Wood?")
    assert 0.0 <= expensive.score <= 1.0


def check_scaling_1(ns: dict[str, Any], values: list[Any]) -> None:
    """The client of the served 'wiki' index counts as the local index does (lower-cased),
    QuCoGate decides from it, and the block's own server is stopped after its ``with``."""
    from rag_gates.corpus import LocalInfiniGram

    stats, local = ns["stats"], LocalInfiniGram(ns["index_dir"])
    phrases = ["Ed Wood", "Scott Derrickson", "united states"]
    served = [r.value for r in stats.count_batch(phrases)]
    assert served == [r.value for r in local.count_batch(phrases)] and min(served) > 0
    decision = ns["gate"].decide(SCOTT)
    assert decision.evidence["counts"] == {"Scott Derrickson": served[1], "Ed Wood": served[0]}
    assert ns["server"].index_name == local.index_name  # the block's own server, closed
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(ns["server"].url, timeout=5)


def check_scaling_2(ns: dict[str, Any], values: list[Any]) -> None:
    """LangChain on a served model: calibrate's spec decides as the core answer-logprob gate
    at its certified threshold (this question's answer is likely enough: a skip, so no
    documents); the composite by name retrieves as its two gates say; ChatOpenAI's samples
    are OpenAICompatibleLM's."""
    from rag_gates.calibration import GateSpec
    from rag_gates.confidence import AnswerLogprobGate
    from rag_gates.lm import OpenAICompatibleLM
    from rag_gates.quco import QuCoGate
    from rag_gates.sample_agreement import SampleAgreementGate

    served, question = OpenAICompatibleLM(ns["url"]), ns["question"]
    spec = GateSpec.load("gate.json")
    assert spec.gate == "answer-logprob" and spec.certified and spec.threshold is not None
    core = AnswerLogprobGate(served, threshold=spec.threshold, max_new_tokens=8).decide(question)
    decision = ns["retriever"].last_decision
    assert decision.score == pytest.approx(core.score, abs=1e-9)
    assert decision.retrieve is core.retrieve is False and ns["docs"] == []
    quco = QuCoGate.from_threshold(ns["stats"], 0.3).decide(question)
    sampled = SampleAgreementGate(served, threshold=0.3, max_new_tokens=8).decide(question)
    assert ns["either"].decide(question).retrieve is (quco.retrieve or sampled.retrieve)
    assert values[-1] == sampled.evidence["samples"] and len(set(values[-1])) > 1


def check_scaling_3(ns: dict[str, Any], values: list[Any]) -> None:
    """LlamaIndex on a served model: OpenAILike through ``as_text_lm`` scores the answer as
    OpenAICompatibleLM does, and the gated retriever skips where the core gate does."""
    from rag_gates.confidence import AnswerLogprobGate
    from rag_gates.lm import OpenAICompatibleLM

    question = ns["question"]
    core = AnswerLogprobGate(OpenAICompatibleLM(ns["url"]), threshold=0.43,
                             max_new_tokens=8).decide(question)
    assert ns["gate"].decide(question).score == pytest.approx(core.score, abs=1e-9)
    assert core.retrieve is False and ns["nodes"] == []


def check_scaling_4(ns: dict[str, Any], values: list[Any]) -> None:
    """The worker's components: the policy is a read-only copy; the SR-RAG retriever returns
    the store's documents or one parametric document, as its decision says; the CBDR gate
    reads the saved probe; QuCo counts through the SQLite cache in the working directory."""
    from rag_gates.cbdr import CBDRGate, ConfidenceProbe
    from rag_gates.corpus import LocalInfiniGram
    from rag_gates.srrag import PolicyEntry, PolicyReadOnlyError

    with pytest.raises(PolicyReadOnlyError):
        ns["policy"].add_questions([PolicyEntry(id="x", question="Q?", source="retrieval")])
    retriever = ns["retriever"]
    for question in ("Who wrote Hamlet?", "What colour is the sky?"):
        docs = retriever.invoke(question)
        decision = retriever.last_decision
        assert all(d.metadata["rag_gates"]["retrieve"] is decision.retrieve for d in docs)
        if decision.retrieve:
            assert docs and all(d.metadata.get("source") != "parametric" for d in docs)
        else:
            assert len(docs) == 1 and docs[0].metadata["source"] == "parametric"
    lm, question = ns["lm"], "Who directed the film Ed Wood?"
    again = CBDRGate(lm, ConfidenceProbe.load(ns["probe_dir"], lm=lm)).decide(question)
    assert ns["cbdr"].decide(question).score == again.score and math.isfinite(again.score)
    quco = ns["quco"].decide(SCOTT)
    local = {e: r.value for e, r in zip(["Scott Derrickson", "Ed Wood"], LocalInfiniGram(
        ns["index_dir"]).count_batch(["Scott Derrickson", "Ed Wood"]), strict=True)}
    assert quco.evidence["counts"] == local and quco.retrieve is True
    cache = ns["quco"].stats
    assert (Path.cwd() / "counts.sqlite").is_file()  # the checks run in the reader's project
    hits = cache.hits
    ns["quco"].decide(SCOTT)
    assert cache.hits == hits + 2  # both entities from the cache the first decision wrote


CHECKS: dict[tuple[str, int], Callable[[dict[str, Any], list[Any]], None]] = {
    ("agents", 1): check_agents_1,
    ("agents", 2): check_agents_2,
    ("composition", 1): check_composition_1,
    ("scaling", 1): check_scaling_1,
    ("scaling", 2): check_scaling_2,
    ("scaling", 3): check_scaling_3,
    ("scaling", 4): check_scaling_4,
}


# ---------------------------------------------------------------- the tests


def test_each_document_has_the_blocks_this_test_knows() -> None:
    assert not set(CHECKS) & set(SKIPPED)
    check_block_counts(DOCS, BLOCKS, set(CHECKS) | set(SKIPPED))


@pytest.mark.parametrize(("doc", "block"), [
    pytest.param(d, i, marks=[pytest.mark.skip(reason=SKIPPED[(d, i)])]
                 if (d, i) in SKIPPED else [])
    for d, n in BLOCKS.items() for i in range(1, n + 1)])
def test_doc_block_runs(sessions: Callable[[str], Session], doc: str, block: int) -> None:
    session = sessions(doc)
    namespace, values = session.run(block)
    with contextlib.chdir(session.workdir):  # relative paths are the reader's project's
        CHECKS[(doc, block)](namespace, values)
