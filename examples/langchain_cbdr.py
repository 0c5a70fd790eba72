"""CBDR in a LangChain application, offline on the embedded defaults.

A BM25 retriever over the HotpotQA sample's paragraphs is wrapped in LangChain's
``ContextualCompressionRetriever`` with CBDR's ``ConfidenceGainReranker`` as the compressor:
the retrieved paragraphs are reordered by how much each one raises the model's probed
confidence that it answers right, ``Inc = Conf(q + paragraph) - Conf(q)``, and the best three
are kept. ``route_by_gate`` with a ``CBDRGate`` sends each question through that retrieval
chain only when ``Conf(q)`` is at most ``beta``; otherwise the model answers directly.

    .venv/bin/python examples/langchain_cbdr.py

Needs ``langchain-classic`` (``ContextualCompressionRetriever`` lives there in LangChain
1.x). The probe is the one shipped for the embedded SmolLM2 (``load_default_probe``; set
``RAG_GATES_CBDR_PROBE=DIR`` for one you trained with ``rag-gates cbdr train-probe``).
``beta`` belongs to a probe: calibrate it with ``rag-gates eval-gate --gate cbdr``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langchain_classic.retrievers import ContextualCompressionRetriever
from langchain_core.documents import Document
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from langchain_rag_gates import (
    ChatRagGates,
    ConfidenceGainReranker,
    passages_to_documents,
    route_by_gate,
)

from rag_gates.cbdr import CBDRGate, load_default_probe
from rag_gates.cbdr.bench import BENCH_BETA
from rag_gates.eval.corpus import corpus_passages
from rag_gates.lm import load_default_lm
from rag_gates.retrieval import BM25Retriever

DATA = Path(__file__).resolve().parent / "data" / "hotpotqa_dev_sample.jsonl"
QUESTIONS = [
    "Were Scott Derrickson and Ed Wood of the same nationality?",  # two obscure people
    "What is the capital of France?",  # what a model knows, if it knows anything
]
BETA = BENCH_BETA  # skip retrieval when Conf(q) > BETA; calibrated for the shipped probe
CANDIDATES = 8  # paragraphs retrieved for the reranker


def format_docs(docs: list[Document]) -> str:
    return "\n\n".join(f"{d.metadata.get('title', '')}: {d.page_content}" for d in docs)


# The application's retriever: BM25 over the HotpotQA sample's paragraphs (rag-gates' BM25,
# seen by LangChain as a runnable from a query to Documents; any LangChain retriever works).
bm25 = BM25Retriever.from_passages(corpus_passages("hotpotqa", DATA))


def bm25_search(query: str) -> list[Document]:
    return passages_to_documents(bm25.retrieve(query, k=CANDIDATES))


# CBDR reads the hidden states of a white-box model: the embedded SmolLM2, which also answers.
lm = load_default_lm()
llm = ChatRagGates(lm=lm, max_tokens=48)
probe = load_default_probe(lm)  # refused if it was trained on another model
retriever = ContextualCompressionRetriever(
    base_compressor=ConfidenceGainReranker.from_probe(lm, probe, top_n=3),
    base_retriever=RunnableLambda(bm25_search, name="bm25"),
)

direct_prompt = ChatPromptTemplate.from_template("Answer briefly.\nQuestion: {question}")
rag_prompt = ChatPromptTemplate.from_template(
    "Answer briefly from the context.\nContext:\n{context}\n\nQuestion: {question}")
# Both branches return {"question", "docs", "answer"}; the router adds its decision under
# "rag_gates".
with_docs = RunnablePassthrough.assign(docs=(lambda x: x["question"]) | retriever)
rag_chain = with_docs | RunnablePassthrough.assign(
    answer={"context": lambda x: format_docs(x["docs"]), "question": lambda x: x["question"]}
    | rag_prompt | llm)
direct_chain = RunnablePassthrough.assign(docs=lambda x: [], answer=direct_prompt | llm)
chain = route_by_gate(CBDRGate(lm, probe, beta=BETA), retrieve=rag_chain, direct=direct_chain)

print(f"probe: {probe.config.model_id}, layer {probe.layer}, prompts "
      f"{probe.prompts.style!r}; beta {BETA}")
for question in QUESTIONS:
    out: dict[str, Any] = chain.invoke({"question": question})
    decision = out["rag_gates"]
    print(f"\nQ: {question}")
    print(f"  decision: retrieve={decision['retrieve']}  "
          f"confidence={decision['evidence']['confidence']:.3f}  ({decision['reason']})")
    if out["docs"]:
        candidates = out["docs"][0].metadata["rag_gates_rerank"]["candidates"]
        print(f"  BM25's {candidates} paragraphs reranked by Inc = Conf(q + paragraph) - Conf(q):")
        for doc in out["docs"]:
            info = doc.metadata["rag_gates_rerank"]
            print(f"    {info['rank']}. Inc={doc.metadata['relevance_score']:+.4f}  "
                  f"(Conf with it {info['evidence']['confidence']:.3f}, BM25 "
                  f"{doc.metadata['score']:.2f})  {doc.metadata.get('title')}")
    print(f"  answer:   {str(out['answer'].content).strip()}")
