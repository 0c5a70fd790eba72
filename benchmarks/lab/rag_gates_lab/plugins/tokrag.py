"""Tok-RAG, CAD and AdaCAD in ``rag-gates bench`` (entry points).

Methods (each retrieves like ``single``: the question, top-k, the same prompt, then decodes
with and without the passages in lockstep):

- ``tokrag``: Tok-RAG with the :class:`~rag_gates.tokrag.TokRAGConfig` defaults;
- ``tokrag@paper``: the paper's judge (Eq. 14-16) with the l* search; ``tokrag@LAYER``: the
  paper's judge at a fixed fusion layer (1 .. num_layers - 1);
- ``tokrag@authors`` / ``tokrag@authors-LAYER``: the authors' released judge
  (:mod:`rag_gates.tokrag.authors`, ``authors-qa``) at attention layer LAYER
  (0 .. num_layers - 1; default the config's);
- ``cad`` / ``cad@ALPHA``: context-aware decoding at ``alpha`` (default
  :data:`~rag_gates.tokrag.cad.DEFAULT_CAD_ALPHA`);
- ``adacad``: CAD with the per-token JSD weight.

Options are checked before any model loads (``validate_option``); a layer beyond the model's
depth is refused when the method is built.
"""

from __future__ import annotations

from typing import Any

from rag_gates.methods import MethodContext, MethodResult, need_retriever
from rag_gates.retrieval.recorded import retrieve_recorded
from rag_gates.types import TraceRecorder
from rag_gates_lab.plugins.options import METHOD_OPTIONS, parse_alpha, parse_tokrag_option

__all__ = ["TwoStreamMethod", "adacad_method", "cad_method", "parse_alpha",
           "parse_tokrag_option", "tokrag_method"]

class TwoStreamMethod:
    """Retrieve once (as ``single``), then answer with a two-stream decoder."""

    def __init__(self, ctx: MethodContext, name: str, decoder: Any) -> None:
        self.ctx = ctx
        self.name = name
        self.retriever = need_retriever(ctx, name)
        self.decoder = decoder

    def answer(self, question: str) -> MethodResult:
        rec = TraceRecorder()
        passages = retrieve_recorded(rec, self.retriever, question, self.ctx.k)
        g = self.decoder.generate(question, passages=passages,
                                  max_new_tokens=self.ctx.max_new_tokens)
        for event in g.trace.events:
            rec.add(event)
        return MethodResult(answer=g.text, trace=rec.trace(), passages=passages)


def _name(base: str, ctx: MethodContext) -> str:
    return base if ctx.option is None else f"{base}@{ctx.option}"


def tokrag_method(ctx: MethodContext) -> TwoStreamMethod:
    """Tok-RAG; ``tokrag@paper`` / ``@LAYER`` / ``@authors`` / ``@authors-LAYER`` choose the
    judge and fix the layer (module docstring)."""
    from rag_gates.tokrag.decoder import TokRAGConfig, TokRAGDecoder

    judge, layer = parse_tokrag_option(ctx.option)
    config = TokRAGConfig(fusion_layer=layer) if judge is None else TokRAGConfig(
        fusion_layer=layer, judge=judge)
    return TwoStreamMethod(ctx, _name("tokrag", ctx),
                           TokRAGDecoder(ctx.lm, config, dataset=ctx.dataset))


def cad_method(ctx: MethodContext) -> TwoStreamMethod:
    """Context-aware decoding; ``cad@ALPHA`` sets the weight."""
    from rag_gates.tokrag.cad import CADDecoder

    alpha = parse_alpha(ctx.option)
    decoder = CADDecoder(ctx.lm, dataset=ctx.dataset) if alpha is None else CADDecoder(
        ctx.lm, alpha, dataset=ctx.dataset)
    return TwoStreamMethod(ctx, _name("cad", ctx), decoder)


def adacad_method(ctx: MethodContext) -> TwoStreamMethod:
    """AdaCAD: CAD with the per-token JSD weight."""
    from rag_gates.tokrag.cad import AdaCADDecoder

    return TwoStreamMethod(ctx, "adacad", AdaCADDecoder(ctx.lm, dataset=ctx.dataset))


tokrag_method.accepts_option = True  # type: ignore[attr-defined]
cad_method.accepts_option = True  # type: ignore[attr-defined]
# Checked before any model is loaded, and before this module is imported (options.py).
tokrag_method.validate_option = METHOD_OPTIONS["tokrag"]  # type: ignore[attr-defined]
cad_method.validate_option = METHOD_OPTIONS["cad"]  # type: ignore[attr-defined]
