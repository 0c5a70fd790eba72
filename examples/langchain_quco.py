"""QuCo-RAG in a LangChain application, offline on the embedded defaults.

Starting from a handful of your documents (here the paragraphs of the shipped HotpotQA sample,
see ``my_documents.py``), the script builds what QuCo needs and wires it into LCEL:

1. the application's retriever: LangChain's ``QdrantVectorStore`` (local mode) with
   ``HuggingFaceEmbeddings`` (all-MiniLM-L6-v2 from a local directory);
2. QuCo's corpus statistics: an infini-gram index of the same documents, built with the public
   ``rag_gates.corpus.build_index`` (what ``rag-gates index build docs.jsonl --out
   indexes/my-docs --lowercase`` does) and opened as ``LocalInfiniGram``;
3. ``route_by_gate`` with a ``QuCoGate``: questions about entities the corpus rarely mentions
   (in at most ``TAU_ENTITY`` documents) go through the retrieval chain, the others straight
   to the model; then ``ClaimVerifierTool`` checks each answer's claims against corpus
   co-occurrence (what an agent would do before replying).

    .venv/bin/python examples/langchain_quco.py

The documents' vectors are computed once and kept under ``$RAG_GATES_HOME/example-embeddings``
(``embedding_cache.py``, LangChain's ``CacheBackedEmbeddings``); a vector store of yours holds
its vectors already: leave ``cached_embeddings`` out.

To point it at your own store: return your documents from ``my_documents()`` (or load them
here); replace ``location=":memory:"`` by ``url=...`` (a Qdrant server) or ``path=...``, or use
the retriever your application already has; set ``EMBED_MODEL`` to your embedding model's
name or path and ``llm`` to your chat model (any LangChain chat model works). Build the corpus
index once with ``rag-gates index build`` and open it with ``LocalInfiniGram("indexes/my-docs",
case="insensitive")``, or count in a pre-training corpus with
``rag_gates.corpus.HostedInfiniGram``.

``TAU_ENTITY`` is a document count in *your* corpus (10 of these 491 documents); how to
calibrate it with ``rag-gates eval-gate --gate quco``: see ``llama_index_quco.py``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from embedding_cache import cached_embeddings
from langchain_core.documents import Document
from langchain_core.prompts import ChatPromptTemplate
from langchain_huggingface import HuggingFaceEmbeddings
from langchain_qdrant import QdrantVectorStore
from my_documents import my_documents, write_jsonl

from langchain_rag_gates import ChatRagGates, ClaimVerifierTool, route_by_gate
from rag_gates.corpus import LocalInfiniGram, build_index
from rag_gates.lm import default_embedder_path, load_default_lm
from rag_gates.quco import ClaimVerifier, QuCoGate

QUESTIONS = [
    "Were Scott Derrickson and Ed Wood of the same nationality?",  # rare entities: retrieve
    "What is the capital of the United States?",  # a common entity: answer directly
]
TAU_ENTITY = 10  # retrieve when the question's entities are in at most 10 documents (above)
# The embedded all-MiniLM-L6-v2, extracted once; or your model: "sentence-transformers/...", a path
EMBED_MODEL = str(default_embedder_path())


def format_docs(docs: list[Document]) -> str:
    return "\n\n".join(f"{d.metadata.get('title', '')}: {d.page_content}" for d in docs)


# Your documents in the application's vector store (Qdrant, local mode), a chat model (the
# embedded SmolLM2; any LangChain chat model works) and its chain.
docs = my_documents()
store = QdrantVectorStore.from_documents(
    [Document(page_content=d["text"], metadata={"title": d["title"], "doc_id": d["id"]})
     for d in docs],
    cached_embeddings(HuggingFaceEmbeddings(  # embedded once (embedding_cache.py)
        model_name=EMBED_MODEL, model_kwargs={"device": "cpu"},
        encode_kwargs={"normalize_embeddings": True})),
    location=":memory:", collection_name="my-docs")
retriever = store.as_retriever(search_kwargs={"k": 3})
llm = ChatRagGates(lm=load_default_lm(), max_tokens=48)
direct_prompt = ChatPromptTemplate.from_template("Answer briefly.\nQuestion: {question}")
rag_prompt = ChatPromptTemplate.from_template(
    "Answer briefly from the context.\nContext:\n{context}\n\nQuestion: {question}")
chain = direct_prompt | llm

# QuCo's evidence: phrase counts in the same documents (a lower-cased infini-gram index, so
# case is ignored; about a second to build for these documents).
workdir = tempfile.TemporaryDirectory(prefix="rag-gates-example-")
corpus_dir = Path(workdir.name) / "corpus-index"
build_index(write_jsonl(docs, Path(workdir.name) / "docs.jsonl"), corpus_dir, lowercase=True,
            cpus=1)
stats = LocalInfiniGram(corpus_dir, case="insensitive")
gated_chain = route_by_gate(
    QuCoGate(stats, tau_entity=TAU_ENTITY),
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

stats.close()
workdir.cleanup()
