"""Context-aware decoding (CAD) and AdaCAD over the same two streams as Tok-RAG.

CAD (Shi et al., 2023) keeps ``argmax [(1 + alpha) log p_RAG - alpha log p_LLM]`` every step,
with a fixed ``alpha``; AdaCAD (Wang et al., 2024) sets ``alpha`` per token to the
Jensen-Shannon divergence (bits, in [0, 1]) between the two distributions, so agreeing
streams decode as standard RAG and conflicting ones lean on the context. Greedy, no
plausibility cut-off (neither paper's default needs one).

Example:
    >>> g = CADDecoder(lm, alpha=0.5).generate(question, passages=passages)
    >>> g = AdaCADDecoder(lm).generate(question, passages=passages)
    >>> [(c.token, c.side, c.alpha) for c in g.disagreements]
"""

from __future__ import annotations

import math
from typing import Any

from rag_gates._optional import require
from rag_gates.tokrag.streams import StepChoice, TwoStreamDecoder, TwoStreams, js_divergence

require("torch", "hf")
import torch  # noqa: E402

__all__ = ["DEFAULT_CAD_ALPHA", "AdaCADDecoder", "CADDecoder", "check_alpha"]

#: CAD's general-purpose weight in the CAD paper (1.0 is its knowledge-conflict setting).
DEFAULT_CAD_ALPHA = 0.5


def check_alpha(alpha: float) -> float:
    """A CAD weight must be a finite number >= 0 (0 = standard RAG)."""
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(
        alpha
    ) or alpha < 0:
        raise ValueError(f"CAD alpha must be a finite number >= 0 (0 = standard RAG), "
                         f"got {alpha!r}")
    return float(alpha)


class CADDecoder(TwoStreamDecoder):
    """Context-aware decoding with a fixed weight ``alpha`` (see the module docstring).

    Invoke:
        >>> g = CADDecoder(lm, alpha=1.0).generate("Who wrote Hamlet?", passages=[...])
    """

    name = "cad"

    def __init__(self, lm: Any, alpha: float = DEFAULT_CAD_ALPHA, *,
                 dataset: str | None = None) -> None:
        super().__init__(lm, dataset=dataset)
        self.alpha = check_alpha(alpha)

    def weight(self, logp: torch.Tensor) -> float:
        """The step's alpha from the two streams' log-probabilities ``[2, vocab]``."""
        return self.alpha

    def _step(self, streams: TwoStreams, position: int) -> StepChoice:
        group = streams.group
        logp = group.logprobs
        alpha = self.weight(logp)
        fused = (1.0 + alpha) * logp[0] - alpha * logp[1]
        token = int(fused.argmax())
        t_rag, t_llm = group.greedy_tokens()
        if token == t_rag == t_llm:
            side = "agree"
        elif token == t_rag:
            side = "rag"
        elif token == t_llm:
            side = "llm"
        else:
            side = "fused"
        return StepChoice(token, self._record(streams, position, token, side, alpha=alpha),
                          fused)


class AdaCADDecoder(CADDecoder):
    """CAD with ``alpha`` = JSD(p_RAG, p_LLM) in bits, per token.

    Invoke:
        >>> g = AdaCADDecoder(lm).generate("Who wrote Hamlet?", passages=[...])
    """

    name = "adacad"

    def __init__(self, lm: Any, *, dataset: str | None = None) -> None:
        super().__init__(lm, alpha=0.0, dataset=dataset)

    def weight(self, logp: torch.Tensor) -> float:
        with torch.inference_mode():
            return float(js_divergence(logp[0], logp[1], base2=True).clamp(0.0, 1.0))
