"""``p-true`` and ``p-true-sampling``: retrieve when the model doubts its own answer is true.

P(True) (Kadavath et al. 2022, "Language Models (Mostly) Know What They Know",
arXiv:2207.05221): the model answers the question closed book, is then shown the question and
its answer and asked whether the answer is "(A) True" or "(B) False"; the probability it puts
on the token ``True`` is its confidence. ``p-true-sampling`` first brainstorms ``samples``
sampled answers and shows them too ("Here are some ideas that were brainstormed: ..."), the
paper's variant that helps a model judge its answer.

The score is ``-log p("True")``, LM-Polygraph's orientation (its ``PTrue`` and
``PTrueSampling`` estimators; higher = less sure = retrieve), on ``[0, inf)``. The prompt is
LM-Polygraph 0.7.0's (:data:`P_TRUE_PROMPT`, :data:`P_TRUE_SAMPLING_PROMPT`), filled as it
fills it (the question slot holds the QA prompt's text, the samples are joined by ``", "``),
sent as one user message through the model's chat template with the generation prompt (a
model without a template gets the text as it is), and ``True`` is read at the first position
after it (for a chat model: the first assistant token), as LM-Polygraph computes it
(``docs/benchmarks.md``, the estimator table, has both measured beside our other gates:
where they win and where they invert). The probability comes from the model's teacher-forced
``score(prompt, ["True"])``: an in-process model (:class:`~rag_gates.lm.hf.HFWhiteBoxLM`),
or a served one (:class:`~rag_gates.lm.OpenAICompatibleLM`) whose server echoes the prompt's
log-probabilities (see ``lm.capabilities.notes["score"]``; a server that does not is refused
when the gate is built, saying why).

``True`` must be one token, as LM-Polygraph asserts: a tokenizer that splits it is refused
when the gate is built (in process, where the tokenizer is known); a server that reports it
as several tokens leaves the decision undecided. The greedy answer is in the decision's
evidence, so a skip replies with it (:mod:`rag_gates.answer_once`), and so are the samples,
the probability and the P(True) prompt that was scored. Fail closed: a served reply that
cannot be read, a model that cannot score the prompt, a value that is not a log-probability:
the gate is undecided, retrieves and says why.

Credits: the method and its prompt format are Kadavath et al. 2022's; the prompt text and the
way it is scored follow LM-Polygraph (Fadeeva et al. 2023, https://github.com/IINemo/lm-polygraph,
MIT: ``lm_polygraph/stat_calculators/prompt.py``). This is rag-gates' own implementation.

Example:
    >>> from rag_gates.lm import load_default_lm
    >>> from rag_gates.p_true import PTrueGate
    >>> lm = load_default_lm()                                              # doctest: +SKIP
    >>> gate = PTrueGate(lm, threshold=0.7, samples=10)                     # doctest: +SKIP
    >>> gate.name                                                           # doctest: +SKIP
    'p-true-sampling'
    >>> d = gate.decide("Who wrote Hamlet?")                                # doctest: +SKIP
    >>> d.score, d.evidence["p_true"], d.evidence["closed_book_answer"]     # doctest: +SKIP
    (0.52, 0.59, 'William Shakespeare')
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import JsonValue

from rag_gates.answer_once import closed_book_evidence
from rag_gates.errors import ServerReplyError, WhiteBoxRequiredError
from rag_gates.gate import BaseGate, logprob_problem
from rag_gates.lm.base import require_capabilities
from rag_gates.prompts import check_prompt_dataset, qa_prompt
from rag_gates.sample_agreement import MAX_SAMPLES, sample_replies

__all__ = ["P_TRUE_PROMPT", "P_TRUE_SAMPLING_PROMPT", "SAMPLING_DEFAULT_SAMPLES", "TRUE",
           "PTrueGate", "p_true_prompt"]

# The prompt format of P(True) (Kadavath et al. 2022, arXiv:2207.05221, section 3), in the
# exact text of LM-Polygraph 0.7.0's PromptCalculator and SamplingPromptCalculator
# (lm_polygraph/stat_calculators/prompt.py): {q} the question as the model was asked it,
# {a} its greedy answer (no space after "Possible answer:"), {s} the samples joined by ", ".
#: P(True)'s prompt (``p-true``).
P_TRUE_PROMPT = ("Question: {q}\n Possible answer:{a}\n "
                 "Is the possible answer:\n (A) True\n (B) False\n The possible answer is:")
#: P(True) with brainstormed samples (``p-true-sampling``).
P_TRUE_SAMPLING_PROMPT = ("Question: {q}\n Here are some ideas that were brainstormed: {s}\n "
                          "Possible answer:{a}\n "
                          "Is the possible answer:\n (A) True\n (B) False\n "
                          "The possible answer is:")
#: The token whose probability is read.
TRUE = "True"
#: The samples ``p-true-sampling`` draws by default: LM-Polygraph's (``samples_n``), the
#: count its measured ``PTrueSampling`` row used.
SAMPLING_DEFAULT_SAMPLES = 10


def p_true_prompt(question_text: str, answer: str, samples: list[str] | None = None) -> str:
    """The P(True) prompt for ``answer`` to a question asked as ``question_text`` (the QA
    prompt's text, as the model saw it); with ``samples`` (even an empty list), the
    brainstormed variant. Samples with no text are left out, as LM-Polygraph drops a sample
    with no tokens.

    Example:
        >>> print(p_true_prompt("Who wrote Hamlet?", "Shakespeare", ["Marlowe", "Kyd"]))
        Question: Who wrote Hamlet?
         Here are some ideas that were brainstormed: Marlowe, Kyd
         Possible answer:Shakespeare
         Is the possible answer:
         (A) True
         (B) False
         The possible answer is:
    """
    if samples is None:
        return P_TRUE_PROMPT.format(q=question_text, a=answer)
    return P_TRUE_SAMPLING_PROMPT.format(q=question_text, a=answer,
                                         s=", ".join(s for s in samples if s))


def _check_true_token(lm: Any) -> None:
    """Refuse a model whose tokenizer (where it is known here) splits ``True``."""
    token_ids = getattr(lm, "token_ids", None)
    if not callable(token_ids):
        return  # a served model: its reply says how many tokens it scored (checked then)
    ids = token_ids(TRUE)
    if len(ids) != 1:
        raise ValueError(
            f"p-true reads the probability of the single token {TRUE!r}, and this model's "
            f"tokenizer splits it into {len(ids)} tokens ({ids}), as LM-Polygraph refuses "
            "too: use another gate with this model (answer-logprob, sample-agreement)")


class PTrueGate(BaseGate):
    """Retrieve when the model puts little probability on its own answer being true: score
    ``-log p("True")`` after the P(True) prompt, in ``[0, inf)`` (0: certain it is true;
    ``log 2 = 0.693``: p = 0.5).

    Args:
        lm: a model with a teacher-forced ``score`` (an ``HFWhiteBoxLM``, or an
            ``OpenAICompatibleLM`` whose server echoes prompt log-probabilities) that also
            generates (``temperature`` and ``seed`` for the samples).
        threshold: retrieve when the score is at least this (default ``log 2``: when
            p(True) is at most 0.5).
        dataset: picks the QA prompt's answer instruction, as for the other gates.
        max_new_tokens: the budget of the greedy answer and of each sample.
        samples: 0 (default): plain P(True), gate name ``p-true``; N > 0: N brainstormed
            samples shown with the answer, gate name ``p-true-sampling`` (LM-Polygraph's
            count is :data:`SAMPLING_DEFAULT_SAMPLES`).
        temperature: the samples' temperature (> 0; default 1.0, LM-Polygraph's).
        seed: the first sample's seed (None: unseeded, a new draw every time).

    Example:
        >>> gate = PTrueGate(lm, threshold=0.7)                              # doctest: +SKIP
        >>> gate.decide("Who wrote Hamlet?").evidence["p_true"]              # doctest: +SKIP
        0.61
    """

    name = "p-true"
    threshold_range = (0.0, math.inf)  # -log of a probability

    def __init__(self, lm: Any, threshold: float = math.log(2.0), dataset: str | None = None,
                 max_new_tokens: int = 32, samples: int = 0, temperature: float = 1.0,
                 seed: int | None = 0) -> None:
        if isinstance(samples, bool) or not isinstance(samples, int) \
                or not 0 <= samples <= MAX_SAMPLES:
            raise ValueError(f"samples is a count in [0, {MAX_SAMPLES}] (0: plain P(True)), "
                             f"got {samples!r}")
        self.name = "p-true-sampling" if samples else "p-true"
        super().__init__(threshold)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
                or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        if isinstance(temperature, bool) or not isinstance(temperature, int | float) \
                or not math.isfinite(temperature) or temperature <= 0:
            raise ValueError(f"temperature must be > 0 (the samples' temperature; 0 would "
                             f"sample the greedy answer every time), got {temperature!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be an integer or None, got {seed!r}")
        check_prompt_dataset(dataset)  # a misspelt dataset raises now, not at the first query
        self.dataset = dataset
        self.max_new_tokens = max_new_tokens
        self.samples = samples
        self.temperature = float(temperature)
        self.seed = seed
        require_capabilities(lm, f"{self.name} (the probability of 'True' after its prompt)",
                             "score", instead="sample-agreement (text only)")
        # A served model may score one prompt form and not another (chat prompts need the
        # model's template here): refuse now, not at the first question of a long run.
        unavailable = getattr(lm, "score_unavailable", None)
        if callable(unavailable):
            why = unavailable(self._sample_prompt())
            if why is not None:
                raise WhiteBoxRequiredError(f"{self.name} reads the log-probability of 'True' "
                                            f"after its prompt, and {why}")
        _check_true_token(lm)
        self.lm = lm

    def _sample_prompt(self) -> str:
        return p_true_prompt(qa_prompt("?"), "?", ["?"] if self.samples else None)

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        prompt = qa_prompt(query, dataset=self.dataset)
        texts: list[str] | None = None
        try:
            greedy = self.lm.generate(prompt, max_new_tokens=self.max_new_tokens)
            if self.samples:
                drawn = sample_replies(self.lm, prompt, self.samples,
                                       max_new_tokens=self.max_new_tokens,
                                       temperature=self.temperature, seed=self.seed)
                texts = [g.text for g in drawn]
        except ServerReplyError as exc:  # an unreadable reply: no answer to judge
            return math.nan, {"error": f"{type(exc).__name__}: {exc}"}
        model = getattr(self.lm, "model_id", None)
        evidence: dict[str, JsonValue] = {
            **closed_book_evidence(greedy.text, prompt, self.max_new_tokens,
                                   greedy.finish_reason, greedy.completion_tokens,
                                   model if isinstance(model, str) else None)}
        if texts is not None:
            evidence.update(samples=list(texts), temperature=self.temperature)
        judged = p_true_prompt(prompt, greedy.text, texts)
        evidence["p_true_prompt"] = judged
        try:  # score() renders and routes the prompt once, refusing a form it cannot score
            (scored,) = self.lm.score(judged, [TRUE])
        except WhiteBoxRequiredError as exc:
            return math.nan, {**evidence, "error": f"the model cannot score the prompt: {exc}"}
        except ServerReplyError as exc:
            return math.nan, {**evidence, "error": f"{type(exc).__name__}: {exc}"}
        if len(scored.logprobs) != 1:
            return math.nan, {**evidence, "error": (
                f"the model scored {TRUE!r} as {len(scored.logprobs)} tokens "
                f"({scored.tokens}); P(True) reads one token's probability")}
        logprob = scored.logprobs[0]
        bad = logprob_problem(logprob)
        if bad is not None:
            return math.nan, {**evidence, "error": f"the log-probability of {TRUE!r} {bad}"}
        evidence["p_true"] = min(1.0, math.exp(logprob))
        return max(0.0, -logprob), evidence  # a value within tolerance above 0: certain

    def score_label(self, evidence: dict[str, JsonValue]) -> str:
        return f"{self.name} -log p(True)"

    def undecided(self, score: float, evidence: dict[str, JsonValue]) -> str:
        if "error" in evidence:
            return f"P(True) could not be read: {evidence['error']}"
        return super().undecided(score, evidence)
