"""SR-RAG in a LlamaIndex application, offline on the embedded defaults.

The application's index (a ``VectorStoreIndex`` in Qdrant local mode with LlamaIndex's own
``HuggingFaceEmbedding``, all-MiniLM-L6-v2 from a local directory, over a handful of your
documents: here the paragraphs of the shipped HotpotQA sample, see ``my_documents.py``) keeps
its retriever; ``SelfRoutingRetriever`` wraps it and the ``RetrieverQueryEngine`` stays as it
is. Per question SR-RAG routes either to the index or to the model's own knowledge:

    retrieve  iff  p_M * p_D >= tau

``p_M`` is the model's own preference (its next-token share of "Search" against "Memory"
after a routing instruction), ``p_D`` the vote of the ``k`` labelled questions nearest to
this one in a kNN policy datastore (``SourcePolicy``, a Qdrant collection; key: the model's
hidden state of the question's last token). Routed to the model, it first writes what it
knows as a background document (GenRead), which comes back as the one source node
(``metadata["source"] == "parametric"``) and the answer is written from it. Each question
prints the routing decision from the nodes' metadata (route, ``p_M``, ``p_D``, the nearest
labelled questions, the reason), the sources and the answer.

    .venv/bin/python examples/llama_index_srrag.py

The policy here is a toy, built in the script: a dozen questions labelled by hand (long-tail
people and places: retrieval; textbook facts: the model's memory) in an in-memory Qdrant,
voting with ``K = 3`` neighbours. A real one holds the model's own labels for hundreds of
training questions (Algorithm 1: the source under which the model finds the gold answer
likelier), built once and kept on disk::

    rag-gates srrag label --dataset popqa --n 300 --offset 500 --out labels.jsonl
    rag-gates srrag build-policy --labels labels.jsonl    # ~/.cache/rag-gates/srrag/policy

and opened here with ``SourcePolicy.open_existing(lm)`` (``path=...`` or ``url=...`` for a
Qdrant server) in place of ``toy_policy``, with the paper's ``k = 30``. ``TAU`` is the
paper's 0.1, not calibrated for SmolLM2 (``rag-gates srrag routing-auroc`` and ``rag-gates
bench --methods srrag@0.1,srrag@0.2`` help choose it; see docs/methods/srrag.md).

The documents' vectors are computed once and kept under ``$RAG_GATES_HOME/example-embeddings``
(``embedding_cache.py``, LlamaIndex's ``IngestionCache``); an index of yours holds its vectors
already: leave ``embedded_nodes`` out.

To point it at your own store: return your documents from ``my_documents()`` (or load them
here); replace ``QdrantClient(location=":memory:")`` by ``QdrantClient(url=...)`` or
``QdrantClient(path=...)``, or use the index your application already has; set
``EMBED_MODEL`` to your embedding model. Routing reads the model's next-token distribution
and hidden states, so it needs a white-box model (here the embedded SmolLM2; ``load_lm(PATH)``
for another); the answer can come from any LlamaIndex LLM.
"""

from __future__ import annotations

from embedding_cache import embedded_nodes
from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.embeddings.huggingface import HuggingFaceEmbedding
from llama_index.llms.rag_gates import RagGatesLLM
from llama_index.retrievers.rag_gates import ANNOTATION_KEY, SelfRoutingRetriever
from llama_index.vector_stores.qdrant import QdrantVectorStore
from my_documents import my_documents
from my_routing_labels import QUESTIONS, TAU, K, show_route, toy_policy
from qdrant_client import QdrantClient

from rag_gates.lm import default_embedder_path, load_default_lm
from rag_gates.srrag import SelfRoutingGate, Verbalizer

# The embedded all-MiniLM-L6-v2, extracted once; or your model: "sentence-transformers/...", a path
EMBED_MODEL = str(default_embedder_path())


docs = my_documents()
qdrant = QdrantVectorStore(client=QdrantClient(location=":memory:"), collection_name="my-docs")
documents = [Document(text=d["text"], metadata={"title": d["title"], "doc_id": d["id"]})
             for d in docs]
embed_model = HuggingFaceEmbedding(model_name=EMBED_MODEL, device="cpu")
# Embedded once, then read back from LlamaIndex's ingestion cache (embedding_cache.py).
index = VectorStoreIndex(embedded_nodes(documents, embed_model), embed_model=embed_model,
                         storage_context=StorageContext.from_defaults(vector_store=qdrant))

lm = load_default_lm()  # the embedded SmolLM2: it routes, verbalizes and answers
policy = toy_policy(lm)
retriever = SelfRoutingRetriever(
    index.as_retriever(similarity_top_k=3),
    gate=SelfRoutingGate(lm, policy, tau=TAU),
    # The paper caps a verbalization at 150 tokens; 48 keeps the example quick.
    verbalizer=Verbalizer(lm, max_new_tokens=48))
# The application's query engine, unchanged but for its retriever.
engine = RetrieverQueryEngine.from_args(retriever=retriever,
                                        llm=RagGatesLLM(lm=lm, max_new_tokens=32))

print(f"policy: {len(policy)} labelled questions, k={K}, tau={TAU}")
for question in QUESTIONS:
    response = engine.query(question)
    print(f"\nQ: {question}")
    show_route(response.source_nodes[0].node.metadata[ANNOTATION_KEY])
    first = response.source_nodes[0].node
    if first.metadata.get("source") == "parametric":
        print(f"  source: parametric ({first.metadata['tokens']} tokens, hit the cap: "
              f"{first.metadata['hit_token_cap']}): {first.get_content()[:160]!r}")
    else:
        print(f"  sources: {[n.node.metadata.get('title') for n in response.source_nodes]}")
    print(f"  answer: {str(response).strip()}")
policy.close()
