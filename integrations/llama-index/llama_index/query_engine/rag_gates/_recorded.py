"""What the LlamaIndex peer methods of ``rag-gates bench`` (FLARE, SubQuestion) share: the
run's model and retriever as LlamaIndex parts whose every call lands in the method's trace."""

from __future__ import annotations

from llama_index.llms.rag_gates import RagGatesLLM
from llama_index.retrievers.rag_gates.base import PassageRetriever

from rag_gates.methods import MethodContext, RecordedLM, RecordedRetriever
from rag_gates.retrieval.base import Retriever
from rag_gates.types import TraceRecorder

__all__ = ["recorded_llm", "recorded_retriever"]


def recorded_llm(ctx: MethodContext, rec: TraceRecorder, *, max_new_tokens: int | None = None,
                 name: str = "llm") -> RagGatesLLM:
    """The run's model as a LlamaIndex LLM whose generations are ``llm_call`` events ``name``
    in ``rec``; ``max_new_tokens`` defaults to the run's answer budget."""
    return RagGatesLLM(lm=RecordedLM(ctx.lm, rec, name=name),
                       max_new_tokens=max_new_tokens or ctx.max_new_tokens)


def recorded_retriever(ctx: MethodContext, retriever: Retriever, rec: TraceRecorder
                       ) -> PassageRetriever:
    """``retriever`` as a LlamaIndex retriever of the run's ``k`` passages whose retrievals are
    ``retrieval`` events in ``rec``."""
    return PassageRetriever(RecordedRetriever(retriever, rec), similarity_top_k=ctx.k)
