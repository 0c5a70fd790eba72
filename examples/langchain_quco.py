"""QuCo-RAG in a LangChain application, offline on the embedded defaults.

An LCEL chain (``prompt | ChatRagGates``) gets QuCo's corpus-statistics gate through
``route_by_gate``: questions about entities the corpus rarely mentions go through a
retrieval chain, the others straight to the model. Then ``ClaimVerifierTool`` checks each
answer's claims against corpus co-occurrence (what an agent would do before replying).

    .venv/bin/python examples/langchain_quco.py
"""

from __future__ import annotations

import json
from pathlib import Path

from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_rag_gates import (
    ChatRagGates,
    ClaimVerifierTool,
    passages_to_documents,
    route_by_gate,
)

from rag_gates.eval.corpus import corpus_passages, load_corpus_stats
from rag_gates.lm import load_default_lm
from rag_gates.lm.defaults import load_default_embedder
from rag_gates.quco import ClaimVerifier, QuCoGate
from rag_gates.quco.bench import BENCH_TAU_ENTITY

DATA = Path(__file__).resolve().parent / "data" / "hotpotqa_dev_sample.jsonl"
QUESTIONS = [
    "Were Scott Derrickson and Ed Wood of the same nationality?",  # rare entities: retrieve
    "What is the capital of the United States?",  # a common entity: answer directly
]


class MiniLMEmbeddings(Embeddings):
    """The embedded all-MiniLM-L6-v2 as LangChain embeddings."""

    def __init__(self) -> None:
        self.model = load_default_embedder()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        vectors = self.model.encode(texts, normalize_embeddings=True, show_progress_bar=False)
        return [[float(x) for x in v] for v in vectors]

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


def format_docs(docs: list[Document]) -> str:
    return "\n\n".join(f"{d.metadata.get('title', '')}: {d.page_content}" for d in docs)


# The application's pieces: a vector store over the HotpotQA sample's paragraphs, a chat
# model (the embedded SmolLM2; any LangChain chat model works) and its chain.
store = InMemoryVectorStore(MiniLMEmbeddings())
store.add_documents(passages_to_documents(corpus_passages("hotpotqa", DATA)))
retriever = store.as_retriever(search_kwargs={"k": 3})
llm = ChatRagGates(lm=load_default_lm(), max_tokens=48)
direct_prompt = ChatPromptTemplate.from_template("Answer briefly.\nQuestion: {question}")
rag_prompt = ChatPromptTemplate.from_template(
    "Answer briefly from the context.\nContext:\n{context}\n\nQuestion: {question}")
chain = direct_prompt | llm

# QuCo's evidence: phrase counts in the HotpotQA + 2Wiki paragraphs (a local infini-gram
# index, built on first use and cached under $RAG_GATES_HOME).
stats = load_corpus_stats()
gated_chain = route_by_gate(
    QuCoGate(stats, tau_entity=BENCH_TAU_ENTITY),
    retrieve={"context": (lambda x: x["question"]) | retriever | format_docs,
              "question": lambda x: x["question"]} | rag_prompt | llm,
    direct=chain,
)
verify = ClaimVerifierTool(verifier=ClaimVerifier(stats))

for question in QUESTIONS:
    message = gated_chain.invoke({"question": question})
    decision = message.response_metadata["rag_gates"]
    print(f"Q: {question}")
    print(f"  decision: retrieve={decision['retrieve']}  ({decision['reason']})")
    print(f"  evidence: counts={decision['evidence'].get('counts')}")
    answer = str(message.content).strip()
    print(f"  answer:   {answer}")
    report = json.loads(verify.invoke({"text": answer or "."}))
    print(f"  verify_claims: {report['claims_checked']} claims checked, "
          f"{len(report['flagged'])} flagged")
    for flag in report["flagged"]:
        print(f"    flagged: {flag['reason']} -> query {flag['query']!r}")

# The tool as an agent sees it.
print(f"\ntool {verify.name!r}: {verify.description[:100]}...")
