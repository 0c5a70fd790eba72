"""Answer once: when a gate generated the closed-book answer to decide and then skips
retrieval, that answer is the reply, so a skipped question costs one generation, not two.

:class:`~rag_gates.confidence.AnswerLogprobGate` generates the greedy closed-book answer to
score it and puts it in its decision's evidence with what it was generated from (prompt,
token budget, model, how it ended). A composite holding such a gate (``Weighted``,
``Cascade``, ``AllOf``, ``AnyOf``) carries it in its sub-decisions. ``FirstTokenProbGate``
reads one next-token distribution and generates nothing, so it has no answer to reuse.

:func:`reusable_answer` hands the answer back only when the direct path would have produced
exactly the same text: same model, same prompt (compared as the model renders it when it
can), greedy decoding without stop strings, and a token budget that cannot change the text
(equal budgets, or the gate's answer ended before the direct budget). Otherwise it says why
not, and the caller generates as before.

Example:
    >>> from rag_gates.answer_once import reusable_answer
    >>> decision = gate.decide("Who wrote Hamlet?")                      # doctest: +SKIP
    >>> reuse = reusable_answer(decision, lm=lm, prompt=qa_prompt("Who wrote Hamlet?"),
    ...                         max_new_tokens=32)                       # doctest: +SKIP
    >>> reuse.answer if reuse.answer is not None else lm.generate(...)   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import JsonValue

from rag_gates.types import GateDecision, TraceRecorder

__all__ = ["ClosedBookAnswer", "Reuse", "closed_book_evidence", "find_closed_book_answer",
           "record_reuse", "reusable_answer"]


@dataclass(frozen=True)
class ClosedBookAnswer:
    """A closed-book answer a gate generated while deciding, and how it was generated."""

    text: str
    prompt: Any  # a string or a list of chat messages (JSON form)
    max_new_tokens: int
    finish_reason: str
    tokens: int
    model: str | None
    gate: str


@dataclass(frozen=True)
class Reuse:
    """The answer to reply with (None: generate as usual) and why."""

    answer: str | None
    why: str
    gate: str | None = None

    def as_json(self) -> dict[str, JsonValue]:
        """For a trace note or response metadata: reused or not, why, from which gate."""
        return {"answer_reused": self.answer is not None, "why": self.why, "gate": self.gate}


def closed_book_evidence(text: str, prompt: Any, max_new_tokens: int, finish_reason: str,
                         tokens: int, model: str | None) -> dict[str, JsonValue]:
    """The evidence keys a generating gate sets so its answer can be reused."""
    return {"closed_book_answer": text, "closed_book_prompt": prompt,
            "closed_book_max_new_tokens": max_new_tokens,
            "closed_book_finish_reason": finish_reason, "tokens": tokens,
            "model": model}


def _from_evidence(gate: str, evidence: Mapping[str, Any]) -> ClosedBookAnswer | None:
    text = evidence.get("closed_book_answer")
    budget = evidence.get("closed_book_max_new_tokens")
    if not isinstance(text, str) or not isinstance(budget, int):
        return None
    model = evidence.get("model")
    return ClosedBookAnswer(text=text, prompt=evidence.get("closed_book_prompt"),
                            max_new_tokens=budget,
                            finish_reason=str(evidence.get("closed_book_finish_reason")),
                            tokens=int(evidence.get("tokens") or 0),
                            model=model if isinstance(model, str) else None, gate=gate)


def find_closed_book_answer(decision: GateDecision | Mapping[str, Any]
                            ) -> ClosedBookAnswer | None:
    """The closed-book answer in a decision or, depth first, in its sub-decisions
    (``evidence["decisions"]`` of a composite); None when no gate generated one."""
    data = decision.model_dump(mode="json") if isinstance(decision, GateDecision) else decision
    evidence = data.get("evidence")
    if not isinstance(evidence, Mapping):
        return None
    found = _from_evidence(str(data.get("gate")), evidence)
    if found is not None:
        return found
    subs = evidence.get("decisions")
    for sub in subs if isinstance(subs, Sequence) and not isinstance(subs, str) else ():
        if isinstance(sub, Mapping):
            found = find_closed_book_answer(sub)
            if found is not None:
                return found
    return None


def _rendered(lm: Any, prompt: Any) -> Any:
    """The prompt as the model sees it, when the model can say (HFWhiteBoxLM.render)."""
    render = getattr(lm, "render", None)
    if render is None:
        return prompt
    try:
        return render(prompt)
    except (TypeError, ValueError):
        return prompt


def reusable_answer(decision: GateDecision, *, lm: Any, prompt: Any, max_new_tokens: int,
                    temperature: float = 0.0, stop: Sequence[str] | None = None) -> Reuse:
    """The gate's closed-book answer if the direct generation (``lm.generate(prompt,
    max_new_tokens=..., temperature=..., stop=...)``) would return exactly it, else None and
    why. Only a decision that skips retrieval is answered from the gate."""
    if decision.retrieve:
        return Reuse(None, "the gate asked for retrieval")
    found = find_closed_book_answer(decision)
    if found is None:
        return Reuse(None, "no gate generated a closed-book answer")

    def no(why: str) -> Reuse:
        return Reuse(None, why, found.gate)

    if temperature != 0.0 or stop:
        return no("the direct path samples or stops on strings; the gate decoded greedily "
                  "without stop strings")
    model = getattr(lm, "model_id", None)
    if found.model is None or model != found.model:
        return no(f"the gate's answer came from model {found.model!r}, the direct path uses "
                  f"{model!r}")
    if prompt != found.prompt and _rendered(lm, prompt) != _rendered(lm, found.prompt):
        return no("the gate's prompt differs from the direct path's prompt")
    if found.max_new_tokens != max_new_tokens and not (
            found.finish_reason != "length" and found.tokens <= max_new_tokens):
        return no(f"the gate's token budget ({found.max_new_tokens}) could change the answer "
                  f"against the direct budget ({max_new_tokens})")
    return Reuse(found.text, "the gate generated this closed-book answer with the direct "
                             "path's model, prompt and budget", found.gate)


def record_reuse(rec: TraceRecorder, reuse: Reuse) -> None:
    """A ``note`` event ``answer_once`` in the trace saying whether the answer was reused."""
    with rec.timed("note", "answer_once") as data:
        data.update(reuse.as_json())
