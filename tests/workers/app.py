"""One worker process of a RAG app: what each uvicorn/gunicorn/Celery worker builds from the
shared artifacts on disk, and its answers. The test starts several at once (spawn)."""

from __future__ import annotations

import os
import traceback
from typing import Any

QUESTIONS = ["Who wrote Hamlet?", "What is the capital of France?",
             "Where does the quick brown fox jump?", "Do scientists measure recall on data?",
             "In which city was William Shakespeare born?", "Who directed the film Ed Wood?"]


def build(spec: dict[str, Any]) -> dict[str, Any]:
    """Every component, built from the files named in ``spec`` as a worker would."""
    import torch
    from langchain_core.embeddings import DeterministicFakeEmbedding
    from langchain_core.vectorstores import InMemoryVectorStore
    from llama_index.retrievers.rag_gates import PassageRetriever
    from llama_index.retrievers.rag_gates import SelfRoutingRetriever as LlamaIndexSelfRouting

    from langchain_rag_gates import SelfRoutingRetriever as LangChainSelfRouting
    from rag_gates.cbdr import CBDRGate, ConfidenceProbe
    from rag_gates.corpus import CachedCorpusStats, LocalInfiniGram
    from rag_gates.lm import load_lm
    from rag_gates.quco import QuCoGate
    from rag_gates.retrieval.bm25 import BM25Retriever
    from rag_gates.srrag import SelfRoutingGate, SourcePolicy, Verbalizer
    from rag_gates.types import Passage

    torch.set_num_threads(1)
    lm = load_lm(spec["model"])
    texts = spec["texts"]

    def srrag_gate() -> SelfRoutingGate:
        # Each framework's retriever opens the one policy folder itself (read-only).
        return SelfRoutingGate(lm, SourcePolicy.open_existing(lm, path=spec["policy"], k=3),
                               tau=spec["tau"])

    store = InMemoryVectorStore.from_texts(texts, embedding=DeterministicFakeEmbedding(size=16))
    bm25 = BM25Retriever.from_passages([Passage(id=f"p{i}", text=t)
                                        for i, t in enumerate(texts)])
    stats = CachedCorpusStats(LocalInfiniGram(spec["index"]), path=spec["count_cache"])
    return {
        "langchain": LangChainSelfRouting(retriever=store.as_retriever(), gate=srrag_gate(),
                                          verbalizer=Verbalizer(lm, max_new_tokens=4), k=2),
        "llama_index": LlamaIndexSelfRouting(PassageRetriever(bm25, similarity_top_k=2),
                                             srrag_gate(),
                                             verbalizer=Verbalizer(lm, max_new_tokens=4)),
        "cbdr": CBDRGate(lm, ConfidenceProbe.load(spec["probe"], lm=lm), beta=spec["beta"]),
        "quco": QuCoGate(stats, tau_entity=spec["tau_entity"]),
        "stats": stats,
    }


def answer(parts: dict[str, Any]) -> list[dict[str, Any]]:
    """Each component on every question: the decision and what came back."""
    rows = []
    for q in QUESTIONS:
        docs = parts["langchain"].invoke(q)
        lc = parts["langchain"].last_decision
        nodes = parts["llama_index"].retrieve(q)
        li = parts["llama_index"].last_decision
        cbdr = parts["cbdr"].decide(q)
        quco = parts["quco"].decide(q)
        rows.append({
            "question": q,
            "langchain": [lc.retrieve, lc.score, [d.page_content for d in docs]],
            "llama_index": [li.retrieve, li.score, [n.node.get_content() for n in nodes]],
            "cbdr": [cbdr.retrieve, cbdr.score],
            "quco": [quco.retrieve, quco.score, quco.evidence.get("entities")],
        })
    return rows


def worker(spec: dict[str, Any], barrier: Any, results: Any) -> None:
    """Build, wait until every worker has built, answer at the same time, report."""
    try:
        parts = build(spec)
        barrier.wait(timeout=300)
        rows = answer(parts)
        parts["stats"].close()
        results.put((os.getpid(), "ok", rows))
    except BaseException:  # reported to the test, which fails with the worker's traceback
        barrier.abort()  # the others stop waiting for this one
        results.put((os.getpid(), "error", traceback.format_exc()))


def reference(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The answers of one process alone (the test's own)."""
    parts = build(spec)
    try:
        return answer(parts)
    finally:
        parts["stats"].close()
