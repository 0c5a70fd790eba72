"""Gates that ``rag-gates eval-gate`` can score, and their registry.

Built-in baselines (the model's own confidence, as in FLARE and the CBDR paper's baselines):

- ``first-token-prob``: ``1 - max_v p(v | QA prompt)``: one forward pass, no generation;
  needs a white-box model.
- ``answer-logprob``: ``-mean log p`` of the greedy closed-book answer's tokens; needs a
  model that returns log-probabilities.

Method packages register theirs under the ``rag_gates.gates`` entry-point group, each entry a
factory ``(MethodContext, threshold) -> Gate``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from pydantic import JsonValue

from rag_gates.eval.methods import MethodContext
from rag_gates.gate import BaseGate, Gate
from rag_gates.lm.base import require_white_box
from rag_gates.prompts import qa_prompt

__all__ = ["AnswerLogprobGate", "FirstTokenProbGate", "available_gates", "make_gate"]

ENTRY_POINT_GROUP = "rag_gates.gates"


class FirstTokenProbGate(BaseGate):
    """Retrieve when the model is unsure of the first answer token: score ``1 - max p``."""

    name = "first-token-prob"

    def __init__(self, lm: Any, threshold: float = 0.5, dataset: str | None = None) -> None:
        super().__init__(threshold)
        self.lm = require_white_box(lm, "first-token-prob")
        self.dataset = dataset

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        logp = self.lm.next_token_logprobs(qa_prompt(query, dataset=self.dataset))
        top = float(logp.max().exp())
        return 1.0 - top, {"first_token_max_prob": top}


class AnswerLogprobGate(BaseGate):
    """Retrieve when the closed-book answer is unlikely: score ``-mean log p(token)``."""

    name = "answer-logprob"

    def __init__(self, lm: Any, threshold: float = 1.0, dataset: str | None = None,
                 max_new_tokens: int = 32) -> None:
        super().__init__(threshold)
        if not getattr(lm, "supports_logprobs", False):
            raise TypeError(f"answer-logprob needs token log-probabilities; "
                            f"{type(lm).__name__} does not return them")
        self.lm = lm
        self.dataset = dataset
        self.max_new_tokens = max_new_tokens

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        g = self.lm.generate(qa_prompt(query, dataset=self.dataset),
                             max_new_tokens=self.max_new_tokens, logprobs=0)
        values = [item.logprob for item in g.logprobs or []]
        mean = sum(values) / len(values) if values else -math.inf
        return -mean if values else math.inf, {"closed_book_answer": g.text,
                                                "mean_logprob": mean if values else None,
                                                "tokens": len(values)}


GateFactory = Callable[[MethodContext, float | None], Gate]


def _builtin(cls: type[FirstTokenProbGate] | type[AnswerLogprobGate]) -> GateFactory:
    def factory(ctx: MethodContext, threshold: float | None) -> Gate:
        kwargs: dict[str, Any] = {"dataset": ctx.dataset}
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
    """Build a gate by exact name; an unknown name lists the valid ones."""
    gates = available_gates()
    if name not in gates:
        raise ValueError(f"unknown gate {name!r}; valid names: {', '.join(sorted(gates))}")
    return gates[name](ctx, threshold)
