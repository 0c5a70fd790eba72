"""Any LlamaIndex LLM as a rag-gates :class:`~rag_gates.lm.base.TextLM`.

Text-only rag-gates methods (QuCo, DeepRAG prompting) then run on whatever model a
LlamaIndex application already uses: OpenAI, Ollama, vLLM, a local HuggingFace LLM, ...
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeAlias

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, LogProb, MessageRole
from llama_index.core.llms import LLM
from llama_index.llms.rag_gates.base import LOGPROBS_LAYOUT, LOGPROBS_LAYOUT_KEY, RagGatesLLM
from pydantic import ValidationError

from rag_gates.errors import LogprobsMissingError
from rag_gates.lm.adapter import FrameworkTextLM, GenerationArgs, cut_at_stop
from rag_gates.lm.base import Prompt, as_messages
from rag_gates.lm.stops import find_stop
from rag_gates.types import Generation, TokenLogprob, TopLogprob

__all__ = [
    "GenerationOptions",
    "LlamaIndexTextLM",
    "as_text_lm",
    "from_llama_index_logprobs",
    "reply_logprobs",
]

_FINISH_REASONS = ("stop", "length", "eos")


#: The generation arguments of one rag-gates call, for ``as_text_lm(call_kwargs=...)``
#: (:class:`rag_gates.lm.adapter.GenerationArgs`).
GenerationOptions: TypeAlias = GenerationArgs


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
    if options.seed is not None:
        kwargs["seed"] = options.seed
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


def reply_logprobs(raw: Any, top: int, source: str = "the LLM") -> list[TokenLogprob] | None:
    """The written tokens' log-probabilities in an OpenAI chat reply (``raw``, as LlamaIndex's
    OpenAI integrations keep it, an object or a dict): ``choices[0].logprobs.content``, each
    token with at most ``top`` alternatives; None when ``raw`` holds none.

    LlamaIndex's own ``logprobs`` rows list each position's likeliest tokens without the one
    written, which is not always the likeliest at ``temperature=0``: llama-cpp-python's
    server applies a repeat penalty by default, so its rows can spell another text.
    """
    def field(obj: Any, name: str) -> Any:
        return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)

    choices = field(raw, "choices")
    if not isinstance(choices, Sequence) or isinstance(choices, str) or not choices:
        return None
    content = field(field(choices[0], "logprobs"), "content")
    if not isinstance(content, list) or not content:
        return None
    try:
        tokens = [TokenLogprob.model_validate(
            item.model_dump() if callable(getattr(item, "model_dump", None)) else item)
            for item in content]
    except ValidationError as exc:
        raise LogprobsMissingError(
            f"{source}'s reply holds log-probabilities in an unknown shape; expected OpenAI's "
            f"{{'token', 'logprob', 'bytes', 'top_logprobs'}} entries: {exc}") from exc
    return [t.model_copy(update={"top_logprobs": t.top_logprobs[:top]}) for t in tokens]


def _bytes(lp: LogProb) -> list[int] | None:
    # LlamaIndex uses [] for "unknown"; only an empty token really has no bytes.
    return list(lp.bytes) if lp.bytes or lp.token == "" else None


class LlamaIndexTextLM(FrameworkTextLM[tuple[str | list[ChatMessage], dict[str, Any]]]):
    """A LlamaIndex ``LLM`` seen as a rag-gates ``TextLM``. Build it with :func:`as_text_lm`.

    * String prompts go to ``complete``/``stream_complete``/``acomplete``/
      ``astream_complete``; chat messages to ``chat``/``stream_chat``/``achat``/
      ``astream_chat``. Async calls use the LLM's own async methods.
    * Streams yield the responses' ``delta`` (or the growth of ``text`` when an LLM sets no
      delta).
    * ``max_new_tokens``, ``temperature``, ``logprobs`` and ``seed`` (the one call option:
      ``generate(..., seed=7)``, as the sampling gates pass it; ``None`` when not given)
      reach the LLM only through ``call_kwargs`` (LlamaIndex has no common per-call names
      for them; without it the LLM's own configuration applies). For :class:`RagGatesLLM`
      they are passed natively.
    * Stop strings: a LlamaIndex LLM cannot be relied on to accept them per call, so the
      text is cut at the first stop string (excluded, ``finish_reason="stop"``); streams
      hold back text that could start a stop string. The LLM may still generate past the
      stop (cost, latency) unless ``call_kwargs`` hands the stops over too, as it does for
      :class:`RagGatesLLM`.
    * Log-probabilities: the written tokens' own, from an OpenAI chat reply the LLM keeps in
      ``raw`` (``choices[0].logprobs.content``: LlamaIndex's OpenAI, OpenAILike, Azure, ...;
      see :func:`reply_logprobs`), as :class:`~rag_gates.lm.OpenAICompatibleLM` reads them;
      else the response's ``logprobs`` rows (see :func:`from_llama_index_logprobs`).
      ``supports_logprobs`` is True only when declared (or for :class:`RagGatesLLM`); a
      declared LLM that then returns none raises.
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

    # ------------------------------------------------------------------ hooks
    def prepare(self, prompt: Prompt, args: GenerationArgs, options: dict[str, Any]
                ) -> tuple[str | list[ChatMessage], dict[str, Any]]:
        options = dict(options)
        seed = options.pop("seed", None)  # what the sampling gates pass (sample-agreement)
        if options:
            raise TypeError(f"unexpected arguments {sorted(options)}: a LlamaIndex LLM takes "
                            "per-call options through as_text_lm(call_kwargs=...)")
        if seed is not None:  # checked as the models check it (an integer)
            args = GenerationArgs.checked(args.max_new_tokens, args.stop, args.temperature,
                                          args.logprobs, seed)
        kwargs = dict(self._call_kwargs(args))
        if isinstance(prompt, str):
            return prompt, kwargs
        messages = [
            ChatMessage(role=MessageRole(m.role), content=m.content) for m in as_messages(prompt)
        ]
        return messages, kwargs

    def invoke(self, call: tuple[str | list[ChatMessage], dict[str, Any]]) -> Any:
        query, kwargs = call
        if isinstance(query, str):
            return self.llm.complete(query, **kwargs)
        return self.llm.chat(query, **kwargs)

    async def ainvoke(self, call: tuple[str | list[ChatMessage], dict[str, Any]]) -> Any:
        query, kwargs = call
        if isinstance(query, str):
            return await self.llm.acomplete(query, **kwargs)
        return await self.llm.achat(query, **kwargs)

    def open_stream(self, call: tuple[str | list[ChatMessage], dict[str, Any]]
                    ) -> Iterator[Any]:
        query, kwargs = call
        if isinstance(query, str):
            return iter(self.llm.stream_complete(query, **kwargs))
        return iter(self.llm.stream_chat(query, **kwargs))

    async def aopen_stream(self, call: tuple[str | list[ChatMessage], dict[str, Any]]
                           ) -> AsyncIterator[Any]:
        query, kwargs = call
        if isinstance(query, str):
            return await self.llm.astream_complete(query, **kwargs)
        return await self.llm.astream_chat(query, **kwargs)

    def piece(self, chunk: Any, so_far: str) -> tuple[str, str]:
        return _delta(chunk, so_far)

    def read(self, reply: Any, args: GenerationArgs, start: float) -> Generation:
        if isinstance(reply, ChatResponse):
            text, rows, info = reply.message.content or "", reply.logprobs, reply.additional_kwargs
        else:
            text, rows, info = reply.text, reply.logprobs, reply.additional_kwargs
        stops, logprobs = args.stop, args.logprobs
        reported = info.get("finish_reason")
        finish: Literal["stop", "length", "eos"] = \
            reported if reported in _FINISH_REASONS else "eos"
        written = text
        text, finish, found = cut_at_stop(text, stops, finish)
        token_logprobs: list[TokenLogprob] | None = None
        written_tokens = None if logprobs is None else reply_logprobs(
            getattr(reply, "raw", None), logprobs, type(self.llm).__name__)
        if written_tokens is not None:
            token_logprobs = written_tokens if found is None else \
                _through(written_tokens, found[1])
        elif logprobs is not None:
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
