"""SR-RAG in a LangChain application, offline on the embedded defaults.

The application's retriever (LangChain's ``QdrantVectorStore`` in local mode with
``HuggingFaceEmbeddings``, all-MiniLM-L6-v2 from a local directory, over a handful of your
documents: here the paragraphs of the shipped HotpotQA sample, see ``my_documents.py``) is
wrapped in ``SelfRoutingRetriever`` and the LCEL chain around it stays as it is. Per question
SR-RAG routes either to the vector store or to the model's own knowledge:

    retrieve  iff  p_M * p_D >= tau

``p_M`` is the model's own preference (its next-token share of "Search" against "Memory"
after a routing instruction), ``p_D`` the vote of the ``k`` labelled questions nearest to
this one in a kNN policy datastore (``SourcePolicy``, a Qdrant collection; key: the model's
hidden state of the question's last token). Routed to the model, it first writes what it
knows as a background document (GenRead), which comes back as the one document
(``metadata["source"] == "parametric"``) and the chain answers from it. The chain keeps the
documents beside the answer, so each question prints the routing decision from their
metadata (route, ``p_M``, ``p_D``, the nearest labelled questions, the reason), the sources
and the answer.

    .venv/bin/python examples/langchain_srrag.py

The policy here is a toy, built in the script: a dozen questions labelled by hand (long-tail
people and places: retrieval; textbook facts: the model's memory) in an in-memory Qdrant,
voting with ``K = 3`` neighbours. A real one holds the model's own labels for hundreds of
training questions (Algorithm 1: the source under which the model finds the gold answer
likelier), built once and kept on disk::

    rag-gates srrag label --dataset popqa --n 300 --offset 500 --out labels.jsonl
    rag-gates srrag build-policy --labels labels.jsonl    # ~/.cache/rag-gates/srrag/policy

and opened here with ``SourcePolicy.open_existing(lm)`` (``path=...`` or ``url=...`` for a
Qdrant server) in place of ``toy_policy``, with the paper's ``k = 30``. ``TAU`` is the
paper's 0.1, not calibrated for SmolLM2 (see docs/methods/srrag.md for how to choose it).

The documents' vectors are computed once and kept under ``$RAG_GATES_HOME/example-embeddings``
(``embedding_cache.py``, LangChain's ``CacheBackedEmbeddings``); a vector store of yours holds
its vectors already: leave ``cached_embeddings`` out.

To point it at your own store: return your documents from ``my_documents()`` (or load them
here); replace ``location=":memory:"`` by ``url=...`` (a Qdrant server) or ``path=...``, or
use the retriever your application already has; set ``EMBED_MODEL`` to your embedding model
and ``llm`` to your chat model. Routing reads the model's next-token distribution and hidden
states, so it needs a white-box model (here the embedded SmolLM2). Needs
``langchain-huggingface`` and ``langchain-qdrant``: ``pip install
"langchain-rag-gates[examples]"``.
"""

from __future__ import annotations

from embedding_cache import cached_embeddings
from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableParallel, RunnablePassthrough
from langchain_huggingface import HuggingFaceEmbeddings
from langchain_qdrant import QdrantVectorStore
from my_documents import my_documents
from my_routing_labels import QUESTIONS, TAU, K, show_route, toy_policy

from langchain_rag_gates import ChatRagGates, SelfRoutingRetriever
from rag_gates.lm import default_embedder_path, load_default_lm
from rag_gates.srrag import SelfRoutingGate, Verbalizer

# The embedded all-MiniLM-L6-v2, extracted once; or your model: "sentence-transformers/...", a path
EMBED_MODEL = str(default_embedder_path())


def format_docs(docs: list[Document]) -> str:
    # A parametric document has no title: the model's own text stands alone.
    return "\n\n".join(f"{d.metadata['title']}: {d.page_content}" if d.metadata.get("title")
                       else d.page_content for d in docs)


store = QdrantVectorStore.from_documents(
    [Document(page_content=d["text"], metadata={"title": d["title"], "doc_id": d["id"]})
     for d in my_documents()],
    cached_embeddings(HuggingFaceEmbeddings(  # embedded once (embedding_cache.py)
        model_name=EMBED_MODEL, model_kwargs={"device": "cpu"},
        encode_kwargs={"normalize_embeddings": True})),
    location=":memory:", collection_name="my-docs")

lm = load_default_lm()  # the embedded SmolLM2: it routes, verbalizes and answers
policy = toy_policy(lm)
retriever = SelfRoutingRetriever(
    retriever=store.as_retriever(), gate=SelfRoutingGate(lm, policy, tau=TAU), k=3,
    # The paper caps a verbalization at 150 tokens; 48 keeps the example quick.
    verbalizer=Verbalizer(lm, max_new_tokens=48))
llm = ChatRagGates(lm=lm, max_tokens=32)
prompt = ChatPromptTemplate.from_template(
    "Answer briefly from the context.\nContext:\n{context}\n\nQuestion: {question}")
# The usual RAG chain, keeping the documents beside the answer (their metadata holds the route).
chain = RunnableParallel(docs=retriever, question=RunnablePassthrough()).assign(
    answer=(lambda x: {"context": format_docs(x["docs"]), "question": x["question"]})
    | prompt | llm | StrOutputParser())

print(f"policy: {len(policy)} labelled questions, k={K}, tau={TAU}")
for question in QUESTIONS:
    out = chain.invoke(question)
    print(f"\nQ: {question}")
    first = out["docs"][0]
    show_route(first.metadata["rag_gates"])
    if first.metadata.get("source") == "parametric":
        print(f"  source: parametric ({first.metadata['tokens']} tokens, hit the cap: "
              f"{first.metadata['hit_token_cap']}): {first.page_content[:160]!r}")
    else:
        print(f"  sources: {[d.metadata.get('title') for d in out['docs']]}")
    print(f"  answer: {out['answer'].strip()}")
policy.close()
