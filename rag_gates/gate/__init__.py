"""The gate protocol: decide whether to retrieve, with a score, a threshold and a reason.

A gate's ``score`` is oriented so that higher means more need to retrieve; it retrieves when
``score >= threshold``. Thresholds are data: ``rag-gates eval-gate`` calibrates them.

The fail-closed rule: **when a gate cannot decide, it retrieves.** A score that is not a
finite number (NaN from a damaged probe, infinity from an empty answer) never turns retrieval
off: the decision is ``retrieve=True`` with ``score`` = :data:`UNDECIDED_SCORE` (the largest
finite float, so it ranks above every real score and stays valid JSON), the raw value as a
string in ``evidence["raw_score"]``, why in ``evidence["undecided"]``, and a reason that says
the gate could not decide. :class:`BaseGate` enforces it: every decision is built by
:meth:`BaseGate.decision`, also by subclasses that override ``decide_batch``.

Example:
    >>> class LengthGate(BaseGate):
    ...     name = "length"
    ...     def score(self, query: str, **signals: object) -> tuple[float, dict]:
    ...         return float(len(query.split())), {"words": len(query.split())}
    >>> LengthGate(threshold=8).decide("Who wrote Hamlet?").retrieve
    False

The package is split by concern: :mod:`rag_gates.gate.base` (the protocol, :class:`BaseGate`,
the range checks and the fail-closed rule), :mod:`rag_gates.gate.composite` (gates made of
gates) and :mod:`rag_gates.gate.expression` (the gate-expression grammar). Import from here.
Gates are built by name in :mod:`rag_gates.registry`, above the method packages.
"""

from __future__ import annotations

from rag_gates.gate.base import (
    LOGPROB_TOLERANCE,
    UNDECIDED_SCORE,
    BaseGate,
    Gate,
    check_in_range,
    check_threshold,
    decision_margin,
    fail_closed,
    gate_error_decision,
    is_undecided,
    json_safe,
    logprob_problem,
    out_of_range,
)
from rag_gates.gate.composite import (
    AllOf,
    AnyOf,
    Cascade,
    Weighted,
    logistic_combination,
)
from rag_gates.gate.expression import (
    GATE_GRAMMAR,
    MAX_EXPRESSION_CHARS,
    MAX_EXPRESSION_DEPTH,
    MAX_EXPRESSION_TERMS,
    MAX_WEIGHTS_FILE_BYTES,
    is_gate_expression,
    parse_gate_expression,
)

__all__ = [
    "GATE_GRAMMAR",
    "LOGPROB_TOLERANCE",
    "MAX_EXPRESSION_CHARS",
    "MAX_EXPRESSION_DEPTH",
    "MAX_EXPRESSION_TERMS",
    "MAX_WEIGHTS_FILE_BYTES",
    "UNDECIDED_SCORE",
    "AllOf",
    "AnyOf",
    "BaseGate",
    "Cascade",
    "Gate",
    "Weighted",
    "check_in_range",
    "check_threshold",
    "decision_margin",
    "fail_closed",
    "gate_error_decision",
    "is_gate_expression",
    "is_undecided",
    "json_safe",
    "logistic_combination",
    "logprob_problem",
    "out_of_range",
    "parse_gate_expression",
]
