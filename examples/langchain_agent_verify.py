"""A LangChain agent that checks its own answer with QuCo's claim verifier, offline.

Starting from your documents (here the paragraphs of the shipped HotpotQA sample, see
``my_documents.py``), the script gives a ``langchain.agents.create_agent`` agent two tools:

1. ``verify_claims`` (:class:`~langchain_rag_gates.ClaimVerifierTool`): QuCo's claim verifier
   over an infini-gram index of the same documents; it flags the draft's claims whose entities
   never co-occur in them, with the search query that would fix each;
2. ``search_documents`` (:class:`~langchain_rag_gates.GatedRetrieverTool`): the application's
   retriever (Qdrant, local mode, with the embedded MiniLM) behind QuCo's gate; the tool says
   what the gate decided and why, with the documents found.

The agent drafts an answer, calls ``verify_claims`` on it, searches with the flagged claim's
query and revises. The model is a served one that calls tools through the OpenAI API
(``ChatOpenAI``): by default the embedded SmolLM2-135M behind llama.cpp's server, started here
in a child process (``llama_cpp_tool_server.py``; ``pip install "llama-cpp-python[server]"``):

    .venv/bin/python examples/langchain_agent_verify.py
    .venv/bin/python examples/langchain_agent_verify.py --base-url http://127.0.0.1:8080/v1
    OPENAI_API_KEY=... .venv/bin/python examples/langchain_agent_verify.py \\
        --base-url https://api.openai.com/v1 --model gpt-4o-mini --free

A 135M model rarely decides to call a tool by itself (see docs/agents.md for how often), so by
default :class:`VerifyFirst`, a small agent middleware, sets ``tool_choice`` each turn: the
first turn must call ``verify_claims`` (the model writes its draft as the argument), a flagged
verification must be followed by ``search_documents``, and then the model answers without
tools, asked to answer in one sentence. ``--free`` leaves every choice to the model (what a
capable model does on its own).

The documents' vectors are computed once and kept under ``$RAG_GATES_HOME/example-embeddings``
(``embedding_cache.py``, LangChain's ``CacheBackedEmbeddings``); a vector store of yours holds
its vectors already: leave ``cached_embeddings`` out.

To point it at your own data: return your documents from ``my_documents()``, use your vector
store's retriever, and your chat model (any LangChain chat model with tool calling).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from llama_cpp_tool_server import add_client_arguments, check_ready, local_server

# Before the frameworks and models load: what is missing is said in one line (exit 2).
if __name__ == "__main__":
    check_ready(sys.argv[1:], {"langchain_openai": 'pip install "langchain-rag-gates[examples]"'})

from embedding_cache import cached_embeddings
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from my_documents import my_documents, write_jsonl

from langchain_rag_gates import ClaimVerifierTool, GatedRetriever, GatedRetrieverTool
from rag_gates.corpus import LocalInfiniGram, build_index
from rag_gates.lm import default_embedder_path
from rag_gates.quco import ClaimVerifier, QuCoGate
from rag_gates.tools import SEARCH_DOCUMENTS_NAME, VERIFY_CLAIMS_NAME

QUESTIONS = [
    "Were Scott Derrickson and Ed Wood of the same nationality?",
    "What was the father of Kasper Schmeichel voted to be by the IFFHS in 1992?",
]
TAU_ENTITY = 10  # search only for entities in at most 10 of these 491 documents (see below)
TOP_K = 3
SYSTEM_PROMPT = (
    "Answer the question in one short sentence. Before you reply, call verify_claims with "
    "your answer. If it flags a claim, call search_documents with its query, then answer "
    "again from the documents."
)


# ---------------------------------------------------------------- the tools
@contextlib.contextmanager
def verification_tools(docs: list[dict[str, str]], *, tau_entity: int = TAU_ENTITY,
                       k: int = TOP_K) -> Iterator[list[Any]]:
    """``[verify_claims, search_documents]`` over ``docs``: the corpus index (built in a
    temporary directory, about a second here) and the vector store (embedded MiniLM)."""
    from langchain_huggingface import HuggingFaceEmbeddings
    from langchain_qdrant import QdrantVectorStore

    store = QdrantVectorStore.from_documents(
        [Document(page_content=d["text"], metadata={"title": d["title"], "doc_id": d["id"]})
         for d in docs],
        cached_embeddings(HuggingFaceEmbeddings(  # embedded once (embedding_cache.py)
            model_name=str(default_embedder_path()), model_kwargs={"device": "cpu"},
            encode_kwargs={"normalize_embeddings": True})),
        location=":memory:", collection_name="my-docs")
    with tempfile.TemporaryDirectory(prefix="rag-gates-agent-") as workdir:
        corpus_dir = Path(workdir) / "corpus-index"
        build_index(write_jsonl(docs, Path(workdir) / "docs.jsonl"), corpus_dir,
                    lowercase=True, cpus=1)
        stats = LocalInfiniGram(corpus_dir, case="insensitive")
        try:
            yield [
                ClaimVerifierTool(verifier=ClaimVerifier(stats)),
                GatedRetrieverTool(retriever=GatedRetriever(
                    retriever=store.as_retriever(), gate=QuCoGate(stats, tau_entity=tau_entity),
                    k=k)),
            ]
        finally:
            stats.close()


# ---------------------------------------------------------------- guiding a small model
def next_tool_choice(messages: Sequence[BaseMessage]) -> str | dict[str, Any]:
    """The ``tool_choice`` of the next turn: verify first, search after a flagged
    verification (once), then answer without tools."""
    results = [(m.name, str(m.content)) for m in messages if isinstance(m, ToolMessage)]
    if not any(name == VERIFY_CLAIMS_NAME for name, _ in results):
        return {"type": "function", "function": {"name": VERIFY_CLAIMS_NAME}}
    name, content = results[-1]
    searched = any(n == SEARCH_DOCUMENTS_NAME for n, _ in results)
    if name == VERIFY_CLAIMS_NAME and not searched and _flagged(content):
        return {"type": "function", "function": {"name": SEARCH_DOCUMENTS_NAME}}
    return "none"


def _flagged(content: str) -> bool:
    try:
        return bool(json.loads(content).get("flagged"))
    except (ValueError, AttributeError):  # a tool error message, not the verifier's JSON
        return False


ANSWER_NOW = "Now answer the question in one short sentence."


class VerifyFirst(AgentMiddleware):
    """Sets each turn's ``tool_choice`` with :func:`next_tool_choice`, so even a model that
    would answer straight away checks its draft and searches for what the verifier flags.
    The answering turn also gets :data:`ANSWER_NOW` as a last user line (sent to the model,
    not kept in the conversation): after tool results a small model otherwise tends to
    write another tool response."""

    @staticmethod
    def _guided(request: ModelRequest) -> ModelRequest:
        choice = next_tool_choice(request.messages)
        messages = list(request.messages)
        if choice == "none":
            messages.append(HumanMessage(ANSWER_NOW))
        return request.override(tool_choice=choice, messages=messages)

    def wrap_model_call(self, request: ModelRequest,
                        handler: Callable[[ModelRequest], ModelResponse]) -> ModelResponse:
        return handler(self._guided(request))

    async def awrap_model_call(
            self, request: ModelRequest,
            handler: Callable[[ModelRequest], Awaitable[ModelResponse]]) -> ModelResponse:
        return await handler(self._guided(request))


def build_agent(model: Any, tools: list[Any], *, guided: bool = True) -> Any:
    """``create_agent`` with the two tools (and :class:`VerifyFirst` when ``guided``)."""
    return create_agent(model, tools, system_prompt=SYSTEM_PROMPT,
                        middleware=[VerifyFirst()] if guided else [])


def chat_model(base_url: str, model: str, max_tokens: int = 160) -> Any:
    """``ChatOpenAI`` on an OpenAI-compatible server (the key from ``OPENAI_API_KEY``;
    a local server needs none)."""
    import os

    from langchain_openai import ChatOpenAI

    return ChatOpenAI(base_url=base_url, model=model, temperature=0, max_tokens=max_tokens,
                      api_key=os.environ.get("OPENAI_API_KEY", "not-needed"))  # type: ignore[arg-type]


def show(messages: list[BaseMessage]) -> None:
    for message in messages[1:]:
        if isinstance(message, AIMessage):
            for call in message.tool_calls:
                print(f"  model -> {call['name']}({json.dumps(call['args'])})")
            if message.content:
                print(f"  model:  {str(message.content).strip()[:300]}")
        elif isinstance(message, ToolMessage):
            # The verifier's reply whole (a cut JSON could not be read back); passages shortened.
            content = str(message.content)
            shown = content if message.name == "verify_claims" else content[:300]
            print(f"  {message.name} -> {shown}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_client_arguments(parser, free_help="let the model choose its tools (no VerifyFirst)")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        base_url = args.base_url or stack.enter_context(local_server())
        tools = stack.enter_context(verification_tools(my_documents()))
        agent = build_agent(chat_model(base_url, args.model), tools, guided=not args.free)
        for question in QUESTIONS:
            print(f"Q: {question}")
            messages = agent.invoke({"messages": [HumanMessage(question)]})["messages"]
            show(messages)
            print(f"  answer: {str(messages[-1].content).strip()}\n")


if __name__ == "__main__":
    main()
