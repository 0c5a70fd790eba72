"""Gates that ``rag-gates eval-gate`` can score, and their registry.

Built-in baselines: the confidence gates of :mod:`rag_gates.confidence` (the model's own
confidence, as in FLARE and the CBDR paper's baselines), ``first-token-prob`` and
``answer-logprob``.

Method packages register theirs under the ``rag_gates.gates`` entry-point group, each entry a
factory ``(MethodContext, threshold) -> Gate``. A factory declares the scale of its gate's
score as ``factory.threshold_range = (low, high)`` (its gate class's
:attr:`~rag_gates.gate.BaseGate.threshold_range`), so ``NAME:THRESHOLD`` is checked before
any gate, model or index is built, by the check every gate applies when built.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from rag_gates.confidence import AnswerLogprobGate, FirstTokenProbGate
from rag_gates.eval.methods import MethodContext
from rag_gates.eval.names import walk_gate_expression
from rag_gates.gate import (
    Gate,
    check_threshold,
    is_gate_expression,
    parse_gate_expression,
)

__all__ = ["AnswerLogprobGate", "FirstTokenProbGate", "available_gates",
           "check_gate_expression", "check_gate_threshold", "gate_needs_lm", "make_gate"]

ENTRY_POINT_GROUP = "rag_gates.gates"


GateFactory = Callable[[MethodContext, float | None], Gate]


def _builtin(cls: type[FirstTokenProbGate] | type[AnswerLogprobGate]) -> GateFactory:
    def factory(ctx: MethodContext, threshold: float | None) -> Gate:
        kwargs: dict[str, Any] = {"dataset": ctx.dataset}
        if cls is AnswerLogprobGate:
            # The run's answer budget: its closed-book answer is then the no-rag answer,
            # which a skip replies with (rag_gates.answer_once).
            kwargs["max_new_tokens"] = ctx.max_new_tokens
        if threshold is not None:
            kwargs["threshold"] = threshold
        gate: Gate = cls(ctx.lm, **kwargs)
        return gate

    factory.threshold_range = cls.threshold_range  # type: ignore[attr-defined]
    return factory


BUILTIN_GATES: dict[str, GateFactory] = {
    "first-token-prob": _builtin(FirstTokenProbGate),
    "answer-logprob": _builtin(AnswerLogprobGate),
}


def available_gates() -> dict[str, GateFactory]:
    """Built-in gates plus those registered under the ``rag_gates.gates`` entry points."""
    gates = dict(BUILTIN_GATES)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        gates.setdefault(ep.name, ep.load())
    return gates


def check_gate_threshold(name: str, threshold: float | None,
                         gates: dict[str, GateFactory] | None = None) -> float | None:
    """``threshold`` if it lies on the score scale the gate ``name`` declares (None stays
    None: the gate's default), else a ValueError naming the gate and its range. Model-free.

    Example:
        >>> check_gate_threshold("first-token-prob", 0.4)
        0.4
    """
    if threshold is None:
        return None
    factory = (gates if gates is not None else available_gates()).get(name)
    return check_threshold(name, threshold,
                           getattr(factory, "threshold_range", (-math.inf, math.inf)))


def check_gate_expression(expression: str, gates: dict[str, GateFactory] | None = None
                          ) -> None:
    """Check a gate expression without building a gate: its syntax and limits, its weights
    files (shape, cycles) and every ``NAME:THRESHOLD`` against the gate's declared range.
    Raises ValueError (:class:`~rag_gates.errors.WeightsFileError` for a weights file) saying
    what is wrong. Names not registered are left to :func:`make_gate`.

    Example:
        >>> check_gate_expression("quco&first-token-prob:0.4")
    """
    known = gates if gates is not None else available_gates()
    walk_gate_expression(expression, lambda name, threshold: check_gate_threshold(
        name, threshold, known))


def gate_needs_lm(expression: str, gates: dict[str, GateFactory] | None = None) -> bool:
    """Whether building the gate ``expression`` needs the model: False only when every gate
    in it declares ``factory.needs_lm = False`` (QuCo's pre-check reads the question and the
    corpus counts, never the model); a factory that declares nothing needs it.

    Example:
        >>> gate_needs_lm("quco"), gate_needs_lm("quco&first-token-prob:0.4")
        (False, True)
    """
    known = gates if gates is not None else available_gates()
    needs = False

    def leaf(name: str, threshold: float | None) -> float | None:
        nonlocal needs
        needs = needs or bool(getattr(known.get(name), "needs_lm", True))
        return threshold

    walk_gate_expression(expression, leaf)
    return needs


def make_gate(name: str, ctx: MethodContext, threshold: float | None = None) -> Gate:
    """Build a gate by exact name, ``NAME:THRESHOLD``, or a composite expression of them
    (``quco&cbdr``, ``cascade(quco,cbdr,0.2,0.8)``: :data:`rag_gates.gate.GATE_GRAMMAR`);
    an unknown name lists the valid ones. An expression is checked whole first
    (:func:`check_gate_expression`), so nothing is built for one that would be refused."""
    gates = available_gates()  # read once: each lookup of the entry points takes ~50 ms
    if (is_gate_expression(name) or ":" in name) and threshold is None:
        check_gate_expression(name, gates)
    return _build(name, ctx, threshold, gates)


def _build(name: str, ctx: MethodContext, threshold: float | None,
           gates: dict[str, GateFactory]) -> Gate:
    if is_gate_expression(name) or ":" in name:
        if threshold is not None:
            raise ValueError(f"gate {name!r}: give thresholds inside the expression "
                             "(NAME:THRESHOLD), not as a separate threshold")
        return parse_gate_expression(name, lambda n, t: _build(n, ctx, t, gates))
    if name not in gates:
        raise ValueError(f"unknown gate {name!r}; valid names: {', '.join(sorted(gates))}")
    return gates[name](ctx, check_gate_threshold(name, threshold, gates))
