"""Tok-RAG in a LlamaIndex application, offline on the embedded defaults.

The application's index (a ``VectorStoreIndex`` in Qdrant local mode with LlamaIndex's own
``HuggingFaceEmbedding``, all-MiniLM-L6-v2 from a local directory, over a handful of your
documents: here the paragraphs of the shipped HotpotQA sample, see ``my_documents.py``) keeps
its retriever; only the response synthesizer changes: ``TokRAGSynthesizer`` hands the
retrieved nodes to the decoder separately from the question. The model then writes the answer
twice in lockstep, with the nodes and without them; where the two disagree on the next token,
Tok-RAG keeps the side the retrieved text supports (by default the authors' released judge:
the RAG stream's top-2 expected embedding against the most attended passage tokens, at one
fixed layer; ``TokRAGConfig(judge="paper")`` for the paper's score at the fusion layer l*).
Each disagreement is printed.

    .venv/bin/python examples/llama_index_tokrag.py

The documents' vectors are computed once and kept under ``$RAG_GATES_HOME/example-embeddings``
(``embedding_cache.py``, LlamaIndex's ``IngestionCache``); an index of yours holds its vectors
already: leave ``embedded_nodes`` out.

To point it at your own store: return your documents from ``my_documents()`` (or load them
here); replace ``QdrantClient(location=":memory:")`` by ``QdrantClient(url=...)`` or
``QdrantClient(path=...)``, or use the index your application already has; set
``EMBED_MODEL`` to your embedding model. Tok-RAG needs a white-box model (here the embedded
SmolLM2; ``load_lm(PATH_OR_HUB_ID)`` for another Llama-family model). ``method="cad"`` or
``"adacad"`` gives context-aware decoding over the same two streams.
"""

from __future__ import annotations

from embedding_cache import embedded_nodes
from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.embeddings.huggingface import HuggingFaceEmbedding
from llama_index.response_synthesizers.rag_gates import CHOICES_KEY, TokRAGSynthesizer
from llama_index.vector_stores.qdrant import QdrantVectorStore
from my_documents import my_documents
from qdrant_client import QdrantClient

from rag_gates.lm import default_embedder_path, load_default_lm

QUESTIONS = [
    "Were Scott Derrickson and Ed Wood of the same nationality?",
    "Which magazine was started first, Arthur's Magazine or First for Women?",
]
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

synth = TokRAGSynthesizer(lm=load_default_lm(), max_new_tokens=32)  # the embedded SmolLM2
# One argument switches the engine to Tok-RAG (llm= only because no Settings.llm is set here).
engine = index.as_query_engine(llm=synth.llm, similarity_top_k=3, response_synthesizer=synth)

for question in QUESTIONS:
    response = engine.query(question)
    record = (response.metadata or {})[CHOICES_KEY]
    print(f"Q: {question}")
    print(f"  sources:  {[n.node.metadata.get('title') for n in response.source_nodes]}")
    print(f"  answer:   {str(response).strip()}")
    print(f"  tokens: {len(record['choices'])}, disagreements: {record['disagreements']} "
          f"(kept RAG {record['rag_chosen']}, kept LLM {record['llm_chosen']})")
    for c in record["choices"]:
        if c["side"] != "agree":
            print(f"    #{c['position']}: with passages {c['rag_token']!r} / without "
                  f"{c['llm_token']!r} -> {c['side'].upper()} (score {c['score']:+.3f}, "
                  f"layer {c['layer']})")

print("\n== streaming: each piece printed once its token is chosen")
streaming = index.as_query_engine(
    llm=synth.llm, similarity_top_k=3,
    response_synthesizer=TokRAGSynthesizer(synth.llm, streaming=True))
streamed = streaming.query(QUESTIONS[0])
print("  ", end="")
for piece in streamed.response_gen:
    print(piece, end="", flush=True)
print(f"\n  disagreements: {(streamed.metadata or {})[CHOICES_KEY]['disagreements']}")
