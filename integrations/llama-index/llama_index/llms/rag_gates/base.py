"""``RagGatesLLM``: a LlamaIndex LLM over rag-gates' white-box transformers model."""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from llama_index.core.base.llms.generic_utils import (
    messages_to_prompt as generic_messages_to_prompt,
)
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    LogProb,
    MessageRole,
    TextBlock,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.callbacks import CallbackManager
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.llms.llm import default_completion_to_prompt

from rag_gates.lm.base import (
    MAX_TOP_LOGPROBS,
    FormattedPrompt,
    Prompt,
    WhiteBoxLM,
    validate_generation_args,
    validate_prompt,
)
from rag_gates.types import ChatMessage as RGChatMessage
from rag_gates.types import Generation, TokenLogprob

if TYPE_CHECKING:  # pragma: no cover - torch is imported only when a model is loaded
    from rag_gates.lm.hf import HFWhiteBoxLM

__all__ = [
    "LOGPROBS_LAYOUT",
    "LOGPROBS_LAYOUT_KEY",
    "RagGatesLLM",
    "to_llama_index_logprobs",
    "to_rag_gates_messages",
    "top_logprobs_to_ask",
]

LOGPROBS_LAYOUT_KEY = "logprobs_layout"
"""``additional_kwargs`` key naming how ``logprobs`` rows are laid out."""
LOGPROBS_LAYOUT = "chosen_then_alternatives"
"""Row ``[0]`` is the generated token; ``[1:]`` the most likely other tokens, best first."""

# Module-wide (not per instance) so that LLM objects stay deep-copyable.
_LOAD_LOCK = threading.Lock()
_AsyncCall = TypeVar("_AsyncCall", bound=Callable[..., Awaitable[Any]])


def _loads_model_first(load: Callable[[Any], Awaitable[Any]]
                       ) -> Callable[[_AsyncCall], _AsyncCall]:
    """Put outside an async call's LlamaIndex callback decorator: ``await load(self)`` first.

    The callback reads ``metadata`` before the call, and the context window is in the model's
    config, so a lazily loaded model would otherwise load there, on the event loop.
    """
    def decorate(call: _AsyncCall) -> _AsyncCall:
        @functools.wraps(call)
        async def loading_first(self: Any, *args: Any, **kwargs: Any) -> Any:
            await load(self)
            return await call(self, *args, **kwargs)

        return loading_first  # type: ignore[return-value]

    return decorate

# Per-call keyword arguments complete()/chat() accept; anything else is a caller's mistake.
_CALL_KWARGS = frozenset({"max_new_tokens", "temperature", "top_logprobs", "stop", "seed", "top_p",
                          "truncation"})

_Role = Literal["system", "user", "assistant"]
_ROLES: dict[str, _Role] = {
    MessageRole.SYSTEM.value: "system",
    MessageRole.DEVELOPER.value: "system",
    MessageRole.USER.value: "user",
    MessageRole.ASSISTANT.value: "assistant",
    MessageRole.MODEL.value: "assistant",
    MessageRole.CHATBOT.value: "assistant",
}


def to_llama_index_logprobs(tokens: Sequence[TokenLogprob],
                            alternatives: int | None = None) -> list[list[LogProb]]:
    """Convert rag-gates per-token log-probabilities to LlamaIndex's ``list[list[LogProb]]``.

    Row ``i`` describes generated token ``i``: ``row[0]`` is the token that was generated,
    with its log-probability; ``row[1:]`` are the most likely *other* tokens at that
    position, most likely first (at most ``alternatives``; None: every one in the token's
    ``top_logprobs`` but the generated one, which OpenAI's ``top_logprobs`` would list again
    under greedy decoding). LlamaIndex's OpenAI integration puts only the top tokens in a
    row; the leading chosen token is what makes the generated token's own log-probability
    available also after sampling. Responses mark this layout with
    ``additional_kwargs["logprobs_layout"] == "chosen_then_alternatives"``.

    Example:
        >>> from rag_gates.types import TokenLogprob, TopLogprob
        >>> t = TokenLogprob(token=" Shakespeare", logprob=-0.1, top_logprobs=[
        ...     TopLogprob(token=" Shakespeare", logprob=-0.1),
        ...     TopLogprob(token=" William", logprob=-2.5)])
        >>> [p.token for p in to_llama_index_logprobs([t])[0]]
        [' Shakespeare', ' William']
    """
    return [
        [
            LogProb(token=t.token, logprob=t.logprob, bytes=list(t.bytes or [])),
            *(
                LogProb(token=a.token, logprob=a.logprob, bytes=list(a.bytes or []))
                for a in _others(t)[:alternatives]
            ),
        ]
        for t in tokens
    ]


def top_logprobs_to_ask(alternatives: int | None) -> int | None:
    """How many top tokens to ask the model for, so that ``alternatives`` remain once the
    generated token (usually among them) is left out by :func:`to_llama_index_logprobs`."""
    return min(alternatives + 1, MAX_TOP_LOGPROBS) if alternatives else alternatives


def _others(token: TokenLogprob) -> list[Any]:
    """The token's top alternatives without the token itself: the first entry with its text,
    bytes and log-probability (byte-level models render several partial tokens as the same
    text, so text alone would drop distinct alternatives)."""
    for i, a in enumerate(token.top_logprobs):
        if (a.token, a.bytes) == (token.token, token.bytes) and math.isclose(
                a.logprob, token.logprob, rel_tol=1e-6, abs_tol=1e-6):
            return [*token.top_logprobs[:i], *token.top_logprobs[i + 1:]]
    return list(token.top_logprobs)


def to_rag_gates_messages(messages: Sequence[ChatMessage]) -> list[RGChatMessage]:
    """Convert LlamaIndex chat messages to rag-gates ones (text content only)."""
    out: list[RGChatMessage] = []
    for i, message in enumerate(messages):
        role = _ROLES.get(str(getattr(message.role, "value", message.role)))
        if role is None:
            raise ValueError(
                f"message {i} has role {message.role!r}; RagGatesLLM takes system, user and "
                "assistant messages only (it does not call tools): fold tool results into a "
                "user message"
            )
        for block in message.blocks:
            if not isinstance(block, TextBlock):
                raise ValueError(
                    f"message {i} holds a {type(block).__name__}; RagGatesLLM reads text "
                    "only: pass the text (e.g. a document's extracted text) instead"
                )
        out.append(RGChatMessage(role=role, content=message.content or ""))
    return out


def _response_kwargs(generation: Generation) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "prompt_tokens": generation.prompt_tokens,
        "completion_tokens": generation.completion_tokens,
        "total_tokens": generation.prompt_tokens + generation.completion_tokens,
        "finish_reason": generation.finish_reason,
    }
    if generation.logprobs is not None:
        kwargs[LOGPROBS_LAYOUT_KEY] = LOGPROBS_LAYOUT
    return kwargs


class RagGatesLLM(CustomLLM):
    """A LlamaIndex LLM over rag-gates' :class:`~rag_gates.lm.hf.HFWhiteBoxLM`.

    It is a chat model: ``chat()`` sends the messages through the tokenizer's chat template
    once, and ``complete()`` sends its prompt as one user turn through the same template
    (the model is instruction-tuned). A custom ``completion_to_prompt`` or
    ``messages_to_prompt`` takes formatting over: its output reaches the model verbatim,
    without the chat template, and special-token text it writes (``<|im_start|>``) is read as
    control tokens. Otherwise text is literal: ``<|im_end|>`` inside a question or a
    retrieved passage never ends the user's turn.

    ``complete()``/``chat()`` return per-token log-probabilities when ``top_logprobs`` is
    set (field or per call): ``logprobs[i][0]`` is generated token ``i``, ``logprobs[i][1:]``
    its ``top_logprobs`` most likely alternatives (see :func:`to_llama_index_logprobs`).
    Streaming responses carry no log-probabilities.

    Per-call keyword arguments: ``max_new_tokens``, ``temperature``, ``top_logprobs``,
    ``stop`` (strings, excluded from the text), ``seed`` and ``top_p`` (sampling), and
    ``truncation`` (``"left"`` drops the oldest prompt tokens when the prompt does not fit).

    Setup:
        ``pip install -c constraints.txt -e ".[hf,qdrant]" -e integrations/llama-index`` (from
        the clone's root)

    Example:
        >>> from llama_index.llms.rag_gates import RagGatesLLM
        >>> llm = RagGatesLLM(max_new_tokens=64)          # embedded SmolLM2, loaded lazily
        >>> llm.complete("What is the capital of France?").text
        >>> r = llm.complete("Who wrote Hamlet?", top_logprobs=3)
        >>> r.logprobs[0][0].logprob, [lp.token for lp in r.logprobs[0][1:]]
        >>> from llama_index.core.llms import ChatMessage
        >>> llm.chat([ChatMessage(role="user", content="Hi!")]).message.content
        >>> async for r in await llm.astream_complete("Tell me a story"): print(r.delta)

        Over a model you already loaded (shared with rag-gates' gates):
        >>> from rag_gates.lm import load_lm
        >>> lm = load_lm("HuggingFaceTB/SmolLM2-360M-Instruct")
        >>> llm = RagGatesLLM(lm=lm)
    """

    model: str = Field(
        default="default",
        description=(
            "'default' for the embedded SmolLM2-135M-Instruct, else a Hugging Face hub id or "
            "local path; loaded lazily with rag_gates.lm.load_lm. Ignored when `lm` is given."
        ),
    )
    load_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments for rag_gates.lm.load_lm (dtype, device, num_threads).",
    )
    max_new_tokens: int = Field(
        default=256,
        gt=0,
        description="Most tokens generated per call; a call's max_new_tokens overrides it.",
    )
    temperature: float = Field(
        default=0.0, ge=0.0, description="Sampling temperature; 0 decodes greedily."
    )
    top_logprobs: int | None = Field(
        default=None,
        ge=0,
        le=20,
        description=(
            "Return per-token log-probabilities with this many top alternatives (0..20; 0 = "
            "the generated token only). None returns no log-probabilities."
        ),
    )
    truncation: Literal["error", "left"] = Field(
        default="error",
        description=(
            "A prompt longer than the context window (with max_new_tokens reserved): 'error' "
            "raises ContextLengthError, 'left' drops the oldest prompt tokens."
        ),
    )
    context_window: int | None = Field(
        default=None,
        gt=0,
        description="Tokens the model can attend to; None reads the model's max_context.",
    )
    num_output: int | None = Field(
        default=None,
        gt=0,
        description="Tokens LlamaIndex reserves for the answer; None uses max_new_tokens.",
    )

    # An HFWhiteBoxLM given to the constructor, or the one loaded from `model` on first use.
    _lm: HFWhiteBoxLM | None = PrivateAttr(default=None)

    def __init__(
        self,
        *,
        lm: HFWhiteBoxLM | None = None,
        callback_manager: CallbackManager | None = None,
        **kwargs: Any,
    ) -> None:
        if lm is not None:
            if not isinstance(lm, WhiteBoxLM):
                raise TypeError(
                    f"lm must be a rag-gates white-box model such as "
                    f"rag_gates.lm.load_lm('default'), got {type(lm).__name__}; to use another "
                    "LlamaIndex LLM with rag-gates, wrap it with as_text_lm(llm) instead"
                )
            kwargs.setdefault("model", lm.model_id)
        super().__init__(callback_manager=callback_manager, **kwargs)
        self._lm = lm

    @classmethod
    def class_name(cls) -> str:
        return "RagGatesLLM"

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> RagGatesLLM:
        # Copies share the loaded model: its weights are read-only and its lock cannot be
        # copied (copy.deepcopy would otherwise fail, or duplicate the weights).
        memo = {} if memo is None else memo
        if self._lm is not None:
            memo[id(self._lm)] = self._lm
        return super().__deepcopy__(memo)

    @property
    def lm(self) -> HFWhiteBoxLM:
        """The underlying rag-gates model, loaded on first use."""
        if self._lm is None:
            with _LOAD_LOCK:  # two threads must not load the model twice
                if self._lm is None:
                    from rag_gates.lm import load_lm

                    self._lm = load_lm(self.model, **self.load_kwargs)
        return self._lm

    async def alm(self) -> HFWhiteBoxLM:
        """:attr:`lm` for async calls: a first load runs in a worker thread."""
        from rag_gates.lm import load_off_event_loop

        return await load_off_event_loop(self._lm, lambda: self.lm)

    @property
    def metadata(self) -> LLMMetadata:
        # Reading the context window needs the model's config, so this loads the model.
        lm = self.lm
        return LLMMetadata(
            context_window=self.context_window or int(getattr(lm, "max_context", 2048)),
            num_output=self.num_output or self.max_new_tokens,
            is_chat_model=True,
            is_function_calling_model=False,
            model_name=lm.model_id,
        )

    # ------------------------------------------------------------------ argument handling
    def _gen_kwargs(self, kwargs: Mapping[str, Any], *, logprobs: bool) -> dict[str, Any]:
        """Merge per-call arguments over the fields and validate them now, not mid-stream."""
        unknown = set(kwargs) - _CALL_KWARGS
        if unknown:
            raise TypeError(
                f"RagGatesLLM got unexpected keyword argument(s) {sorted(unknown)}; "
                f"accepted: {sorted(_CALL_KWARGS)}"
            )
        if not logprobs and kwargs.get("top_logprobs") is not None:
            raise ValueError(
                "streaming responses carry no log-probabilities; call complete()/chat() "
                "with top_logprobs instead"
            )
        out: dict[str, Any] = {
            "max_new_tokens": kwargs.get("max_new_tokens", self.max_new_tokens),
            "temperature": kwargs.get("temperature", self.temperature),
            "truncation": kwargs.get("truncation", self.truncation),
        }
        if out["truncation"] not in ("error", "left"):
            raise ValueError(
                f"truncation must be 'error' or 'left', got {out['truncation']!r}"
            )
        for key in ("stop", "seed", "top_p"):
            if kwargs.get(key) is not None:
                out[key] = kwargs[key]
        top = kwargs.get("top_logprobs", self.top_logprobs) if logprobs else None
        validate_generation_args(out["max_new_tokens"], out.get("stop"), out["temperature"], top)
        if logprobs:
            out["logprobs"] = top_logprobs_to_ask(top)
        return out

    def _alternatives(self, kwargs: Mapping[str, Any]) -> int | None:
        """How many alternatives per token the caller asked for (``top_logprobs``)."""
        top: int | None = kwargs.get("top_logprobs", self.top_logprobs)
        return top

    def _completion_input(self, prompt: str, formatted: bool) -> tuple[Prompt, bool | None]:
        """The model's prompt and the chat-template choice (None = the model's default)."""
        formatter = self.completion_to_prompt
        if formatter is None or formatter is default_completion_to_prompt:
            return validate_prompt(prompt), None
        # A custom formatter owns the format: its output goes to the model verbatim, its
        # special-token text parsed as control tokens (FormattedPrompt).
        return validate_prompt(FormattedPrompt(prompt if formatted else formatter(prompt))), False

    def _chat_input(self, messages: Sequence[ChatMessage]) -> tuple[Prompt, bool | None]:
        formatter = self.messages_to_prompt
        if formatter is None or formatter is generic_messages_to_prompt:
            # The tokenizer's chat template renders the messages, exactly once.
            return validate_prompt(to_rag_gates_messages(messages)), None
        return validate_prompt(FormattedPrompt(formatter(messages))), False

    # The arguments are checked before the prompt, and both before the model is called.
    def _completion_request(self, prompt: str, formatted: bool, kwargs: Mapping[str, Any], *,
                            logprobs: bool) -> tuple[Prompt, dict[str, Any]]:
        """The model's prompt and generation arguments (with the chat-template choice)."""
        gen_kwargs = self._gen_kwargs(kwargs, logprobs=logprobs)
        text, template = self._completion_input(prompt, formatted)
        return text, {"chat_template": template, **gen_kwargs}

    def _chat_request(self, messages: Sequence[ChatMessage], kwargs: Mapping[str, Any], *,
                      logprobs: bool) -> tuple[Prompt, dict[str, Any]]:
        """:meth:`_completion_request` for chat messages."""
        gen_kwargs = self._gen_kwargs(kwargs, logprobs=logprobs)
        prompt, template = self._chat_input(messages)
        return prompt, {"chat_template": template, **gen_kwargs}

    # ------------------------------------------------------------------ completion
    @llm_completion_callback()
    def complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        text, call = self._completion_request(prompt, formatted, kwargs, logprobs=True)
        return _completion_response(self.lm.generate(text, **call), self._alternatives(kwargs))

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        text, call = self._completion_request(prompt, formatted, kwargs, logprobs=False)
        return _completion_stream(self.lm.stream(text, **call))

    @_loads_model_first(alm)
    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        text, call = self._completion_request(prompt, formatted, kwargs, logprobs=True)
        lm = await self.alm()
        return _completion_response(await lm.agenerate(text, **call), self._alternatives(kwargs))

    @_loads_model_first(alm)
    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        text, call = self._completion_request(prompt, formatted, kwargs, logprobs=False)
        lm = await self.alm()
        return _acompletion_stream(lm.astream(text, **call))

    # ------------------------------------------------------------------ chat
    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        prompt, call = self._chat_request(messages, kwargs, logprobs=True)
        return _chat_response(self.lm.generate(prompt, **call), self._alternatives(kwargs))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        prompt, call = self._chat_request(messages, kwargs, logprobs=False)
        return _chat_stream(self.lm.stream(prompt, **call))

    @_loads_model_first(alm)
    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        prompt, call = self._chat_request(messages, kwargs, logprobs=True)
        lm = await self.alm()
        return _chat_response(await lm.agenerate(prompt, **call), self._alternatives(kwargs))

    @_loads_model_first(alm)
    @llm_chat_callback()
    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        prompt, call = self._chat_request(messages, kwargs, logprobs=False)
        lm = await self.alm()
        return _achat_stream(lm.astream(prompt, **call))


def _generation_fields(generation: Generation, alternatives: int | None) -> dict[str, Any]:
    """What a completion and a chat response both carry of a generation."""
    return {
        "logprobs": (
            to_llama_index_logprobs(generation.logprobs, alternatives)
            if generation.logprobs is not None
            else None
        ),
        "additional_kwargs": _response_kwargs(generation),
        "raw": generation,
    }


def _completion_response(generation: Generation, alternatives: int | None) -> CompletionResponse:
    return CompletionResponse(text=generation.text,
                              **_generation_fields(generation, alternatives))


def _chat_response(generation: Generation, alternatives: int | None) -> ChatResponse:
    return ChatResponse(message=_assistant(generation.text),
                        **_generation_fields(generation, alternatives))


def _assistant(text: str) -> ChatMessage:
    return ChatMessage(role=MessageRole.ASSISTANT, content=text)


def _texts(deltas: Iterator[str]) -> Iterator[tuple[str, str]]:
    """``(text so far, delta)`` per delta; one ``("", "")`` when the model ended at once, so
    consumers still get one (empty) response."""
    text = ""
    for delta in deltas:
        text += delta
        yield text, delta
    if not text:
        yield "", ""


async def _atexts(deltas: AsyncIterator[str]) -> AsyncIterator[tuple[str, str]]:
    """:func:`_texts` over an async stream."""
    text = ""
    async for delta in deltas:
        text += delta
        yield text, delta
    if not text:
        yield "", ""


def _completion_stream(deltas: Iterator[str]) -> CompletionResponseGen:
    for text, delta in _texts(deltas):
        yield CompletionResponse(text=text, delta=delta)


def _chat_stream(deltas: Iterator[str]) -> ChatResponseGen:
    for text, delta in _texts(deltas):
        yield ChatResponse(message=_assistant(text), delta=delta)


async def _acompletion_stream(deltas: AsyncIterator[str]) -> CompletionResponseAsyncGen:
    async for text, delta in _atexts(deltas):
        yield CompletionResponse(text=text, delta=delta)


async def _achat_stream(deltas: AsyncIterator[str]) -> ChatResponseAsyncGen:
    async for text, delta in _atexts(deltas):
        yield ChatResponse(message=_assistant(text), delta=delta)
