"""Pieces the QuCo gate, verifier and pipeline share: the on-error policy and timing."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Literal, TypeVar, cast

from rag_gates.corpus.errors import CorpusError, InvalidCountError
from rag_gates.gate import out_of_range

__all__ = ["OnError", "check_on_error", "checked_count", "default_extractor_or_given",
           "timed_ms"]

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


def checked_count(value: object, what: str) -> float:
    """``value`` if it is a finite count (>= 0), else :class:`InvalidCountError`: every count
    is checked before it is combined, since ``min`` or ``<`` with a NaN answers as if the
    NaN were not there."""
    problem = out_of_range(value, low=0.0)
    if problem is not None:
        raise InvalidCountError(f"the corpus answered an invalid count for {what}: {problem}")
    return float(value)  # type: ignore[arg-type]  # out_of_range checked it is a number
