"""Two lockstep streams over one generated answer: the model with the retrieved passages
(RAG) and without them (LLM). The shared decoding loop of Tok-RAG, CAD and AdaCAD lives here,
so the three differ only in how one step picks its token.

Prompts are the benchmark's own (:func:`rag_gates.prompts.qa_prompt`): the RAG stream sees
exactly what the ``single`` method gives the model, the LLM stream what ``no-rag`` gives it.

Passages that do not fit: the RAG prompt must fit the context with ``max_new_tokens``
reserved. When it does not, passage text is cut from the end of the *last* passage backwards
(later-ranked passages lose text first; a passage cut to nothing is dropped) until it fits.
The number of passage tokens removed is ``TwoStreamGeneration.truncated_tokens`` and a note
in the trace. A question too long on its own raises :class:`~rag_gates.errors.ContextLengthError`.

Example:
    >>> from rag_gates.tokrag import TokRAGDecoder
    >>> decoder = TokRAGDecoder(lm)
    >>> g = decoder.generate("Who wrote Hamlet?", passages=[Passage(text="...")])
    >>> g.text, [c.side for c in g.choices if c.side != "agree"]
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from abc import abstractmethod
from collections.abc import AsyncIterator, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, JsonValue

from rag_gates._optional import require
from rag_gates._text import check_text
from rag_gates.errors import WhiteBoxRequiredError
from rag_gates.lm.base import BaseTextLM, require_white_box, validate_generation_args
from rag_gates.prompts import format_passages, qa_prompt
from rag_gates.types import (
    Generation,
    Passage,
    TokenChoice,
    Trace,
    TraceEvent,
    TraceRecorder,
)

require("torch", "hf")
import torch  # noqa: E402

__all__ = ["StepChoice", "TwoStreamDecoder", "TwoStreamGeneration", "TwoStreams", "as_passages",
           "js_divergence", "passage_block", "stream_prompts"]

logger = logging.getLogger(__name__)

NO_PASSAGES_WARNING = "no passages given: plain generation without retrieval (one stream)"


class TwoStreamGeneration(Generation):
    """A :class:`~rag_gates.types.Generation` plus what the two streams did.

    ``choices`` has one :class:`~rag_gates.types.TokenChoice` per decoding step: every
    generated token, plus the end-of-sequence step when generation ended there (that token is
    not in the text); empty when no passages were given. ``trace`` records the call,
    truncation and warnings.
    """

    choices: list[TokenChoice] = Field(default_factory=list)
    trace: Trace = Field(default_factory=Trace)
    passages: list[Passage] = Field(default_factory=list,
                                    description="Passages as the RAG stream saw them.")
    truncated_tokens: int = Field(0, ge=0, description="Passage tokens cut to fit the context.")
    warnings: list[str] = Field(default_factory=list)

    @property
    def disagreements(self) -> list[TokenChoice]:
        """The steps where the two streams proposed different tokens (or CAD fused)."""
        return [c for c in self.choices if c.side != "agree"]

    def summary(self) -> dict[str, JsonValue]:
        """JSON-ready record for framework metadata: every token's choice, the counts, the
        truncation, warnings and the trace."""
        return {
            "choices": [c.model_dump(mode="json") for c in self.choices],
            "disagreements": len(self.disagreements),
            "rag_chosen": sum(c.side == "rag" for c in self.choices),
            "llm_chosen": sum(c.side == "llm" for c in self.choices),
            "finish_reason": self.finish_reason,
            "truncated_tokens": self.truncated_tokens,
            "warnings": list(self.warnings),
            "trace": self.trace.model_dump(mode="json"),
        }


@dataclass
class TwoStreams:
    """An open pair of streams: stream 0 = RAG, stream 1 = LLM (only stream 0 when there are
    no passages). ``passage_positions`` index the RAG stream's prompt tokens that belong to
    the passages; ``passage_ids`` are those tokens."""

    group: Any
    passages: list[Passage]
    passage_positions: list[int]
    passage_ids: list[int]
    truncated_tokens: int = 0
    warnings: list[str] = field(default_factory=list)
    # What a step rule reads again and again: the positions as an index, and per-step results
    # (valid while the number of generated tokens is ``memo_step``).
    passage_index: torch.Tensor = field(init=False, repr=False)
    passage_embeddings: torch.Tensor | None = field(default=None, repr=False)
    passage_skip: torch.Tensor | None = field(default=None, repr=False)
    memo: dict[Any, torch.Tensor] = field(default_factory=dict, repr=False)
    memo_step: int = field(default=-1, repr=False)

    def __post_init__(self) -> None:
        self.passage_index = torch.tensor(self.passage_positions, dtype=torch.long)

    @property
    def single(self) -> bool:
        return bool(self.group.n_streams == 1)

    def step_memo(self) -> dict[Any, torch.Tensor]:
        """A dict for values of the current decoding step (emptied once a token is added)."""
        step = len(self.group.generated_ids)
        if step != self.memo_step:
            self.memo, self.memo_step = {}, step
        return self.memo


@dataclass
class StepChoice:
    """What a decoder's step rule returns: the token, its record, and the logits it was
    chosen from (for the reported log-probability)."""

    token: int
    choice: TokenChoice
    logits: torch.Tensor


def passage_block(passages: Sequence[Passage], passage_format: str = "list") -> str:
    """The passages as the RAG stream shows them: ``"list"`` (the benchmark's ``- Title:
    text`` lines) or ``"reference"`` (the authors' ``[Reference]: text`` blocks,
    concatenated, as their Tok-RAG_for_ODQA.py writes them)."""
    if passage_format == "reference":
        return "".join(f"[Reference]: {p.title}: {p.text}" if p.title
                       else f"[Reference]: {p.text}" for p in passages)
    return format_passages(passages)


def stream_prompts(question: str, passages: Sequence[Passage], *, dataset: str | None = None,
                   passage_format: str = "list") -> tuple[str, str]:
    """(RAG prompt, LLM prompt) of a two-stream decoder (see
    :meth:`TwoStreamDecoder.prompts`); the testbed's reading practice renders Tok-RAG's
    prompt with it, so the practice cannot drift from the decoder."""
    return (qa_prompt(question, passages, dataset=dataset,
                      block=passage_block(passages, passage_format)),
            qa_prompt(question, dataset=dataset))


def as_passages(passages: Sequence[Passage | str] | None) -> list[Passage]:
    """Passages as :class:`Passage` (strings become untitled passages); blank ones refused."""
    if passages is None:
        return []
    if isinstance(passages, str) or not isinstance(passages, Sequence):
        raise TypeError("passages must be a list of Passage or str (one per retrieved text)")
    out: list[Passage] = []
    for i, p in enumerate(passages):
        if isinstance(p, str):
            p = Passage(text=p)
        if not isinstance(p, Passage):
            raise TypeError(f"passage {i} must be a Passage or str, got {type(p).__name__}")
        check_text(p.text, f"passage {i}")
        out.append(p)
    return out


class TwoStreamDecoder(BaseTextLM):
    """Base of the two-stream decoders: prompts, truncation, the loop, streaming, async.

    Subclasses implement :meth:`_step`. ``generate(question, passages=[...])`` is the whole
    API; ``agenerate``/``astream`` run it in a worker thread (from :class:`BaseTextLM`).
    Greedy only (``temperature`` must be 0): the methods compare the streams' top tokens.
    """

    name = "two-stream"
    # "list": the benchmark's "- Title: text" lines; "reference": the Tok-RAG authors'
    # "[Reference]: text" blocks, concatenated (their Tok-RAG_for_ODQA.py).
    passage_format = "list"

    def __init__(self, lm: Any, *, dataset: str | None = None) -> None:
        method = type(self).__name__
        white_box = require_white_box(
            lm, method, instead="one answer over the passages (QuCoPipeline, or generate() with "
            "a prompt that holds them)")
        model = getattr(white_box, "model", None)
        if model is None or not hasattr(model, "get_input_embeddings") or not hasattr(
            white_box, "tokenizer"
        ):
            raise WhiteBoxRequiredError(
                f"{method} reads the model's embedding matrix, logits and attention; "
                f"{type(lm).__name__} exposes no transformers model. Pass an HFWhiteBoxLM "
                "(rag_gates.lm.load_lm('default') or HFWhiteBoxLM.from_pretrained(...))."
            )
        self.lm: Any = white_box
        self.dataset = dataset
        with torch.inference_mode():
            self._embeddings: torch.Tensor = model.get_input_embeddings().weight.detach().float()

    @property
    def model_id(self) -> str:
        return f"{self.name}:{self.lm.model_id}"

    @property
    def supports_logprobs(self) -> bool:
        return True

    # ------------------------------------------------------------------ streams
    def prompts(self, question: str, passages: Sequence[Passage]) -> tuple[str, str]:
        """(RAG prompt, LLM prompt): the ``single`` and ``no-rag`` prompts of the benchmark
        (with ``passage_format = "reference"``, the passage block in the authors' form)."""
        return stream_prompts(question, passages, dataset=self.dataset,
                              passage_format=self.passage_format)

    def _block(self, passages: Sequence[Passage]) -> str:
        return passage_block(passages, self.passage_format)

    def capture(self) -> tuple[list[int], list[int]]:
        """(hidden layers, attention layers) the step rule reads; none by default."""
        return [], []

    def open(self, question: str, passages: Sequence[Passage | str] | None, *,
             max_new_tokens: int = 128) -> TwoStreams:
        """Prefill both streams (passages cut to fit, see the module docstring)."""
        if not isinstance(question, str):
            raise TypeError(f"question must be a str, got {type(question).__name__}")
        if not question.strip():
            raise ValueError("question is empty or whitespace; pass the user's question")
        check_text(question, "question")
        kept = as_passages(passages)
        if not kept:
            logger.warning(NO_PASSAGES_WARNING)
            group = self.lm.open_streams([qa_prompt(question, dataset=self.dataset)],
                                         reserve=max_new_tokens)
            return TwoStreams(group, [], [], [], warnings=[NO_PASSAGES_WARNING])
        kept, cut = self._fit(question, kept, max_new_tokens)
        warnings: list[str] = []
        if cut:
            warnings.append(f"passages cut by {cut} tokens (from the last passage backwards) "
                            f"to fit the {self.lm.max_context}-token context")
            logger.warning(warnings[-1])
        rag_prompt, llm_prompt = self.prompts(question, kept)
        hidden, attention = self.capture()
        group = self.lm.open_streams([rag_prompt, llm_prompt], reserve=max_new_tokens,
                                     hidden_layers=hidden, attention_layers=attention)
        prompt_ids = self.lm.encode(rag_prompt, reserve=max_new_tokens)
        positions = self._passage_positions(rag_prompt, kept, prompt_ids)
        if not positions:
            warnings.append("passage tokens not located in the prompt; using the whole prompt")
            positions = list(range(len(prompt_ids)))
        return TwoStreams(group, kept, positions, [prompt_ids[i] for i in positions],
                          truncated_tokens=cut, warnings=warnings)

    def _length(self, prompt: str) -> int:
        return len(self.lm.tokenizer(self.lm.render(prompt))["input_ids"])

    def _fit(self, question: str, passages: list[Passage], max_new_tokens: int
             ) -> tuple[list[Passage], int]:
        budget = self.lm.max_context - max_new_tokens
        tok = self.lm.tokenizer
        kept = list(passages)
        cut = 0
        for _ in range(4 * len(kept) + 4):
            over = self._length(self.prompts(question, kept)[0]) - budget
            if over <= 0 or not kept:
                break
            ids = tok(kept[-1].text, add_special_tokens=False)["input_ids"]
            # A couple of tokens of slack: re-tokenising the cut text may merge differently.
            n = min(len(ids), over + 2)
            text = str(tok.decode(ids[: len(ids) - n])).strip()
            cut += n
            if text:
                kept[-1] = kept[-1].model_copy(update={"text": text})
            else:
                kept.pop()
        return kept, cut

    def _passage_positions(self, prompt: str, passages: Sequence[Passage],
                           prompt_ids: list[int]) -> list[int]:
        """Token positions of the passage block in the RAG prompt (via offset mapping)."""
        text = self.lm.render(prompt)
        block = self._block(passages)
        start = text.find(block)
        if start < 0 or not getattr(self.lm.tokenizer, "is_fast", False):
            return []
        end = start + len(block)
        for special in (False, True):
            enc = self.lm.tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
            if list(enc["input_ids"]) == list(prompt_ids):
                return [i for i, (s, e) in enumerate(enc["offset_mapping"])
                        if e > start and s < end]
        return []

    # ------------------------------------------------------------------ the step rule
    @abstractmethod
    def _step(self, streams: TwoStreams, position: int) -> StepChoice:
        """Pick the next token of a two-stream group."""

    def _record(self, streams: TwoStreams, position: int, token: int, side: str, *,
                score: float | None = None, layer: int | None = None,
                alpha: float | None = None) -> TokenChoice:
        logp = streams.group.logprobs
        t_rag, t_llm = (int(t) for t in logp.argmax(dim=-1))
        text = self.lm._token_text
        return TokenChoice(position=position, token=text(token), token_id=token,
                           side=side,
                           rag_token=text(t_rag), rag_token_id=t_rag, llm_token=text(t_llm),
                           llm_token_id=t_llm, rag_logprob=float(logp[0, t_rag]),
                           llm_logprob=float(logp[1, t_llm]), score=score, layer=layer,
                           alpha=alpha)

    # ------------------------------------------------------------------ decoding
    def _loop(self, streams: TwoStreams, *, max_new_tokens: int, stops: tuple[str, ...],
              logprobs: int | None, start: float
              ) -> Generator[str, None, TwoStreamGeneration]:
        group = streams.group
        choices: list[TokenChoice] = []

        def choose(position: int) -> tuple[int, torch.Tensor]:
            if streams.single:
                logits = group.logits[0]
                return int(logits.argmax()), logits
            step = self._step(streams, position)
            choices.append(step.choice)
            return step.token, step.logits

        done = yield from self.lm.decode_steps(group, choose, max_new_tokens=max_new_tokens,
                                               stops=stops, logprobs=logprobs)
        finish, completion = done.finish_reason, done.completion_tokens
        latency = (time.perf_counter() - start) * 1000.0
        rec = TraceRecorder()
        for warning in streams.warnings:
            rec.add(TraceEvent(kind="note", name="warning", data={"message": warning}))
        disagreements = [c for c in choices if c.side != "agree"]
        rec.add(TraceEvent(
            kind="llm_call", name=self.name, latency_ms=latency, tokens=completion,
            data={"finish_reason": finish, "passages": len(streams.passages),
                  "truncated_tokens": streams.truncated_tokens,
                  "disagreements": len(disagreements),
                  "rag_chosen": sum(c.side == "rag" for c in disagreements),
                  "llm_chosen": sum(c.side == "llm" for c in disagreements),
                  "choices": [c.model_dump(mode="json") for c in disagreements]},
        ))
        return TwoStreamGeneration(
            text=done.text, finish_reason=finish, logprobs=done.logprobs,
            prompt_tokens=group.prompt_lengths[0], completion_tokens=completion,
            latency_ms=latency, choices=choices,
            trace=rec.trace(), passages=streams.passages,
            truncated_tokens=streams.truncated_tokens, warnings=streams.warnings,
        )

    def _start(self, prompt: str, passages: Sequence[Passage | str] | None,
               max_new_tokens: int, stop: Sequence[str] | None, temperature: float,
               logprobs: int | None) -> Generator[str, None, TwoStreamGeneration]:
        start = time.perf_counter()
        stops = validate_generation_args(max_new_tokens, stop, temperature, logprobs)
        if temperature != 0:
            raise ValueError(f"{type(self).__name__} decodes greedily; pass temperature=0 "
                             f"(got {temperature})")
        streams = self.open(prompt, passages, max_new_tokens=max_new_tokens)
        return self._loop(streams, max_new_tokens=max_new_tokens, stops=stops,
                          logprobs=logprobs, start=start)

    def generate(  # type: ignore[override]
        self,
        prompt: str,
        *,
        passages: Sequence[Passage | str] | None = None,
        max_new_tokens: int = 128,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
        logprobs: int | None = None,
    ) -> TwoStreamGeneration:
        """Answer ``prompt`` (the question) with the ``passages`` given separately.

        Stops at end-of-sequence, at the first ``stop`` string (excluded) or after
        ``max_new_tokens``. ``logprobs=k``: per-token log-probabilities of the kept token
        under the distribution it was chosen from, with ``k`` alternatives.
        """
        loop = self._start(prompt, passages, max_new_tokens, stop, temperature, logprobs)
        while True:
            try:
                next(loop)
            except StopIteration as done:
                result: TwoStreamGeneration = done.value
                return result

    def stream(  # type: ignore[override]
        self,
        prompt: str,
        *,
        passages: Sequence[Passage | str] | None = None,
        max_new_tokens: int = 128,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
        logprobs: int | None = None,
    ) -> Generator[str, None, TwoStreamGeneration]:
        """Yield text as each token is chosen; the generator's return value is the
        :class:`TwoStreamGeneration` (``result = yield from decoder.stream(...)``), with the
        per-token log-probabilities when ``logprobs=k`` (as :meth:`generate`)."""
        return (yield from self._start(prompt, passages, max_new_tokens, stop, temperature,
                                       logprobs))

    def stream_events(self, prompt: str, *, passages: Sequence[Passage | str] | None = None,
                      max_new_tokens: int = 128, stop: Sequence[str] | None = None,
                      logprobs: int | None = None,
                      ) -> Generator[str | TwoStreamGeneration, None, None]:
        """Text pieces as tokens are chosen, then the finished :class:`TwoStreamGeneration`
        as the last item (for adapters that stream and also report the choices and, with
        ``logprobs=k``, the per-token log-probabilities)."""
        result = yield from self.stream(prompt, passages=passages,
                                        max_new_tokens=max_new_tokens, stop=stop,
                                        logprobs=logprobs)
        yield result

    async def astream_events(self, prompt: str, *,
                             passages: Sequence[Passage | str] | None = None,
                             max_new_tokens: int = 128, stop: Sequence[str] | None = None,
                             logprobs: int | None = None,
                             ) -> AsyncIterator[str | TwoStreamGeneration]:
        """:meth:`stream_events` with each step in a worker thread (the event loop is never
        blocked); closing the iterator stops decoding after the current token."""
        events = self.stream_events(prompt, passages=passages, max_new_tokens=max_new_tokens,
                                    stop=stop, logprobs=logprobs)
        done = object()
        try:
            while True:
                item = await asyncio.to_thread(next, events, done)
                if item is done:
                    return
                yield item  # type: ignore[misc]
        finally:
            with contextlib.suppress(ValueError):  # still running in its thread: it ends there
                events.close()


def js_divergence(logp: torch.Tensor, logq: torch.Tensor, *, base2: bool = False) -> torch.Tensor:
    """Jensen-Shannon divergence between distributions given as log-probabilities over the
    last dimension (natural log; ``base2`` gives bits, so the value lies in [0, 1])."""
    logm = torch.logaddexp(logp, logq) - torch.log(torch.tensor(2.0))
    kl_p = (logp.exp() * (logp - logm)).sum(-1)
    kl_q = (logq.exp() * (logq - logm)).sum(-1)
    out = 0.5 * (kl_p + kl_q)
    return out / torch.log(torch.tensor(2.0)) if base2 else out
