"""``sample-agreement``: retrieve when a few sampled answers disagree with the greedy one.

The score is ``1 - agreement``, the agreement of a few sampled answers with the greedy one:
a model that knows the answer says it again when sampled; one that guesses scatters. Needs
text only, so it works on any model: a served one (``OpenAICompatibleLM``: the samples come
in one request with the API's ``n`` where the server honours it, else one request each) and
an in-process one (``samples`` seeded generations). The greedy answer is in the decision's
evidence, so a skip replies with it (:mod:`rag_gates.answer_once`).

The agreement (``agreement=``) is ``f1`` (default: the mean token F1 of each sample with the
greedy answer, after the answer matcher's normalisation: a graded score, which a small
model's wordy samples need), ``exact`` (the share of samples equal to the greedy answer once
normalised) or ``f1:CUT`` (the share whose F1 is at least CUT). Sampling is seeded
(``seed``; the i-th sample ``seed + i`` where drawn one by one), so a deterministic server
gives the same score twice. A reply the server sends malformed leaves the gate undecided:
it retrieves and says why.

Example:
    >>> from rag_gates.lm import OpenAICompatibleLM
    >>> from rag_gates.sample_agreement import SampleAgreementGate
    >>> gate = SampleAgreementGate(OpenAICompatibleLM("http://127.0.0.1:8000/v1"),
    ...                            threshold=0.5, samples=5)              # doctest: +SKIP
    >>> d = gate.decide("Who wrote Hamlet?")                            # doctest: +SKIP
    >>> d.score, d.evidence["samples"]                                  # doctest: +SKIP
    (0.27, ['Shakespeare', 'William Shakespeare', ...])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pydantic import JsonValue

from rag_gates.answer_once import closed_book_evidence
from rag_gates.errors import ServerReplyError
from rag_gates.gate import BaseGate
from rag_gates.prompts import check_prompt_dataset, qa_prompt
from rag_gates.types import Generation

__all__ = ["AGREEMENTS", "SampleAgreementGate", "agreement", "sample_replies"]

#: Most samples a gate may draw per question: each is a generation.
MAX_SAMPLES = 64
AGREEMENTS = "f1 | exact | f1:CUT (0 < CUT <= 1)"


def agreement(greedy: str, samples: Sequence[str], how: str = "f1") -> float:
    """How far ``samples`` agree with ``greedy``, in [0, 1] (see the module docstring).

    Example:
        >>> agreement("Paris", ["Paris.", "paris", "Lyon"], "exact")
        0.6666666666666666
        >>> round(agreement("William Shakespeare", ["Shakespeare", "Marlowe"]), 3)
        0.333
    """
    from rag_gates.answers import _f1_one, normalize_answer
    from rag_gates.calibration.judges import parse_same_answer

    if not samples:
        raise ValueError("no samples to compare with")
    if how == "f1":
        key = normalize_answer(greedy)
        # Two empty replies agree (F1 reads them as 0).
        return sum(1.0 if normalize_answer(s) == key else _f1_one(greedy, s)
                   for s in samples) / len(samples)
    judge = parse_same_answer(how)
    return sum(judge(greedy, s) for s in samples) / len(samples)


def _check_agreement(how: str) -> str:
    try:
        agreement("a", ["a"], how)
    except ValueError:
        raise ValueError(f"agreement {how!r}: give {AGREEMENTS}") from None
    return how


def sample_replies(lm: Any, prompt: Any, n: int, *, max_new_tokens: int, temperature: float,
                   seed: int | None) -> list[Generation]:
    """``n`` sampled replies: ``lm.sample`` where the model has it (OpenAICompatibleLM: one
    request with ``n`` where the server allows it), else ``n`` generations seeded
    ``seed + i``."""
    batch = getattr(lm, "sample", None)
    if callable(batch):
        return list(batch(prompt, n, max_new_tokens=max_new_tokens, temperature=temperature,
                          seed=seed))
    return [lm.generate(prompt, max_new_tokens=max_new_tokens, temperature=temperature,
                        seed=None if seed is None else seed + i) for i in range(n)]


class SampleAgreementGate(BaseGate):
    """Retrieve when sampled answers disagree with the greedy answer: score ``1 -``
    :func:`agreement`, in [0, 1] (0: every sample is the greedy answer).

    Args:
        lm: any TextLM (served or in process); ``generate`` with ``temperature`` and ``seed``.
        threshold: retrieve when the score is at least this.
        samples: how many answers to sample (each a generation; one request where the server
            takes ``n``).
        temperature: the sampling temperature (> 0).
        seed: the first sample's seed (None: unseeded, a new draw every time).
        agreement: ``f1`` (mean token F1 with the greedy answer), ``exact`` or ``f1:CUT``.
    """

    name = "sample-agreement"
    threshold_range = (0.0, 1.0)  # 1 - a share

    def __init__(self, lm: Any, threshold: float = 0.5, dataset: str | None = None,
                 max_new_tokens: int = 32, samples: int = 5, temperature: float = 0.7,
                 seed: int | None = 0, agreement: str = "f1") -> None:
        super().__init__(threshold)
        if isinstance(samples, bool) or not isinstance(samples, int) \
                or not 1 <= samples <= MAX_SAMPLES:
            raise ValueError(f"samples is a count in [1, {MAX_SAMPLES}], got {samples!r}")
        if not isinstance(temperature, int | float) or not math.isfinite(temperature) \
                or temperature <= 0:
            raise ValueError(f"temperature must be > 0 (0 would sample the greedy answer "
                             f"{samples} times), got {temperature!r}")
        check_prompt_dataset(dataset)  # a misspelt dataset raises now, not at the first query
        self.lm = lm
        self.dataset = dataset
        self.max_new_tokens = max_new_tokens
        self.samples = samples
        self.temperature = float(temperature)
        self.seed = seed
        self.agreement = _check_agreement(agreement)

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        prompt = qa_prompt(query, dataset=self.dataset)
        try:
            greedy = self.lm.generate(prompt, max_new_tokens=self.max_new_tokens)
            drawn = sample_replies(self.lm, prompt, self.samples,
                                   max_new_tokens=self.max_new_tokens,
                                   temperature=self.temperature, seed=self.seed)
        except ServerReplyError as exc:  # an unreadable reply: no answers to compare
            return math.nan, {"error": f"{type(exc).__name__}: {exc}"}
        texts = [g.text for g in drawn]
        agreed = agreement(greedy.text, texts, self.agreement)
        model = getattr(self.lm, "model_id", None)
        evidence = closed_book_evidence(greedy.text, prompt, self.max_new_tokens,
                                        greedy.finish_reason, greedy.completion_tokens,
                                        model if isinstance(model, str) else None)
        return 1.0 - agreed, {
            **evidence, "samples": list(texts), "agreement": agreed,
            "agreement_kind": self.agreement, "temperature": self.temperature}

    def undecided(self, score: float, evidence: dict[str, JsonValue]) -> str:
        if "error" in evidence:
            return f"the model's reply could not be read: {evidence['error']}"
        return super().undecided(score, evidence)
