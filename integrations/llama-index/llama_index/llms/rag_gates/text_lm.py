"""Any LlamaIndex LLM as a rag-gates :class:`~rag_gates.lm.base.TextLM`.

Text-only rag-gates methods (QuCo, DeepRAG prompting) then run on whatever model a
LlamaIndex application already uses: OpenAI, Ollama, vLLM, a local HuggingFace LLM, ...
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

from llama_index.core.base.llms.types import ChatMessage, LogProb, MessageRole
from llama_index.core.llms import LLM
from llama_index.llms.rag_gates.base import LOGPROBS_LAYOUT, LOGPROBS_LAYOUT_KEY, RagGatesLLM
from pydantic import BaseModel, ConfigDict, Field

from rag_gates.errors import LogprobsMissingError
from rag_gates.lm.base import (
    BaseTextLM,
    Prompt,
    as_messages,
    validate_generation_args,
    validate_prompt,
)
from rag_gates.lm.stops import StopCutter, find_stop
from rag_gates.types import Generation, TokenLogprob, TopLogprob

__all__ = [
    "GenerationOptions",
    "LlamaIndexTextLM",
    "as_text_lm",
    "from_llama_index_logprobs",
]

_FINISH_REASONS = ("stop", "length", "eos")


class GenerationOptions(BaseModel):
    """The generation arguments of one rag-gates call, for ``as_text_lm(call_kwargs=...)``."""

    model_config = ConfigDict(frozen=True)

    max_new_tokens: int = Field(..., description="Most tokens to generate.")
    temperature: float = Field(..., description="Sampling temperature; 0 = greedy.")
    logprobs: int | None = Field(
        ..., description="Top alternatives per token wanted; None = no log-probabilities."
    )
    stop: tuple[str, ...] = Field((), description="Stop strings (applied by truncation too).")


CallKwargs = Callable[[GenerationOptions], Mapping[str, Any]]
"""Maps rag-gates generation arguments to the wrapped LLM's per-call keyword arguments."""


def _rag_gates_call_kwargs(options: GenerationOptions) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "max_new_tokens": options.max_new_tokens,
        "temperature": options.temperature,
    }
    if options.logprobs is not None:
        kwargs["top_logprobs"] = options.logprobs
    if options.stop:
        kwargs["stop"] = list(options.stop)
    return kwargs


def _no_call_kwargs(options: GenerationOptions) -> dict[str, Any]:
    return {}


def from_llama_index_logprobs(
    rows: Sequence[Sequence[LogProb]], top: int, *, layout: str | None = None
) -> list[TokenLogprob] | None:
    """Convert LlamaIndex ``list[list[LogProb]]`` to rag-gates per-token log-probabilities.

    ``layout="chosen_then_alternatives"`` (what :class:`RagGatesLLM` returns): ``row[0]`` is
    the generated token and ``row[1:]`` the most likely other tokens; the generated token is
    put back among them by its log-probability, so ``top_logprobs`` is the model's top-k as
    rag-gates (and OpenAI) list it. ``"chosen_then_top"`` (earlier versions): ``row[1:]`` is
    that top-k already. Any other layout is LlamaIndex's
    usual one (OpenAI integration): a row holds only the most likely tokens, so ``row[0]``
    stands for the generated token, which is exact under greedy decoding (rag-gates'
    default, ``temperature=0``); :class:`LlamaIndexTextLM` refuses rows whose first tokens
    do not spell the text (the LLM sampled) with a ``LogprobsMissingError``. ``top`` caps the
    alternatives kept. Returns None when a row is empty (the LLM sent no alternatives).
    """
    chosen_first = layout in (LOGPROBS_LAYOUT, "chosen_then_top")
    out: list[TokenLogprob] = []
    for row in rows:
        if not row:
            return None
        alternatives = list(row[1:] if chosen_first else row)
        if layout == LOGPROBS_LAYOUT:
            alternatives = sorted([row[0], *alternatives], key=lambda a: -a.logprob)
        out.append(
            TokenLogprob(
                token=row[0].token,
                logprob=row[0].logprob,
                bytes=_bytes(row[0]),
                top_logprobs=[
                    TopLogprob(token=a.token, logprob=a.logprob, bytes=_bytes(a))
                    for a in alternatives[:top]
                ],
            )
        )
    return out


def _first_tokens_spell(rows: Sequence[Sequence[LogProb]], text: str,
                        stops: Sequence[str] = ()) -> bool:
    """Whether the rows' first tokens spell ``text`` (whitespace at either end aside), by
    their bytes when every one has them (a character split over tokens), else their text.
    Also when they spell it followed by a stop string the server cut from the text but not
    from the log-probabilities, and when a server sent a piece of a character as U+FFFD
    (each run of them then stands for any characters)."""
    if all(row[0].bytes for row in rows):
        spelt = bytes(b for row in rows for b in row[0].bytes).decode("utf-8", "replace")
    else:
        spelt = "".join(row[0].token for row in rows)
    candidates = [spelt]
    found = find_stop(spelt, stops)
    if found is not None:
        candidates.append(spelt[: found[0]])
    want = text.strip()
    for candidate in (c.strip() for c in candidates):
        if candidate == want:
            return True
        if "\ufffd" in candidate and "\ufffd" not in want:
            pattern = ".+?".join(re.escape(p) for p in re.split("\ufffd+", candidate))
            if re.fullmatch(pattern, want, flags=re.DOTALL):
                return True
    return False


def _bytes(lp: LogProb) -> list[int] | None:
    # LlamaIndex uses [] for "unknown"; only an empty token really has no bytes.
    return list(lp.bytes) if lp.bytes or lp.token == "" else None


class LlamaIndexTextLM(BaseTextLM):
    """A LlamaIndex ``LLM`` seen as a rag-gates ``TextLM``. Build it with :func:`as_text_lm`.

    * String prompts go to ``complete``/``stream_complete``/``acomplete``/
      ``astream_complete``; chat messages to ``chat``/``stream_chat``/``achat``/
      ``astream_chat``. Async calls use the LLM's own async methods.
    * Streams yield the responses' ``delta`` (or the growth of ``text`` when an LLM sets no
      delta).
    * ``max_new_tokens``, ``temperature`` and ``logprobs`` reach the LLM only through
      ``call_kwargs`` (LlamaIndex has no common per-call names for them; without it the
      LLM's own configuration applies). For :class:`RagGatesLLM` they are passed natively.
    * Stop strings: a LlamaIndex LLM cannot be relied on to accept them per call, so the
      text is cut at the first stop string (excluded, ``finish_reason="stop"``); streams
      hold back text that could start a stop string. The LLM may still generate past the
      stop (cost, latency) unless ``call_kwargs`` hands the stops over too, as it does for
      :class:`RagGatesLLM`.
    * Log-probabilities are read from the response's ``logprobs`` when present (see
      :func:`from_llama_index_logprobs`). ``supports_logprobs`` is True only when declared
      (or for :class:`RagGatesLLM`); a declared LLM that then returns none raises.
    * ``finish_reason`` is the response's ``additional_kwargs["finish_reason"]`` when valid,
      ``"stop"`` after a stop-string cut, else ``"eos"``; token counts come from
      ``additional_kwargs`` (``prompt_tokens``/``completion_tokens``) when the LLM reports
      them.
    """

    def __init__(
        self,
        llm: LLM,
        *,
        model_id: str | None = None,
        supports_logprobs: bool | None = None,
        call_kwargs: CallKwargs | None = None,
    ) -> None:
        if not isinstance(llm, LLM):
            raise TypeError(
                f"llm must be a llama_index.core.llms.LLM, got {type(llm).__name__}; "
                "for a LangChain model use the langchain-rag-gates adapter"
            )
        native = isinstance(llm, RagGatesLLM)
        self.llm = llm
        self._model_id = model_id
        self._supports_logprobs = native if supports_logprobs is None else supports_logprobs
        self._call_kwargs: CallKwargs = call_kwargs or (
            _rag_gates_call_kwargs if native else _no_call_kwargs
        )

    @property
    def model_id(self) -> str:
        if self._model_id is None:
            self._model_id = self.llm.metadata.model_name
        return self._model_id

    @property
    def supports_logprobs(self) -> bool:
        return self._supports_logprobs

    # ------------------------------------------------------------------ helpers
    def _prepare(
        self,
        prompt: Prompt,
        max_new_tokens: int,
        stop: Sequence[str] | None,
        temperature: float,
        logprobs: int | None,
    ) -> tuple[str | list[ChatMessage], tuple[str, ...], dict[str, Any]]:
        stops = validate_generation_args(max_new_tokens, stop, temperature, logprobs)
        checked = validate_prompt(prompt)
        options = GenerationOptions(
            max_new_tokens=max_new_tokens, temperature=temperature, logprobs=logprobs, stop=stops
        )
        kwargs = dict(self._call_kwargs(options))
        if isinstance(checked, str):
            return checked, stops, kwargs
        messages = [
            ChatMessage(role=MessageRole(m.role), content=m.content) for m in as_messages(checked)
        ]
        return messages, stops, kwargs

    def _generation(
        self,
        text: str,
        rows: Sequence[Sequence[LogProb]] | None,
        info: Mapping[str, Any],
        stops: tuple[str, ...],
        logprobs: int | None,
        start: float,
    ) -> Generation:
        finish: Literal["stop", "length", "eos"] = "eos"
        reported = info.get("finish_reason")
        if reported in _FINISH_REASONS:
            finish = reported
        found = find_stop(text, stops)
        written = text
        if found is not None:
            text, finish = text[: found[0]], "stop"
        token_logprobs: list[TokenLogprob] | None = None
        if logprobs is not None:
            if rows and all(rows) and \
                    info.get(LOGPROBS_LAYOUT_KEY) not in (LOGPROBS_LAYOUT, "chosen_then_top") \
                    and not _first_tokens_spell(rows, written, stops):
                # LlamaIndex's usual layout lists only the likeliest tokens: when they are
                # not what was written the LLM sampled, and reading them would make the
                # answer look likelier than it was (a confidence gate then skips).
                raise LogprobsMissingError(
                    f"{type(self.llm).__name__}'s log-probabilities list only the likeliest "
                    "tokens, and those do not spell the text it wrote (it sampled, or the "
                    "server reformatted the text): the written tokens' log-probabilities "
                    "are unknown. Decode greedily "
                    "(temperature=0 in the LLM, or through as_text_lm(call_kwargs=...))"
                )
            if rows is not None:
                token_logprobs = from_llama_index_logprobs(
                    rows, logprobs, layout=info.get(LOGPROBS_LAYOUT_KEY)
                )
                if token_logprobs is not None and found is not None:
                    # Keep the tokens through the one that completed the stop string.
                    token_logprobs = _through(token_logprobs, found[1])
            if token_logprobs is None and self._supports_logprobs and text:
                raise LogprobsMissingError(
                    f"{type(self.llm).__name__} returned no token log-probabilities; "
                    "configure it to return them (e.g. OpenAI(logprobs=True, "
                    "top_logprobs=5)) or pass supports_logprobs=False to as_text_lm"
                )
        completion_tokens = info.get("completion_tokens")
        if not isinstance(completion_tokens, int):  # not reported: count the logprob rows
            completion_tokens = len(token_logprobs or rows or ())
        prompt_tokens = info.get("prompt_tokens")
        return Generation(
            text=text,
            finish_reason=finish,
            logprobs=token_logprobs,
            prompt_tokens=prompt_tokens if isinstance(prompt_tokens, int) else 0,
            completion_tokens=completion_tokens,
            latency_ms=(time.perf_counter() - start) * 1000.0,
        )

    # ------------------------------------------------------------------ TextLM
    def generate(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 128,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
        logprobs: int | None = None,
    ) -> Generation:
        start = time.perf_counter()
        query, stops, kwargs = self._prepare(prompt, max_new_tokens, stop, temperature, logprobs)
        if isinstance(query, str):
            r = self.llm.complete(query, **kwargs)
            text, rows, info = r.text, r.logprobs, r.additional_kwargs
        else:
            c = self.llm.chat(query, **kwargs)
            text, rows, info = c.message.content or "", c.logprobs, c.additional_kwargs
        return self._generation(text, rows, info, stops, logprobs, start)

    async def agenerate(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 128,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
        logprobs: int | None = None,
    ) -> Generation:
        start = time.perf_counter()
        query, stops, kwargs = self._prepare(prompt, max_new_tokens, stop, temperature, logprobs)
        if isinstance(query, str):
            r = await self.llm.acomplete(query, **kwargs)
            text, rows, info = r.text, r.logprobs, r.additional_kwargs
        else:
            c = await self.llm.achat(query, **kwargs)
            text, rows, info = c.message.content or "", c.logprobs, c.additional_kwargs
        return self._generation(text, rows, info, stops, logprobs, start)

    def stream(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 128,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
    ) -> Iterator[str]:
        query, stops, kwargs = self._prepare(prompt, max_new_tokens, stop, temperature, None)
        if isinstance(query, str):
            responses: Iterator[Any] = self.llm.stream_complete(query, **kwargs)
        else:
            responses = self.llm.stream_chat(query, **kwargs)
        scanner = StopCutter(stops)
        text = ""
        try:
            for r in responses:
                delta, text = _delta(r, text)
                out = scanner.feed(delta)
                if out:
                    yield out
                if scanner.stopped:
                    return  # finally closes the LLM's stream: stop paying for tokens
            rest = scanner.flush()
            if rest:
                yield rest
        finally:
            close = getattr(responses, "close", None)
            if close is not None:
                close()

    async def astream(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 128,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
    ) -> AsyncIterator[str]:
        query, stops, kwargs = self._prepare(prompt, max_new_tokens, stop, temperature, None)
        if isinstance(query, str):
            responses: AsyncIterator[Any] = await self.llm.astream_complete(query, **kwargs)
        else:
            responses = await self.llm.astream_chat(query, **kwargs)
        scanner = StopCutter(stops)
        text = ""
        try:
            async for r in responses:
                delta, text = _delta(r, text)
                out = scanner.feed(delta)
                if out:
                    yield out
                if scanner.stopped:
                    return
            rest = scanner.flush()
            if rest:
                yield rest
        finally:
            aclose = getattr(responses, "aclose", None)
            if aclose is not None:
                await aclose()


def _delta(response: Any, previous: str) -> tuple[str, str]:
    """The new text of a streamed response and the text so far."""
    message = getattr(response, "message", None)
    text = (message.content or "") if message is not None else (response.text or "")
    if response.delta is not None:
        return response.delta, previous + response.delta
    # No delta: take the growth of the cumulative text.
    return (text[len(previous) :] if text.startswith(previous) else text), text


def _through(tokens: list[TokenLogprob], end: int) -> list[TokenLogprob]:
    """The tokens that produced the first ``end`` characters (up to the stop string's end)."""
    kept: list[TokenLogprob] = []
    offset = 0
    for t in tokens:
        if offset >= end:
            break
        kept.append(t)
        offset += len(t.token)
    return kept


def as_text_lm(
    llm: LLM,
    *,
    model_id: str | None = None,
    supports_logprobs: bool | None = None,
    call_kwargs: CallKwargs | None = None,
) -> LlamaIndexTextLM:
    """Wrap any LlamaIndex LLM as a rag-gates ``TextLM`` (see :class:`LlamaIndexTextLM`).

    Args:
        llm: the LlamaIndex LLM (``OpenAI(...)``, ``Ollama(...)``, :class:`RagGatesLLM`, ...).
        model_id: name used in traces and caches (default: ``llm.metadata.model_name``).
        supports_logprobs: declare that the LLM returns token log-probabilities (default:
            only :class:`RagGatesLLM` is known to).
        call_kwargs: map :class:`GenerationOptions` to the LLM's per-call keyword
            arguments (default: nothing is passed, except to :class:`RagGatesLLM`).

    Example:
        >>> from llama_index.llms.openai import OpenAI
        >>> lm = as_text_lm(
        ...     OpenAI(model="gpt-4o-mini", logprobs=True, top_logprobs=5),
        ...     supports_logprobs=True,
        ...     call_kwargs=lambda o: {"max_tokens": o.max_new_tokens,
        ...                            "temperature": o.temperature,
        ...                            "stop": list(o.stop) or None},
        ... )
        >>> lm.generate("Who wrote Hamlet?", max_new_tokens=16, stop=["\\n"]).text
    """
    return LlamaIndexTextLM(
        llm, model_id=model_id, supports_logprobs=supports_logprobs, call_kwargs=call_kwargs
    )
