"""The Python blocks of the integration READMEs run as written, on real objects.

``integrations/langchain/README.md`` and ``integrations/llama-index/README.md`` show snippets
that use names the reader brings from their own app (``vector_store``, ``llm``, ``index``,
``gate``...). Each block is read verbatim from its README, by order, with the parser ``make
test-install`` uses (``tests/install/run_readme.py``); nothing is copied here. A README's
blocks run in order in one namespace, as in a reader's session (a later block sees what an
earlier one bound), executed statement by statement with ``exec`` (a bare expression's value
is kept for the checks; tracebacks name the README line). The namespace starts from that
README's *prelude* (:func:`langchain_prelude`, :func:`llama_index_prelude`), which binds only
the names the README leaves to the reader, each to a real object; after each block,
``CHECKS`` asserts what the block did.

The runner (``run_block``, ``Session``) and the fixtures are in ``tests/integration/snippets.py``.
The reader's documents and project directory (``workdir``): the paragraphs of the shipped
HotpotQA sample (``examples/my_documents.py``, the examples' stand-in for *your* documents) in
``docs/``, indexed with the README's own command ``rag-gates index build docs/ --out
indexes/docs`` (one cpu), so ``LocalInfiniGram("indexes/docs")`` opens it; the blocks run
with that directory as the working directory. Models: the tiny random-weight Llama of
``rag_gates.testing`` wherever the reader supplies one (plumbing only); the embedded SmolLM2
where a README itself loads it (``ChatRagGates(model="default")``, ``RagGatesLLM()``).
``RAG_GATES_HOME`` is private to the module (``home``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.install.run_readme import ROOT
from tests.integration.snippets import SCOTT, Session, check_block_counts, reader_gate

pytestmark = pytest.mark.integration

READMES = {"langchain": ROOT / "integrations" / "langchain" / "README.md",
           "llama-index": ROOT / "integrations" / "llama-index" / "README.md"}
#: How many ``python`` blocks each README has: the ones ``CHECKS`` knows.
BLOCKS = {"langchain": 3, "llama-index": 5}


# ---------------------------------------------------------------- the reader's side


def langchain_prelude(tiny: Any, workdir: Path, documents: list[dict[str, str]]
                      ) -> dict[str, Any]:
    """The names integrations/langchain/README.md leaves to the reader, as real objects.

    * block 1: ``any_langchain_chat_model``: a ``ChatRagGates`` over the tiny model;
    * block 2 (the "existing app"): ``vector_store``, LangChain's ``InMemoryVectorStore`` of
      the documents (``metadata["title"]``) under ``DeterministicFakeEmbedding`` (no model;
      hash-seeded vectors, so which documents come back is arbitrary but fixed); ``gate``
      (``snippets.reader_gate``); ``llm``, a ``ChatRagGates`` over the tiny model; ``format_docs``,
      ``rag_prompt`` and ``direct_prompt`` as in ``examples/langchain_quco.py``.
    """
    from langchain_core.documents import Document
    from langchain_core.embeddings import DeterministicFakeEmbedding
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.vectorstores import InMemoryVectorStore

    from langchain_rag_gates import ChatRagGates

    def format_docs(docs: list[Document]) -> str:
        return "\n\n".join(f"{d.metadata.get('title', '')}: {d.page_content}" for d in docs)

    vector_store = InMemoryVectorStore.from_documents(
        [Document(page_content=d["text"], metadata={"title": d["title"], "doc_id": d["id"]})
         for d in documents], DeterministicFakeEmbedding(size=32))
    llm = ChatRagGates(lm=tiny, max_tokens=16)
    direct_prompt = ChatPromptTemplate.from_template("Answer briefly.\nQuestion: {question}")
    rag_prompt = ChatPromptTemplate.from_template(
        "Answer briefly from the context.\nContext:\n{context}\n\nQuestion: {question}")
    return {"any_langchain_chat_model": ChatRagGates(lm=tiny, max_tokens=16),
            "vector_store": vector_store, "gate": reader_gate(workdir), "llm": llm,
            "format_docs": format_docs, "rag_prompt": rag_prompt,
            "direct_prompt": direct_prompt}


def llama_index_prelude(tiny: Any, workdir: Path, documents: list[dict[str, str]]
                        ) -> dict[str, Any]:
    """The names integrations/llama-index/README.md leaves to the reader, as real objects
    (``llm`` is not one: block 1 binds it to ``RagGatesLLM()``, the embedded SmolLM2).

    * block 1: ``any_llama_index_llm``: a ``RagGatesLLM`` over the tiny model;
    * block 2 (the "existing app"): ``index``, a ``VectorStoreIndex`` of the documents
      (``metadata["title"]``) under LlamaIndex's ``MockEmbedding`` (no model; equal vectors,
      so which nodes come back is arbitrary but fixed); ``gate`` (``snippets.reader_gate``).
    """
    from llama_index.core import Document, VectorStoreIndex
    from llama_index.core.embeddings import MockEmbedding
    from llama_index.llms.rag_gates import RagGatesLLM

    index = VectorStoreIndex.from_documents(
        [Document(text=d["text"], metadata={"title": d["title"], "doc_id": d["id"]})
         for d in documents], embed_model=MockEmbedding(embed_dim=8))
    return {"any_llama_index_llm": RagGatesLLM(lm=tiny, max_new_tokens=16), "index": index,
            "gate": reader_gate(workdir)}


PRELUDES = {"langchain": langchain_prelude, "llama-index": llama_index_prelude}


@pytest.fixture(scope="module")
def tiny_long() -> Any:
    """The tiny random-weight Llama with room for a few retrieved paragraphs (its byte-level
    BPE of 320 tokens spells QuCo's prompt with three of them in about 7,200 tokens)."""
    from rag_gates.testing import tiny_lm

    return tiny_lm(seed=0, max_context=16384)


@pytest.fixture(scope="module")
def sessions(tiny_long: Any, workdir: Path, documents: list[dict[str, str]]
             ) -> Iterator[Callable[[str], Session]]:
    """Each README's :class:`Session`, made on first use (a prelude costs seconds)."""
    made: dict[str, Session] = {}

    def get(readme: str) -> Session:
        if readme not in made:
            prelude = PRELUDES[readme](tiny_long, workdir, documents)
            made[readme] = Session(READMES[readme], prelude, workdir, BLOCKS[readme],
                                   __file__)
        return made[readme]

    yield get
    for session in made.values():
        session.close()


# ---------------------------------------------------------------- what each block did


def check_langchain_1(ns: dict[str, Any], values: list[Any]) -> None:
    """The embedded model answers with OpenAI-shaped logprobs; ``as_text_lm`` makes the
    reader's chat model a TextLM that generates."""
    from rag_gates.lm.base import TextLM

    top_logprobs, text = values
    assert "Paris" in ns["msg"].content  # SmolLM2, greedy
    assert len(top_logprobs) == 3
    assert all(isinstance(t["token"], str) and t["logprob"] <= 0 for t in top_logprobs)
    assert isinstance(ns["lm"], TextLM)
    assert isinstance(text, str)


def check_langchain_2(ns: dict[str, Any], values: list[Any]) -> None:
    """No entity in "two plus two": no retrieval, ``[]`` as the comment says; the router
    sends the rare-entity question through the retrieval chain and says why."""
    no_docs, reason = values
    assert no_docs == []
    assert isinstance(reason, str) and reason
    decision = ns["msg"].response_metadata["rag_gates"]
    assert decision["retrieve"] is True and "rare in the corpus" in reason
    assert isinstance(ns["msg"].content, str)
    docs = ns["retriever"].invoke(SCOTT)  # the gate says yes: k annotated copies
    assert len(docs) == 3 and all(d.metadata["rag_gates"]["retrieve"] for d in docs)


def check_langchain_3(ns: dict[str, Any], values: list[Any]) -> None:
    """QuCo retrieves for the rare entities; the router with the gate alone answers a
    common-entity question directly; the tool flags the README's claim with its query."""
    (answer, reason, rounds), titles, queries = values
    out = ns["out"]
    assert isinstance(answer, str) and isinstance(rounds, int) and rounds >= 0
    assert out["decision"]["retrieve"] is True and "rare in the corpus" in reason
    assert titles and all(isinstance(t, str) and t for t in titles)
    assert queries == ["Ed Wood born in"]  # the README's comment
    msg = ns["router"].invoke("What is the capital of the United States?")
    assert msg.response_metadata["rag_gates"]["retrieve"] is False  # 91 documents > 82


def check_llama_index_1(ns: dict[str, Any], values: list[Any]) -> None:
    """The embedded model's completion carries the token and its top-3 alternatives; the
    reader's LLM becomes a TextLM that generates; the conversions are imported."""
    from rag_gates.lm.base import TextLM

    (first,) = values
    assert ns["r"].text.strip() and ns["r"].text.startswith(first.token)
    assert len(ns["r"].logprobs[0]) == 4 and math.isfinite(first.logprob)
    assert isinstance(ns["lm"], TextLM)
    assert isinstance(ns["lm"].generate("Who wrote Hamlet?", max_new_tokens=4).text, str)
    assert all(callable(ns[n]) for n in ("node_to_passage", "passage_to_node", "annotate_node"))


def check_llama_index_2(ns: dict[str, Any], values: list[Any]) -> None:
    """The gate retrieves for the rare entities: the engine answers from 3 nodes, each a copy
    annotated with the decision."""
    annotation, reason = values
    assert annotation["retrieve"] is True and annotation["reason"] == reason
    assert "rare in the corpus" in reason
    assert len(ns["response"].source_nodes) == 3
    assert str(ns["response"]).strip()


def check_llama_index_3(ns: dict[str, Any], values: list[Any]) -> None:
    """"United States" is common in the reader's corpus (91 > 82 documents): no retrieval,
    no source nodes, and the LLM still answers."""
    counts, sources = values
    assert list(counts) == ["United States"] and counts["United States"] > 82
    assert sources == []
    assert ns["response"].metadata["rag_gates"]["retrieve"] is False
    assert str(ns["response"]).strip()


def check_llama_index_4(ns: dict[str, Any], values: list[Any]) -> None:
    """QuCo's loop: the pre-check retrieves for the rare entities, then verification records,
    rounds and trace; every passage used comes back as a node."""
    decision, verifications, (rounds, trace), sources = values
    assert decision["retrieve"] is True
    assert isinstance(verifications, list) and all("flagged" in v for v in verifications)
    assert isinstance(rounds, int) and rounds >= 0 and trace
    assert sources and all(n.node.metadata.get("title") for n in sources)
    assert str(ns["response"]).strip()


def check_llama_index_5(ns: dict[str, Any], values: list[Any]) -> None:
    """The tool's content is the JSON the README shows: the claim flagged, never co-occurring,
    and its query."""
    (content,) = values
    report = json.loads(content)
    assert report["queries"] == ["Ed Wood born in"]
    flag = report["flagged"][0]
    assert (flag["head"], flag["relation"], flag["tail"]) == ("Ed Wood", "born in", "Paris")
    assert flag["cooccurrence"] == 0 and flag["query"] == "Ed Wood born in"


CHECKS: dict[tuple[str, int], Callable[[dict[str, Any], list[Any]], None]] = {
    ("langchain", 1): check_langchain_1,
    ("langchain", 2): check_langchain_2,
    ("langchain", 3): check_langchain_3,
    ("llama-index", 1): check_llama_index_1,
    ("llama-index", 2): check_llama_index_2,
    ("llama-index", 3): check_llama_index_3,
    ("llama-index", 4): check_llama_index_4,
    ("llama-index", 5): check_llama_index_5,
}


# ---------------------------------------------------------------- the tests


def test_each_readme_has_the_blocks_this_test_knows() -> None:
    check_block_counts(READMES, BLOCKS, set(CHECKS))


@pytest.mark.parametrize(("readme", "block"),
                         [(r, i) for r, n in BLOCKS.items() for i in range(1, n + 1)])
def test_readme_block_runs(sessions: Callable[[str], Session], readme: str,
                           block: int) -> None:
    namespace, values = sessions(readme).run(block)
    CHECKS[(readme, block)](namespace, values)
