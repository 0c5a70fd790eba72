"""The HTTP side of :class:`~rag_gates.lm.openai_compat.OpenAICompatibleLM`: its options
(:class:`OpenAIConfig`) and :class:`OpenAITransport`, which sends one logical request with
retries.

The transport holds the client's private loop thread and connection pool (a
:class:`~rag_gates._http.ClientLoop`, as the hosted infini-gram client does), at most
``max_concurrency`` requests in flight, the API key header (read from the environment, sent
only as ``Authorization``, scrubbed from every reply as it is read), a per-attempt timeout,
bounded retries with backoff (``Retry-After`` honoured) inside a total deadline, and reply
bodies read in chunks up to ``max_response_bytes``. What the replies mean is read in
:mod:`rag_gates.lm.openai_replies`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rag_gates._http import (
    DEFAULT_MAX_RESPONSE_BYTES,
    ERROR_BODY_BYTES,
    ClientLoop,
    GaveUp,
    RetryableReply,
    check_api_key,
    check_server_url,
    read_body,
    read_lines,
    register_secret,
    retry_after_seconds,
    retryable_status,
    with_retries,
)
from rag_gates._json import JSONDepthError, loads_bounded
from rag_gates._optional import require
from rag_gates.errors import (
    ContextLengthError,
    ServerError,
    ServerReplyError,
    ServerRequestError,
    ServerTimeoutError,
    ServerUnavailableError,
)

__all__ = ["ContextLengthRefusal", "OpenAIConfig", "OpenAITransport", "StreamStarted",
           "refusal"]

logger = logging.getLogger(__name__)
T = TypeVar("T")


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


class OpenAITransport:
    """Requests to one OpenAI-compatible server, for every call of one
    :class:`~rag_gates.lm.openai_compat.OpenAICompatibleLM` (sync, async, from any thread).

    Example:
        >>> transport = OpenAITransport(OpenAIConfig(base_url="http://127.0.0.1:8000/v1"))
        >>> transport.call(transport.request("/models"))                 # doctest: +SKIP
        {'object': 'list', 'data': [{'id': 'smollm2', ...}]}
    """

    def __init__(self, config: OpenAIConfig) -> None:
        self.config = config
        self.base_url = config.base_url.rstrip("/")  # checked by OpenAIConfig
        self.requests_sent = 0
        self._loop = ClientLoop("rag-gates-openai")
        self._slots: asyncio.Semaphore | None = None
        self._secrets: tuple[bytes, ...] = ()  # scrubbed from every reply (the API key)

    # ------------------------------------------------------------------------------ the loop
    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the transport's loop thread."""
        return self._loop.submit(coro)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop thread and wait for its result."""
        # Each request enforces its own deadline; this is only a backstop.
        return self._loop.result(
            coro, timeout=self.config.timeout * 2 + 5.0,
            on_timeout=lambda: ServerTimeoutError(
                f"no answer from {self.base_url} within {self.config.timeout:.0f} s"))

    async def on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` run on the loop thread, from the caller's event loop."""
        return await self._loop.on_loop(coro)

    def close(self) -> None:
        """Close the connection pool and stop the loop thread (a later call starts anew)."""
        self._loop.close()

    # ------------------------------------------------------------------------------ requests
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

    def _new_client(self) -> Any:
        httpx = require("httpx", "api")
        n = self.config.max_concurrency
        self._slots = asyncio.Semaphore(n)
        return httpx.AsyncClient(limits=httpx.Limits(max_connections=n,
                                                     max_keepalive_connections=n),
                                 headers=self._headers(), trust_env=self.config.trust_env)

    async def request(self, path: str, payload: dict[str, Any] | None = None,
                       *, on_open: Callable[[Any], Coroutine[Any, Any, T]] | None = None
                       ) -> Any:
        """One logical request with retries. Without ``on_open`` the JSON reply is returned;
        with it, ``on_open(response)`` reads a streamed reply (retried only if it fails before
        it has read anything)."""
        client = self._loop.http(self._new_client)
        assert self._slots is not None  # made with the client
        url = f"{self.base_url}{path}"
        deadline = time.monotonic() + self.config.timeout

        async def attempt(per_try: float) -> Any:
            self.requests_sent += 1
            method = "GET" if payload is None else "POST"
            request = client.build_request(method, url, json=payload, timeout=per_try)
            async with asyncio.timeout(per_try):  # until the headers arrive
                response = await client.send(request, stream=True)
            try:
                if response.status_code < 400 and on_open is not None:
                    try:
                        async with asyncio.timeout(max(0.001, deadline - time.monotonic())):
                            return await on_open(response)
                    except StreamStarted as exc:  # failed after text was handed out: no retry
                        raise ServerUnavailableError(
                            f"{url} dropped a streamed reply after it had started: "
                            f"{exc.__cause__}") from exc
                async with asyncio.timeout(per_try):
                    body = await self._read(response, url)
            finally:
                await response.aclose()
            status = response.status_code
            if retryable_status(status):
                raise RetryableReply(f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}",
                                     retry_after_seconds(response.headers))
            if status >= 400:
                raise refusal(url, status, body)
            try:
                return loads_bounded(body, what=f"the reply of {url}")
            except JSONDepthError as exc:
                raise ServerReplyError(str(exc)) from None
            except ValueError as exc:
                raise ServerReplyError(
                    f"{url} answered HTTP {status} with a body that is not JSON: "
                    f"{body[:200]!r}") from exc

        def give_up(failure: GaveUp) -> Exception:
            if failure.timed_out:
                return ServerTimeoutError(
                    f"no answer from {url} within {self.config.timeout:.0f} s (retries "
                    "included); raise timeout= or check that the server is up")
            return ServerUnavailableError(
                f"{url} {failure.summary}. Check that the server is up, or raise "
                "max_retries/timeout")

        return await with_retries(
            attempt, policy=self.config, deadline=deadline, give_up=give_up, where=url,
            log=logger, timed_out="the attempt timed out", slots=self._slots,
            secrets=[s.decode("utf-8", "replace") for s in self._secrets])

    async def _read(self, response: Any, url: str) -> bytes:
        """A reply's body: bounded, scrubbed of the key (an error reply: its first 64 KiB)."""
        failed = response.status_code >= 400
        return await read_body(response, ERROR_BODY_BYTES if failed else
                               self.config.max_response_bytes, where=url,
                               setting="max_response_bytes", error=ServerReplyError,
                               secrets=self._secrets, truncate=failed)

    def lines(self, response: Any, url: str) -> AsyncIterator[str]:
        """A streamed reply's lines: bounded in all, scrubbed of the key."""
        return read_lines(response, self.config.max_response_bytes, where=url,
                          setting="max_response_bytes", error=ServerReplyError,
                          secrets=self._secrets)


class StreamStarted(Exception):
    """A stream failed after it had handed out text: retrying would repeat it."""


def refusal(url: str, status: int, body: bytes) -> ServerError:
    """The error for a refused request (HTTP 4xx): a too-long prompt as a
    :class:`ContextLengthRefusal`, anything else as a ServerRequestError."""
    text = body[:500].decode("utf-8", "replace")
    lowered = text.lower()
    if "context" in lowered and any(w in lowered for w in ("exceed", "length", "too long",
                                                          "maximum")):
        return ContextLengthRefusal(
            f"{url} refused the prompt as too long (HTTP {status}): {text}. Shorten the "
            "prompt or the passages, or lower max_new_tokens")
    return ServerRequestError(f"{url} refused the request (HTTP {status}): {text}")


class ContextLengthRefusal(ServerRequestError, ContextLengthError):
    """The server's context window is too small for the prompt."""
