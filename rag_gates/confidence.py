"""Gates on the model's own confidence: the baselines every learned gate must beat.

- :class:`FirstTokenProbGate`: ``1 - max_v p(v | QA prompt)``: one forward pass, no
  generation; needs a white-box model.
- :class:`FirstTokenLogprobGate`: the same score from a generated reply's first token and its
  top alternatives: works on any model that returns log-probabilities, a served one
  (``OpenAICompatibleLM``: vLLM, llama.cpp's server, TGI) included; the reply is kept for
  reuse, as :class:`AnswerLogprobGate`'s is.
- :class:`AnswerLogprobGate`: ``-mean log p`` of the greedy closed-book answer's tokens; needs
  a model that returns log-probabilities (any TextLM with ``supports_logprobs``). A served
  model that reports a value that is not a log-probability (``ServerLogprobError``: not
  finite, or above 0), or a served reply that cannot be read (``ServerReplyError``), leaves
  it undecided: it retrieves and says why. The answer is in the
  decision's evidence with its prompt and budget: when the gate skips retrieval,
  the gated engines reply with it (:mod:`rag_gates.answer_once`).

Example:
    >>> from rag_gates.confidence import FirstTokenProbGate
    >>> from rag_gates.lm import load_default_lm
    >>> gate = FirstTokenProbGate(load_default_lm(), threshold=0.5)         # doctest: +SKIP
    >>> gate.decide("Who wrote Hamlet?").evidence["first_token_max_prob"]  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from rag_gates.answer_once import closed_book_evidence
from rag_gates.errors import ServerLogprobError, ServerReplyError
from rag_gates.gate import BaseGate, logprob_problem
from rag_gates.lm.base import require_white_box
from rag_gates.prompts import check_prompt_dataset, qa_prompt
from rag_gates.types import Generation, Passage

__all__ = ["AnswerLogprobGate", "FirstTokenLogprobGate", "FirstTokenProbGate",
           "PassageAnswer", "answer_logprob_score", "answer_with_passages"]


class FirstTokenProbGate(BaseGate):
    """Retrieve when the model is unsure of the first answer token: score ``1 - max p``."""

    name = "first-token-prob"
    threshold_range = (0.0, 1.0)  # 1 - a probability

    def __init__(self, lm: Any, threshold: float = 0.5, dataset: str | None = None) -> None:
        super().__init__(threshold)
        self.lm = require_white_box(
            lm, "first-token-prob", instead="AnswerLogprobGate (generated-token logprobs only)")
        check_prompt_dataset(dataset)  # a misspelt dataset raises now, not at the first query
        self.dataset = dataset

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        logp = self.lm.next_token_logprobs(qa_prompt(query, dataset=self.dataset))
        top = float(logp.max().exp())
        return 1.0 - top, {"first_token_max_prob": top}


class FirstTokenLogprobGate(BaseGate):
    """:class:`FirstTokenProbGate`'s score, ``1 - max_v p(v)`` at the first answer token,
    read from a generated reply instead of the logits: the greedy reply's first token and its
    ``top_alternatives`` most likely alternatives (the chosen token is the most likely one
    under greedy decoding, so this is the white-box gate's value whenever the server's
    log-probabilities are the model's). For a model behind a server, which returns the
    generated tokens' log-probabilities but not the logits.

    The closed-book reply (``max_new_tokens``) is in the decision's evidence, so a skip
    replies with it (:mod:`rag_gates.answer_once`): one generation per question either way.
    A reply with no tokens, or a log-probability that is not one, leaves the gate undecided
    (it retrieves and says why).

    Example:
        >>> from rag_gates.lm import OpenAICompatibleLM                        # doctest: +SKIP
        >>> gate = FirstTokenLogprobGate(OpenAICompatibleLM("http://127.0.0.1:8000/v1"),
        ...                              threshold=0.5)                       # doctest: +SKIP
        >>> gate.decide("Who wrote Hamlet?").evidence["first_token_max_prob"]  # doctest: +SKIP
    """

    name = "first-token-logprob"
    threshold_range = (0.0, 1.0)  # 1 - a probability

    def __init__(self, lm: Any, threshold: float = 0.5, dataset: str | None = None,
                 max_new_tokens: int = 32, top_alternatives: int = 5) -> None:
        super().__init__(threshold)
        if not getattr(lm, "supports_logprobs", False):
            raise TypeError(f"first-token-logprob needs token log-probabilities; "
                            f"{type(lm).__name__} does not return them (for a served model: "
                            "a server that returns logprobs, e.g. vLLM or llama.cpp's)")
        if isinstance(top_alternatives, bool) or not isinstance(top_alternatives, int) \
                or top_alternatives < 1:
            raise ValueError(f"top_alternatives is a count >= 1, got {top_alternatives!r}")
        self.lm = lm
        check_prompt_dataset(dataset)  # a misspelt dataset raises now, not at the first query
        self.dataset = dataset
        self.max_new_tokens = max_new_tokens
        self.top_alternatives = top_alternatives

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        prompt = qa_prompt(query, dataset=self.dataset)
        try:
            g = self.lm.generate(prompt, max_new_tokens=self.max_new_tokens,
                                 logprobs=self.top_alternatives)
        except ServerReplyError as exc:  # a reply unreadable, or its log-probabilities:
            # no number to decide on, undecided (retrieve), as sample-agreement is
            return math.nan, {"error": f"{type(exc).__name__}: {exc}"}
        if not g.logprobs:
            return math.nan, {"error": "the reply has no tokens to read a first token from"}
        first = g.logprobs[0]
        values = [first.logprob, *(a.logprob for a in first.top_logprobs)]
        bad = next((p for v in values if (p := logprob_problem(v))), None)
        if bad is not None:
            return math.nan, {"error": f"the first token's log-probability {bad}"}
        top = min(1.0, math.exp(max(values)))  # a value within tolerance above 0: certain
        model = getattr(self.lm, "model_id", None)
        evidence = closed_book_evidence(g.text, prompt, self.max_new_tokens, g.finish_reason,
                                        len(g.logprobs), model if isinstance(model, str) else None)
        return 1.0 - top, {**evidence, "first_token_max_prob": top,
                           "first_token": first.token}

    def undecided(self, score: float, evidence: dict[str, JsonValue]) -> str:
        if "error" in evidence:
            return f"the model's log-probabilities are unusable: {evidence['error']}"
        return super().undecided(score, evidence)


class AnswerLogprobGate(BaseGate):
    """Retrieve when the closed-book answer is unlikely: score ``-mean log p(token)``."""

    name = "answer-logprob"
    #: -mean log p in nats: 0 (certain) up; a uniform choice among 50,000 tokens is 10.8, so
    #: a threshold above 100 would never retrieve.
    threshold_range = (0.0, 100.0)

    def __init__(self, lm: Any, threshold: float = 1.0, dataset: str | None = None,
                 max_new_tokens: int = 32) -> None:
        super().__init__(threshold)
        if not getattr(lm, "supports_logprobs", False):
            raise TypeError(f"answer-logprob needs token log-probabilities; "
                            f"{type(lm).__name__} does not return them")
        self.lm = lm
        check_prompt_dataset(dataset)  # a misspelt dataset raises now, not at the first query
        self.dataset = dataset
        self.max_new_tokens = max_new_tokens

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        prompt = qa_prompt(query, dataset=self.dataset)
        try:
            g = self.lm.generate(prompt, max_new_tokens=self.max_new_tokens, logprobs=0)
        except ServerReplyError as exc:  # a reply unreadable, or its log-probabilities:
            # no number to decide on, undecided (retrieve), as sample-agreement is
            return math.nan, {"error": f"{type(exc).__name__}: {exc}"}
        score, error = answer_logprob_score(g)
        if error is not None:
            return math.nan, {"error": error}
        # What the answer was generated from, so a skip can reply with it (answer_once).
        model = getattr(self.lm, "model_id", None)
        evidence = closed_book_evidence(g.text, prompt, self.max_new_tokens, g.finish_reason,
                                        len(g.logprobs or []),
                                        model if isinstance(model, str) else None)
        return score, {**evidence, "mean_logprob": -score if math.isfinite(score) else None}

    def undecided(self, score: float, evidence: dict[str, JsonValue]) -> str:
        if "error" in evidence:
            return f"the model's log-probabilities are unusable: {evidence['error']}"
        return super().undecided(score, evidence)


def answer_logprob_score(g: Generation) -> tuple[float, str | None]:
    """``-mean log p`` of a generation's tokens (``inf`` for an empty answer: nothing the
    model was sure of), or ``(nan, why)`` when a token's log-probability is unusable."""
    values = [item.logprob for item in g.logprobs or []]
    # A wrapper that is not OpenAICompatibleLM (a LangChain or LlamaIndex adapter) may
    # pass on what its server sent unchecked: a value above 0 would read as confident.
    bad = next(((i, p) for i, v in enumerate(values) if (p := logprob_problem(v))), None)
    if bad is not None:
        return math.nan, f"answer token {bad[0]}'s log-probability {bad[1]}"
    return (-sum(values) / len(values) if values else math.inf), None


class PassageAnswer(BaseModel):
    """The answer generated from retrieved passages and its with-passages score
    (:func:`answer_with_passages`): what a three-way spec's abstention decides on."""

    model_config = ConfigDict(frozen=True)

    answer: str
    score: float = Field(..., description="-mean log p of the answer's tokens (higher = less "
                         "reliable); nan when the model's log-probabilities were unusable.")
    error: str | None = Field(None, description="Why the score is nan.")


def answer_with_passages(lm: Any, question: str, passages: Sequence[Passage], *,
                         dataset: str | None = None, max_new_tokens: int = 32
                         ) -> PassageAnswer:
    """Answer ``question`` from ``passages`` greedily (the ``single`` method's prompt and
    budget) and score the answer as ``answer-logprob`` scores a closed-book one: the
    with-passages score ``rag-gates calibrate`` records and a three-way spec's abstention
    threshold is compared with.

    Example:
        >>> pa = answer_with_passages(lm, "Who wrote Hamlet?", passages)   # doctest: +SKIP
        >>> pa.answer, pa.score                                           # doctest: +SKIP
    """
    if not getattr(lm, "supports_logprobs", False):
        raise TypeError(f"the with-passages score needs token log-probabilities; "
                        f"{type(lm).__name__} does not return them")
    prompt = qa_prompt(question, list(passages), dataset=dataset)
    try:
        g = lm.generate(prompt, max_new_tokens=max_new_tokens, logprobs=0)
    except ServerLogprobError as exc:
        # The text is still wanted; without a score the spec abstains (fail closed).
        text = lm.generate(prompt, max_new_tokens=max_new_tokens).text
        return PassageAnswer(answer=text, score=math.nan,
                             error=f"{type(exc).__name__}: {exc}")
    score, error = answer_logprob_score(g)
    return PassageAnswer(answer=g.text, score=score, error=error)
