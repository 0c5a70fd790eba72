"""QuCo-RAG in a LlamaIndex application, offline on the embedded defaults.

Starting from a handful of your documents (here the paragraphs of the shipped HotpotQA sample,
see ``my_documents.py``), the script builds what QuCo needs and wires it into LlamaIndex:

1. the application's index: a ``VectorStoreIndex`` in Qdrant (local mode) with LlamaIndex's
   own ``HuggingFaceEmbedding`` (all-MiniLM-L6-v2 from a local directory);
2. QuCo's corpus statistics: an infini-gram index of the same documents, built with the public
   ``rag_gates.corpus.build_index`` (what ``rag-gates index build docs.jsonl --out
   indexes/my-docs --lowercase`` does) and opened as ``LocalInfiniGram``;
3. ``GatedQueryEngine``: retrieves only when the question's entities are rare in that corpus
   (in at most ``TAU_ENTITY`` documents), otherwise the LLM answers directly; and
   ``QuCoQueryEngine``: the whole QuCo loop (gate, generation, claim verification,
   re-retrieval for flagged claims). Each decision is printed with its evidence.

    .venv/bin/python examples/llama_index_quco.py

The documents' vectors are computed once and kept under ``$RAG_GATES_HOME/example-embeddings``
(``embedding_cache.py``, LlamaIndex's ``IngestionCache``); an index of yours holds its vectors
already: leave ``embedded_nodes`` out.

To point it at your own store: return your documents from ``my_documents()`` (or load them
here); replace ``QdrantClient(location=":memory:")`` by ``QdrantClient(url=...)`` or
``QdrantClient(path=...)``, or use the LlamaIndex index your application already has; set
``EMBED_MODEL`` to your embedding model's name or path and ``llm`` to your LLM (any LlamaIndex
LLM works with both engines). Build the corpus index once with ``rag-gates index build`` and
open it with ``LocalInfiniGram("indexes/my-docs", case="insensitive")``, or count in a
pre-training corpus with ``rag_gates.corpus.HostedInfiniGram``.

``TAU_ENTITY`` is a document count in *your* corpus, so it scales with the corpus: 10 of
these 491 documents. ``rag-gates eval-gate --gate quco --dataset popqa --n 500 --out
runs/gate-quco`` calibrates it on labelled questions (best accuracy; the rarity threshold ``t``
in ``runs/gate-quco/gate.json`` gives ``QuCoGate.from_threshold(stats, t)``, i.e.
``tau_entity = 1 / t - 1``); that command counts in the benchmark's index of 13,169 HotpotQA
and 2Wiki paragraphs, where it gave 82.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from embedding_cache import embedded_nodes
from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.embeddings.huggingface import HuggingFaceEmbedding
from llama_index.llms.rag_gates import RagGatesLLM
from llama_index.query_engine.rag_gates import GatedQueryEngine, QuCoQueryEngine
from llama_index.vector_stores.qdrant import QdrantVectorStore
from my_documents import my_documents, write_jsonl
from qdrant_client import QdrantClient

from rag_gates.corpus import LocalInfiniGram, build_index
from rag_gates.lm import default_embedder_path, load_default_lm
from rag_gates.quco import QuCoGate

QUESTIONS = [
    "Were Scott Derrickson and Ed Wood of the same nationality?",  # rare entities: retrieve
    "What is the capital of the United States?",  # a common entity: answer directly
]
TAU_ENTITY = 10  # retrieve when the question's entities are in at most 10 documents (above)
# The embedded all-MiniLM-L6-v2, extracted once; or your model: "sentence-transformers/...", a path
EMBED_MODEL = str(default_embedder_path())


def show_decision(decision: dict[str, Any] | None) -> None:
    if decision is None:
        return
    print(f"  decision: retrieve={decision['retrieve']}  score={decision['score']:.4f}  "
          f"threshold={decision['threshold']:.4f}")
    print(f"  reason:   {decision['reason']}")
    print(f"  evidence: entities={decision['evidence']['entities']} "
          f"counts={decision['evidence'].get('counts')}")


# Your documents as LlamaIndex Documents, in the application's index (Qdrant, local mode).
docs = my_documents()
qdrant = QdrantVectorStore(client=QdrantClient(location=":memory:"), collection_name="my-docs")
documents = [Document(text=d["text"], metadata={"title": d["title"], "doc_id": d["id"]})
             for d in docs]
embed_model = HuggingFaceEmbedding(model_name=EMBED_MODEL, device="cpu")
# Embedded once, then read back from LlamaIndex's ingestion cache (embedding_cache.py).
index = VectorStoreIndex(embedded_nodes(documents, embed_model), embed_model=embed_model,
                         storage_context=StorageContext.from_defaults(vector_store=qdrant))
llm = RagGatesLLM(lm=load_default_lm(), max_new_tokens=48)  # the embedded SmolLM2

# QuCo's evidence: phrase counts in the same documents (a lower-cased infini-gram index, so
# case is ignored; about a second to build for these documents).
workdir = tempfile.TemporaryDirectory(prefix="rag-gates-example-")
corpus_dir = Path(workdir.name) / "corpus-index"
build_index(write_jsonl(docs, Path(workdir.name) / "docs.jsonl"), corpus_dir, lowercase=True,
            cpus=1)
stats = LocalInfiniGram(corpus_dir, case="insensitive")
gate = QuCoGate(stats, tau_entity=TAU_ENTITY)

print("== GatedQueryEngine: retrieve only when QuCo's gate says so")
engine = GatedQueryEngine(index.as_query_engine(llm=llm, similarity_top_k=3), gate=gate,
                          llm=llm)
for question in QUESTIONS:
    response = engine.query(question)
    print(f"Q: {question}")
    show_decision(response.metadata["rag_gates"] if response.metadata else None)
    print(f"  sources:  {[n.node.metadata.get('title') for n in response.source_nodes]}")
    print(f"  answer:   {str(response).strip()}")

print("\n== QuCoQueryEngine: gate, generation, claim verification, re-retrieval")
quco = QuCoQueryEngine(llm, index.as_retriever(similarity_top_k=3), stats,
                       tau_entity=TAU_ENTITY, k=3, chunk_tokens=48, max_new_tokens=48,
                       max_rounds=2)
question = QUESTIONS[0]
response = quco.query(question)
meta = response.metadata or {}
print(f"Q: {question}")
show_decision(meta.get("rag_gates"))
for i, summary in enumerate(meta.get("verifications", [])):
    print(f"  verification {i}: {summary['claims_checked']} claims checked, flagged: "
          f"{json.dumps(summary['flagged'])}")
print(f"  rounds: {meta.get('rounds')}  stop: {meta.get('stop_reason')}")
print(f"  sources:  {[n.node.metadata.get('title') for n in response.source_nodes]}")
print(f"  answer:   {str(response).strip()}")

stats.close()
workdir.cleanup()
