"""Any LangChain chat model or LLM as a rag-gates :class:`~rag_gates.lm.base.TextLM`.

Text-only rag-gates methods (QuCo, DeepRAG prompting) take a ``TextLM``; this adapter lets
them prompt any LangChain model: API models, local servers, or :class:`ChatRagGates`.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel, BaseLanguageModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from pydantic import ValidationError

from langchain_rag_gates.chat_models import ChatRagGates
from rag_gates.errors import LogprobsMissingError
from rag_gates.lm.adapter import FrameworkTextLM, GenerationArgs, cut_at_stop
from rag_gates.lm.base import Prompt, TextLM, as_messages
from rag_gates.types import Generation, TokenLogprob

__all__ = ["LangChainTextLM", "as_text_lm"]

logger = logging.getLogger(__name__)

FinishReason = Literal["stop", "length", "eos"]
#: One call: the per-call model copy, its input, and the call options.
_Call = tuple[BaseLanguageModel[Any], str | list[BaseMessage], dict[str, Any]]

# Field names providers use for "maximum tokens to generate", in the order they are tried.
MAX_TOKENS_FIELDS = (
    "max_tokens",
    "max_new_tokens",
    "max_output_tokens",
    "max_completion_tokens",
    "num_predict",
)

# Where providers report why generation ended, and the values meaning "hit the limit".
_FINISH_KEYS = ("finish_reason", "stop_reason", "done_reason")
_LENGTH_REASONS = frozenset({"length", "max_tokens", "MAX_TOKENS", "max_output_tokens"})


def _field_names(model: BaseLanguageModel[Any]) -> frozenset[str]:
    return frozenset(type(model).model_fields)


def _copy_with(model: BaseLanguageModel[Any], update: dict[str, Any]) -> BaseLanguageModel[Any]:
    """A shallow copy of ``model`` with some fields changed (client and weights shared)."""
    copy = model.model_copy(update=update)
    # Cached properties were computed from the original's settings; LangChain caches the
    # model's serialised form there and uses it for tracing and LLM-cache keys.
    for klass in type(copy).__mro__:
        for name, attr in vars(klass).items():
            if isinstance(attr, functools.cached_property):
                copy.__dict__.pop(attr.attrname or name, None)
    return copy


def _to_langchain(prompt: Prompt) -> str | list[BaseMessage]:
    if isinstance(prompt, str):
        return prompt
    out: list[BaseMessage] = []
    for m in as_messages(prompt):
        if m.role == "system":
            out.append(SystemMessage(content=m.content))
        elif m.role == "user":
            out.append(HumanMessage(content=m.content))
        else:
            out.append(AIMessage(content=m.content))
    return out


def _text_of(output: object) -> str:
    """The text of an invoke/stream output: a message (chat model) or a str (LLM)."""
    if isinstance(output, BaseMessage):
        return str(output.text)
    if isinstance(output, str):
        return output
    raise TypeError(
        f"expected a message or a str from the LangChain model, got {type(output).__name__}"
    )


def _finish_reason(metadata: Mapping[str, Any]) -> FinishReason:
    for key in _FINISH_KEYS:
        value = metadata.get(key)
        if value is None:
            continue
        if value in _LENGTH_REASONS:
            return "length"
        if value == "eos":
            return "eos"
        return "stop"
    return "stop"  # nothing reported: the model ended on its own


class LangChainTextLM(FrameworkTextLM["_Call"]):
    """A LangChain chat model or LLM behind the rag-gates ``TextLM`` protocol.

    Build it with :func:`as_text_lm`. Each call goes through the model's own ``invoke``,
    ``stream``, ``ainvoke`` and ``astream``, so callbacks, tracing and rate limiters apply.

    What each ``TextLM`` argument becomes:

    - ``max_new_tokens``: set on a per-call copy of the model
      (``model.model_copy(update=...)``) as the first field it declares among
      :data:`MAX_TOKENS_FIELDS` (``max_tokens``, ``max_new_tokens``, ``max_output_tokens``,
      ``max_completion_tokens``, ``num_predict``); not passed when it declares none.
      A copy rather than call kwargs, because providers read these fields when they build a
      request while per-call keywords differ (ChatOllama, for one, forwards unknown call
      kwargs to its client). The copy shares the client and any loaded weights, and drops
      cached properties such as LangChain's cached serialised form (LLM-cache key).
    - ``temperature``: set the same way when the model has a ``temperature`` field.
    - ``stop``: passed as LangChain's ``stop`` argument, and also applied to the returned
      text, since some models ignore it.
    - ``logprobs=k``: sets ``logprobs=True, top_logprobs=k`` (the OpenAI option names, also
      :class:`~langchain_rag_gates.ChatRagGates`'s); read back from
      ``response_metadata["logprobs"]["content"]``. :attr:`supports_logprobs` is True only
      for chat models declaring both fields (for a ``ChatRagGates`` holding a model: whether
      that model reports them); ``stream`` never returns logprobs.

    - any other keyword argument: passed unchanged to the model's ``invoke`` / ``stream``,
      as a call option (e.g. ``seed=7`` for ChatOpenAI) or, for ``config=``, as the
      ``RunnableConfig`` (callbacks, tags); what a call option means is up to the model.

    ``set_max_tokens=False`` / ``set_temperature=False`` leave those fields alone, for
    models that reject them (e.g. reasoning models with a fixed temperature).

    ``finish_reason`` comes from ``response_metadata`` (``finish_reason``, ``stop_reason``
    or ``done_reason``): limit reasons map to ``"length"``, ``"eos"`` stays, anything else
    and nothing at all map to ``"stop"``. Token counts come from ``usage_metadata`` (0 when
    the model reports none); ``latency_ms`` is the wall time of the call. A reply longer
    than ``max_new_tokens`` (its server ignored the field the model sent: llama-cpp-python's
    server reads ``max_tokens`` only, and ``ChatOpenAI`` sends ``max_completion_tokens``)
    is logged once as a warning, naming the fix. An LLM's
    ``invoke`` returns bare text, so for LLMs ``finish_reason`` is always ``"stop"`` and the
    token counts 0; chat messages given to an LLM are flattened to text by LangChain.
    """

    def __init__(
        self,
        model: BaseLanguageModel[Any],
        *,
        model_id: str | None = None,
        set_max_tokens: bool = True,
        set_temperature: bool = True,
    ) -> None:
        if not isinstance(model, BaseLanguageModel):
            raise TypeError(
                f"model must be a LangChain chat model or LLM (BaseLanguageModel), got "
                f"{type(model).__name__}; for a Runnable such as model.bind(...), pass the "
                "configured model itself"
            )
        self.model = model
        fields = _field_names(model)
        self.max_tokens_field: str | None = (
            next((f for f in MAX_TOKENS_FIELDS if f in fields), None) if set_max_tokens else None
        )
        self.temperature_field: str | None = (
            "temperature" if set_temperature and "temperature" in fields else None
        )
        self._logprob_fields = {"logprobs", "top_logprobs"} <= fields
        self._model_id = model_id or self._name_of(model)
        self._warned_overrun = False

    @staticmethod
    def _name_of(model: BaseLanguageModel[Any]) -> str:
        for attr in ("model_name", "model", "model_id"):
            value = getattr(model, attr, None)
            if isinstance(value, str) and value:
                return value
        return type(model).__name__

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def supports_logprobs(self) -> bool:
        # A ChatRagGates holding a model knows the answer without loading anything.
        if isinstance(self.model, ChatRagGates) and self.model.lm is not None:
            return bool(self.model.lm.supports_logprobs)
        return self._logprob_fields and isinstance(self.model, BaseChatModel)

    # ------------------------------------------------------------------ hooks
    def _configured(
        self, max_new_tokens: int, temperature: float, logprobs: int | None
    ) -> BaseLanguageModel[Any]:
        update: dict[str, Any] = {}
        if self.max_tokens_field:
            update[self.max_tokens_field] = max_new_tokens
        if self.temperature_field:
            update[self.temperature_field] = temperature
        if logprobs is not None:
            if not self.supports_logprobs:
                raise ValueError(
                    f"{type(self.model).__name__} does not offer logprobs (no logprobs / "
                    "top_logprobs fields); call with logprobs=None, or use a model that "
                    "returns them such as ChatRagGates or ChatOpenAI"
                )
            update.update(logprobs=True, top_logprobs=logprobs)
        return _copy_with(self.model, update) if update else self.model

    def prepare(self, prompt: Prompt, args: GenerationArgs, options: dict[str, Any]) -> _Call:
        """The per-call model copy, the LangChain input, and the call options (``options``
        are passed to ``invoke`` / ``stream`` unchanged, ``stop`` added)."""
        model = self._configured(args.max_new_tokens, args.temperature, args.logprobs)
        kwargs = {**options, "stop": list(args.stop)} if args.stop else dict(options)
        return model, _to_langchain(prompt), kwargs

    def invoke(self, call: _Call) -> Any:
        model, lc_input, kwargs = call
        return model.invoke(lc_input, **kwargs)

    async def ainvoke(self, call: _Call) -> Any:
        model, lc_input, kwargs = call
        return await model.ainvoke(lc_input, **kwargs)

    def open_stream(self, call: _Call) -> Iterator[Any]:
        model, lc_input, kwargs = call
        return model.stream(lc_input, **kwargs)

    async def aopen_stream(self, call: _Call) -> AsyncIterator[Any]:
        model, lc_input, kwargs = call
        return model.astream(lc_input, **kwargs)

    def piece(self, chunk: Any, so_far: str) -> tuple[str, str]:
        delta = _text_of(chunk)
        return delta, so_far + delta

    def read(self, reply: Any, args: GenerationArgs, start: float) -> Generation:
        metadata: Mapping[str, Any] = getattr(reply, "response_metadata", None) or {}
        text, finish, _ = cut_at_stop(_text_of(reply), args.stop, _finish_reason(metadata))
        usage = getattr(reply, "usage_metadata", None) or {}
        self._check_budget(int(usage.get("output_tokens", 0)), args.max_new_tokens)
        return Generation(
            text=text,
            finish_reason=finish,
            logprobs=None if args.logprobs is None else self._logprobs(metadata),
            prompt_tokens=int(usage.get("input_tokens", 0)),
            completion_tokens=int(usage.get("output_tokens", 0)),
            latency_ms=(time.perf_counter() - start) * 1000.0,
        )

    def _check_budget(self, written: int, budget: int) -> None:
        """Warn (once) when the reply has more tokens than asked for: the server ignored the
        limit, so a gate's closed-book answer is not the one its budget describes."""
        if written <= budget or self._warned_overrun or self.max_tokens_field is None:
            return
        self._warned_overrun = True
        logger.warning(
            "%s wrote %d tokens where max_new_tokens=%d was asked (set as its %r field): "
            "its server ignored the limit (ChatOpenAI sends it as max_completion_tokens, "
            "which llama-cpp-python's server does not read); give the budget as the server "
            "reads it, e.g. ChatOpenAI(..., extra_body={'max_tokens': %d})",
            self.model_id, written, budget, self.max_tokens_field, budget)

    def _logprobs(self, metadata: Mapping[str, Any]) -> list[TokenLogprob]:
        raw = metadata.get("logprobs")
        content = raw.get("content") if isinstance(raw, Mapping) else None
        if not isinstance(content, list):
            raise LogprobsMissingError(
                f"{self.model_id} returned no logprobs although they were requested "
                "(expected response_metadata['logprobs']['content'], OpenAI shape)"
            )
        try:
            return [TokenLogprob.model_validate(item) for item in content]
        except ValidationError as exc:
            raise LogprobsMissingError(
                f"{self.model_id} returned logprobs in an unknown shape; expected OpenAI's "
                f"{{'token', 'logprob', 'bytes', 'top_logprobs'}} entries: {exc}"
            ) from exc


def as_text_lm(
    model: BaseLanguageModel[Any],
    *,
    model_id: str | None = None,
    set_max_tokens: bool = True,
    set_temperature: bool = True,
) -> TextLM:
    """Wrap any LangChain chat model or LLM as a rag-gates ``TextLM``.

    See :class:`LangChainTextLM` for how each generation argument reaches the model.

    Example:
        >>> from langchain_rag_gates import ChatRagGates, as_text_lm
        >>> lm = as_text_lm(ChatRagGates(model="default"))
        >>> lm.generate("Who wrote Hamlet?", max_new_tokens=16).text
    """
    return LangChainTextLM(
        model,
        model_id=model_id,
        set_max_tokens=set_max_tokens,
        set_temperature=set_temperature,
    )
