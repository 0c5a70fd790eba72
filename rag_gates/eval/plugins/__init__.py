"""The methods' entries in ``rag-gates bench`` and ``rag-gates eval-gate``.

The method packages (``rag_gates.quco``, ``rag_gates.cbdr``, ...) know nothing of the
benchmark; each module here adapts one of them: factories ``(MethodContext) -> Method`` and
``(MethodContext, threshold) -> Gate`` registered under the ``rag_gates.methods`` and
``rag_gates.gates`` entry points (pyproject.toml), plus the thresholds calibrated for the
benchmark's corpus. A new method adds a module here and its entry points.
"""

from __future__ import annotations

__all__ = ["unit_interval_option"]


def unit_interval_option(option: str | None, method: str, what: str, default: float) -> float:
    """The number in [0, 1] of ``METHOD@OPTION`` (``default`` without an option), or a
    ValueError naming the method and what the option is.

    Example:
        >>> unit_interval_option("0.9", "cbdr", "beta", 0.5)
        0.9
    """
    if option is None:
        return default
    try:
        value = float(option)
    except ValueError:
        raise ValueError(f"{method}@{option}: the option is {what}, a number in [0, 1]"
                         ) from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{method}@{option}: {what} must be in [0, 1]")
    return value
