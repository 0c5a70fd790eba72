"""DeepRAG in a LangChain application, offline on the embedded defaults.

The application's retriever (LangChain's ``QdrantVectorStore`` in local mode with
``HuggingFaceEmbeddings``, all-MiniLM-L6-v2 from a local directory, over a handful of your
documents: here the paragraphs of the shipped HotpotQA sample, see ``my_documents.py``) and
chat model (``ChatRagGates`` over the embedded SmolLM2) drive ``DeepRAGRunnable``. On a
multi-hop question the model writes one subquery at a time (``Follow up: ...``) and decides
per subquery whether to answer from its own knowledge (``Intermediate answer: ...``) or to
retrieve *with the subquery* (``Let's search the question in Wikipedia.``, then the documents
as ``Context:``), until it writes the final answer or the step cap forces it.

``stream`` yields one chunk per step as it is taken, printed here with its decision (a
``GateDecision``: score and reason) and the documents retrieved, then a chunk with the answer
and the trajectory. Then the same question through ``ainvoke`` with ``mode="likelihood"``:
there the decision is not the text the model writes but ``log p(retrieve marker) - log
p(direct marker) >= threshold``, read from the chat model's log-probabilities.

    .venv/bin/python examples/langchain_deeprag.py

The documents' vectors are computed once and kept under ``$RAG_GATES_HOME/example-embeddings``
(``embedding_cache.py``, LangChain's ``CacheBackedEmbeddings``); a vector store of yours holds
its vectors already: leave ``cached_embeddings`` out.

To point it at your own store: return your documents from ``my_documents()`` (or load them
here); replace ``location=":memory:"`` by ``url=...`` (a Qdrant server) or ``path=...``, or
use the retriever your application already has; set ``EMBED_MODEL`` to your embedding model
and ``llm`` to your chat model (one that continues a final AI message, as ``ChatRagGates``
does; otherwise pass ``prompt=DeepRAGPrompt(style="completion")`` with an LLM).
``gate=QuCoGate(stats)`` lets any rag-gates gate decide per subquery. Needs
``langchain-huggingface`` and ``langchain-qdrant``: ``pip install
"langchain-rag-gates[examples]"``.

The embedded SmolLM2-135M was never trained on DeepRAG's format: the one-shot
``DEMONSTRATION`` shows it the markers, and the loop's rules (docs/methods/deeprag.md) read
what it writes anyway (a step with no marker is asked again with ``Follow up:`` written for
it; a subquery with no decision retrieves). A model trained with ``rag-gates deeprag
synthesize / export / train`` needs no demonstration; the likelihood ``threshold`` is
calibrated per model (``rag-gates bench --methods deeprag-likelihood@-2,...``). ``MAX_STEPS``
and the token budgets are kept small so the example runs in about a minute on one CPU thread.
"""

from __future__ import annotations

import asyncio
from typing import Any

from embedding_cache import cached_embeddings
from langchain_core.documents import Document
from langchain_huggingface import HuggingFaceEmbeddings
from langchain_qdrant import QdrantVectorStore
from my_documents import my_documents

from langchain_rag_gates import ChatRagGates, DeepRAGRunnable
from rag_gates.deeprag import DEMONSTRATION, DeepRAGPrompt
from rag_gates.lm import default_embedder_path, load_default_lm

# A two-hop HotpotQA question: first the book's author, then since when he has worked in France.
QUESTION = ("Seven Brief Lessons on Physics was written by an Italian physicist that has worked "
            "in France since what year?")
GOLD = "2000"  # HotpotQA's answer, for comparison
MAX_STEPS = 3  # subqueries before the final answer is forced (the paper: 6 on HotpotQA)
# The embedded all-MiniLM-L6-v2, extracted once; or your model: "sentence-transformers/...", a path
EMBED_MODEL = str(default_embedder_path())


def show_step(step: dict[str, Any]) -> None:
    """One streamed step: subquery, decision (score and reason), documents, answer."""
    decision = step["decision"]
    action = "retrieve" if decision["retrieve"] else "answer from memory"
    # A decision the gate could not take (no marker written) retrieves: fail closed.
    score = "undecided" if "undecided" in decision["evidence"] else f"{decision['score']:g}"
    print(f"step {step['index'] + 1}: Follow up: {step['subquery']}")
    print(f"  decision: {action}  score={score}  ({decision['reason']})")
    if step["documents"] is not None:
        print(f"  retrieved with the subquery: "
              f"{[d.metadata.get('title') for d in step['documents']]}")
    print(f"  intermediate answer: {step['answer']}")


store = QdrantVectorStore.from_documents(
    [Document(page_content=d["text"], metadata={"title": d["title"], "doc_id": d["id"]})
     for d in my_documents()],
    cached_embeddings(HuggingFaceEmbeddings(  # embedded once (embedding_cache.py)
        model_name=EMBED_MODEL, model_kwargs={"device": "cpu"},
        encode_kwargs={"normalize_embeddings": True})),
    location=":memory:", collection_name="my-docs")
retriever = store.as_retriever(search_kwargs={"k": 3})
llm = ChatRagGates(lm=load_default_lm())  # the embedded SmolLM2; any chat model works
settings: dict[str, Any] = {
    "k": 3, "max_steps": MAX_STEPS, "max_step_tokens": 40, "max_answer_tokens": 20,
    "prompt": DeepRAGPrompt(demonstration=DEMONSTRATION),  # one-shot: the model is untrained
}

print(f"Q: {QUESTION}")
deeprag = DeepRAGRunnable(llm=llm, retriever=retriever, **settings)
for chunk in deeprag.stream(QUESTION):
    for step in chunk.get("steps", []):  # one step per chunk, as soon as it is taken
        show_step(step)
    if "answer" in chunk:  # the last chunk: answer, trajectory, documents, trace
        print(f"answer: {chunk['answer']}  (HotpotQA: {GOLD})")
        print(f"stop: {chunk['stop_reason']}, malformed steps: "
              f"{[m['kind'] for m in chunk['malformed']]}")
        print(f"\n== the trajectory, in DeepRAG's format\n{chunk['trajectory']}")

# The same question, the decision by the markers' likelihood, on the async path.
print(f"\n== ainvoke, mode='likelihood'\nQ: {QUESTION}")
likelihood = DeepRAGRunnable(llm=llm, retriever=retriever, mode="likelihood", threshold=0.0,
                             **settings)
out = asyncio.run(likelihood.ainvoke({"question": QUESTION}))
for step in out["steps"]:
    show_step(step)
print(f"answer: {out['answer']}  (HotpotQA: {GOLD})")
print(f"stop: {out['stop_reason']}")
