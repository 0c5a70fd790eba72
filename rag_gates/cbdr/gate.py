"""The CBDR gate: skip retrieval when the probe says the model already knows.

Score = ``1 - Conf(q)`` (higher = more need to retrieve); threshold = ``1 - beta``. The gate
skips when ``Conf(q) > beta`` and retrieves otherwise (section 3.4 of the paper; a tie
retrieves), comparing the confidence with beta itself.

:meth:`CBDRGate.prefill` is the cheap path: it runs the QA prompt once, reads the hidden state
from that forward pass, and on a skip the answer continues from the same KV cache, so gating
costs one tiny MLP and no second prefill.

Example:
    >>> gate = CBDRGate(lm, ConfidenceProbe.load("probe/", lm=lm))  # the probe's calibrated beta
    >>> probed = gate.prefill("Who wrote Hamlet?", max_new_tokens=32)
    >>> probed.decision.retrieve, probed.confidence
    (False, 0.97)
    >>> probed.generate(max_new_tokens=32).text      # continues from the probe's pass
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from pydantic import JsonValue

from rag_gates._text import check_text
from rag_gates.cbdr.probe import ConfidenceProbe
from rag_gates.gate import BaseGate
from rag_gates.lm.base import require_white_box
from rag_gates.types import GateDecision, Generation

__all__ = ["CBDRGate", "ProbedQuestion"]


class ProbedQuestion:
    """A question after the gate's forward pass: the decision, and (for the skip path) the
    prefilled prompt to continue the answer from. :meth:`generate` may be called once."""

    def __init__(self, lm: Any, group: Any, decision: GateDecision, confidence: float) -> None:
        self._lm = lm
        self._group = group
        self.decision = decision
        self.confidence = confidence
        self._used = False

    def generate(self, *, max_new_tokens: int = 128, stop: Sequence[str] | None = None,
                 temperature: float = 0.0, logprobs: int | None = None) -> Generation:
        """The closed-book answer, continued from the prefilled QA prompt (no new prefill)."""
        if self._used:
            raise RuntimeError("this ProbedQuestion was already generated from; call "
                               "gate.prefill(question) again for another answer")
        self._used = True
        result: Generation = self._lm.generate_from(
            self._group, max_new_tokens=max_new_tokens, stop=stop, temperature=temperature,
            logprobs=logprobs)
        return result


class CBDRGate(BaseGate):
    """Retrieve unless the probe's confidence that the model answers right exceeds ``beta``.

    Args:
        lm: the white-box model the probe was trained on (a text-only model is refused).
        probe: a trained :class:`ConfidenceProbe` (refused if trained on another model).
        beta: skip retrieval when ``Conf(q) > beta`` (a tie retrieves); None (the default):
            the beta calibrated with the probe (:attr:`ConfidenceProbe.beta`, 0.5 for a probe
            without one). The shipped SmolLM2 probe's is 0.442, certified on calibration rows
            (``benchmarks/cbdr_threshold.py``): it skips retrieval for about 58% of its
            place-of-birth calibration questions, 10% of the PopQA and 22% of the HotpotQA
            dev samples, and on this small model every skip risks accuracy (5.0 points on
            PopQA rows 0-499). ``beta=1.0`` always retrieves. Calibrate a probe of your own
            with ``rag-gates calibrate`` (the paper's 0.98 was for its own probe).
        threshold: instead of ``beta``, a threshold on the gate's own score scale
            (``1 - Conf``; retrieve when ``1 - Conf >= threshold``), as a certified spec or
            ``cbdr:THRESHOLD`` gives it: no conversion to beta and back.
        batch_size: kept for compatibility; :meth:`decide_batch` scores one question per
            pass (see there).
    """

    name = "cbdr"
    threshold_range = (0.0, 1.0)  # 1 - the probe's confidence

    def __init__(self, lm: Any, probe: ConfidenceProbe, beta: float | None = None, *,
                 threshold: float | None = None, batch_size: int = 8) -> None:
        self.lm = require_white_box(
            lm, "CBDRGate", instead="QuCoGate (text only) to decide, and CrossEncoderReranker "
            "to rerank")
        if not isinstance(probe, ConfidenceProbe):
            raise TypeError(f"probe must be a ConfidenceProbe, got {type(probe).__name__}; "
                            "load one with ConfidenceProbe.load(directory, lm=lm)")
        probe.check_compatible(self.lm)
        if threshold is not None:
            if beta is not None:
                raise ValueError("give beta (a confidence) or threshold (1 - confidence), "
                                 "not both")
            super().__init__(threshold=threshold)
            # Shown in the evidence and the reason only; the score decides (see decision).
            self.beta = max(0.0, 1.0 - self.threshold)
            self._beta_rule = False
        else:
            if beta is None:  # the probe's own calibration travels with it
                beta = probe.beta
            if isinstance(beta, bool) or not isinstance(beta, int | float) \
                    or not 0 <= beta <= 1:
                raise ValueError(f"beta is a confidence in [0, 1], got {beta!r}")
            super().__init__(threshold=1.0 - float(beta))
            self.beta = float(beta)
            self._beta_rule = True
        self.probe = probe
        self.batch_size = batch_size

    def _evidence(self, confidence: float) -> dict[str, JsonValue]:
        return {"confidence": confidence, "beta": self.beta, "layer": self.probe.layer,
                "probe_model": self.probe.config.model_id,
                "prompt_style": self.probe.prompts.style}

    def reason(self, score: float, retrieve: bool, evidence: dict[str, JsonValue]) -> str:
        conf = 1.0 - score
        if retrieve:
            return f"probe confidence {conf:.3f} <= beta {self.beta:.3g}: retrieve"
        return f"probe confidence {conf:.3f} > beta {self.beta:.3g}: answer without retrieval"

    def undecided(self, score: float, evidence: dict[str, JsonValue]) -> str:
        return (f"probe confidence is {evidence.get('confidence')}, not a number in [0, 1]: "
                "the probe or the model's hidden state is damaged (retrain or reload the "
                "probe; ConfidenceProbe.load refuses non-finite weights)")

    def decision(self, score: float, evidence: dict[str, JsonValue], *,
                 latency_ms: float = 0.0) -> GateDecision:
        """The base decision, with ``retrieve`` read from ``Conf`` and ``beta`` themselves
        (section 3.4: skip iff ``Conf > beta``; a tie retrieves). ``1 - Conf >= 1 - beta``
        alone is not that rule in floating point: a confidence one step above beta can round
        onto the threshold and retrieve."""
        made = super().decision(score, evidence, latency_ms=latency_ms)
        conf = evidence.get("confidence")
        if not self._beta_rule or "undecided" in made.evidence or not isinstance(conf, float):
            return made  # fail closed: the base decision already retrieves
        retrieve = not conf > self.beta
        if retrieve == made.retrieve:
            return made
        return made.model_copy(update={
            "retrieve": retrieve, "reason": self.reason(made.score, retrieve, made.evidence)})

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        conf = self.probe.confidence(self.lm, [query])[0]
        return 1.0 - conf, self._evidence(conf)

    def decide_batch(self, queries: Sequence[str], **signals: Any) -> list[GateDecision]:
        """Decisions in the order of ``queries``, each from its own unpadded forward pass.

        Not batched on purpose: padding a batch moves the probe's confidence by up to 2e-6
        (measured on SmolLM2), and a certified threshold is compared with the score
        :meth:`decide` gave during calibration, so a padded pass could flip a decision at
        the threshold. Every path scores as :meth:`decide` does, bit for bit."""
        for i, q in enumerate(queries):
            check_text(q, f"query {i}")
        return [self.decide(q) for q in queries]

    def _decision(self, confidence: float, latency_ms: float) -> GateDecision:
        return self.decision(1.0 - confidence, self._evidence(confidence),
                             latency_ms=latency_ms)

    def prefill(self, query: str, *, max_new_tokens: int = 128) -> ProbedQuestion:
        """Run the QA prompt once: the decision, and a prefilled prompt for the skip path.

        ``max_new_tokens`` is the answer budget to reserve in the context window.
        """
        check_text(query, "query")
        start = time.perf_counter()
        prompt = self.probe.prompts.qa(query)
        layer = self.probe.layer
        group = self.lm.open_streams([prompt], hidden_layers=[layer], reserve=max_new_tokens)
        if self.probe.config.position == -1:
            hidden = group.hidden(layer)
        else:  # another position: one more pass, since the stream keeps only the last token
            hidden = self.lm.hidden_states([prompt], [layer],
                                           position=self.probe.config.position)[:, 0]
        conf = float(self.probe.confidence_from_hidden(hidden)[0])
        decision = self._decision(conf, (time.perf_counter() - start) * 1000.0)
        return ProbedQuestion(self.lm, group, decision, conf)
