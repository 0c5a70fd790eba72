"""Tok-RAG in a LangChain application, offline on the embedded defaults.

The application's retriever (LangChain's ``QdrantVectorStore`` in local mode with
``HuggingFaceEmbeddings``, all-MiniLM-L6-v2 from a local directory, over a handful of your
documents: here the paragraphs of the shipped HotpotQA sample, see ``my_documents.py``) feeds
``TokRAGRunnable`` in an LCEL chain: ``{"question": ..., "documents": retriever} | tokrag``.
The model writes the answer with and without the documents in lockstep; where the two
disagree on the next token, Tok-RAG keeps the side the documents support. The answer is an
``AIMessage`` whose ``response_metadata["tokrag"]`` lists every token's choice; context-aware
decoding (``method="cad"``) runs over the same chain for comparison.

    .venv/bin/python examples/langchain_tokrag.py

The documents' vectors are computed once and kept under ``$RAG_GATES_HOME/example-embeddings``
(``embedding_cache.py``, LangChain's ``CacheBackedEmbeddings``); a vector store of yours holds
its vectors already: leave ``cached_embeddings`` out.

To point it at your own store: return your documents from ``my_documents()`` (or load them
here); replace ``location=":memory:"`` by ``url=...`` (a Qdrant server) or ``path=...``, or
use the retriever your application already has; set ``EMBED_MODEL`` to your embedding model.
Tok-RAG needs a white-box model (here the embedded SmolLM2). Needs ``langchain-huggingface``
and ``langchain-qdrant``: ``pip install "langchain-rag-gates[examples]"``.
"""

from __future__ import annotations

from embedding_cache import cached_embeddings
from langchain_core.documents import Document
from langchain_core.runnables import RunnablePassthrough
from langchain_huggingface import HuggingFaceEmbeddings
from langchain_qdrant import QdrantVectorStore
from my_documents import my_documents

from langchain_rag_gates import TokRAGRunnable
from rag_gates.lm import default_embedder_path, load_default_lm

QUESTION = "Were Scott Derrickson and Ed Wood of the same nationality?"
# The embedded all-MiniLM-L6-v2, extracted once; or your model: "sentence-transformers/...", a path
EMBED_MODEL = str(default_embedder_path())

store = QdrantVectorStore.from_documents(
    [Document(page_content=d["text"], metadata={"title": d["title"], "doc_id": d["id"]})
     for d in my_documents()],
    cached_embeddings(HuggingFaceEmbeddings(  # embedded once (embedding_cache.py)
        model_name=EMBED_MODEL, model_kwargs={"device": "cpu"},
        encode_kwargs={"normalize_embeddings": True})),
    location=":memory:", collection_name="my-docs")
retriever = store.as_retriever(search_kwargs={"k": 3})

lm = load_default_lm()  # the embedded SmolLM2
for method in ("tokrag", "cad"):
    chain = ({"question": RunnablePassthrough(), "documents": retriever}
             | TokRAGRunnable(lm=lm, method=method, max_new_tokens=32))
    msg = chain.invoke(QUESTION)
    record = msg.response_metadata["tokrag"]
    print(f"[{method}] Q: {QUESTION}")
    print(f"  answer: {str(msg.content).strip()}")
    print(f"  tokens: {len(record['choices'])}, steps not taken as agreed: "
          f"{record['disagreements']}")
    for c in record["choices"]:
        if c["side"] != "agree":
            detail = (f"score {c['score']:+.3f}, layer {c['layer']}" if c["score"] is not None
                      else f"alpha {c['alpha']:.2f}")
            print(f"    #{c['position']}: with documents {c['rag_token']!r} / without "
                  f"{c['llm_token']!r} -> kept {c['token']!r} ({c['side']}, {detail})")

print("\n[tokrag] streamed:", end=" ")
tokrag = {"question": RunnablePassthrough(), "documents": retriever} | TokRAGRunnable(
    lm=lm, max_new_tokens=32)
for chunk in tokrag.stream(QUESTION):
    print(chunk.content, end="", flush=True)
print()
