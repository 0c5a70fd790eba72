"""CBDR in a LlamaIndex application, offline on the embedded defaults.

An existing VectorStoreIndex (MiniLM embeddings over the HotpotQA sample's paragraphs) gets
the two halves of CBDR, both reading one hidden state of the LLM through a small probe:

* ``GatedRetriever`` with a ``CBDRGate``: retrieve only when the probe's confidence that the
  model answers right, ``Conf(q)``, is at most ``beta``;
* ``ConfidenceGainReranker`` as the query engine's node postprocessor: the retrieved
  paragraphs are reordered by how much each one raises that confidence,
  ``Inc = Conf(q + paragraph) - Conf(q)``, and the best three go to the LLM.

Each question prints the gate's decision, the reranked titles with their ``Inc`` (and the
vector store's score they arrived with), and the answer.

    .venv/bin/python examples/llama_index_cbdr.py

The probe is the one shipped for the embedded SmolLM2 (``load_default_probe``; set
``RAG_GATES_CBDR_PROBE=DIR`` for one you trained with ``rag-gates cbdr train-probe``).
``beta`` belongs to a probe: calibrate it with ``rag-gates eval-gate --gate cbdr``.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.llms.rag_gates import RagGatesLLM
from llama_index.postprocessor.rag_gates import RERANK_KEY, ConfidenceGainReranker
from llama_index.retrievers.rag_gates import GatedRetriever, passages_to_nodes
from llama_index.vector_stores.qdrant import QdrantVectorStore
from pydantic import PrivateAttr
from qdrant_client import QdrantClient

from rag_gates.cbdr import CBDRGate, load_default_probe
from rag_gates.cbdr.bench import BENCH_BETA
from rag_gates.eval.corpus import corpus_passages
from rag_gates.lm import load_default_lm
from rag_gates.lm.defaults import load_default_embedder

DATA = Path(__file__).resolve().parent / "data" / "hotpotqa_dev_sample.jsonl"
QUESTIONS = [
    "Were Scott Derrickson and Ed Wood of the same nationality?",  # two obscure people
    "What is the capital of France?",  # what a model knows, if it knows anything
]
BETA = BENCH_BETA  # skip retrieval when Conf(q) > BETA; calibrated for the shipped probe
CANDIDATES = 8  # paragraphs retrieved for the reranker
MAX_NEW_TOKENS = 48


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


# The application's existing index: the HotpotQA sample's paragraphs, MiniLM embeddings, in
# a Qdrant collection (local mode; pass url=... for a Qdrant server).
# Qdrant point ids must be UUIDs: derive one from each paragraph's id (kept in the metadata).
nodes = [n.node.model_copy(update={
            "id_": str(uuid.uuid5(uuid.NAMESPACE_URL, n.node.node_id)),
            "metadata": {**n.node.metadata, "paragraph_id": n.node.node_id}})
         for n in passages_to_nodes(corpus_passages("hotpotqa", DATA))]
qdrant = QdrantVectorStore(client=QdrantClient(location=":memory:"), collection_name="hotpotqa")
index = VectorStoreIndex(nodes, embed_model=MiniLMEmbedding(),
                         storage_context=StorageContext.from_defaults(vector_store=qdrant))

# CBDR reads the hidden states of a white-box model: the embedded SmolLM2, which also answers.
lm = load_default_lm()
llm = RagGatesLLM(lm=lm, max_new_tokens=MAX_NEW_TOKENS)
probe = load_default_probe(lm)  # refused if it was trained on another model
gate = CBDRGate(lm, probe, beta=BETA)
retriever = GatedRetriever(index.as_retriever(similarity_top_k=CANDIDATES), gate=gate)
reranker = ConfidenceGainReranker.from_probe(lm, probe, top_n=3, keep_retrieval_score=True)
engine = RetrieverQueryEngine.from_args(retriever=retriever, llm=llm,
                                        node_postprocessors=[reranker])

print(f"probe: {probe.config.model_id}, layer {probe.layer}, prompts "
      f"{probe.prompts.style!r}; beta {BETA}")
for question in QUESTIONS:
    response = engine.query(question)
    decision = retriever.last_decision
    assert decision is not None
    print(f"\nQ: {question}")
    print(f"  decision: retrieve={decision.retrieve}  "
          f"confidence={decision.evidence['confidence']:.3f}  ({decision.reason})")
    if decision.retrieve:
        result = reranker.last_result
        assert result is not None
        print(f"  reranked {result.candidates} paragraphs by Inc = Conf(q + paragraph) - "
              f"Conf(q), Conf(q) = {result.evidence['question_confidence']:.3f}:")
        for n in response.source_nodes:
            info = n.node.metadata[RERANK_KEY]
            print(f"    {info['rank']}. Inc={n.score:+.4f}  "
                  f"(retrieval score {info['retrieval_score']:.3f})  "
                  f"{n.node.metadata.get('title')}")
        answer = str(response)
    else:
        # The engine's synthesizer has no nodes and says "Empty Response" (GatedQueryEngine
        # answers directly instead). CBDR's own skip path: the closed-book answer continues
        # from the probe's forward pass of the question, no second prefill.
        answer = gate.prefill(question, max_new_tokens=MAX_NEW_TOKENS).generate(
            max_new_tokens=MAX_NEW_TOKENS).text
        print("  no retrieval: closed-book answer from the gate's own forward pass")
    print(f"  answer:   {answer.strip()}")
