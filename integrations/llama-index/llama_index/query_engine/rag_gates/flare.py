"""LlamaIndex's own FLARE query engine as a ``rag-gates bench`` method (the peer baseline).

``FLAREInstructQueryEngine`` runs with the run's model (through :class:`RagGatesLLM`) and the
run's retriever (through :class:`PassageRetriever` inside a ``RetrieverQueryEngine``), so it
is compared with the other methods on equal terms. Every model call and retrieval it makes is
recorded in the method's trace.

Registered under the ``rag_gates.methods`` entry point as ``flare``:

    rag-gates bench --dataset hotpotqa --methods no-rag,single,flare --n 200 --out runs/x
"""

from __future__ import annotations

import contextlib
import io

from llama_index.core.query_engine import FLAREInstructQueryEngine, RetrieverQueryEngine
from llama_index.query_engine.rag_gates._recorded import recorded_llm, recorded_retriever
from llama_index.retrievers.rag_gates import nodes_to_passages

from rag_gates.methods import MethodContext, MethodResult, need_retriever
from rag_gates.types import TraceRecorder

__all__ = ["FlareMethod"]


class FlareMethod:
    """FLARE (Jiang et al., 2023) as implemented by LlamaIndex, on the run's model and
    retriever. ``max_iterations`` bounds the look-ahead rounds (LlamaIndex's default is 10;
    3 keeps a CPU benchmark affordable and is recorded in each answer's trace)."""

    name = "flare"

    def __init__(self, ctx: MethodContext, max_iterations: int = 3) -> None:
        if max_iterations < 1:
            raise ValueError(f"max_iterations must be >= 1, got {max_iterations}")
        self.ctx = ctx
        self.retriever = need_retriever(ctx, self.name)
        self.max_iterations = max_iterations

    def answer(self, question: str) -> MethodResult:
        rec = TraceRecorder()
        llm = recorded_llm(self.ctx, rec)
        retriever = recorded_retriever(self.ctx, self.retriever, rec)
        engine = FLAREInstructQueryEngine(
            query_engine=RetrieverQueryEngine.from_args(retriever, llm=llm),
            llm=llm, max_iterations=self.max_iterations,
        )
        # LlamaIndex's FLARE prints every query to stdout; keep the caller's output clean.
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                response = engine.query(question)
        except IndexError as error:
            # FLARE's lookahead parser (flare/output_parser.py) indexes past the end when a
            # model writes "[Search" without "(...)"; the peer gives no answer for that
            # question. Recorded, scored as an empty answer, counted in the report.
            with rec.timed("note", "flare-error") as data:
                data["error"] = f"{type(error).__name__}: {error}"
            return MethodResult(answer="", trace=rec.trace())
        with rec.timed("note", "flare") as data:
            data["max_iterations"] = self.max_iterations
        return MethodResult(answer=str(response).strip(), trace=rec.trace(),
                            passages=nodes_to_passages(response.source_nodes))
