"""CBDR in a LangChain application, offline on the embedded defaults.

The application's retriever (LangChain's ``QdrantVectorStore`` in local mode with
``HuggingFaceEmbeddings``, all-MiniLM-L6-v2 from a local directory, over a handful of your
documents: here the paragraphs of the shipped HotpotQA sample, see ``my_documents.py``) is
wrapped in LangChain's ``ContextualCompressionRetriever`` with CBDR's
``ConfidenceGainReranker`` as the compressor: the retrieved paragraphs are reordered by how
much each one raises the model's probed confidence that it answers right,
``Inc = Conf(q + paragraph) - Conf(q)``, and the best three are kept. ``route_by_gate`` with a
``CBDRGate`` sends each question through that retrieval chain only when ``Conf(q)`` is at most
the probe's calibrated ``beta``; otherwise the model answers directly.

    .venv/bin/python examples/langchain_cbdr.py

The documents' vectors are computed once and kept under ``$RAG_GATES_HOME/example-embeddings``
(``embedding_cache.py``, LangChain's ``CacheBackedEmbeddings``); a vector store of yours holds
its vectors already: leave ``cached_embeddings`` out.

To point it at your own store: return your documents from ``my_documents()`` (or load them
here); replace ``location=":memory:"`` by ``url=...`` (a Qdrant server) or ``path=...``, or
pass the retriever your application already has as ``base_retriever``; set ``EMBED_MODEL`` to
your embedding model's name or path. CBDR itself needs a white-box model (here the embedded
SmolLM2, ``load_lm(PATH_OR_HUB_ID)`` for another) and a probe trained for that model.

Needs ``langchain-classic`` (``ContextualCompressionRetriever`` lives there in LangChain
1.x), ``langchain-huggingface`` and ``langchain-qdrant``: ``pip install
"langchain-rag-gates[examples]"``. The probe is the one shipped for the embedded SmolLM2
(``load_default_probe``; set ``RAG_GATES_CBDR_PROBE=DIR`` for one you trained with ``rag-gates
cbdr train-probe``). The gate's ``beta`` belongs to the probe and travels with it (``probe.json``'s
``calibration``, ``probe.beta``): 0.442 for the shipped one, certified with
``rag_gates.calibration`` on calibration questions that are no evaluation rows
(``benchmarks/cbdr_threshold.py``; docs/fidelity.md, row C17). Certify one for your probe
with ``rag-gates calibrate``, or pass ``beta=`` to the gate (``beta=1.0`` always retrieves).
"""

from __future__ import annotations

from typing import Any

from embedding_cache import cached_embeddings
from langchain_classic.retrievers import ContextualCompressionRetriever
from langchain_core.documents import Document
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from langchain_huggingface import HuggingFaceEmbeddings
from langchain_qdrant import QdrantVectorStore
from my_documents import my_documents

from langchain_rag_gates import ChatRagGates, ConfidenceGainReranker, route_by_gate
from rag_gates.cbdr import CBDRGate, load_default_probe
from rag_gates.lm import default_embedder_path, load_default_lm

QUESTIONS = [
    "Were Scott Derrickson and Ed Wood of the same nationality?",  # two obscure people
    "What is the capital of France?",  # what a model knows, if it knows anything
]
CANDIDATES = 8  # paragraphs retrieved for the reranker
# The embedded all-MiniLM-L6-v2, extracted once; or your model: "sentence-transformers/...", a path
EMBED_MODEL = str(default_embedder_path())


def format_docs(docs: list[Document]) -> str:
    return "\n\n".join(f"{d.metadata.get('title', '')}: {d.page_content}" for d in docs)


# Your documents in the application's vector store (Qdrant, local mode).
store = QdrantVectorStore.from_documents(
    [Document(page_content=d["text"], metadata={"title": d["title"], "doc_id": d["id"]})
     for d in my_documents()],
    cached_embeddings(HuggingFaceEmbeddings(  # embedded once (embedding_cache.py)
        model_name=EMBED_MODEL, model_kwargs={"device": "cpu"},
        encode_kwargs={"normalize_embeddings": True})),
    location=":memory:", collection_name="my-docs")

# CBDR reads the hidden states of a white-box model: the embedded SmolLM2, which also answers.
lm = load_default_lm()
llm = ChatRagGates(lm=lm, max_tokens=48)
probe = load_default_probe(lm)  # refused if it was trained on another model
retriever = ContextualCompressionRetriever(
    base_compressor=ConfidenceGainReranker.from_probe(lm, probe, top_n=3),
    base_retriever=store.as_retriever(search_kwargs={"k": CANDIDATES}),
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
gate = CBDRGate(lm, probe)  # skips retrieval when Conf(q) > probe.beta (calibrated, above)
chain = route_by_gate(gate, retrieve=rag_chain, direct=direct_chain)

print(f"probe: {probe.config.model_id}, layer {probe.layer}, prompts "
      f"{probe.prompts.style!r}; beta {gate.beta:g}")
for question in QUESTIONS:
    out: dict[str, Any] = chain.invoke({"question": question})
    decision = out["rag_gates"]
    print(f"\nQ: {question}")
    print(f"  decision: retrieve={decision['retrieve']}  "
          f"confidence={decision['evidence']['confidence']:.3f}  ({decision['reason']})")
    if out["docs"]:
        candidates = out["docs"][0].metadata["rag_gates_rerank"]["candidates"]
        print(f"  the store's {candidates} paragraphs reranked by Inc = Conf(q + paragraph) - "
              "Conf(q):")
        for doc in out["docs"]:
            info = doc.metadata["rag_gates_rerank"]
            print(f"    {info['rank']}. Inc={doc.metadata['relevance_score']:+.4f}  "
                  f"(Conf with it {info['evidence']['confidence']:.3f})  "
                  f"{doc.metadata.get('title')}")
    print(f"  answer:   {str(out['answer'].content).strip()}")
