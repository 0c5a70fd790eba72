"""QuCo-RAG in a LlamaIndex application, offline on the embedded defaults.

An existing VectorStoreIndex (MiniLM embeddings over the HotpotQA sample's paragraphs) gets
QuCo's corpus-statistics gate: ``GatedQueryEngine`` retrieves only when the question's
entities are rare in the corpus and otherwise lets the LLM answer directly;
``QuCoQueryEngine`` runs the whole QuCo loop (gate, generation, claim verification,
re-retrieval for flagged claims). Each decision is printed with its evidence.

    .venv/bin/python examples/llama_index_quco.py

The index lives in Qdrant's local mode (``QdrantClient(location=":memory:")``; pass
``url=...`` for a Qdrant server): any existing LlamaIndex vector store works the same way.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.llms.rag_gates import RagGatesLLM
from llama_index.query_engine.rag_gates import GatedQueryEngine, QuCoQueryEngine
from llama_index.retrievers.rag_gates import passages_to_nodes
from llama_index.vector_stores.qdrant import QdrantVectorStore
from pydantic import PrivateAttr
from qdrant_client import QdrantClient

from rag_gates.eval.corpus import corpus_passages, load_corpus_stats
from rag_gates.lm import load_default_lm
from rag_gates.lm.defaults import load_default_embedder
from rag_gates.quco import QuCoGate
from rag_gates.quco.bench import BENCH_TAU_ENTITY

DATA = Path(__file__).resolve().parent / "data" / "hotpotqa_dev_sample.jsonl"
QUESTIONS = [
    "Were Scott Derrickson and Ed Wood of the same nationality?",  # rare entities: retrieve
    "What is the capital of the United States?",  # a common entity: answer directly
]


class MiniLMEmbedding(BaseEmbedding):
    """The embedded all-MiniLM-L6-v2 as a LlamaIndex embedding."""

    _model: Any = PrivateAttr()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(model_name="all-MiniLM-L6-v2", **kwargs)
        self._model = load_default_embedder()

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        vectors = self._model.encode(texts, normalize_embeddings=True, show_progress_bar=False)
        return [[float(x) for x in v] for v in vectors]

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._get_text_embeddings([text])[0]

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._get_text_embedding(query)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)


def show_decision(decision: dict[str, Any] | None) -> None:
    if decision is None:
        return
    print(f"  decision: retrieve={decision['retrieve']}  score={decision['score']:.4f}  "
          f"threshold={decision['threshold']:.4f}")
    print(f"  reason:   {decision['reason']}")
    print(f"  evidence: entities={decision['evidence']['entities']} "
          f"counts={decision['evidence'].get('counts')}")


# The application's existing index: the HotpotQA sample's paragraphs, MiniLM embeddings, in
# a Qdrant collection.
# Qdrant point ids must be UUIDs: derive one from each paragraph's id (kept in the metadata).
nodes = [n.node.model_copy(update={
            "id_": str(uuid.uuid5(uuid.NAMESPACE_URL, n.node.node_id)),
            "metadata": {**n.node.metadata, "paragraph_id": n.node.node_id}})
         for n in passages_to_nodes(corpus_passages("hotpotqa", DATA))]
qdrant = QdrantVectorStore(client=QdrantClient(location=":memory:"), collection_name="hotpotqa")
index = VectorStoreIndex(nodes, embed_model=MiniLMEmbedding(),
                         storage_context=StorageContext.from_defaults(vector_store=qdrant))
llm = RagGatesLLM(lm=load_default_lm(), max_new_tokens=48)  # the embedded SmolLM2

# QuCo's evidence: phrase counts in the HotpotQA + 2Wiki paragraphs (a local infini-gram
# index, built on first use and cached under $RAG_GATES_HOME).
stats = load_corpus_stats()
gate = QuCoGate(stats, tau_entity=BENCH_TAU_ENTITY)

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
                       tau_entity=BENCH_TAU_ENTITY, k=3, chunk_tokens=48, max_new_tokens=48,
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
