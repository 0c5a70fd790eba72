"""Model access protocols: :class:`TextLM` (text in, text out) and :class:`WhiteBoxLM`.

Text-only methods (QuCo, DeepRAG prompting) accept any ``TextLM``, including API models
wrapped by the LlamaIndex and LangChain adapters. White-box methods (Tok-RAG, CBDR, SR-RAG)
need a ``WhiteBoxLM``; :func:`require_white_box` turns a text-only model into a clear error.

This module does not import torch.
"""

from __future__ import annotations

import asyncio
import functools
import operator
import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from rag_gates._text import check_encodable
from rag_gates.errors import WhiteBoxRequiredError
from rag_gates.types import ChatMessage, Generation

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from rag_gates.lm.streams import StreamGroup

__all__ = [
    "MAX_TOP_LOGPROBS",
    "BaseTextLM",
    "Capabilities",
    "ContinuationScore",
    "FormattedPrompt",
    "GenerationArgs",
    "Prompt",
    "TextLM",
    "WhiteBoxLM",
    "as_messages",
    "capabilities_of",
    "require_capabilities",
    "require_white_box",
    "validate_generation_args",
    "validate_prompt",
]

Prompt: TypeAlias = str | Sequence[ChatMessage | Mapping[str, str]]
"""A plain string, or chat messages (``ChatMessage`` or ``{"role": ..., "content": ...}``).

Text in a prompt is literal: ``"<|im_end|>"`` written in a question or a retrieved passage
is encoded as those characters, never as the model's end-of-turn token; only the chat
template adds control tokens. Wrap text you formatted yourself in :class:`FormattedPrompt`
to have its control tokens parsed.

Messages ending with an assistant message ask the model to continue that message (assistant
prefill): ``HFWhiteBoxLM`` renders no end of turn after it, as transformers' text-generation
pipeline does; API models differ (some prefill, some start a new turn)."""


class FormattedPrompt(str):
    r"""A prompt already in the model's format, from trusted text: no chat template is
    applied, and special-token text in it (``<|im_start|>``) becomes control tokens.

    Never build one from user text or retrieved passages: they could forge chat turns.

    Example:
        >>> FormattedPrompt("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
        '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n'
    """

    __slots__ = ()


class ContinuationScore(BaseModel):
    """Teacher-forced log-probabilities of one continuation after a prompt."""

    model_config = ConfigDict(frozen=True)

    text: str
    token_ids: list[int]
    tokens: list[str]
    logprobs: list[float] = Field(..., description="log p(token_i | prompt, tokens_<i).")

    @property
    def total(self) -> float:
        """Sum of the token log-probabilities: log p(continuation | prompt)."""
        return float(sum(self.logprobs))

    @property
    def mean(self) -> float:
        """Length-normalised log-probability."""
        return self.total / len(self.logprobs)


def validate_prompt(prompt: object) -> Prompt:
    """Check a prompt's type and content; raise TypeError or ValueError saying what is wrong
    (an empty prompt; text that cannot be encoded, with its position)."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("prompt is empty or whitespace; pass the question or instruction text")
        return check_encodable(prompt, "prompt")
    if isinstance(prompt, Sequence) and not isinstance(prompt, bytes | bytearray):
        if len(prompt) == 0:
            raise ValueError("prompt is an empty list of messages; pass at least one message")
        messages = as_messages(prompt)
        if not any(m.content.strip() for m in messages):
            raise ValueError("every message of the prompt is empty or whitespace")
        for i, m in enumerate(messages):
            check_encodable(m.content, f"message {i} content")
        return messages
    raise TypeError(
        f"prompt must be a str or a list of chat messages, got {type(prompt).__name__}"
    )


def as_messages(prompt: Sequence[ChatMessage | Mapping[str, str]]) -> list[ChatMessage]:
    """Normalise chat messages given as dicts or ChatMessage models."""
    out: list[ChatMessage] = []
    for i, m in enumerate(prompt):
        if isinstance(m, ChatMessage):
            out.append(m)
        elif isinstance(m, Mapping):
            try:
                out.append(ChatMessage(role=m["role"], content=m["content"]))
            except (KeyError, ValueError) as exc:
                raise ValueError(
                    f"message {i} must have 'role' (system/user/assistant) and 'content': {exc}"
                ) from exc
        else:
            raise TypeError(f"message {i} must be a ChatMessage or a dict, got {type(m).__name__}")
    return out


#: The most top alternatives per token a model is asked for (OpenAI's limit).
MAX_TOP_LOGPROBS = 20


def validate_generation_args(
    max_new_tokens: int, stop: Sequence[str] | None, temperature: float, logprobs: int | None
) -> tuple[str, ...]:
    """Validate the common generation arguments; return the stop strings as a tuple."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise TypeError(f"max_new_tokens must be an int, got {type(max_new_tokens).__name__}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if isinstance(stop, str):
        stop = (stop,)
    stops = tuple(stop or ())
    for s in stops:
        if not isinstance(s, str) or not s:
            raise ValueError(f"stop strings must be non-empty str, got {s!r}")
    if not isinstance(temperature, int | float) or temperature < 0:
        raise ValueError(f"temperature must be a number >= 0 (0 = greedy), got {temperature!r}")
    if logprobs is not None and (
        isinstance(logprobs, bool) or not isinstance(logprobs, int)
        or not 0 <= logprobs <= MAX_TOP_LOGPROBS
    ):
        raise ValueError(f"logprobs (number of top alternatives) must be 0..{MAX_TOP_LOGPROBS}, "
                         f"got {logprobs!r}")
    return stops


class GenerationArgs(BaseModel):
    """One call's generation arguments, checked once (:meth:`checked`, from the public
    keywords every model takes) and carried inside the model, to the request or the decoding
    loop, in place of the keywords.

    Example:
        >>> args = GenerationArgs.checked(16, stop="\\n", temperature=0, logprobs=None)
        >>> args.max_new_tokens, args.stop, args.seed
        (16, ('\\n',), None)
    """

    model_config = ConfigDict(frozen=True)

    max_new_tokens: int = Field(..., description="Most tokens to generate.")
    temperature: float = Field(..., description="Sampling temperature; 0 = greedy.")
    logprobs: int | None = Field(
        ..., description="Top alternatives per token wanted; None = no log-probabilities.")
    stop: tuple[str, ...] = Field((), description="Stop strings (applied by truncation too).")
    seed: int | None = Field(None, description="Sampling seed, for a model that takes one; "
                                               "None: every call draws afresh.")

    @classmethod
    def checked(cls, max_new_tokens: int, stop: Sequence[str] | None, temperature: float,
                logprobs: int | None, seed: int | None = None) -> GenerationArgs:
        """The arguments of one call, checked (:func:`validate_generation_args`, and ``seed``
        an integer or None: TypeError or ValueError saying what is wrong)."""
        stops = validate_generation_args(max_new_tokens, stop, temperature, logprobs)
        if seed is not None:
            # Any integer type (numpy's too), never a bool, str or float pydantic would coerce.
            if isinstance(seed, bool) or not hasattr(type(seed), "__index__"):
                raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
            seed = operator.index(seed)
        return cls(max_new_tokens=max_new_tokens, temperature=temperature, logprobs=logprobs,
                   stop=stops, seed=seed)


@runtime_checkable
class TextLM(Protocol):
    """Text in, text out. Any model a method can prompt: local, API, or framework-wrapped."""

    @property
    def model_id(self) -> str: ...

    @property
    def supports_logprobs(self) -> bool: ...

    def generate(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 128,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
        logprobs: int | None = None,
    ) -> Generation: ...

    def stream(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 128,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
    ) -> Iterator[str]: ...

    async def agenerate(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 128,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
        logprobs: int | None = None,
    ) -> Generation: ...

    def astream(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 128,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
    ) -> AsyncIterator[str]: ...


@runtime_checkable
class WhiteBoxLM(TextLM, Protocol):
    """A TextLM that also exposes logits, hidden states, attention and lockstep decoding."""

    def score(
        self, prompt: Prompt, continuations: Sequence[str], **kwargs: Any
    ) -> list[ContinuationScore]: ...

    def next_token_logprobs(self, prompt: Prompt, **kwargs: Any) -> torch.Tensor: ...

    def hidden_states(
        self, prompts: Sequence[Prompt], layers: Sequence[int], **kwargs: Any
    ) -> torch.Tensor: ...

    def attention_row(self, prompt: Prompt, layer: int, **kwargs: Any) -> torch.Tensor: ...

    def open_streams(self, prompts: Sequence[Prompt], **kwargs: Any) -> StreamGroup: ...


Capability = Literal["logprobs", "score", "next_token", "hidden_states", "attention",
                     "streams"]
_WHITE_BOX: tuple[Capability, ...] = ("hidden_states", "attention", "streams")


class Capabilities(BaseModel):
    """What a model can do for a method, declared by the model (``lm.capabilities``).

    Text generation is always there. ``next_token`` is ``"full"`` (a whole-vocabulary
    distribution), ``"top-k"`` (the ``top_logprobs`` most likely tokens, e.g. from a server)
    or ``"none"``. ``notes`` says, per capability, how it was found or why it is missing (a
    served model's prompt log-probabilities are probed, not trusted: see
    :class:`~rag_gates.lm.openai_compat.OpenAICompatibleLM`).

    Example:
        >>> Capabilities(logprobs=True, top_logprobs=20, next_token="top-k").has("score")
        False
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    logprobs: bool = Field(False, description="Log-probabilities of generated tokens.")
    top_logprobs: int = Field(0, ge=0, description="Most alternatives per generated token.")
    next_token: Literal["full", "top-k", "none"] = Field(
        "none", description="Next-token distribution: whole vocabulary, top-k, or none.")
    score: bool = Field(False, description="Teacher-forced score(prompt, continuations).")
    hidden_states: bool = Field(False, description="Hidden states of any layer.")
    attention: bool = Field(False, description="Attention rows.")
    streams: bool = Field(False, description="Lockstep decoding streams (open_streams).")
    notes: dict[str, str] = Field(default_factory=dict,
                                  description="Per capability: how it was found, or why not.")

    def has(self, capability: Capability) -> bool:
        """Whether the model offers ``capability``."""
        if capability == "next_token":
            return self.next_token != "none"
        return bool(getattr(self, capability))

    def offered(self) -> list[str]:
        """Names of what the model offers, text first."""
        names = ["text", "logprobs", "score", "next_token", "hidden_states", "attention",
                 "streams"]
        return [n for n in names if n == "text" or self.has(n)]  # type: ignore[arg-type]


def capabilities_of(lm: object) -> Capabilities:
    """The capabilities ``lm`` declares; for a model that declares none, what its type shows
    (a :class:`WhiteBoxLM` offers everything, a TextLM with ``supports_logprobs`` logprobs)."""
    declared = getattr(lm, "capabilities", None)
    if isinstance(declared, Capabilities):
        return declared
    if isinstance(lm, WhiteBoxLM):
        return Capabilities(logprobs=True, top_logprobs=20, next_token="full", score=True,
                            hidden_states=True, attention=True, streams=True)
    logprobs = bool(getattr(lm, "supports_logprobs", False))
    return Capabilities(logprobs=logprobs, top_logprobs=20 if logprobs else 0)


def require_capabilities(lm: object, component: str, *needs: Capability,
                         instead: str | None = None) -> Capabilities:
    """Check, when a component is built, that ``lm`` offers everything in ``needs``.

    Raises :class:`WhiteBoxRequiredError` naming what is missing, why (the model's own note,
    e.g. a server whose prompt log-probabilities failed the probe), and what would work
    instead: ``instead`` (another component that works with this model), and the same
    weights loaded in process.

    Example:
        >>> require_capabilities(lm, "DeepRAG likelihood decisions", "score")  # doctest: +SKIP
    """
    caps = capabilities_of(lm)
    missing = [n for n in needs if not caps.has(n)]
    if not missing:
        return caps
    name = getattr(lm, "model_id", None) or type(lm).__name__
    why = "; ".join(f"{n}: {caps.notes[n]}" for n in missing if n in caps.notes)
    message = (f"{component} needs {', '.join(missing)}, which {type(lm).__name__} "
               f"({name}) does not offer: it is text-only here (it offers "
               f"{', '.join(caps.offered())})"
               + (f" [{why}]" if why else "") + ". ")
    if instead:
        message += f"With this model use {instead} instead; or pass "
    else:
        message += "Pass "
    message += ("a white-box model with the same weights in process: "
                "rag_gates.lm.load_lm('default') or HFWhiteBoxLM.from_pretrained('<hf id or "
                "path>').")
    raise WhiteBoxRequiredError(message)


def require_white_box(lm: object, method: str, *, instead: str | None = None) -> WhiteBoxLM:
    """Return ``lm`` if it is a WhiteBoxLM, else raise :class:`WhiteBoxRequiredError` saying
    what it lacks and what to pass (or, with ``instead``, which component works with it)."""
    if isinstance(lm, WhiteBoxLM):
        return lm
    caps = capabilities_of(lm)
    missing = [n for n in ("score", "next_token", *_WHITE_BOX) if not caps.has(n)]
    require_capabilities(lm, f"{method} reads logits/hidden states; it",
                         *(missing or _WHITE_BOX), instead=instead)
    raise WhiteBoxRequiredError(  # declares every capability but is no WhiteBoxLM
        f"{method} needs a WhiteBoxLM; {type(lm).__name__} lacks its methods")


class BaseTextLM(ABC):
    """Convenience base: implement ``generate`` (and ideally ``stream``); async comes free.

    The async variants run the blocking call in a worker thread so an event loop is never
    blocked by a local model.
    """

    @property
    @abstractmethod
    def model_id(self) -> str: ...

    @property
    def supports_logprobs(self) -> bool:
        return False

    @abstractmethod
    def generate(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 128,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
        logprobs: int | None = None,
    ) -> Generation: ...

    def stream(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 128,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
    ) -> Iterator[str]:
        """Yield the generated text in pieces; the default yields it whole."""
        yield self.generate(
            prompt, max_new_tokens=max_new_tokens, stop=stop, temperature=temperature
        ).text

    async def agenerate(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 128,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
        logprobs: int | None = None,
        **kwargs: Any,
    ) -> Generation:
        """:meth:`generate` in a worker thread; extra keyword arguments pass through."""
        return await asyncio.to_thread(
            functools.partial(
                self.generate,
                prompt,
                max_new_tokens=max_new_tokens,
                stop=stop,
                temperature=temperature,
                logprobs=logprobs,
                **kwargs,
            )
        )

    async def astream(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 128,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
        result: list[Generation] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[str]:
        """Run :meth:`stream` in a worker thread and hand its pieces to the event loop.

        Closing or cancelling the async iterator stops the worker after its current piece,
        so an abandoned stream does not keep the model busy. ``result``: a list the whole
        :class:`~rag_gates.types.Generation` is appended to when :meth:`stream` returns one
        (``HFWhiteBoxLM``'s does: finish reason and token counts), since an async
        generator cannot return it.
        """
        pieces: queue.Queue[tuple[str, object]] = queue.Queue()
        cancelled = threading.Event()

        def produce() -> None:
            stream = self.stream(prompt, max_new_tokens=max_new_tokens, stop=stop,
                                 temperature=temperature, **kwargs)
            done: object = None
            try:
                pieces_of = iter(stream)
                while not cancelled.is_set():
                    try:
                        piece = next(pieces_of)
                    except StopIteration as end:  # what a generator returns, if anything
                        done = end.value
                        break
                    pieces.put(("piece", piece))
            except BaseException as exc:  # handed to the consumer, re-raised there
                pieces.put(("error", exc))
            else:
                pieces.put(("done", done))
            finally:
                close = getattr(stream, "close", None)
                if close is not None:
                    close()

        threading.Thread(target=produce, daemon=True).start()
        try:
            while True:
                kind, value = await asyncio.to_thread(pieces.get)
                if kind == "piece":
                    yield str(value)
                elif kind == "error":
                    raise value  # type: ignore[misc]
                else:
                    if result is not None and isinstance(value, Generation):
                        result.append(value)
                    return
        finally:
            cancelled.set()
