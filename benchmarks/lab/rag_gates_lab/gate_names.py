"""Gate names and gate expressions, checked before any plugin or model loads.

The part of :mod:`rag_gates_lab.names` that the shipped methods' option parsers
(:mod:`rag_gates_lab.plugins.options`: ``deeprag-gate@GATE``) need too, so both import it
and neither imports the other. The registered names come from the entry points' *names*;
the threshold of a built-in or shipped gate is checked against its score scale
(:data:`SHIPPED_GATE_RANGES`) without importing its plugin.

Example:
    >>> check_gate_names("quco&cbdr:0.4")
    >>> check_gate_names("nosuch")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: unknown gate 'nosuch'; valid names: ...
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib.metadata import entry_points

from rag_gates.registry import walk_gate_expression

__all__ = ["BUILTIN_GATE_NAMES", "SHIPPED_GATE_RANGES", "check_gate_names", "gate_names",
           "registered_names", "unknown_name"]

# Kept here so that listing them imports no gate or model code
# (tests/unit/test_cli_fail_fast.py checks them against the core gates).
BUILTIN_GATE_NAMES = ("answer-logprob", "cbdr", "first-token-logprob", "first-token-prob",
                      "p-true", "p-true-sampling", "quco", "sample-agreement")

#: The score scale of every gate rag-gates' plugins register (their gate classes'
#: ``threshold_range``; a test holds the two equal), so ``NAME:THRESHOLD`` is checked before
#: a plugin, and the torch it imports, loads.
SHIPPED_GATE_RANGES: dict[str, tuple[float, float]] = {
    "srrag": (0.0, 1.0), "srrag-no-knn": (0.0, 1.0), "srrag-knn-only": (0.0, 1.0),
    "skr": (0.0, 1.0)}


def registered_names(group: str) -> list[str]:
    """The names registered under the entry-point ``group`` (nothing is imported)."""
    return [ep.name for ep in entry_points(group=group)]


def unknown_name(kind: str, name: str, valid: Iterable[str]) -> ValueError:
    """The error for an unknown name, listing the valid ones."""
    return ValueError(f"unknown {kind} {name!r}; valid names: {', '.join(valid)}")


def gate_names() -> list[str]:
    """Every gate name: the built-ins and those registered under ``rag_gates.gates``."""
    return sorted({*BUILTIN_GATE_NAMES, *registered_names("rag_gates.gates")})


def check_gate_names(text: str) -> None:
    """Raise ValueError unless ``text`` is a gate name, ``NAME:THRESHOLD`` or an expression
    whose every gate is registered (grammar: :data:`rag_gates.gate.GATE_GRAMMAR`); the
    message lists the valid names. ``weighted(FILE)`` reads the file's gate names. The
    threshold of a built-in or shipped gate is checked against its score scale here, importing
    no plugin (:data:`SHIPPED_GATE_RANGES`); a third-party gate's by
    :func:`rag_gates.registry.check_gate_expression`, which imports it."""
    from rag_gates.gate import check_threshold
    from rag_gates.registry import CORE_GATE_RANGES

    known = gate_names()
    ranges = {**SHIPPED_GATE_RANGES, **CORE_GATE_RANGES}

    def check_leaf(name: str, threshold: float | None) -> float | None:
        if name not in known:
            raise unknown_name("gate", name, known)
        # (a third-party plugin registered under a shipped name would be held to the
        # shipped gate's scale here: registering over a shipped name is not supported)
        if threshold is not None and name in ranges:
            check_threshold(name, threshold, ranges[name])
        return threshold

    walk_gate_expression(text, check_leaf)
