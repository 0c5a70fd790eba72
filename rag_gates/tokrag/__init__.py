"""Tok-RAG: token-level collaboration of the model with and without the retrieved passages
(papers/tok-rag.txt), with context-aware decoding (CAD) and AdaCAD over the same streams.

* :class:`TokRAGDecoder`: where the two streams' greedy tokens differ, keep the side the
  passages support (fusion layer l*, p_R, expected embeddings; :class:`TokRAGConfig`);
* :class:`CADDecoder` (fixed alpha) and :class:`AdaCADDecoder` (per-token JSD alpha);
* every decoder returns a :class:`TwoStreamGeneration`: the text plus one
  :class:`~rag_gates.types.TokenChoice` per token and a :class:`~rag_gates.types.Trace`.

White-box: a text-only model is refused at construction.

Example:
    >>> from rag_gates.tokrag import TokRAGDecoder
    >>> g = TokRAGDecoder(lm).generate("Who wrote Hamlet?", passages=["Hamlet ..."])
    >>> g.text, len(g.disagreements)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rag_gates._optional import lazy_attributes

if TYPE_CHECKING:  # pragma: no cover
    from rag_gates.tokrag.cad import DEFAULT_CAD_ALPHA, AdaCADDecoder, CADDecoder
    from rag_gates.tokrag.decoder import Judgement, TokRAGConfig, TokRAGDecoder
    from rag_gates.tokrag.streams import TwoStreamDecoder, TwoStreamGeneration, TwoStreams

# Lazy: importing the package must not pull in torch.
_WHERE = {
    "DEFAULT_CAD_ALPHA": "cad", "AdaCADDecoder": "cad", "CADDecoder": "cad",
    "Judgement": "decoder", "TokRAGConfig": "decoder", "TokRAGDecoder": "decoder",
    "TwoStreamDecoder": "streams", "TwoStreamGeneration": "streams", "TwoStreams": "streams",
}

__all__ = ["DEFAULT_CAD_ALPHA", "AdaCADDecoder", "CADDecoder", "Judgement", "TokRAGConfig",
           "TokRAGDecoder", "TwoStreamDecoder", "TwoStreamGeneration", "TwoStreams"]

__getattr__ = lazy_attributes(__name__, _WHERE)
