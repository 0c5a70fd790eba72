"""LangChain chat model over a rag-gates white-box model (``HFWhiteBoxLM``)."""

from __future__ import annotations

import inspect
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Literal, Self, cast

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    UsageMetadata,
)
from langchain_core.messages import ChatMessage as LCChatMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from rag_gates.lm import TextLM, load_lm, load_off_event_loop
from rag_gates.lm.base import BaseTextLM, Prompt, validate_prompt
from rag_gates.lm.defaults import DEFAULT_LM_ID
from rag_gates.types import ChatMessage, Generation

__all__ = ["ChatRagGates"]

PROVIDER = "rag_gates"

# LangChain's standard parameters for remote APIs. A local model has no key, endpoint,
# request timeout or retry loop, so these are accepted (the standard tests and generic
# code pass them) and dropped.
_REMOTE_ONLY_PARAMS = ("api_key", "base_url", "timeout", "max_retries")

# Keys LangChain itself may add to call kwargs; they carry no generation option.
_LANGCHAIN_CALL_KEYS = ("stream", "ls_structured_output_format", "structured_output_format")

Role = Literal["system", "user", "assistant"]

_ROLES: dict[str, Role] = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
}


class _LMCell:
    """Holds the lazily loaded model; shared by ``model_copy`` copies so they load it once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lm: TextLM | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> _LMCell:
        # Weights are read-only during generation: deep copies of the chat model share them.
        return self


class _CallOptions(BaseModel):
    """Generation options of one call: the instance's fields with per-call overrides."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int = Field(..., ge=1)
    temperature: float = Field(..., ge=0.0)
    stop: list[str] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    truncation: Literal["error", "left"] = "error"

    @property
    def top_k(self) -> int | None:
        """``logprobs`` argument of ``TextLM.generate``: None = off, k = top-k alternatives."""
        if not self.logprobs:
            return None
        return self.top_logprobs or 0


def _message_text(message: BaseMessage, index: int) -> str:
    if isinstance(message.content, str):
        return message.content
    parts: list[str] = []
    for block in message.content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        else:
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise ValueError(
                f"message {index} has a {kind!r} content block; ChatRagGates is text-only. "
                "Pass text content (str or 'text' blocks)."
            )
    return "".join(parts)


def _to_chat_message(message: BaseMessage, index: int) -> ChatMessage:
    """One LangChain message as a rag-gates ChatMessage (system/user/assistant)."""
    role: Role
    if isinstance(message, SystemMessage):
        role = "system"
    elif isinstance(message, HumanMessage):
        role = "user"
    elif isinstance(message, AIMessage):
        if message.tool_calls:
            raise ValueError(
                f"message {index} is an AIMessage with tool calls; ChatRagGates has no tool "
                "calling. Drop the tool-calling turns from the history."
            )
        role = "assistant"
    elif isinstance(message, LCChatMessage) and message.role.lower() in _ROLES:
        role = _ROLES[message.role.lower()]
    else:
        raise ValueError(
            f"message {index} is a {type(message).__name__}"
            + (f" with role {message.role!r}" if isinstance(message, LCChatMessage) else "")
            + "; ChatRagGates takes system, human and AI messages only (no tool calling)."
        )
    return ChatMessage(role=role, content=_message_text(message, index))


def _logprobs_metadata(generation: Generation) -> dict[str, Any]:
    """``{"content": [...]}``, the OpenAI ``logprobs`` shape, or nothing if none were made."""
    if generation.logprobs is None:
        return {}
    return {"logprobs": {"content": [t.model_dump() for t in generation.logprobs]}}


def _usage(generation: Generation) -> UsageMetadata:
    return UsageMetadata(
        input_tokens=generation.prompt_tokens,
        output_tokens=generation.completion_tokens,
        total_tokens=generation.prompt_tokens + generation.completion_tokens,
    )


class ChatRagGates(BaseChatModel):
    """Chat model over a rag-gates white-box model, run in this process.

    Messages are rendered with the model's chat template; greedy decoding by default.
    With ``logprobs=True`` every reply carries OpenAI-shaped per-token log-probabilities
    in ``response_metadata["logprobs"]``.

    Setup:
        from the clone's root, ``pip install -c constraints.txt -e ".[hf,qdrant]" -e
        integrations/langchain``. For ``model="default"`` (the embedded
        SmolLM2-135M-Instruct, offline) also ``rag-gates models install``.

    Key init args (generation):
        max_tokens: int
            Maximum number of tokens to generate.
        temperature: float
            0 = greedy; above 0 = sampling with a fixed seed (repeatable across calls).
        stop: list[str] | None
            Stop strings (excluded from the reply).
        logprobs: bool
            Return per-token log-probabilities.
        top_logprobs: int | None
            Number of most likely alternatives per token (0..20; needs ``logprobs``).
        streaming: bool
            Route ``invoke`` through the streaming path too (callbacks see each delta).

    Key init args (model):
        model: str
            ``"default"``, a local directory or a Hugging Face hub id; loaded on first
            use with ``rag_gates.lm.load_lm``.
        lm: HFWhiteBoxLM | None
            An already-loaded model; takes precedence over ``model``.
        load_kwargs: dict
            Keyword arguments for ``load_lm`` (``dtype``, ``num_threads``, ...).

    ``api_key``, ``base_url``, ``timeout`` and ``max_retries`` (LangChain's standard
    parameters for remote APIs) are accepted and ignored: there is no remote API.
    Every generation option can be overridden per call: ``chat.invoke(msgs, max_tokens=8)``.

    Instantiate:
        ```python
        from langchain_rag_gates import ChatRagGates

        chat = ChatRagGates(model="default", max_tokens=64)
        # or over a model you already hold
        from rag_gates.lm import load_lm

        chat = ChatRagGates(lm=load_lm("HuggingFaceTB/SmolLM2-360M-Instruct"))
        ```

    Invoke:
        ```python
        messages = [
            ("system", "Answer in one sentence."),
            ("human", "What is the capital of France?"),
        ]
        msg = chat.invoke(messages)
        msg.content
        msg.usage_metadata  # {'input_tokens': ..., 'output_tokens': ..., ...}
        msg.response_metadata["finish_reason"]  # 'eos', 'stop' or 'length'
        ```

    Logprobs:
        ```python
        msg = chat.invoke(messages, logprobs=True, top_logprobs=3)
        first = msg.response_metadata["logprobs"]["content"][0]
        first["token"], first["logprob"], first["top_logprobs"]
        ```

    Stream:
        ```python
        for chunk in chat.stream(messages):
            print(chunk.content, end="")
        ```

        Chunks joined equal the ``invoke`` text. rag-gates' ``stream`` reports text only,
        so streamed replies carry no ``usage_metadata`` or ``finish_reason``; with
        ``logprobs`` on, ``stream`` yields the whole reply, with its metadata, as one chunk.

    Async:
        ```python
        msg = await chat.ainvoke(messages)
        async for chunk in chat.astream(messages):
            print(chunk.content, end="")
        ```

        The model runs in a worker thread, so the event loop is never blocked.
    """

    model: str = Field(
        "default",
        description=(
            "'default' for the embedded SmolLM2-135M-Instruct, a local directory or a "
            "Hugging Face hub id; loaded lazily with rag_gates.lm.load_lm. When `lm` is "
            "given, this only names it (default: lm.model_id)."
        ),
    )
    lm: Any = Field(
        None,
        exclude=True,
        description=(
            "An already-built model (an HFWhiteBoxLM, or any rag_gates TextLM); takes "
            "precedence over `model`. Not serialised."
        ),
    )
    load_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments for rag_gates.lm.load_lm (dtype, num_threads, ...).",
    )
    max_tokens: int = Field(256, ge=1, description="Maximum number of tokens to generate.")
    temperature: float = Field(
        0.0,
        ge=0.0,
        description="0 = greedy decoding; above 0 = sampling with a fixed seed (repeatable).",
    )
    stop: list[str] | None = Field(
        None, description="Stop strings; generation ends before the first one."
    )
    logprobs: bool = Field(
        False,
        description="Return per-token log-probabilities in response_metadata['logprobs'].",
    )
    top_logprobs: int | None = Field(
        None,
        ge=0,
        le=20,
        description="Most likely alternatives per token (0..20); needs logprobs=True.",
    )
    streaming: bool = Field(
        False, description="Generate through the streaming path in invoke() as well."
    )
    truncation: Literal["error", "left"] = Field(
        "error",
        description=(
            "A prompt longer than the context window (with max_tokens reserved): 'error' "
            "raises ContextLengthError, 'left' drops the oldest prompt tokens (HFWhiteBoxLM)."
        ),
    )

    model_config = ConfigDict(extra="forbid")

    _cell: _LMCell = PrivateAttr(default_factory=_LMCell)

    # ------------------------------------------------------------------ validation
    @model_validator(mode="before")
    @classmethod
    def _drop_remote_params(cls, values: Any) -> Any:
        if isinstance(values, dict) and any(k in values for k in _REMOTE_ONLY_PARAMS):
            return {k: v for k, v in values.items() if k not in _REMOTE_ONLY_PARAMS}
        return values

    @field_validator("lm")
    @classmethod
    def _check_lm(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, TextLM):
            raise ValueError(
                f"lm must be a rag_gates model such as HFWhiteBoxLM, got "
                f"{type(value).__name__}; pass model='<path or hub id>' to load one instead"
            )
        return value

    @model_validator(mode="after")
    def _check_options(self) -> Self:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=True; set both")
        if self.lm is not None and "model" not in self.model_fields_set:
            self.model = self.lm.model_id
        return self

    # ------------------------------------------------------------------ LangChain hooks
    @property
    def _llm_type(self) -> str:
        return "rag-gates-chat"

    @property
    def model_name(self) -> str:
        """The model's name in traces and response metadata (no loading needed)."""
        if self.lm is not None:
            return str(self.lm.model_id)
        return DEFAULT_LM_ID if self.model == "default" else self.model

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model": self.model_name,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "stop": self.stop,
            "logprobs": self.logprobs,
            "top_logprobs": self.top_logprobs,
        }

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        # Per-call values win, as they do in generation; tracing never raises on bad ones.
        model = kwargs.get("model")
        temperature = kwargs.get("temperature")
        max_tokens = kwargs.get("max_tokens")
        params = LangSmithParams(
            ls_provider=PROVIDER,
            ls_model_name=model if isinstance(model, str) else self.model_name,
            ls_model_type="chat",
            ls_temperature=float(
                temperature if isinstance(temperature, int | float) else self.temperature
            ),
            ls_max_tokens=max_tokens if isinstance(max_tokens, int) else self.max_tokens,
        )
        stops = stop if stop is not None else self.stop
        if stops:
            params["ls_stop"] = list(stops)
        return params

    # ------------------------------------------------------------------ model access
    def get_lm(self) -> TextLM:
        """The model: ``lm`` if given, else ``model`` loaded on first use (once)."""
        if self.lm is not None:
            return self.lm
        cell = self._cell
        if cell.lm is None:
            with cell.lock:  # two threads calling at once load the model once
                if cell.lm is None:
                    cell.lm = load_lm(self.model, **self.load_kwargs)
        return cell.lm

    async def aget_lm(self) -> TextLM:
        """:meth:`get_lm` for async calls: a first load runs in a worker thread."""
        return await load_off_event_loop(
            self.lm if self.lm is not None else self._cell.lm, self.get_lm)

    def _options(self, stop: list[str] | None, kwargs: dict[str, Any]) -> _CallOptions:
        """Merge per-call kwargs over the instance's fields, rejecting unknown ones."""
        call = {k: v for k, v in kwargs.items() if k not in _LANGCHAIN_CALL_KEYS}
        model = call.pop("model", None)
        if model is not None and model not in (self.model, self.model_name):
            raise ValueError(
                f"ChatRagGates holds one model ({self.model_name!r}) and cannot switch to "
                f"{model!r} per call; create another ChatRagGates(model={model!r})"
            )
        values: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "stop": self.stop,
            "logprobs": self.logprobs,
            "top_logprobs": self.top_logprobs,
            "truncation": self.truncation,
        }
        unknown = sorted(set(call) - set(values))
        if unknown:
            raise TypeError(
                f"ChatRagGates got unsupported call options {unknown}; it accepts "
                f"{sorted(values)} (tools and structured output are not supported)"
            )
        values.update(call)
        if stop is not None:
            values["stop"] = stop
        options = _CallOptions.model_validate(values)
        if options.top_logprobs is not None and not options.logprobs:
            raise ValueError("top_logprobs needs logprobs=True; pass both")
        return options

    def _prompt(self, messages: Sequence[BaseMessage], lm: TextLM) -> Prompt:
        converted = [_to_chat_message(m, i) for i, m in enumerate(messages)]
        # A model without a chat template (a base model) can still answer one plain
        # question: hand it the text rather than failing on the missing template.
        if (
            len(converted) == 1
            and converted[0].role == "user"
            and getattr(lm, "chat_template", True) is False
        ):
            return validate_prompt(converted[0].content)
        # Any TextLM, not only HFWhiteBoxLM: odd text is refused here, naming the message.
        return validate_prompt(converted)

    def _check_logprobs(self, lm: TextLM, options: _CallOptions) -> None:
        if options.logprobs and not lm.supports_logprobs:
            raise ValueError(
                f"{type(lm).__name__} ({lm.model_id}) does not report logprobs; "
                "set logprobs=False or use an HFWhiteBoxLM"
            )
        if options.truncation == "left" and "truncation" not in inspect.signature(
            lm.generate
        ).parameters:
            raise ValueError(
                f"{type(lm).__name__} ({lm.model_id}) cannot truncate prompts; shorten the "
                "prompt, or use an HFWhiteBoxLM with truncation='left'"
            )

    @staticmethod
    def _gen_args(options: _CallOptions, *, logprobs: bool) -> dict[str, Any]:
        """Keyword arguments of TextLM.generate/stream for these options."""
        args: dict[str, Any] = {
            "max_new_tokens": options.max_tokens,
            "stop": options.stop,
            "temperature": options.temperature,
        }
        if logprobs:
            args["logprobs"] = options.top_k
        if options.truncation == "left":  # only HFWhiteBoxLM takes it (checked above)
            args["truncation"] = "left"
        return args

    def _response_metadata(self) -> dict[str, Any]:
        return {"model_name": self.model_name, "model_provider": PROVIDER}

    def _result(self, generation: Generation) -> ChatResult:
        message = AIMessage(
            content=generation.text,
            usage_metadata=_usage(generation),
            response_metadata=self._response_metadata(),
        )
        info = {"finish_reason": generation.finish_reason, **_logprobs_metadata(generation)}
        return ChatResult(generations=[ChatGeneration(message=message, generation_info=info)])

    def _whole_chunk(self, generation: Generation) -> ChatGenerationChunk:
        return ChatGenerationChunk(
            message=AIMessageChunk(
                content=generation.text,
                usage_metadata=_usage(generation),
                response_metadata=self._response_metadata(),
                chunk_position="last",
            ),
            generation_info={
                "finish_reason": generation.finish_reason,
                **_logprobs_metadata(generation),
            },
        )

    def _last_chunk(self, generation: object = None) -> ChatGenerationChunk:
        """The closing chunk: with the finish reason and token counts when the model's
        stream returned its whole Generation, so a streamed reply (LangChain streams
        ``invoke`` under ``astream_events``) reads as the same reply as an ``invoke``."""
        if not isinstance(generation, Generation):
            return ChatGenerationChunk(
                message=AIMessageChunk(
                    content="", response_metadata=self._response_metadata(),
                    chunk_position="last"))
        return ChatGenerationChunk(
            message=AIMessageChunk(
                content="", usage_metadata=_usage(generation),
                response_metadata=self._response_metadata(), chunk_position="last"),
            generation_info={"finish_reason": generation.finish_reason})

    # ------------------------------------------------------------------ generation
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        options = self._options(stop, kwargs)
        lm = self.get_lm()
        self._check_logprobs(lm, options)
        generation = lm.generate(
            self._prompt(messages, lm), **self._gen_args(options, logprobs=True)
        )
        return self._result(generation)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        options = self._options(stop, kwargs)
        lm = await self.aget_lm()
        self._check_logprobs(lm, options)
        generation = await lm.agenerate(
            self._prompt(messages, lm), **self._gen_args(options, logprobs=True)
        )
        return self._result(generation)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        options = self._options(stop, kwargs)
        lm = self.get_lm()
        self._check_logprobs(lm, options)
        prompt = self._prompt(messages, lm)
        if options.logprobs:
            # TextLM.stream yields text only; generate whole to keep the logprobs.
            chunk = self._whole_chunk(
                lm.generate(
                    prompt, **self._gen_args(options, logprobs=True)
                )
            )
            if run_manager:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk
            return
        deltas = iter(lm.stream(prompt, **self._gen_args(options, logprobs=False)))
        while True:
            try:
                delta = next(deltas)
            except StopIteration as end:  # HFWhiteBoxLM's stream returns its Generation
                yield self._last_chunk(end.value)
                return
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=delta))
            if run_manager:
                run_manager.on_llm_new_token(delta, chunk=chunk)
            yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        options = self._options(stop, kwargs)
        lm = await self.aget_lm()
        self._check_logprobs(lm, options)
        prompt = self._prompt(messages, lm)
        if options.logprobs:
            chunk = self._whole_chunk(
                await lm.agenerate(
                    prompt, **self._gen_args(options, logprobs=True)
                )
            )
            if run_manager:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk
            return
        result: list[Generation] = []
        args = self._gen_args(options, logprobs=False)
        # Only the worker-thread astream hands back what stream returned (HFWhiteBoxLM's).
        deltas = (cast(BaseTextLM, lm).astream(prompt, **args, result=result)
                  if type(lm).astream is BaseTextLM.astream else lm.astream(prompt, **args))
        async for delta in deltas:
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=delta))
            if run_manager:
                await run_manager.on_llm_new_token(delta, chunk=chunk)
            yield chunk
        yield self._last_chunk(result[0] if result else None)
