"""``OpenAICompatibleLM``: a :class:`~rag_gates.lm.base.TextLM` over any server that speaks the
OpenAI completions/chat API (vLLM, llama.cpp's servers, TGI, OpenAI itself).

What it gives: generation with stop strings, streaming, async calls with a bounded number in
flight, per-token ``logprobs``/``top_logprobs``, the next-token distribution from
``top_logprobs`` (:meth:`~OpenAICompatibleLM.top_next_tokens`), and teacher-forced
:meth:`~OpenAICompatibleLM.score` from the prompt log-probabilities the completions endpoint
echoes (``echo`` + ``logprobs``), where the server gets them right.

Servers get prompt log-probabilities wrong, so they are probed, never trusted: at
construction the model generates a few tokens after a known prompt, and the same tokens are
then scored by echo. Agreement means *aligned*; agreement once every echoed entry is read one
position earlier means *shifted* (llama-cpp-python reports, for a prompt that does not start
with the BOS token, each token's entry from the distribution after it): the shift is corrected
from the previous position's ``top_logprobs``, and a token missing from them raises a clear
error. No echoed values (llama.cpp's C++ server) or values that match neither reading: score()
is declared unsupported, with the reason, in ``lm.capabilities``. The probe runs once per
prompt kind: *raw* text (sent as is) and *chat* prompts rendered with a ``chat_template`` given
to the client (without one, chat prompts go to the chat endpoint, which echoes nothing).

Text in a served prompt is not literal: the server parses special-token text such as
``<|im_end|>`` in a completions prompt, and chat servers render messages to text before
tokenising them. Unlike :class:`~rag_gates.lm.hf.HFWhiteBoxLM`, a served model cannot keep a
passage from forging a chat turn; keep untrusted text away from control tokens.

Every log-probability a server reports (generated tokens, their alternatives, echoed prompts)
must be finite and <= 0, allowing :data:`LOGPROB_TOLERANCE` (1e-6) above 0 for float rounding
(such a value is read as 0): anything else raises :class:`~rag_gates.errors.ServerLogprobError`
(a gate reading it then retrieves), and a server whose probe replies carry such values is
declared as offering no log-probabilities.

The API key is read from the environment (``api_key_env``, default ``OPENAI_API_KEY``) and
sent only as the ``Authorization`` header; it is never logged, stored in a run directory or
put in an error message. A ``base_url`` carrying credentials or a query string is refused
(without repeating them), and every reply is scrubbed of the key as it is read, so a server
that echoes the header cannot put it into an error or a log line. Every reply body is read in
chunks and refused beyond ``max_response_bytes`` (32 MiB by default).

Example:
    >>> lm = OpenAICompatibleLM("http://127.0.0.1:8000/v1")               # doctest: +SKIP
    >>> lm.capabilities.offered()                                          # doctest: +SKIP
    ['text', 'logprobs', 'score', 'next_token']
    >>> lm.generate("The capital of France is", max_new_tokens=4, logprobs=3)  # doctest: +SKIP
    >>> lm.score("The capital of France is", [" Paris", " Rome"])          # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import math
import os
import queue
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rag_gates._fork import rebuild_after_fork
from rag_gates._http import (
    DEFAULT_MAX_RESPONSE_BYTES,
    ERROR_BODY_BYTES,
    RETRY_STATUS,
    LoopThread,
    backoff_delay,
    check_api_key,
    check_server_url,
    read_body,
    read_lines,
    redact_url,
    register_secret,
    retry_after_seconds,
    scrub_text,
)
from rag_gates._json import JSONDepthError, loads_bounded
from rag_gates._optional import require
from rag_gates._text import check_encodable
from rag_gates.errors import (
    ContextLengthError,
    LogprobsMissingError,
    ServerError,
    ServerLogprobError,
    ServerReplyError,
    ServerRequestError,
    ServerTimeoutError,
    ServerUnavailableError,
    WhiteBoxRequiredError,
)
from rag_gates.gate import LOGPROB_TOLERANCE, logprob_problem
from rag_gates.lm.base import (
    BaseTextLM,
    Capabilities,
    ContinuationScore,
    FormattedPrompt,
    Prompt,
    as_messages,
    validate_generation_args,
    validate_prompt,
)
from rag_gates.lm.stops import StopCutter, find_stop
from rag_gates.types import ChatMessage, Generation, TokenLogprob, TopLogprob

__all__ = ["OpenAICompatibleLM", "OpenAIConfig", "PromptKind", "load_chat_template"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

PromptKind = Literal["raw", "chat", "messages"]
"""How a prompt reaches the server: ``raw`` text and ``chat`` (messages rendered by the client's
``chat_template``) go to the completions endpoint; ``messages`` to the chat endpoint."""
Alignment = Literal["aligned", "shifted", "missing", "mismatch", "unprobed"]

# The probe: a prompt whose continuation is near-certain for any instruction-tuned model.
PROBE_RAW = "The capital of France is"
PROBE_QUESTION = "What is the capital of France? Answer in one word."
_PROBE_TOKENS = 3


class OpenAIConfig(BaseModel):
    """Options of :class:`OpenAICompatibleLM`."""

    # A refused value is never echoed: a base_url may carry a key (refused below).
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    base_url: str = Field(..., min_length=1,
                          description="API root, e.g. 'http://127.0.0.1:8000/v1' (no "
                                      "credentials or query string: the key goes in the "
                                      "environment, see api_key_env).")
    model: str | None = Field(None, description="Model name sent to the server (default: the "
                                                "first one GET /models lists).")
    model_id: str | None = Field(None, description="Name recorded in traces and probes "
                                                   "(default: openai:BASE_URL#MODEL).")
    api_key_env: str | None = Field("OPENAI_API_KEY", description="Environment variable "
                                    "holding the API key (sent as a Bearer token; never "
                                    "logged). None: send no key.")
    chat: bool = Field(True, description="Send a plain string prompt as one user message "
                                         "(as HFWhiteBoxLM does for chat models).")
    chat_template: str | None = Field(None, description="Jinja chat template (the model's, "
                                      "e.g. tokenizer.chat_template): chat prompts are "
                                      "rendered here and sent to the completions endpoint, "
                                      "so score() works on them and assistant prefill "
                                      "continues the message. None: the chat endpoint.")
    timeout: float = Field(120.0, gt=0, le=3600, description="Hard limit, in seconds, for one "
                                                             "call including every retry.")
    attempt_timeout: float = Field(60.0, gt=0, le=3600,
                                   description="Limit for one HTTP attempt.")
    max_retries: int = Field(3, ge=0, le=20, description="Retries after the first attempt "
                                                         "(timeouts, dropped connections, "
                                                         "408/429/5xx).")
    backoff_base: float = Field(0.5, ge=0, le=60, description="First backoff, seconds.")
    backoff_max: float = Field(8.0, ge=0, le=600, description="Largest backoff, seconds.")
    max_concurrency: int = Field(4, ge=1, le=256, description="Requests in flight at once "
                                                              "(also the connection pool).")
    max_top_logprobs: int = Field(20, ge=0, le=100, description="Most alternatives the server "
                                  "gives per token (also what a shift correction asks for).")
    max_stop_strings: int = Field(4, ge=0, le=64, description="Stop strings sent to the server "
                                  "(OpenAI takes 4); all of them are also cut client-side.")
    probe: bool = Field(True, description="Probe logprobs and prompt scoring at construction "
                                          "(a few short requests).")
    probe_tolerance: float = Field(0.05, gt=0, le=5, description="Largest difference, in "
                                   "nats, between an echoed and a generated log-probability "
                                   "of the same token for the server to count as aligned.")
    trust_env: bool = Field(True, description="Use proxy settings from the environment.")
    max_response_bytes: int = Field(DEFAULT_MAX_RESPONSE_BYTES, ge=1024, le=2 ** 34,
                                    description="Largest reply body read (streamed replies: "
                                                "in all); a larger one is refused (reading "
                                                "stops at the limit) with ServerReplyError.")

    @field_validator("base_url")
    @classmethod
    def _no_secrets_in_url(cls, value: str) -> str:
        return check_server_url(value, "base_url", "Put the API key in the environment "
                                "variable named by api_key_env (default OPENAI_API_KEY)")


class _Echo(BaseModel):
    """The echoed prompt of a completions reply: tokens with their log-probabilities."""

    text: str
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]


class OpenAICompatibleLM(BaseTextLM):
    """A model behind an OpenAI-compatible server, as a :class:`~rag_gates.lm.base.TextLM`.

    Args:
        base_url: the API root (``http://HOST:PORT/v1``).
        config: an :class:`OpenAIConfig`; keyword overrides also work (``model=``,
            ``chat_template=``, ``max_concurrency=``, ...).

    Setup:
        ``pip install "rag-gates[api]"`` (httpx, jinja2). A local server for the embedded
        model: ``pip install "llama-cpp-python[server]"`` then ``python -m llama_cpp.server
        --model SmolLM2-135M-Instruct.Q4_1.gguf --logits_all true``.

    Instantiate:
        >>> lm = OpenAICompatibleLM("http://127.0.0.1:8000/v1")            # doctest: +SKIP
        >>> lm = OpenAICompatibleLM.from_spec("openai:http://127.0.0.1:8000/v1#smollm2")
        ...                                                                 # doctest: +SKIP

    Invoke:
        >>> g = lm.generate("Who wrote Hamlet?", max_new_tokens=16, stop=["\\n"], logprobs=3)
        ...                                                                 # doctest: +SKIP
        >>> lm.top_next_tokens("The capital of France is", k=5)            # doctest: +SKIP

    Async:
        >>> gens = await asyncio.gather(*(lm.agenerate(q) for q in questions))  # doctest: +SKIP
        >>> async for piece in lm.astream("Who wrote Hamlet?"): ...         # doctest: +SKIP
    """

    def __init__(self, base_url: str | None = None, *, config: OpenAIConfig | None = None,
                 **overrides: Any) -> None:
        if base_url is not None:
            overrides["base_url"] = base_url
        if config is None:
            self.config = OpenAIConfig.model_validate(overrides)
        else:
            self.config = OpenAIConfig.model_validate({**config.model_dump(), **overrides})
        self.base_url = self.config.base_url.rstrip("/")  # checked by OpenAIConfig
        self._template: Any = _compile_template(self.config.chat_template)
        self._model: str | None = self.config.model
        self._lock = threading.Lock()
        self._runner: LoopThread | None = None
        self._client: Any = None
        self._slots: asyncio.Semaphore | None = None
        self._secrets: tuple[bytes, ...] = ()  # scrubbed from every reply (the API key)
        self.requests_sent = 0
        self.alignment: dict[PromptKind, Alignment] = {}
        self._parents: list[Any] = []  # a forked child's inherited loop and client, unused
        rebuild_after_fork(self)
        if self.config.probe:
            self._capabilities = self._call(self._probe())
        else:
            self._capabilities = Capabilities(
                logprobs=True, top_logprobs=self.config.max_top_logprobs, next_token="top-k",
                notes={"score": "not probed (probe=False): prompt log-probabilities are "
                                "untrusted until probed"})

    @classmethod
    def from_spec(cls, spec: str, **overrides: Any) -> OpenAICompatibleLM:
        """Build from ``openai:URL[#model-name]`` (the form ``--model`` takes)."""
        if not spec.startswith("openai:"):
            raise ValueError(f"expected 'openai:URL[#model-name]', got {redact_url(spec)!r}")
        url, _, model = spec.removeprefix("openai:").partition("#")
        if model:
            overrides.setdefault("model", model)
        return cls(url, **overrides)

    # ------------------------------------------------------------------------------ identity
    @property
    def model_id(self) -> str:
        return self.config.model_id or f"openai:{self.base_url}#{self._model or '?'}"

    @property
    def model_name(self) -> str | None:
        """The model name sent to the server (resolved from GET /models when not given)."""
        return self._model

    @property
    def capabilities(self) -> Capabilities:
        """What this served model offers, as probed at construction."""
        return self._capabilities

    @property
    def supports_logprobs(self) -> bool:
        return self._capabilities.logprobs

    def __repr__(self) -> str:  # the key is never part of it
        return f"OpenAICompatibleLM({self.base_url!r}, model={self._model!r})"

    # ------------------------------------------------------------------------------ plumbing
    def _after_fork(self) -> None:
        """In a forked worker: a new loop thread, client and lock on first use (the parent's
        are kept referenced, never closed from here)."""
        self._parents.append((self._runner, self._client))
        self._lock = threading.Lock()
        self._runner, self._client, self._slots = None, None, None

    def _loop(self) -> LoopThread:
        with self._lock:
            if self._runner is None:
                self._runner = LoopThread("rag-gates-openai")
                weakref.finalize(self, LoopThread.stop, self._runner)
            return self._runner

    def _submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return self._loop().submit(coro)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        future = self._submit(coro)
        try:
            # Each request enforces its own deadline; this is only a backstop.
            return future.result(timeout=self.config.timeout * 2 + 5.0)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise ServerTimeoutError(
                f"no answer from {self.base_url} within {self.config.timeout:.0f} s") from exc

    async def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(self._submit(coro))

    def _headers(self) -> dict[str, str]:
        headers = {"User-Agent": "rag-gates", "Accept": "application/json"}
        key = os.environ.get(self.config.api_key_env) if self.config.api_key_env else None
        if key:
            # A newline kept from a file: the HTTP stack's refusal would print the key.
            check_api_key(key, f"${self.config.api_key_env}")
            headers["Authorization"] = f"Bearer {key}"
            self._secrets = (key.encode("utf-8"),)
            register_secret(key)
        return headers

    async def _http(self) -> Any:
        if self._client is None:
            httpx = require("httpx", "api")
            n = self.config.max_concurrency
            self._client = httpx.AsyncClient(
                limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
                headers=self._headers(), trust_env=self.config.trust_env)
            self._slots = asyncio.Semaphore(n)
        return self._client

    async def _request(self, path: str, payload: dict[str, Any] | None = None,
                       *, on_open: Callable[[Any], Coroutine[Any, Any, T]] | None = None
                       ) -> Any:
        """One logical request with retries. Without ``on_open`` the JSON reply is returned;
        with it, ``on_open(response)`` reads a streamed reply (retried only if it fails before
        it has read anything)."""
        httpx = require("httpx", "api")
        client = await self._http()
        assert self._slots is not None
        url = f"{self.base_url}{path}"
        deadline = time.monotonic() + self.config.timeout
        last = "no attempt made"
        attempt = 0
        for attempt in range(self.config.max_retries + 1):
            retry_after: float | None = None
            try:
                async with self._slots:
                    per_try = max(0.001, min(self.config.attempt_timeout,
                                             deadline - time.monotonic()))
                    self.requests_sent += 1
                    method = "GET" if payload is None else "POST"
                    request = client.build_request(method, url, json=payload,
                                                   timeout=per_try)
                    async with asyncio.timeout(per_try):  # until the headers arrive
                        response = await client.send(request, stream=True)
                    try:
                        if response.status_code < 400 and on_open is not None:
                            async with asyncio.timeout(max(0.001, deadline - time.monotonic())):
                                return await on_open(response)
                        async with asyncio.timeout(per_try):
                            body = await self._read(response, url)
                    finally:
                        await response.aclose()
                status = response.status_code
                if status in RETRY_STATUS or status >= 500:
                    last = f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}"
                    retry_after = retry_after_seconds(response.headers)
                elif status >= 400:
                    raise _refusal(url, status, body)
                else:
                    try:
                        return loads_bounded(body, what=f"the reply of {url}")
                    except JSONDepthError as exc:
                        raise ServerReplyError(str(exc)) from None
                    except ValueError as exc:
                        raise ServerReplyError(
                            f"{url} answered HTTP {status} with a body that is not JSON: "
                            f"{body[:200]!r}") from exc
            except (TimeoutError, httpx.TimeoutException):
                last = "the attempt timed out"
            except httpx.TransportError as exc:  # refused, reset, dropped mid-reply, ...
                last = scrub_text(f"{type(exc).__name__}: {exc}",
                                  [s.decode("utf-8", "replace") for s in self._secrets])
            except _StreamStarted as exc:  # failed after text was handed out: no retry
                raise ServerUnavailableError(
                    f"{url} dropped a streamed reply after it had started: {exc.__cause__}"
                ) from exc
            if attempt == self.config.max_retries:
                break
            delay = backoff_delay(attempt, retry_after, self.config.backoff_base,
                                  self.config.backoff_max)
            if time.monotonic() + delay >= deadline:
                break
            logger.debug("retrying %s after %s (%.2f s)", url, last, delay)
            await asyncio.sleep(delay)
        if last == "the attempt timed out" and time.monotonic() >= deadline - 0.05:
            raise ServerTimeoutError(
                f"no answer from {url} within {self.config.timeout:.0f} s (retries "
                "included); raise timeout= or check that the server is up")
        raise ServerUnavailableError(
            f"{url} failed after {attempt + 1} attempt(s); last: {last}. Check that the "
            "server is up, or raise max_retries/timeout")

    async def _read(self, response: Any, url: str) -> bytes:
        """A reply's body: bounded, scrubbed of the key (an error reply: its first 64 KiB)."""
        failed = response.status_code >= 400
        return await read_body(response, ERROR_BODY_BYTES if failed else
                               self.config.max_response_bytes, where=url,
                               setting="max_response_bytes", error=ServerReplyError,
                               secrets=self._secrets, truncate=failed)

    def _lines(self, response: Any, url: str) -> AsyncIterator[str]:
        """A streamed reply's lines: bounded in all, scrubbed of the key."""
        return read_lines(response, self.config.max_response_bytes, where=url,
                          setting="max_response_bytes", error=ServerReplyError,
                          secrets=self._secrets)

    async def _resolve_model(self) -> str:
        if self._model is None:
            data = await self._request("/models")
            try:
                self._model = str(data["data"][0]["id"])
            except (KeyError, IndexError, TypeError) as exc:
                raise ServerReplyError(
                    f"{self.base_url}/models lists no model ({str(data)[:200]}); pass "
                    "model='<name>'") from exc
        return self._model

    # ------------------------------------------------------------------------------ prompts
    def route(self, prompt: Prompt) -> tuple[PromptKind, str | list[dict[str, str]]]:
        """Where ``prompt`` goes and in what form (see :data:`PromptKind`)."""
        prompt = validate_prompt(prompt)
        if isinstance(prompt, FormattedPrompt):
            # Formatted text is chat-formatted in practice: it shares the chat probe.
            return ("chat" if self._template is not None else "raw"), str(prompt)
        if isinstance(prompt, str) and not self.config.chat:
            return "raw", prompt
        messages = ([ChatMessage(role="user", content=prompt)] if isinstance(prompt, str)
                    else as_messages(prompt))
        if self._template is not None:
            return "chat", self.render(messages)
        if messages and messages[-1].role == "assistant":
            # The chat endpoint would close that message and start a new one: the model would
            # not continue the text it was given, and nothing would say so.
            raise ValueError(
                f"this prompt ends with an assistant message to continue (prefill), which the "
                f"chat endpoint of {self.base_url} cannot do: pass chat_template= (the model's "
                "Jinja template; `rag-gates bench --chat-template`), so the prompt is rendered "
                "here and continued through the completions endpoint")
        return "messages", [{"role": m.role, "content": m.content} for m in messages]

    def render(self, messages: Sequence[ChatMessage | dict[str, str]]) -> str:
        """Render chat messages with the client's ``chat_template``. A final assistant message
        is continued (no end of turn after it), as HFWhiteBoxLM does."""
        if self._template is None:
            raise ValueError("render() needs chat_template= (the model's Jinja template)")
        msgs = as_messages(messages)
        prefill = msgs[-1].role == "assistant"
        text = str(self._template.render(
            messages=[{"role": m.role, "content": m.content} for m in msgs],
            add_generation_prompt=not prefill, bos_token="", eos_token=""))
        if prefill:
            content = msgs[-1].content
            end = text.rfind(content) if content else -1
            if end < 0:
                raise ValueError("the chat template dropped the final assistant message; "
                                 "cannot continue it")
            text = text[: end + len(content)]
        return text

    # ------------------------------------------------------------------------------ generation
    def _payload(self, kind: PromptKind, body: str | list[dict[str, str]],
                 max_new_tokens: int, stops: tuple[str, ...], temperature: float,
                 logprobs: int | None, seed: int | None, stream: bool
                 ) -> tuple[str, dict[str, Any]]:
        payload: dict[str, Any] = {"model": self._model, "max_tokens": max_new_tokens,
                                   "temperature": float(temperature), "stream": stream}
        if stops and self.config.max_stop_strings:
            payload["stop"] = list(stops[: self.config.max_stop_strings])
        if seed is not None:
            payload["seed"] = seed
        if kind == "messages":
            payload["messages"] = body
            if logprobs is not None:
                payload["logprobs"] = True
                payload["top_logprobs"] = logprobs
            return "/chat/completions", payload
        payload["prompt"] = body
        if logprobs is not None:
            payload["logprobs"] = logprobs
        return "/completions", payload

    def _check_top(self, logprobs: int | None) -> None:
        if logprobs is not None and logprobs > self.config.max_top_logprobs:
            raise ValueError(f"logprobs={logprobs} is more than this server gives "
                             f"(max_top_logprobs={self.config.max_top_logprobs})")

    async def _agenerate(self, prompt: Prompt, max_new_tokens: int, stop: Sequence[str] | None,
                         temperature: float, logprobs: int | None, seed: int | None
                         ) -> Generation:
        stops = validate_generation_args(max_new_tokens, stop, temperature, logprobs)
        self._check_top(logprobs)
        kind, body = self.route(prompt)
        return await self._agenerate_routed(kind, body, max_new_tokens, stops, temperature,
                                            logprobs, seed)

    async def _agenerate_routed(self, kind: PromptKind, body: str | list[dict[str, str]],
                                max_new_tokens: int, stops: tuple[str, ...],
                                temperature: float, logprobs: int | None, seed: int | None
                                ) -> Generation:
        start = time.perf_counter()
        await self._resolve_model()
        path, payload = self._payload(kind, body, max_new_tokens, stops, temperature, logprobs,
                                      seed, stream=False)
        data = await self._request(path, payload)
        url = f"{self.base_url}{path}"
        choice = _first_choice(data, url)
        if kind == "messages":
            text = _field(choice, url, "message", "content", kind=str, nullable=True) or ""
            tokens = _chat_logprobs(choice, url, logprobs) if logprobs is not None else None
        else:
            text = _field(choice, url, "text", kind=str)
            tokens = (_completion_logprobs(choice, url, logprobs)
                      if logprobs is not None else None)
        if logprobs is not None and not tokens and text:
            raise LogprobsMissingError(f"{url} returned no log-probabilities although they were "
                                   "asked for (start the server with logits_all / logprobs "
                                   "enabled)")
        text, tokens, finish = _finish(text, tokens, stops, choice)
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        return Generation(
            text=text, finish_reason=finish, logprobs=tokens,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or len(tokens or ())),
            latency_ms=(time.perf_counter() - start) * 1000.0)

    def generate(self, prompt: Prompt, *, max_new_tokens: int = 128,
                 stop: Sequence[str] | None = None, temperature: float = 0.0,
                 logprobs: int | None = None, seed: int | None = None) -> Generation:
        """Generate greedily (``temperature=0``) or by sampling (``seed`` where the server
        takes one). ``logprobs=k`` returns per-token log-probabilities with the ``k`` most
        likely alternatives. ``finish_reason`` is ``"stop"`` when a stop string ended the text
        (servers that do not say whether they stopped at end-of-sequence or at a stop string
        are read as ``"stop"`` whenever stop strings were given)."""
        return self._call(self._agenerate(prompt, max_new_tokens, stop, temperature, logprobs,
                                          seed))

    async def agenerate(self, prompt: Prompt, *, max_new_tokens: int = 128,
                        stop: Sequence[str] | None = None, temperature: float = 0.0,
                        logprobs: int | None = None, seed: int | None = None,
                        **kwargs: Any) -> Generation:
        """:meth:`generate` without a thread: at most ``max_concurrency`` requests of this
        client are in flight at once, the rest wait for a slot."""
        if kwargs:
            raise TypeError(f"unexpected arguments: {sorted(kwargs)}")
        return await self._on_loop(self._agenerate(prompt, max_new_tokens, stop, temperature,
                                                   logprobs, seed))

    async def _stream_into(self, emit: Callable[[tuple[str, object]], None],
                           cancelled: threading.Event, prompt: Prompt, max_new_tokens: int,
                           stop: Sequence[str] | None, temperature: float, seed: int | None
                           ) -> None:
        try:
            start = time.perf_counter()
            stops = validate_generation_args(max_new_tokens, stop, temperature, None)
            kind, body = self.route(prompt)
            await self._resolve_model()
            path, payload = self._payload(kind, body, max_new_tokens, stops, temperature, None,
                                          seed, stream=True)
            url = f"{self.base_url}{path}"
            cutter = StopCutter(stops)
            state: dict[str, Any] = {"finish": None, "pieces": 0}

            async def read(response: Any) -> None:
                started = False
                try:
                    async for line in self._lines(response, url):
                        if cancelled.is_set():
                            return
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            return
                        try:
                            chunk = loads_bounded(data, what=f"an event streamed by {url}")
                        except JSONDepthError as exc:
                            raise ServerReplyError(str(exc)) from None
                        except ValueError as exc:
                            raise ServerReplyError(
                                f"{url} streamed an event that is not JSON: {data[:200]!r}"
                            ) from exc
                        choice = _first_choice(chunk, url)
                        piece = (_field(choice, url, "delta", "content", kind=str,
                                        nullable=True, optional=True)
                                 if kind == "messages" else
                                 _field(choice, url, "text", kind=str, nullable=True))
                        state["finish"] = choice.get("finish_reason") or state["finish"]
                        if piece:
                            state["pieces"] += 1
                            out = cutter.feed(piece)
                            if out:
                                started = True
                                emit(("piece", out))
                            if cutter.stopped:
                                return  # leaving closes the connection: the server stops
                except Exception as exc:
                    if started and not isinstance(exc, ServerError):
                        raise _StreamStarted() from exc
                    raise

            await self._request(path, payload, on_open=read)
            rest = cutter.flush()
            if rest:
                emit(("piece", rest))
            finish = ("stop" if cutter.stopped else
                      "length" if state["finish"] == "length" else
                      "stop" if stops and state["finish"] == "stop" else "eos")
            emit(("done", Generation(text=cutter.text, finish_reason=finish,
                                     completion_tokens=state["pieces"],
                                     latency_ms=(time.perf_counter() - start) * 1000.0)))
        except Exception as exc:  # handed to the consumer, raised there
            emit(("error", exc))

    def stream(self, prompt: Prompt, *, max_new_tokens: int = 128,
               stop: Sequence[str] | None = None, temperature: float = 0.0,
               seed: int | None = None) -> Generator[str, None, Generation | None]:
        """Yield text as the server streams it (stop strings cut as in :meth:`generate`);
        the generator's return value is the finished :class:`Generation`. Closing it early
        closes the connection, so the server stops generating."""
        pieces: queue.Queue[tuple[str, object]] = queue.Queue()
        cancelled = threading.Event()
        future = self._submit(self._stream_into(pieces.put, cancelled, prompt, max_new_tokens,
                                                stop, temperature, seed))
        try:
            while True:
                try:
                    what, value = pieces.get(timeout=self.config.timeout * 2 + 5.0)
                except queue.Empty as exc:
                    raise ServerTimeoutError(f"{self.base_url} streamed nothing for "
                                             f"{self.config.timeout * 2 + 5.0:.0f} s") from exc
                if what == "piece":
                    yield str(value)
                elif what == "error":
                    raise value  # type: ignore[misc]
                else:
                    return value if isinstance(value, Generation) else None
        finally:
            cancelled.set()
            future.cancel()

    async def astream(self, prompt: Prompt, *, max_new_tokens: int = 128,
                      stop: Sequence[str] | None = None, temperature: float = 0.0,
                      seed: int | None = None, **kwargs: Any) -> AsyncIterator[str]:
        """:meth:`stream` for an event loop (no worker thread); cancelling or closing it
        closes the connection."""
        if kwargs:
            raise TypeError(f"unexpected arguments: {sorted(kwargs)}")
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue[tuple[str, object]] = asyncio.Queue()
        cancelled = threading.Event()

        def emit(item: tuple[str, object]) -> None:
            with contextlib.suppress(RuntimeError):  # the consumer's loop has closed
                loop.call_soon_threadsafe(pieces.put_nowait, item)

        future = self._submit(self._stream_into(emit, cancelled, prompt, max_new_tokens, stop,
                                                temperature, seed))
        try:
            while True:
                what, value = await pieces.get()
                if what == "piece":
                    yield str(value)
                elif what == "error":
                    raise value  # type: ignore[misc]
                else:
                    return
        finally:
            cancelled.set()
            future.cancel()

    # ------------------------------------------------------------------------------ next token
    def top_next_tokens(self, prompt: Prompt, k: int = 5) -> list[TopLogprob]:
        """The ``k`` most likely next tokens with their log-probabilities (the server's
        ``top_logprobs`` of one generated token): the next-token distribution a served model
        can give."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        g = self.generate(prompt, max_new_tokens=1, logprobs=k)
        if not g.logprobs:
            raise ServerReplyError(f"{self.base_url} generated no token after the prompt "
                                   "(it ended at once), so there is no distribution to read")
        return list(g.logprobs[0].top_logprobs)

    # ------------------------------------------------------------------------------ scoring
    async def _echo(self, text: str, top: int) -> _Echo:
        """Echo ``text`` through the completions endpoint with its prompt log-probabilities
        (one generated token rides along: some servers read max_tokens=0 as 'no limit')."""
        path = "/completions"
        url = f"{self.base_url}{path}"
        data = await self._request(path, {"model": self._model, "prompt": text, "echo": True,
                                          "logprobs": top, "max_tokens": 1,
                                          "temperature": 0.0})
        choice = _first_choice(data, url)
        lp = choice.get("logprobs")
        reply_text = _field(choice, url, "text", kind=str)
        if not isinstance(lp, dict):
            return _Echo(text=reply_text, tokens=[], token_logprobs=[], top_logprobs=[])
        try:
            echo = _Echo(text=reply_text, tokens=lp.get("tokens") or [],
                         token_logprobs=lp.get("token_logprobs") or [],
                         top_logprobs=lp.get("top_logprobs") or [])
        except ValueError as exc:
            raise ServerReplyError(f"{url} returned echoed log-probabilities that are not in "
                                   f"the completions shape: {str(lp)[:200]}") from exc
        # The first prompt token has no value (None); every value given must be one.
        for i, value in enumerate(echo.token_logprobs):
            if value is not None:
                echo.token_logprobs[i] = _logprob(value, url, f"echoed token {i}")
        for i, top_entry in enumerate(echo.top_logprobs):
            if top_entry is not None:
                echo.top_logprobs[i] = {t: _logprob(v, url, f"echoed token {i}, alternative "
                                                    f"{t!r}") for t, v in top_entry.items()}
        return echo

    @staticmethod
    def _continuation_span(echo: _Echo, prompt: str, continuation: str) -> tuple[int, int]:
        """Token positions ``[a, b)`` of ``continuation`` in an echo of prompt+continuation."""
        full = prompt + continuation
        if not echo.text.startswith(full):
            raise ServerReplyError("the server's echo does not start with the prompt it was "
                                   "sent; it does not echo prompts")
        generated = echo.text[len(full):]
        joined = "".join(echo.tokens)
        end = len(echo.tokens)
        if generated and joined.endswith(continuation + generated):
            tail = ""
            while end > 0 and len(tail) < len(generated):
                end -= 1
                tail = echo.tokens[end] + tail
            if tail != generated:
                raise ServerReplyError("the echoed tokens do not end at the generated token")
        elif not joined.endswith(continuation):
            raise ServerReplyError("the echoed tokens do not end with the continuation "
                                   f"{continuation!r}")
        start, got = end, ""
        while start > 0 and len(got) < len(continuation):
            start -= 1
            got = echo.tokens[start] + got
        if got != continuation:
            raise ValueError(
                f"the continuation {continuation!r} does not begin at a token boundary on this "
                f"server (token {echo.tokens[start]!r} spans the end of the prompt); end the "
                "prompt with whitespace or begin the continuation with a space")
        return start, end

    @staticmethod
    def _read_span(echo: _Echo, span: tuple[int, int], alignment: Alignment
                   ) -> list[float | None]:
        """Log-probabilities of the tokens in ``span`` under an alignment (None: not there)."""
        out: list[float | None] = []
        for i in range(*span):
            if alignment == "aligned":
                value = echo.token_logprobs[i] if i < len(echo.token_logprobs) else None
            else:  # shifted: token i's value is in the previous entry's alternatives
                prev = echo.top_logprobs[i - 1] if 0 < i <= len(echo.top_logprobs) else None
                # The previous entry's own token was written into it with a wrong value.
                same = i > 0 and echo.tokens[i - 1] == echo.tokens[i]
                value = None if prev is None or same else prev.get(echo.tokens[i])
            out.append(None if value is None or not math.isfinite(value) else float(value))
        return out

    async def _ascore_one(self, kind: PromptKind, prompt: str, continuation: str
                          ) -> ContinuationScore:
        alignment = self.alignment.get(kind, "unprobed")
        top = 1 if alignment == "aligned" else self.config.max_top_logprobs
        echo = await self._echo(prompt + continuation, top)
        span = self._continuation_span(echo, prompt, continuation)
        values = self._read_span(echo, span, alignment)
        tokens = echo.tokens[span[0]: span[1]]
        if any(v is None for v in values):
            missing = [t for t, v in zip(tokens, values, strict=True) if v is None]
            raise ServerError(
                f"{self.base_url} reports prompt log-probabilities shifted by one position "
                f"(found by the probe at construction); the corrected value of token(s) "
                f"{missing!r} is not among the previous position's top "
                f"{self.config.max_top_logprobs}, so it cannot be recovered. Use chat prompts "
                "with chat_template= if they probed aligned, or a server with correct prompt "
                "log-probabilities")
        return ContinuationScore(text=continuation, token_ids=[], tokens=tokens,
                                 logprobs=[float(v) for v in values if v is not None])

    def check_prompt_form(self, prompt: Prompt) -> None:
        """Raise ValueError, saying what to pass, if prompts of this form cannot be sent (an
        assistant message to continue without a ``chat_template``). Components whose prompts
        have one form check a sample at construction."""
        self.route(prompt)

    def score_unavailable(self, prompt: Prompt) -> str | None:
        """Why :meth:`score` cannot score continuations of a prompt of this form (None: it
        can). Components that score prompts of one form check a sample at construction, so
        a server that cannot is refused before any question is asked."""
        return self._score_route(prompt)[1]

    def _score_route(self, prompt: Prompt) -> tuple[tuple[PromptKind, str] | None, str | None]:
        """``((kind, text), None)`` for a prompt score() can read, else ``(None, why)``."""
        try:
            kind, body = self.route(prompt)
        except ValueError as exc:  # a form this server cannot take at all
            return None, str(exc)
        if kind == "messages":
            return None, (f"score() on chat prompts is not available from {self.base_url}: "
                          "the chat endpoint echoes no prompt; pass chat_template= (the "
                          "model's Jinja template; `rag-gates bench --chat-template`) so chat "
                          "prompts are rendered here and scored by echo")
        if self.alignment.get(kind) not in ("aligned", "shifted"):
            return None, (f"score() on {kind} prompts is not available from {self.base_url}: "
                          + self._capabilities.notes.get("score", "the probe did not pass"))
        assert isinstance(body, str)
        return (kind, body), None

    async def _ascore(self, prompt: Prompt, continuations: Sequence[str]
                      ) -> list[ContinuationScore]:
        if isinstance(continuations, str) or not isinstance(continuations, Sequence):
            raise TypeError("continuations must be a list of strings")
        for i, c in enumerate(continuations):
            if not isinstance(c, str):
                raise TypeError(f"continuation {i} must be a str, got {type(c).__name__}")
            if not c:
                raise ValueError(f"continuation {i} is empty; nothing to score")
            check_encodable(c, f"continuation {i}")
        routed, reason = self._score_route(prompt)  # the prompt is rendered once
        if routed is None:
            raise WhiteBoxRequiredError(
                f"{reason}. Use an HFWhiteBoxLM with the same weights for teacher-forced "
                "scores")
        kind, body = routed
        await self._resolve_model()
        return list(await asyncio.gather(*(self._ascore_one(kind, body, c)
                                           for c in continuations)))

    def score(self, prompt: Prompt, continuations: Sequence[str], **kwargs: Any
              ) -> list[ContinuationScore]:
        """Teacher-forced log-probabilities of each continuation after ``prompt``, from the
        server's echoed prompt log-probabilities (only where the probe found them aligned or
        correctably shifted: see ``capabilities.notes['score']``).

        The server tokenises prompt + continuation together; the continuation must begin at
        a token boundary (write its leading space: ``" Paris"``). ``token_ids`` are empty:
        the completions API returns token strings only.
        """
        if kwargs:
            raise TypeError(f"unexpected arguments: {sorted(kwargs)}")
        return self._call(self._ascore(prompt, continuations))

    async def ascore(self, prompt: Prompt, continuations: Sequence[str]
                     ) -> list[ContinuationScore]:
        """:meth:`score` for an event loop."""
        return await self._on_loop(self._ascore(prompt, continuations))

    # ------------------------------------------------------------------------------ the probe
    async def _probe_kind(self, kind: PromptKind) -> tuple[Alignment, str, bool]:
        """Alignment of prompt log-probabilities for one prompt kind, the evidence, and
        whether generated tokens came with log-probabilities."""
        text = PROBE_RAW if kind == "raw" else self.render(
            [ChatMessage(role="user", content=PROBE_QUESTION)])
        gen = await self._agenerate_routed(kind, text, _PROBE_TOKENS, (), 0.0, 1, None)
        if not gen.logprobs:
            return "missing", "generated tokens came without log-probabilities", False
        tokens = [t.token for t in gen.logprobs]
        continuation = "".join(tokens)
        if not continuation:
            return "mismatch", "the probe generated no text", True
        echo = await self._echo(text + continuation, self.config.max_top_logprobs)
        if not any(v is not None for v in echo.token_logprobs):
            return "missing", "the echo carries no prompt log-probabilities", True
        try:
            span = self._continuation_span(echo, text, continuation)
        except (ValueError, ServerReplyError) as exc:
            return "mismatch", f"the echo could not be read: {exc}", True
        echoed = echo.tokens[span[0]: span[1]]
        n = 0  # compare the tokens both tokenisations share
        while n < min(len(echoed), len(tokens)) and echoed[n] == tokens[n]:
            n += 1
        if n == 0:
            return "mismatch", "the echo tokenised the generated text differently", True
        generated = [t.logprob for t in gen.logprobs[:n]]
        evidence = []
        for alignment in ("aligned", "shifted"):
            values = self._read_span(echo, (span[0], span[0] + n), alignment)
            shown = ", ".join("?" if v is None else f"{v:.3f}" for v in values)
            evidence.append(f"{alignment} reading [{shown}]")
            if all(v is not None and abs(v - g) <= self.config.probe_tolerance
                   for v, g in zip(values, generated, strict=True)):
                return alignment, (f"{echoed[:n]!r} after {text[-40:]!r}: generated "
                                   f"[{', '.join(f'{g:.3f}' for g in generated)}], "
                                   + evidence[-1]), True
        return "mismatch", (f"{echoed[:n]!r}: generated "
                            f"[{', '.join(f'{g:.3f}' for g in generated)}] vs "
                            + "; ".join(evidence)), True

    async def _probe(self) -> Capabilities:
        await self._resolve_model()
        kinds: list[PromptKind] = ["raw", "chat"] if self._template is not None else ["raw"]
        found = {}
        invalid: str | None = None
        for kind in kinds:
            try:
                found[kind] = await self._probe_kind(kind)
            except ServerRequestError as exc:  # e.g. a chat-only server refusing completions
                found[kind] = ("missing", f"the completions endpoint refused: {exc}", False)
            except LogprobsMissingError:  # none at all: say how to start the server, as ever
                raise
            except ServerLogprobError as exc:  # values that are not log-probabilities
                invalid = str(exc)
                found[kind] = ("mismatch", f"invalid log-probabilities: {exc}", False)
        self.alignment = {kind: result[0] for kind, result in found.items()}
        logprobs = any(result[2] for result in found.values())
        words = {"aligned": "aligned", "shifted": "shifted by one position (corrected from "
                 "the previous position's top_logprobs)", "missing": "not available",
                 "mismatch": "wrong (matches neither reading; disabled)"}
        summary = "; ".join(f"{kind} prompts: {words[a]} ({detail})"
                            for kind, (a, detail, _) in found.items())
        if self._template is None:
            summary += "; chat prompts: not scorable (no chat_template given)"
        scorable = any(a in ("aligned", "shifted") for a in self.alignment.values())
        for kind, (a, detail, _) in found.items():
            if a not in ("aligned", "shifted"):
                logger.warning("%s: score() on %s prompts disabled: prompt log-probabilities "
                               "%s (%s)", self.base_url, kind, words[a], detail)
        notes = {"score": summary}
        if not logprobs:
            notes["logprobs"] = invalid or ("the server returned no log-probabilities for "
                                            "generated tokens")
        return Capabilities(logprobs=logprobs,
                            top_logprobs=self.config.max_top_logprobs if logprobs else 0,
                            next_token="top-k" if logprobs else "none", score=scorable,
                            notes=notes)

    def close(self) -> None:
        """Close the connection pool (the client is unusable afterwards)."""
        if self._runner is not None and self._client is not None:
            with contextlib.suppress(Exception):  # closing is best effort
                self._call(self._client.aclose())
            self._client = None
        if self._runner is not None:
            self._runner.stop()
            self._runner = None

    def __enter__(self) -> OpenAICompatibleLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _StreamStarted(Exception):
    """A stream failed after it had handed out text: retrying would repeat it."""


def _compile_template(source: str | None) -> Any:
    if source is None:
        return None
    jinja2 = require("jinja2", "api")
    sandbox = require("jinja2.sandbox", "api")

    def raise_exception(message: str) -> None:
        raise ValueError(f"the chat template refused the messages: {message}")

    env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                undefined=jinja2.Undefined)
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent)
    return env.from_string(source)


def _refusal(url: str, status: int, body: bytes) -> ServerError:
    text = body[:500].decode("utf-8", "replace")
    lowered = text.lower()
    if "context" in lowered and any(w in lowered for w in ("exceed", "length", "too long",
                                                          "maximum")):
        return _ContextLength(f"{url} refused the prompt as too long (HTTP {status}): {text}. "
                              "Shorten the prompt or the passages, or lower max_new_tokens")
    return ServerRequestError(f"{url} refused the request (HTTP {status}): {text}")


class _ContextLength(ServerRequestError, ContextLengthError):
    """The server's context window is too small for the prompt."""


def _first_choice(data: Any, url: str) -> dict[str, Any]:
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ServerReplyError(f"{url} sent a reply without choices[0]; not an OpenAI reply: "
                               f"{str(data)[:200]}")
    return choices[0]


def _field(obj: dict[str, Any], url: str, *path: str, kind: type, nullable: bool = False,
           optional: bool = False) -> Any:
    value: Any = obj
    for key in path:
        if not isinstance(value, dict) or key not in value:
            if optional:
                return None
            raise ServerReplyError(f"{url} sent a reply without choices[0].{'.'.join(path)}: "
                                   f"{str(obj)[:200]}")
        value = value[key]
    if value is None and nullable:
        return None
    if not isinstance(value, kind):
        raise ServerReplyError(f"{url}: choices[0].{'.'.join(path)} is "
                               f"{type(value).__name__}, expected {kind.__name__}")
    return value


def _logprob(value: Any, url: str, where: str) -> float:
    """``value`` as a log-probability (finite, <= 0 within :data:`LOGPROB_TOLERANCE`, clipped
    to 0), or a :class:`ServerLogprobError` naming the server and the entry."""
    problem = logprob_problem(float(value))
    if problem is not None:
        raise ServerLogprobError(
            f"{url} reported a log-probability that is not one ({where}: {problem}); "
            f"log-probabilities are finite and <= 0 (tolerance {LOGPROB_TOLERANCE:g}), so the "
            "server's logprobs are broken: no decision is read from them. Check the server "
            "(its logprobs option, its version) or use another one")
    return min(float(value), 0.0)


def _tops(entries: Any, k: int, url: str, where: str) -> list[TopLogprob]:
    pairs = sorted(((str(t), _logprob(v, url, f"{where}, alternative {str(t)!r}"))
                    for t, v in entries), key=lambda p: -p[1])[:k]
    return [TopLogprob(token=t, logprob=v, bytes=list(t.encode())) for t, v in pairs]


def _completion_logprobs(choice: dict[str, Any], url: str, k: int) -> list[TokenLogprob]:
    lp = choice.get("logprobs")
    if lp is None:
        return []
    try:
        tokens, values = lp["tokens"], lp["token_logprobs"]
        tops = lp.get("top_logprobs") or [None] * len(tokens)
        return [TokenLogprob(token=t, logprob=_logprob(v, url, f"token {i} {t!r}"),
                             bytes=list(t.encode()),
                             top_logprobs=_tops((top or {}).items(), k, url, f"token {i}"))
                for i, (t, v, top) in enumerate(zip(tokens, values, tops, strict=True))]
    except (KeyError, TypeError, ValueError) as exc:
        raise LogprobsMissingError(f"{url}: choices[0].logprobs is not in the completions shape "
                               f"(tokens, token_logprobs, top_logprobs): {str(lp)[:200]}"
                               ) from exc


def _chat_logprobs(choice: dict[str, Any], url: str, k: int) -> list[TokenLogprob]:
    lp = choice.get("logprobs")
    if lp is None:
        return []
    try:
        return [TokenLogprob(token=item["token"],
                             logprob=_logprob(item["logprob"], url,
                                              f"token {i} {item['token']!r}"),
                             bytes=item.get("bytes") or list(item["token"].encode()),
                             top_logprobs=_tops(((t["token"], t["logprob"])
                                                 for t in item.get("top_logprobs") or []), k,
                                                url, f"token {i}"))
                for i, item in enumerate(lp["content"] or [])]
    except (KeyError, TypeError, ValueError) as exc:
        raise LogprobsMissingError(f"{url}: choices[0].logprobs is not in the chat shape "
                               f"(content[].token/logprob/top_logprobs): {str(lp)[:200]}"
                               ) from exc


def _finish(text: str, tokens: list[TokenLogprob] | None, stops: tuple[str, ...],
            choice: dict[str, Any]) -> tuple[str, list[TokenLogprob] | None,
                                             Literal["stop", "length", "eos"]]:
    """Cut at a stop string the server left in (or was not sent), keep the log-probabilities
    of the tokens up to the one that completed it (as HFWhiteBoxLM and llama.cpp do), and
    name why generation ended."""
    found = find_stop(text, stops)
    if found is not None:
        text = text[: found[0]]
        if tokens is not None:
            kept, offset = [], 0
            for t in tokens:
                if offset >= found[1]:
                    break
                kept.append(t)
                offset += len(t.token)
            tokens = kept
        return text, tokens, "stop"
    reason = choice.get("finish_reason")
    if reason == "length":
        return text, tokens, "length"
    # vLLM names the stop string that matched (None at end-of-sequence); llama.cpp's server
    # says stop_type "word" or "eos". Others do not say: a stop with stop strings given is
    # read as a stop string.
    if "stop_reason" in choice:
        return text, tokens, "stop" if isinstance(choice["stop_reason"], str) else "eos"
    if "stop_type" in choice:
        return text, tokens, "stop" if choice["stop_type"] == "word" else "eos"
    return text, tokens, "stop" if stops and reason == "stop" else "eos"


def load_chat_template(source: str) -> str:
    """The Jinja chat template named by ``source``, for ``OpenAICompatibleLM(chat_template=)``:
    ``"default"`` (the embedded SmolLM2's), a template file, or a model directory holding
    ``chat_template.jinja`` or a ``tokenizer_config.json`` with one.

    Example:
        >>> template = load_chat_template("default")                  # doctest: +SKIP
        >>> lm = OpenAICompatibleLM(url, chat_template=template)      # doctest: +SKIP
    """
    if source == "default":
        from rag_gates.lm.defaults import load_default_tokenizer

        template = load_default_tokenizer().chat_template
        if not isinstance(template, str):
            raise ValueError("the embedded model's tokenizer carries no chat template")
        return template
    from rag_gates._files import read_json, read_text

    path = Path(source).expanduser()
    if path.is_file():
        return read_text(path)
    if path.is_dir():
        if (path / "chat_template.jinja").is_file():
            return read_text(path / "chat_template.jinja")
        config = path / "tokenizer_config.json"
        if config.is_file():
            template = read_json(config, finite=False, expect=dict,
                                 fix="it is not a tokenizer config").get("chat_template")
            if isinstance(template, str):
                return template
        raise ValueError(f"{path} holds no chat template (neither chat_template.jinja nor a "
                         "chat_template in tokenizer_config.json)")
    raise ValueError(f"chat template {source!r}: expected 'default' (the embedded model's), a "
                     "template file, or a model directory; no such file or directory")
