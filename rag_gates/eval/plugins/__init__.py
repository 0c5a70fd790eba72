"""The methods' entries in ``rag-gates bench`` and ``rag-gates eval-gate``.

The method packages (``rag_gates.quco``, ``rag_gates.cbdr``, ...) know nothing of the
benchmark; each module here adapts one of them: factories ``(MethodContext) -> Method`` and
``(MethodContext, threshold) -> Gate`` registered under the ``rag_gates.methods`` and
``rag_gates.gates`` entry points (pyproject.toml), plus the thresholds calibrated for the
benchmark's corpus. A new method adds a module here and its entry points.
"""

from __future__ import annotations

import math

__all__ = ["number_option", "unit_interval_option"]


def number_option(option: str | None, method: str, what: str, default: float, *,
                  low: float = -math.inf, high: float = math.inf) -> float:
    """The finite number in ``[low, high]`` of ``METHOD@OPTION`` (``default`` without an
    option), or a ValueError naming the method, what the option is and its range: a typo
    or ``nan`` never reaches a method as a threshold.

    Example:
        >>> number_option("20", "quco", "tau_entity, an entity count", 82.0, low=0)
        20.0
    """
    if option is None:
        return default
    try:
        value = float(option)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"{method}@{option}: the option is {what}, {_range_words(low, high)}")
    return value


def _range_words(low: float, high: float) -> str:
    if math.isfinite(low) and math.isfinite(high):
        return f"a number in [{low:g}, {high:g}]"
    if math.isfinite(low):
        return f"a number >= {low:g}"
    if math.isfinite(high):
        return f"a number <= {high:g}"
    return "a finite number"


def unit_interval_option(option: str | None, method: str, what: str, default: float) -> float:
    """The number in [0, 1] of ``METHOD@OPTION`` (``default`` without an option), or a
    ValueError naming the method and what the option is.

    Example:
        >>> unit_interval_option("0.9", "cbdr", "beta", 0.5)
        0.9
    """
    return number_option(option, method, what, default, low=0.0, high=1.0)
