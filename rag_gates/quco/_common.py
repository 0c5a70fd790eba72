"""Pieces the QuCo gate, verifier and pipeline share: the on-error policy and timing."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Literal, TypeVar, cast

from rag_gates.corpus.errors import CorpusError

__all__ = ["OnError", "check_on_error", "default_extractor_or_given", "timed_ms"]

logger = logging.getLogger("rag_gates.quco")

OnError = Literal["retrieve", "skip", "raise"]
"""What to do when the corpus cannot answer (timeout, 5xx, missing index):
``"retrieve"`` (default: without evidence, be safe), ``"skip"`` (carry on without retrieval)
or ``"raise"`` (let the :class:`~rag_gates.corpus.errors.CorpusError` through)."""

ON_ERROR_CHOICES: tuple[OnError, ...] = ("retrieve", "skip", "raise")

T = TypeVar("T")


def check_on_error(value: str) -> OnError:
    """``value`` if it is a valid policy, else a ValueError listing the valid ones."""
    if value not in ON_ERROR_CHOICES:
        raise ValueError(f"on_error must be one of {', '.join(ON_ERROR_CHOICES)}; got {value!r}")
    return cast(OnError, value)


def timed_ms(fn: Callable[[], T]) -> tuple[T, float]:
    """Call ``fn`` and return its result with the wall time in milliseconds."""
    start = time.perf_counter()
    result = fn()
    return result, (time.perf_counter() - start) * 1000.0


def default_extractor_or_given(extractor: object) -> object:
    """The given extractor, or the package default (built lazily: it may load a model)."""
    if extractor is not None:
        return extractor
    from rag_gates.extract import default_extractor

    return default_extractor()


def corpus_failure(policy: OnError, what: str, error: CorpusError) -> None:
    """Log a corpus failure; re-raise it under the ``"raise"`` policy."""
    if policy == "raise":
        raise error
    logger.warning("corpus statistics failed for %s (%s: %s); on_error=%r",
                   what, type(error).__name__, error, policy)
