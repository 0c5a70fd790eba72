"""The verbalizer: the model writes what it knows as a background document (GenRead).

SR-RAG treats the model itself as a second knowledge source. When a question is not routed to
retrieval, the model first *verbalizes* its own knowledge with the GenRead prompt of the paper
(Fig. 5), greedily and at most ``max_new_tokens`` tokens, and then answers from that document.
The document is a :class:`~rag_gates.types.Passage` with ``metadata["source"] = "parametric"``,
so prompts, rerankers and synthesizers treat it like any retrieved passage. A verbalization that
hits the token cap is used as it is, and flagged (``metadata["hit_token_cap"] = True``).

Any :class:`~rag_gates.lm.base.TextLM` works: verbalizing only generates text.

Example:
    >>> from rag_gates.srrag import Verbalizer
    >>> from rag_gates.testing import tiny_lm
    >>> passage = Verbalizer(tiny_lm(), max_new_tokens=8).verbalize("Who wrote Hamlet?")
    >>> passage.metadata["source"], passage.metadata["tokens"]
    ('parametric', 8)
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections import OrderedDict
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rag_gates._text import check_text
from rag_gates.lm.base import TextLM
from rag_gates.types import GateDecision, Generation, Passage

__all__ = ["GENREAD_PROMPT", "PARAMETRIC", "Verbalizer", "VerbalizerConfig", "retrieve_instead",
           "says_nothing", "verbalizer_for"]

#: The GenRead prompt of the SR-RAG paper (Fig. 5), verbatim; ``{question}`` is filled in.
GENREAD_PROMPT = (
    "Generate a background document from Wikipedia to help answer the following question. "
    "Directly start with document content and do not generate URL.\n"
    "Question: {question}\n"
    "Background document:"
)
#: ``Passage.metadata["source"]`` of a verbalization.
PARAMETRIC: Final = "parametric"


class VerbalizerConfig(BaseModel):
    """How the model verbalizes its knowledge (part of a label file's identity)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt: str = Field(GENREAD_PROMPT, description="Template with one '{question}' field.")
    max_new_tokens: int = Field(150, ge=1, le=2048,
                                description="Token cap of one verbalization (paper: 150).")

    @field_validator("prompt")
    @classmethod
    def _one_question_field(cls, value: str) -> str:
        if value.count("{question}") != 1:
            raise ValueError("the verbalizer prompt needs exactly one '{question}' field")
        try:
            value.format(question="q")
        except (IndexError, KeyError, ValueError) as exc:
            raise ValueError(f"the verbalizer prompt is not a valid template ({exc}); write "
                             "literal braces as '{{' and '}}'") from None
        return value

    def render(self, question: str) -> str:
        """The filled-in prompt for ``question`` (what :meth:`Verbalizer.prompt` sends; the
        testbed's verbalization practice renders its prompts with it too)."""
        return self.prompt.format(question=check_text(question, "question").strip())


class Verbalizer:
    """Writes the model's own background document for a question.

    Args:
        lm: any TextLM (local, API, framework-wrapped).
        max_new_tokens: the token cap (the paper's 150).
        prompt: the template (default :data:`GENREAD_PROMPT`).
        reuse: remember the last ``reuse`` greedy verbalizations and return them again for
            the same question instead of generating (0: never). Greedy decoding gives the
            same document for the same prompt, so several pipelines sharing one verbalizer
            (the bench's ``genread`` and ``srrag@TAU`` methods on one question) pay for it
            once. A reused passage says so (``metadata["reused"]``) and carries the first
            call's time (``metadata["verbalize_ms"]``), so costs stay countable.

    Example:
        >>> v = Verbalizer(lm)                                               # doctest: +SKIP
        >>> v.verbalize("Who directed Ed Wood?").text[:60]                   # doctest: +SKIP
        'Ed Wood is a 1994 American biographical film directed by Tim'
        >>> v.verbalize("Who directed Ed Wood?", temperature=0.8, seed=1)    # doctest: +SKIP
    """

    def __init__(self, lm: TextLM, max_new_tokens: int = 150, *,
                 prompt: str = GENREAD_PROMPT, reuse: int = 0) -> None:
        if not isinstance(lm, TextLM):
            raise TypeError(f"lm must be a TextLM (generate, stream, ...), got "
                            f"{type(lm).__name__}")
        if reuse < 0:
            raise ValueError(f"reuse must be >= 0 (0 turns it off), got {reuse}")
        self.lm = lm
        self.config = VerbalizerConfig(prompt=prompt, max_new_tokens=max_new_tokens)
        self.reuse = reuse
        self._recent: OrderedDict[str, Passage] = OrderedDict()
        self._lock = threading.Lock()

    def prompt(self, question: str) -> str:
        """The filled-in prompt for ``question``."""
        return self.config.render(question)

    def verbalize(self, question: str, *, temperature: float = 0.0, seed: int | None = None
                  ) -> Passage:
        """One verbalization: greedy by default; ``temperature`` > 0 samples (with ``seed``
        where the model takes one), for the diverse contexts of source labelling."""
        prompt = self.prompt(question)
        greedy = temperature <= 0
        if greedy and self.reuse:
            with self._lock:
                seen = self._recent.get(prompt)
                if seen is not None:
                    self._recent.move_to_end(prompt)
                    return seen.model_copy(update={"metadata": {**seen.metadata,
                                                                "reused": True}})
        kwargs: dict[str, Any] = {"max_new_tokens": self.config.max_new_tokens,
                                  "temperature": temperature}
        if seed is not None and not greedy:
            kwargs["seed"] = seed
        start = time.perf_counter()
        generation = self.lm.generate(prompt, **kwargs)
        passage = self.passage(question, generation, temperature=temperature, seed=seed)
        if greedy and self.reuse and not says_nothing(passage):  # an empty one is not kept
            passage = passage.model_copy(update={"metadata": {
                **passage.metadata, "reused": False,
                "verbalize_ms": round((time.perf_counter() - start) * 1000.0, 3)}})
            with self._lock:
                self._recent[prompt] = passage
                while len(self._recent) > self.reuse:
                    self._recent.popitem(last=False)
        return passage

    async def averbalize(self, question: str, *, temperature: float = 0.0,
                         seed: int | None = None) -> Passage:
        """:meth:`verbalize` in a worker thread."""
        return await asyncio.to_thread(self.verbalize, question, temperature=temperature,
                                       seed=seed)

    def passage(self, question: str, generation: Generation, *, temperature: float = 0.0,
                seed: int | None = None) -> Passage:
        """The :class:`Passage` of a finished generation (marked parametric, flagged when it
        stopped at the token cap)."""
        text = generation.text.strip()
        digest = hashlib.sha256(f"{question}\n{text}".encode()).hexdigest()[:16]
        return Passage(
            text=text, id=f"parametric-{digest}", title=None,
            metadata={
                "source": PARAMETRIC, "model_id": self.lm.model_id,
                "tokens": generation.completion_tokens,
                "finish_reason": generation.finish_reason,
                "hit_token_cap": generation.finish_reason == "length",
                "temperature": temperature, "seed": seed,
            })


def verbalizer_for(gate: Any, verbalizer: Any = None) -> Any:
    """The verbalizer a self-routing shell uses: ``verbalizer`` when it has ``verbalize``
    (else a TypeError), or by default a :class:`Verbalizer` on ``gate.lm`` (a ValueError
    when the gate has no model)."""
    if verbalizer is None:
        lm = getattr(gate, "lm", None)
        if lm is None:
            raise ValueError(
                f"gate {getattr(gate, 'name', type(gate).__name__)!r} has no model to "
                "verbalize with: pass verbalizer=Verbalizer(lm)")
        return Verbalizer(lm)
    if not callable(getattr(verbalizer, "verbalize", None)):
        raise TypeError(f"verbalizer must be a rag_gates.srrag.Verbalizer, got "
                        f"{type(verbalizer).__name__}")
    return verbalizer


def says_nothing(passage: Passage) -> bool:
    """Whether a verbalization is empty (blank after stripping): nothing to answer from."""
    return not passage.text.strip()


def retrieve_instead(decision: GateDecision) -> GateDecision:
    """``decision`` (answer from the model's own knowledge) overturned because the
    verbalization came back empty: retrieve, and say why (fail closed; the evidence gets
    ``"verbalization": "empty"``).

    Example:
        >>> from rag_gates.types import GateDecision
        >>> d = GateDecision(gate="srrag", retrieve=False, score=0.2, threshold=0.1,
        ...                  reason="p_M * p_D = 0.2 >= tau: verbalize")
        >>> retrieve_instead(d).retrieve, retrieve_instead(d).evidence
        (True, {'verbalization': 'empty'})
    """
    return decision.model_copy(update={
        "retrieve": True,
        "reason": f"{decision.reason}; but the model's verbalization was empty, nothing to "
                  "answer from: retrieve",
        "evidence": {**decision.evidence, "verbalization": "empty"}})
