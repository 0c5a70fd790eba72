"""DeepRAG in a LlamaIndex application, offline on the embedded defaults.

The application's index (a ``VectorStoreIndex`` in Qdrant local mode with LlamaIndex's own
``HuggingFaceEmbedding``, all-MiniLM-L6-v2 from a local directory, over a handful of your
documents: here the paragraphs of the shipped HotpotQA sample, see ``my_documents.py``) keeps
its retriever; ``DeepRAGQueryEngine`` drives it. On a multi-hop question the model writes one
subquery at a time (``Follow up: ...``) and decides per subquery whether to answer from its
own knowledge (``Intermediate answer: ...``) or to retrieve *with the subquery* (``Let's
search the question in Wikipedia.``, then the passages as ``Context:``), until it writes the
final answer or the step cap forces it. Each step is printed as it is taken (the engine
dispatches a ``DeepRAGStepEvent`` per step) with its decision (a ``GateDecision``: score and
reason), then the answer and the whole trajectory.

    .venv/bin/python examples/llama_index_deeprag.py

The documents' vectors are computed once and kept under ``$RAG_GATES_HOME/example-embeddings``
(``embedding_cache.py``, LlamaIndex's ``IngestionCache``); an index of yours holds its vectors
already: leave ``embedded_nodes`` out.

To point it at your own store: return your documents from ``my_documents()`` (or load them
here); replace ``QdrantClient(location=":memory:")`` by ``QdrantClient(url=...)`` or
``QdrantClient(path=...)``, or use the index your application already has; set
``EMBED_MODEL`` to your embedding model and ``llm`` to your LLM (any LlamaIndex LLM that
continues an assistant message, as ``RagGatesLLM`` does; otherwise pass
``prompt=DeepRAGPrompt(style="completion")``). ``mode="likelihood"`` decides by the markers'
log-probabilities instead of the text the model writes (a white-box model, or one that
returns log-probabilities); ``gate=QuCoGate(stats)`` lets any rag-gates gate decide per
subquery.

The embedded SmolLM2-135M was never trained on DeepRAG's format: the one-shot
``DEMONSTRATION`` shows it the markers, and the loop's rules (docs/methods/deeprag.md) read
what it writes anyway (a step with no marker is asked again with ``Follow up:`` written for
it; a subquery with no decision retrieves). A model trained with ``rag-gates deeprag
synthesize / export / train`` needs no demonstration.

``await engine.aquery(question)`` runs the same loop on the model's, retriever's and gate's
async forms; LlamaIndex's Qdrant store then needs its async client too
(``QdrantVectorStore(client=..., aclient=AsyncQdrantClient(url=...))``: an in-memory async
client would be a second, empty store), so this example stays synchronous;
``langchain_deeprag.py`` shows the async call. ``MAX_STEPS`` and the token budgets are
kept small so the example runs in about a minute on one CPU thread.
"""

from __future__ import annotations

from typing import Any

from embedding_cache import embedded_nodes
from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.base import BaseEvent
from llama_index.embeddings.huggingface import HuggingFaceEmbedding
from llama_index.llms.rag_gates import RagGatesLLM
from llama_index.query_engine.rag_gates import DeepRAGQueryEngine, DeepRAGStepEvent
from llama_index.vector_stores.qdrant import QdrantVectorStore
from my_documents import my_documents
from qdrant_client import QdrantClient

from rag_gates.deeprag import DEMONSTRATION, DeepRAGPrompt
from rag_gates.lm import default_embedder_path, load_default_lm
from rag_gates.types import Trace

# A two-hop HotpotQA question: first the book's author, then since when he has worked in France.
QUESTION = ("Seven Brief Lessons on Physics was written by an Italian physicist that has worked "
            "in France since what year?")
GOLD = "2000"  # HotpotQA's answer, for comparison
MAX_STEPS = 3  # subqueries before the final answer is forced (the paper: 6 on HotpotQA)
# The embedded all-MiniLM-L6-v2, extracted once; or your model: "sentence-transformers/...", a path
EMBED_MODEL = str(default_embedder_path())


def show_step(step: dict[str, Any]) -> None:
    """One step as the engine reports it (``step_json``): subquery, decision, answer."""
    decision = step["decision"]
    action = "retrieve" if decision["retrieve"] else "answer from memory"
    # A decision the gate could not take (no marker written) retrieves: fail closed.
    score = "undecided" if "undecided" in decision["evidence"] else f"{decision['score']:g}"
    print(f"step {step['index'] + 1}: Follow up: {step['subquery']}")
    print(f"  decision: {action}  score={score}  ({decision['reason']})")
    if step["passage_ids"] is not None:
        print(f"  retrieved {len(step['passage_ids'])} passages with the subquery")
    print(f"  intermediate answer: {step['answer']}")


class PrintSteps(BaseEventHandler):
    """Prints each DeepRAG step the moment the engine dispatches it."""

    @classmethod
    def class_name(cls) -> str:
        return "PrintSteps"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        if isinstance(event, DeepRAGStepEvent):
            show_step(event.step)


docs = my_documents()
qdrant = QdrantVectorStore(client=QdrantClient(location=":memory:"), collection_name="my-docs")
documents = [Document(text=d["text"], metadata={"title": d["title"], "doc_id": d["id"]})
             for d in docs]
embed_model = HuggingFaceEmbedding(model_name=EMBED_MODEL, device="cpu")
# Embedded once, then read back from LlamaIndex's ingestion cache (embedding_cache.py).
index = VectorStoreIndex(embedded_nodes(documents, embed_model), embed_model=embed_model,
                         storage_context=StorageContext.from_defaults(vector_store=qdrant))

llm = RagGatesLLM(lm=load_default_lm())  # the embedded SmolLM2
engine = DeepRAGQueryEngine(
    llm, index.as_retriever(similarity_top_k=3),
    k=3, max_steps=MAX_STEPS, max_step_tokens=40, max_answer_tokens=20,
    prompt=DeepRAGPrompt(demonstration=DEMONSTRATION))  # one-shot: the model is untrained

# Steps arrive as instrumentation events while the loop runs (as a UI or a log would see them).
get_dispatcher().add_event_handler(PrintSteps())  # the root dispatcher sees every event

print(f"Q: {QUESTION}")
response = engine.query(QUESTION)
meta = response.metadata or {}
trace = Trace.model_validate(meta["trace"])  # every decision, retrieval and model call
print(f"answer: {str(response).strip()}  (HotpotQA: {GOLD})")
print(f"stop: {meta['stop_reason']}, retrievals: {trace.retrievals}, model calls: "
      f"{trace.llm_calls}, malformed steps: {[m['kind'] for m in meta['malformed']]}")
print(f"sources: {[n.node.metadata.get('title') for n in response.source_nodes]}")
print(f"\n== the trajectory, in DeepRAG's format\n{meta['trajectory']}")

