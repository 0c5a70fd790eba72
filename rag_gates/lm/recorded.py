"""Model calls that leave a record: tokens and latency of every generation go into a
:class:`~rag_gates.types.TraceRecorder`, so a pipeline's trace counts its model calls.

Example:
    >>> from rag_gates.types import TraceRecorder
    >>> rec = TraceRecorder()
    >>> text = generate_recorded(rec, lm, "Who wrote Hamlet?", max_new_tokens=16)  # doctest: +SKIP
    >>> rec.trace().llm_calls                                                     # doctest: +SKIP
    1
"""

from __future__ import annotations

from typing import Any

from rag_gates.lm.base import TextLM
from rag_gates.types import TraceRecorder

__all__ = ["RecordedLM", "generate_recorded"]


def generate_recorded(rec: TraceRecorder, lm: TextLM, prompt: str, max_new_tokens: int,
                      name: str = "answer") -> str:
    """Call the model and record the call (tokens, finish reason, latency) in the trace."""
    with rec.timed("llm_call", name) as data:
        g = lm.generate(prompt, max_new_tokens=max_new_tokens)
        data["tokens"] = g.completion_tokens
        data["finish_reason"] = g.finish_reason
    return g.text


class RecordedLM:
    """A model proxy that records every generation in a trace (for methods that hand the
    model to a framework, which would otherwise call it unseen). Everything else passes
    through unchanged, so white-box checks still see a white-box model."""

    def __init__(self, lm: Any, rec: TraceRecorder, name: str = "llm") -> None:
        self._lm = lm
        self._rec = rec
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._lm, attr)

    def generate(self, prompt: Any, **kwargs: Any) -> Any:
        with self._rec.timed("llm_call", self._name) as data:
            g = self._lm.generate(prompt, **kwargs)
            data["tokens"] = g.completion_tokens
        return g

    async def agenerate(self, prompt: Any, **kwargs: Any) -> Any:
        with self._rec.timed("llm_call", self._name) as data:
            g = await self._lm.agenerate(prompt, **kwargs)
            data["tokens"] = g.completion_tokens
        return g
