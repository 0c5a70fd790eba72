"""CBDR in a LlamaIndex application, offline on the embedded defaults.

An application's VectorStoreIndex over a handful of your documents (here the paragraphs of the
shipped HotpotQA sample, see ``my_documents.py``; LlamaIndex's own ``HuggingFaceEmbedding``
with all-MiniLM-L6-v2 from a local directory, in Qdrant's local mode) gets the two halves of
CBDR, both reading one hidden state of the LLM through a small probe:

* ``GatedRetriever`` with a ``CBDRGate``: retrieve only when the probe's confidence that the
  model answers right, ``Conf(q)``, is at most ``beta``;
* ``ConfidenceGainReranker`` as the query engine's node postprocessor: the retrieved
  paragraphs are reordered by how much each one raises that confidence,
  ``Inc = Conf(q + paragraph) - Conf(q)``, and the best three go to the LLM.

Each question prints the gate's decision, the reranked titles with their ``Inc`` (and the
vector store's score they arrived with), and the answer.

    .venv/bin/python examples/llama_index_cbdr.py

The documents' vectors are computed once and kept under ``$RAG_GATES_HOME/example-embeddings``
(``embedding_cache.py``, LlamaIndex's ``IngestionCache``); an index of yours holds its vectors
already: leave ``embedded_nodes`` out.

To point it at your own store: return your documents from ``my_documents()`` (or load them
here); replace ``QdrantClient(location=":memory:")`` by ``QdrantClient(url=...)`` or
``QdrantClient(path=...)``, or use the LlamaIndex index your application already has; set
``EMBED_MODEL`` to your embedding model's name or path. CBDR itself needs a white-box model
(here the embedded SmolLM2, ``load_lm(PATH_OR_HUB_ID)`` for another) and a probe trained for
that model (``rag-gates cbdr train-probe``).

The probe is the one shipped for the embedded SmolLM2 (``load_default_probe``; set
``RAG_GATES_CBDR_PROBE=DIR`` for one you trained with ``rag-gates cbdr train-probe``).
The gate's ``beta`` belongs to the probe and travels with it (``probe.json``'s
``calibration``, ``probe.beta``): 0.442 for the shipped one, certified with
``rag_gates.calibration`` on calibration questions that are no evaluation rows
(``benchmarks/cbdr_threshold.py``; docs/fidelity.md, row C17). Certify one for your probe
with ``rag-gates calibrate``, or pass ``beta=`` to the gate (``beta=1.0`` always retrieves).
"""

from __future__ import annotations

from embedding_cache import embedded_nodes
from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.embeddings.huggingface import HuggingFaceEmbedding
from llama_index.llms.rag_gates import RagGatesLLM
from llama_index.postprocessor.rag_gates import RERANK_KEY, ConfidenceGainReranker
from llama_index.retrievers.rag_gates import GatedRetriever
from llama_index.vector_stores.qdrant import QdrantVectorStore
from my_documents import my_documents
from qdrant_client import QdrantClient

from rag_gates.cbdr import CBDRGate, load_default_probe
from rag_gates.lm import default_embedder_path, load_default_lm

QUESTIONS = [
    "Were Scott Derrickson and Ed Wood of the same nationality?",  # two obscure people
    "What is the capital of France?",  # what a model knows, if it knows anything
]
CANDIDATES = 8  # paragraphs retrieved for the reranker
MAX_NEW_TOKENS = 48
# The embedded all-MiniLM-L6-v2, extracted once; or your model: "sentence-transformers/...", a path
EMBED_MODEL = str(default_embedder_path())


# Your documents as LlamaIndex Documents, in the application's index (Qdrant, local mode).
qdrant = QdrantVectorStore(client=QdrantClient(location=":memory:"), collection_name="my-docs")
documents = [Document(text=d["text"], metadata={"title": d["title"], "doc_id": d["id"]})
             for d in my_documents()]
embed_model = HuggingFaceEmbedding(model_name=EMBED_MODEL, device="cpu")
# Embedded once, then read back from LlamaIndex's ingestion cache (embedding_cache.py).
index = VectorStoreIndex(embedded_nodes(documents, embed_model), embed_model=embed_model,
                         storage_context=StorageContext.from_defaults(vector_store=qdrant))

# CBDR reads the hidden states of a white-box model: the embedded SmolLM2, which also answers.
lm = load_default_lm()
llm = RagGatesLLM(lm=lm, max_new_tokens=MAX_NEW_TOKENS)
probe = load_default_probe(lm)  # refused if it was trained on another model
gate = CBDRGate(lm, probe)  # skips retrieval when Conf(q) > probe.beta (calibrated, above)
retriever = GatedRetriever(index.as_retriever(similarity_top_k=CANDIDATES), gate=gate)
reranker = ConfidenceGainReranker.from_probe(lm, probe, top_n=3, keep_retrieval_score=True)
engine = RetrieverQueryEngine.from_args(retriever=retriever, llm=llm,
                                        node_postprocessors=[reranker])

print(f"probe: {probe.config.model_id}, layer {probe.layer}, prompts "
      f"{probe.prompts.style!r}; beta {gate.beta:g}")
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
