"""The CBDR rerankers' factories for the framework shells (written once for LangChain's
document compressor and LlamaIndex's node postprocessor)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Self

__all__ = ["RerankerFactories"]


class RerankerFactories:
    """``from_probe`` and ``from_cross_encoder`` for a framework's reranker shell (LangChain's
    document compressor, LlamaIndex's node postprocessor): each builds the core reranker and
    hands it to the shell's constructor as ``reranker=``, with the shell's own options
    (``top_n``, ...) from ``kwargs``. The rerankers' module (torch) is imported only when
    called, so a shell that mixes this in imports without torch."""

    @classmethod
    def from_probe(cls, lm: Any, probe: Any, *, batch_size: int = 4,
                   max_passage_tokens: int = 512, **kwargs: Any) -> Self:
        """CBDR's zero-shot reranker: score = ``Conf(q + c) - Conf(q)`` with ``probe`` on
        ``lm`` (the white-box model it was trained on; another model is refused).

        ``batch_size`` and ``max_passage_tokens`` go to
        :class:`rag_gates.cbdr.ConfidenceGainReranker`; ``kwargs`` (``top_n``, ...) to this
        class.
        """
        from rag_gates.cbdr.rerank import ConfidenceGainReranker

        shell: Callable[..., Self] = cls
        return shell(reranker=ConfidenceGainReranker(
            lm, probe, batch_size=batch_size, max_passage_tokens=max_passage_tokens), **kwargs)

    @classmethod
    def from_cross_encoder(cls, model: Any, *, batch_size: int = 16, max_length: int = 256,
                           **kwargs: Any) -> Self:
        """Rerank with a sentence-transformers ``CrossEncoder`` (or the path of one, e.g.
        the output of ``rag-gates cbdr train-reranker``), without the LLM.

        ``batch_size`` and ``max_length`` go to :class:`rag_gates.cbdr.CrossEncoderReranker`;
        ``kwargs`` (``top_n``, ...) to this class.
        """
        from rag_gates.cbdr.rerank import CrossEncoderReranker

        shell: Callable[..., Self] = cls
        return shell(reranker=CrossEncoderReranker(model, batch_size=batch_size,
                                                   max_length=max_length), **kwargs)
