"""A LlamaIndex ``FunctionAgent`` that checks its own answer with QuCo's claim verifier, offline.

Starting from your documents (here the paragraphs of the shipped HotpotQA sample, see
``my_documents.py``), the script gives a ``FunctionAgent`` two tools:

1. ``verify_claims`` (``llama_index.tools.rag_gates.claim_verifier_tool``): QuCo's claim
   verifier over an infini-gram index of the same documents; it flags the draft's claims whose
   entities never co-occur in them, with the search query that would fix each;
2. ``search_documents`` (``gated_retriever_tool``): the application's index (a
   ``VectorStoreIndex`` in Qdrant, local mode, with the embedded MiniLM) behind QuCo's gate,
   as a ``GatedRetriever``; the tool says what the gate decided and why, with the documents.

The model is a served one that calls tools through the OpenAI API (``OpenAILike``): by
default the embedded SmolLM2-135M behind llama.cpp's server, started here in a child process
(``llama_cpp_tool_server.py``; ``pip install "llama-cpp-python[server]"``):

    .venv/bin/python examples/llama_index_agent_verify.py
    .venv/bin/python examples/llama_index_agent_verify.py --base-url http://127.0.0.1:8080/v1
    OPENAI_API_KEY=... .venv/bin/python examples/llama_index_agent_verify.py \\
        --base-url https://api.openai.com/v1 --model gpt-4o-mini --free

The agent's first turn must call ``verify_claims`` (``initial_tool_choice``; the model writes
its draft as the argument); after that the model chooses: search with the flagged claim's
query and revise, or answer. A 135M model rarely chooses a tool by itself (docs/agents.md has
the counts); ``--free`` leaves the first choice to the model too. Each tool call and result
is printed from the agent's event stream.

The documents' vectors are computed once and kept under ``$RAG_GATES_HOME/example-embeddings``
(``embedding_cache.py``, LlamaIndex's ``IngestionCache``); an index of yours holds its vectors
already: leave ``embedded_nodes`` out.

To point it at your own data: return your documents from ``my_documents()``, use your own
index and your LLM (any LlamaIndex function-calling LLM).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from llama_cpp_tool_server import add_client_arguments, check_ready, local_server

# Before the frameworks and models load: what is missing is said in one line (exit 2).
if __name__ == "__main__":
    check_ready(sys.argv[1:], {"llama_index.llms.openai_like":
                              'pip install "llama-index-rag-gates[examples]"'})

from embedding_cache import embedded_nodes
from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
from llama_index.embeddings.huggingface import HuggingFaceEmbedding
from llama_index.retrievers.rag_gates import GatedRetriever
from llama_index.tools.rag_gates import claim_verifier_tool, gated_retriever_tool
from llama_index.vector_stores.qdrant import QdrantVectorStore
from my_documents import my_documents, write_jsonl
from qdrant_client import QdrantClient

from rag_gates.corpus import LocalInfiniGram, build_index
from rag_gates.lm import default_embedder_path
from rag_gates.quco import ClaimVerifier, QuCoGate
from rag_gates.tools import VERIFY_CLAIMS_NAME

QUESTIONS = [
    "Were Scott Derrickson and Ed Wood of the same nationality?",
    "What was the father of Kasper Schmeichel voted to be by the IFFHS in 1992?",
]
TAU_ENTITY = 10  # search only for entities in at most 10 of these 491 documents
TOP_K = 3
SYSTEM_PROMPT = (
    "Answer the question in one short sentence. Before you reply, call verify_claims with "
    "your answer. If it flags a claim, call search_documents with its query, then answer "
    "again from the documents."
)


async def ask(agent: FunctionAgent, question: str) -> None:
    print(f"Q: {question}")
    handler = agent.run(user_msg=question)
    async for event in handler.stream_events():
        if isinstance(event, ToolCallResult):
            # The verifier's call and reply whole (a cut JSON could not be read back); the
            # passages a search returns, shortened.
            whole = event.tool_name == "verify_claims"
            print(f"  model -> {event.tool_name}({json.dumps(event.tool_kwargs)})")
            content = str(event.tool_output.content)
            print(f"  {event.tool_name} -> {content if whole else content[:300]}")
    output: Any = await handler
    print(f"  answer: {str(output.response.content or '').strip()}\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_client_arguments(parser, free_help="let the model choose its first tool too")
    args = parser.parse_args(argv)

    # Your documents in the application's index (Qdrant, local mode).
    docs = my_documents()
    qdrant = QdrantVectorStore(client=QdrantClient(location=":memory:"),
                               collection_name="my-docs")
    documents = [Document(text=d["text"], metadata={"title": d["title"], "doc_id": d["id"]})
                 for d in docs]
    embed_model = HuggingFaceEmbedding(model_name=str(default_embedder_path()), device="cpu")
    # Embedded once, then read back from LlamaIndex's ingestion cache (embedding_cache.py).
    index = VectorStoreIndex(embedded_nodes(documents, embed_model), embed_model=embed_model,
                             storage_context=StorageContext.from_defaults(vector_store=qdrant))

    with contextlib.ExitStack() as stack:
        # QuCo's evidence: an infini-gram index of the same documents (about a second).
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rag-gates-")))
        build_index(write_jsonl(docs, workdir / "docs.jsonl"), workdir / "corpus-index",
                    lowercase=True, cpus=1)
        stats = LocalInfiniGram(workdir / "corpus-index", case="insensitive")
        stack.callback(stats.close)
        tools = [
            claim_verifier_tool(ClaimVerifier(stats)),
            gated_retriever_tool(GatedRetriever(index.as_retriever(similarity_top_k=TOP_K),
                                                gate=QuCoGate(stats, tau_entity=TAU_ENTITY))),
        ]
        base_url = args.base_url or stack.enter_context(local_server())
        from llama_index.llms.openai_like import OpenAILike

        llm = OpenAILike(model=args.model, api_base=base_url,
                         api_key=os.environ.get("OPENAI_API_KEY", "not-needed"),
                         is_chat_model=True, is_function_calling_model=True,
                         context_window=4096, max_tokens=160, temperature=0.0)
        agent = FunctionAgent(tools=tools, llm=llm, system_prompt=SYSTEM_PROMPT,
                              initial_tool_choice=None if args.free else VERIFY_CLAIMS_NAME)
        for question in QUESTIONS:
            asyncio.run(ask(agent, question))


if __name__ == "__main__":
    main()
