"""The per-subquery decisions of DeepRAG as gates, so every decision is a
:class:`~rag_gates.types.GateDecision` under the fail-closed rule.

- :class:`MarkerGate` (``generate`` mode): the marker the model wrote after the subquery.
- :class:`ConstantGate` (``always`` / ``never``): the same decision for every subquery.
- :class:`MarkerLikelihoodGate` (``likelihood`` mode): ``log p(retrieve marker) - log p(direct
  marker)`` after the subquery, against a threshold.

Any other rag-gates :class:`~rag_gates.gate.Gate` (QuCo, CBDR, a composite) decides in
``gate`` mode; it is asked with the subquery as its query.

Example:
    >>> MarkerGate().decide("Who directed Jaws?", written="direct").retrieve
    False
    >>> d = MarkerGate().decide("Who directed Jaws?", written=None)   # no marker written
    >>> d.retrieve, d.evidence["undecided"]
    (True, 'the model wrote no decision marker after the subquery')
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import JsonValue

from rag_gates.deeprag.markers import INTERMEDIATE, RETRIEVE
from rag_gates.errors import ServerLogprobError, WhiteBoxRequiredError
from rag_gates.gate import BaseGate, logprob_problem
from rag_gates.lm.base import Prompt, capabilities_of, require_white_box

__all__ = ["ConstantGate", "MarkerGate", "MarkerLikelihoodGate", "UnreadableStepGate"]


class MarkerGate(BaseGate):
    """Decides from the text the model wrote: score 1 for the retrieve marker, 0 for the
    direct-answer marker (threshold 0.5).

    Neither marker (``missing_marker``):

    - ``"retrieve"`` (the default, fail closed): the score is NaN, so the decision retrieves
      and says the model wrote no marker;
    - ``"answer"`` (the authors' rule: their loop retrieves only when the follow-up ends with
      the retrieval marker, gxy-gxy/DeepRAG ``src/algorithms/sragsftv2.py:94``, and answers
      anything else directly, ``:105-107``): score 0, answer without retrieval.

    ``decide(subquery, written="retrieve" | "direct" | None)``.

    Example:
        >>> MarkerGate(missing_marker="answer").decide("Who directed Jaws?").retrieve
        False
    """

    name = "deeprag-generate"

    def __init__(self, name: str | None = None, *,
                 missing_marker: Literal["retrieve", "answer"] = "retrieve") -> None:
        super().__init__(threshold=0.5)
        if missing_marker not in ("retrieve", "answer"):
            raise ValueError(f"missing_marker must be 'retrieve' (fail closed) or 'answer' "
                             f"(the authors' rule), got {missing_marker!r}")
        self.missing_marker = missing_marker
        if name:
            self.name = name

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        written = signals.get("written")
        if written == "retrieve":
            return 1.0, {"written": RETRIEVE}
        if written == "direct":
            return 0.0, {"written": INTERMEDIATE}
        if self.missing_marker == "answer":
            return 0.0, {"written": None, "missing_marker": "answer"}
        return float("nan"), {"written": None}

    def reason(self, score: float, retrieve: bool, evidence: dict[str, JsonValue]) -> str:
        verb = "retrieve" if retrieve else "answer without retrieval"
        if evidence["written"] is None:
            return (f"the model wrote no retrieval marker after the subquery: {verb} (the "
                    "authors' rule)")
        return f"the model wrote {evidence['written']!r}: {verb}"

    def undecided(self, score: float, evidence: dict[str, JsonValue]) -> str:
        return "the model wrote no decision marker after the subquery"


class ConstantGate(BaseGate):
    """The same decision for every subquery (``always`` retrieves, ``never`` does not)."""

    def __init__(self, retrieve: bool, name: str | None = None) -> None:
        super().__init__(threshold=0.5)
        self.retrieve = bool(retrieve)
        self.name = name or ("always" if retrieve else "never")

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        return (1.0 if self.retrieve else 0.0), {}

    def reason(self, score: float, retrieve: bool, evidence: dict[str, JsonValue]) -> str:
        return f"{self.name}: {'retrieve' if retrieve else 'answer without retrieval'} " \
               "for every subquery"


class UnreadableStepGate(BaseGate):
    """The decision when the model's step cannot be read (no marker after the nudge, an
    empty or repeated subquery, an empty final answer) before anything was retrieved: the
    run cannot decide, so it retrieves with the question itself instead of answering from
    memory in silence.

    ``decide(question, problem="empty_subquery", written=<the model's text>)``.
    """

    name = "deeprag-unreadable-step"

    def __init__(self) -> None:
        super().__init__(threshold=0.5)

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        written = signals.get("written")
        return float("nan"), {"problem": str(signals.get("problem")),
                              "written": written[:200] if isinstance(written, str) else None}

    def undecided(self, score: float, evidence: dict[str, JsonValue]) -> str:
        return (f"the model's step could not be read ({evidence['problem']}) and nothing was "
                "retrieved yet; retrieving with the question")


class MarkerLikelihoodGate(BaseGate):
    """Retrieve when ``log p(retrieve marker) - log p(direct marker) >= threshold``, both
    read right after the subquery line.

    A model with ``score`` (white-box, or a served model whose prompt log-probabilities passed
    the probe: see ``lm.capabilities``) gives the teacher-forced log-probability of each whole
    marker (``Let's search the question in Wikipedia.`` vs ``Intermediate answer:``). A
    text-only model that returns log-probabilities gives the first token's: the best of its
    top-20 alternatives that begins each marker (a marker missing from the top 20 counts at
    the 20th log-probability, an upper bound, flagged in the evidence; the score is then a
    bound too, and decides only when it lies on the threshold's far side, else the gate
    retrieves undecided). Neither marker among them: NaN, so the gate retrieves (fail
    closed).

    ``decide(subquery, prompt=PROMPT)``: ``PROMPT`` ends right after the subquery's line (the
    agent passes it).

    Example:
        >>> gate = MarkerLikelihoodGate(lm, threshold=0.0)                   # doctest: +SKIP
        >>> gate.decide("Who directed Jaws?", prompt=prompt).evidence         # doctest: +SKIP
        {'logp_retrieve': -9.1, 'logp_direct': -2.3, 'method': 'score'}
    """

    name = "deeprag-likelihood"
    TOP = 20

    def __init__(self, lm: Any, threshold: float = 0.0, *,
                 sample_prompt: Prompt | None = None) -> None:
        super().__init__(threshold)
        if capabilities_of(lm).has("score"):  # in process, or a server whose probe passed
            self.method = "score"
        elif getattr(lm, "supports_logprobs", False):
            self.method = "top_logprobs"
        else:
            require_white_box(lm, "deeprag likelihood decisions (or a model with logprobs)")
        # A served model may score one prompt form and not another (chat prompts need the
        # model's template here): refuse now, not at the first subquery of a long run.
        unavailable = getattr(lm, "score_unavailable", None)
        if self.method == "score" and sample_prompt is not None and callable(unavailable):
            reason = unavailable(sample_prompt)
            if reason is not None:
                raise WhiteBoxRequiredError(
                    f"DeepRAG's likelihood mode scores its two markers after every subquery, "
                    f"in the form of its prompts; {reason}")
        self.lm = lm

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        prompt: Prompt | None = signals.get("prompt")
        if prompt is None:
            raise ValueError("MarkerLikelihoodGate needs prompt=<the prompt ending after the "
                             "subquery line>; DeepRAG passes it")
        if self.method == "score":
            try:
                retrieve, direct = self.lm.score(prompt, [RETRIEVE, INTERMEDIATE])
            except ServerLogprobError as exc:  # a served model's numbers are not logprobs
                return float("nan"), {"method": "score",
                                      "logprob_error": f"{type(exc).__name__}: {exc}"}
            lr, ld = retrieve.total, direct.total
            evidence: dict[str, JsonValue] = {"logp_retrieve": lr, "logp_direct": ld,
                                              "method": "score"}
            return lr - ld, evidence
        try:
            g = self.lm.generate(prompt, max_new_tokens=1, logprobs=self.TOP)
        except ServerLogprobError as exc:  # missing or broken log-probabilities
            return float("nan"), {"method": "top_logprobs",
                                  "logprob_error": f"{type(exc).__name__}: {exc}"}
        top = g.logprobs[0].top_logprobs if g.logprobs else []
        bad = next((f"{t.token!r}: {p}" for t in top if (p := logprob_problem(t.logprob))), None)
        if bad is not None:  # an adapter passed on a broken server's values unchecked
            return float("nan"), {"method": "top_logprobs", "logprob_error": bad}
        floor = min((t.logprob for t in top), default=float("nan"))

        def best(marker: str) -> float | None:
            values = [t.logprob for t in top if t.token.strip()
                      and marker.startswith(t.token.strip())]
            return max(values) if values else None

        lr_found, ld_found = best(RETRIEVE), best(INTERMEDIATE)
        evidence = {"method": "top_logprobs", "retrieve_bound": lr_found is None,
                    "direct_bound": ld_found is None}
        if lr_found is None and ld_found is None:
            evidence.update(logp_retrieve=None, logp_direct=None)
            return float("nan"), evidence
        lr = floor if lr_found is None else lr_found
        ld = floor if ld_found is None else ld_found
        evidence.update(logp_retrieve=lr, logp_direct=ld)
        # A marker outside the top K is only known to be at most the K-th value, so the
        # difference is a bound: lower when the direct marker is missing, upper when the
        # retrieve marker is. It decides only when the bound is on the threshold's far side.
        if (ld_found is None and lr - ld < self.threshold) or (
                lr_found is None and lr - ld >= self.threshold):
            evidence["bounded_score"] = lr - ld
            return float("nan"), evidence
        return lr - ld, evidence

    def reason(self, score: float, retrieve: bool, evidence: dict[str, JsonValue]) -> str:
        relation = ">=" if retrieve else "<"
        verb = "retrieve" if retrieve else "answer without retrieval"
        return (f"log p(retrieve marker) - log p(direct marker) = {score:.3g} {relation} "
                f"{self.threshold:.3g}: {verb}")

    def undecided(self, score: float, evidence: dict[str, JsonValue]) -> str:
        if "logprob_error" in evidence:
            return f"the model's log-probabilities are unusable ({evidence['logprob_error']})"
        if "bounded_score" in evidence:
            side = ">=" if evidence.get("direct_bound") else "<="
            return (f"a marker is outside the model's top {self.TOP} next tokens, so the "
                    f"score is only known to be {side} {evidence['bounded_score']:.3g}, on "
                    f"neither side of the threshold for certain")
        if evidence.get("method") == "top_logprobs":
            return f"neither marker begins any of the model's top {self.TOP} next tokens"
        return f"the marker log-probabilities are not finite ({score!r})"
