"""The methods' entries in ``rag-gates bench`` and ``rag-gates eval-gate``.

The method packages (``rag_gates.quco``, ``rag_gates.cbdr``, ...) know nothing of the
benchmark; each module here adapts one of them: factories ``(MethodContext) -> Method`` and
``(MethodContext, threshold) -> Gate`` registered under the ``rag_gates.methods`` and
``rag_gates.gates`` entry points (pyproject.toml), plus the thresholds calibrated for the
benchmark's corpus. A new method adds a module here and its entry points.
"""

from __future__ import annotations

import math

from rag_gates.gate import check_in_range

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
    # The same check as a gate's NAME:THRESHOLD (rag_gates.gate.check_in_range).
    return check_in_range(value, f"{method}@{option}: the option is {what}", low, high)


def unit_interval_option(option: str | None, method: str, what: str, default: float) -> float:
    """The number in [0, 1] of ``METHOD@OPTION`` (``default`` without an option), or a
    ValueError naming the method and what the option is.

    Example:
        >>> unit_interval_option("0.9", "cbdr", "beta", 0.5)
        0.9
    """
    return number_option(option, method, what, default, low=0.0, high=1.0)
