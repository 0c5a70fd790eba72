"""Gates that ``rag-gates eval-gate`` can score, and their registry.

Built-in baselines: the confidence gates of :mod:`rag_gates.confidence` (the model's own
confidence, as in FLARE and the CBDR paper's baselines), ``first-token-prob`` and
``answer-logprob``.

Method packages register theirs under the ``rag_gates.gates`` entry-point group, each entry a
factory ``(MethodContext, threshold) -> Gate``.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from rag_gates.confidence import AnswerLogprobGate, FirstTokenProbGate
from rag_gates.eval.methods import MethodContext
from rag_gates.gate import Gate, is_gate_expression, parse_gate_expression

__all__ = ["AnswerLogprobGate", "FirstTokenProbGate", "available_gates", "make_gate"]

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


def make_gate(name: str, ctx: MethodContext, threshold: float | None = None) -> Gate:
    """Build a gate by exact name, ``NAME:THRESHOLD``, or a composite expression of them
    (``quco&cbdr``, ``cascade(quco,cbdr,0.2,0.8)``: :data:`rag_gates.gate.GATE_GRAMMAR`);
    an unknown name lists the valid ones."""
    if is_gate_expression(name) or ":" in name:
        if threshold is not None:
            raise ValueError(f"gate {name!r}: give thresholds inside the expression "
                             "(NAME:THRESHOLD), not as a separate threshold")
        return parse_gate_expression(name, lambda n, t: make_gate(n, ctx, t))
    gates = available_gates()
    if name not in gates:
        raise ValueError(f"unknown gate {name!r}; valid names: {', '.join(sorted(gates))}")
    return gates[name](ctx, threshold)
