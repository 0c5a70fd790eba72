"""Plumbing shared by the HTTP clients (model servers, hosted corpus indexes): a private event
loop on a daemon thread, so sync, batch and async calls from any thread share one connection
pool and one concurrency bound; the retry loop (:func:`with_retries`: bounded attempts,
exponential backoff with jitter, ``Retry-After`` honoured, never past the call's deadline);
and the two rules every reply and every server URL pass through here:

* **Secrets stay out** (:func:`check_server_url`, :func:`scrub`): a URL carrying credentials
  (``user:KEY@host``) or a query string (``?api_key=...``) is refused, and the refusal shows
  the URL with those parts replaced by ``***``; every reply body is scrubbed of the client's
  API key as it is read, so an error, a log line or a trace built from it cannot repeat the
  key (some servers echo the ``Authorization`` header in their error bodies). A key a client
  sends is also registered (:func:`register_secret`) with a filter on httpx's and httpcore's
  loggers, whose debug lines print response headers, which such a server fills with it.
* **Replies are bounded** (:func:`read_body`, :func:`read_lines`): a body is read in chunks and
  refused at ``limit`` bytes (:data:`DEFAULT_MAX_RESPONSE_BYTES` unless configured), before it
  is parsed; the error names the limit and the option that raises it.

Example:
    >>> runner = LoopThread("example")
    >>> async def two() -> int:
    ...     return 2
    >>> runner.submit(two()).result()
    2
    >>> runner.stop()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import random
import re
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from rag_gates._fork import rebuild_after_fork

__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "ERROR_BODY_BYTES",
    "MIN_SECRET_CHARS",
    "RETRY_STATUS",
    "SERVED_PREFIX",
    "ClientLoop",
    "GaveUp",
    "LoopThread",
    "RetryPolicy",
    "RetryableReply",
    "backoff_delay",
    "check_api_key",
    "check_served_spec",
    "check_server_url",
    "is_http_url",
    "looks_like_server",
    "read_body",
    "read_lines",
    "redact_url",
    "register_secret",
    "retry_after_seconds",
    "retryable_status",
    "scrub",
    "scrub_text",
    "with_retries",
]

T = TypeVar("T")

#: The largest reply body a client reads (32 MiB): far above any real count or completion
#: reply (an echoed 4,000-token prompt with 20 alternatives per token is about 3 MB).
DEFAULT_MAX_RESPONSE_BYTES = 32 * 1024 * 1024
#: How much of an error reply (4xx/5xx) is read: enough for the server's message.
ERROR_BODY_BYTES = 64 * 1024
_REDACTED = "***"
# Everything between the scheme (if any) and the last '@' before the query: the authority's
# credentials, and a password holding a '/' (``user:pa/ss@host``, which a URL parser reads as
# a path).
_USERINFO = re.compile(r"^((?:[A-Za-z][A-Za-z0-9+.-]*:)?//)?[^?#]*@")
_QUERY = re.compile(r"\?[^#]*")
# An authority with credentials, or a host:port, before any '/': a server without a scheme.
_SCHEMELESS = re.compile(r"^(?:[^/?#]*@|[A-Za-z0-9.-]+:\d+(?:[/?#]|$))")
# The loggers of the HTTP stack this package uses (httpcore's debug lines print headers).
_HTTP_LOGGERS = ("httpx", "httpcore.connection", "httpcore.http11", "httpcore.http2",
                 "httpcore.proxy", "httpcore.socks")
#: Shorter "keys" are placeholders ("EMPTY", "none"), not secrets: scrubbing them would change
#: model output that happens to contain the word.
MIN_SECRET_CHARS = 8
_SECRETS: set[str] = set()
_SECRETS_LOCK = threading.Lock()


class _ScrubSecrets(logging.Filter):
    """Rewrites a record whose text holds a registered secret, with ``***`` in its place."""

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = tuple(_SECRETS)
        if not secrets:
            return True
        text = record.getMessage()
        if any(s in text for s in secrets):
            for secret in secrets:
                text = text.replace(secret, _REDACTED)
            record.msg, record.args = text, None
        return True


_FILTER = _ScrubSecrets()


def register_secret(secret: str) -> None:
    """Keep ``secret`` (an API key a client sends) out of httpx's and httpcore's log lines
    from now on, in this process (unless it is a placeholder shorter than
    :data:`MIN_SECRET_CHARS`).

    Example:
        >>> register_secret("sk-example-key")
    """
    if len(secret) < MIN_SECRET_CHARS:
        return
    with _SECRETS_LOCK:
        _SECRETS.add(secret)
        for name in _HTTP_LOGGERS:
            log = logging.getLogger(name)
            if _FILTER not in log.filters:
                log.addFilter(_FILTER)

# Statuses worth another try: timeouts, rate limits, and the server's own failures.
RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


class LoopThread:
    """A private asyncio loop on a daemon thread, shared by every call of one client."""

    def __init__(self, name: str) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        if self.pid != os.getpid():  # a forked child's copy: the loop and thread are the parent's
            return
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        if not self.loop.is_running():
            self.loop.close()


class ClientLoop:
    """The private loop thread of one HTTP client object and the httpx client living on it,
    shared by every call of that object (sync, batch and async, from any thread), so they
    share one connection pool and one concurrency bound.

    Both are made on first use; in a forked child they are made afresh (the parent's are kept
    referenced, never closed from the child); :meth:`close` closes the client and stops the
    thread, as does the loop object's collection.

    Example:
        >>> loop = ClientLoop("rag-gates-example")
        >>> async def answer() -> int:
        ...     return 42
        >>> loop.result(answer(), timeout=5.0, on_timeout=lambda: TimeoutError("no answer"))
        42
        >>> loop.close()
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._runner: LoopThread | None = None
        self.client: Any = None
        self._parents: list[Any] = []  # a forked child's inherited loop and client, unused
        rebuild_after_fork(self)

    def _after_fork(self) -> None:
        self._parents.append((self._runner, self.client))
        self._lock = threading.Lock()
        self._runner, self.client = None, None

    @property
    def runner(self) -> LoopThread:
        """The loop thread, started on first use."""
        with self._lock:
            if self._runner is None:
                self._runner = LoopThread(self.name)
                weakref.finalize(self, LoopThread.stop, self._runner)
            return self._runner

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop thread."""
        return self.runner.submit(coro)

    def result(self, coro: Coroutine[Any, Any, T], *, timeout: float,
               on_timeout: Callable[[], Exception]) -> T:
        """Run ``coro`` on the loop thread and wait for it; after ``timeout`` seconds (a
        backstop: each request keeps its own deadline) cancel it and raise ``on_timeout()``."""
        future = self.submit(coro)
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise on_timeout() from exc

    async def on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` run on the loop thread, from another event loop."""
        return await asyncio.wrap_future(self.submit(coro))

    def http(self, make: Callable[[], Any]) -> Any:
        """The httpx client; on the loop thread, made by ``make()`` on first use (again after
        a fork, so ``make`` also makes whatever belongs to the client's loop: semaphores)."""
        if self.client is None:
            self.client = make()
        return self.client

    def close(self) -> None:
        """Close the client (best effort, 5 s at most) and stop the loop thread."""
        runner, self._runner = self._runner, None
        client, self.client = self.client, None
        if runner is None:
            return
        if client is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(client.aclose(), runner.loop).result(5)
        runner.stop()


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """The ``Retry-After`` header in seconds, when it is a number."""
    value = headers.get("Retry-After")
    if value is None:
        return None
    with contextlib.suppress(ValueError):
        return float(value)
    return None


def backoff_delay(attempt: int, retry_after: float | None, base: float, cap: float) -> float:
    """Seconds to wait before retry ``attempt + 1``: the server's ``Retry-After`` when given
    (capped), else ``base * 2**attempt`` (capped) with jitter so clients do not retry in step."""
    if retry_after is not None:
        return min(cap, max(0.0, retry_after))
    return float(min(cap, base * (2 ** attempt)) * random.uniform(0.5, 1.0))


def retryable_status(status: int) -> bool:
    """Is an HTTP ``status`` worth another try (:data:`RETRY_STATUS`, or any 5xx)?

    Example:
        >>> retryable_status(503), retryable_status(429), retryable_status(400)
        (True, True, False)
    """
    return status in RETRY_STATUS or status >= 500


class RetryPolicy(Protocol):
    """The retry options a client's config carries (``HostedConfig`` and ``OpenAIConfig``
    both do): read, never set."""

    @property
    def max_retries(self) -> int:
        """Retries after the first attempt."""
        ...

    @property
    def attempt_timeout(self) -> float:
        """Seconds one attempt may take (the call's deadline may cut it shorter)."""
        ...

    @property
    def backoff_base(self) -> float:
        """The first backoff, seconds."""
        ...

    @property
    def backoff_max(self) -> float:
        """The largest backoff, seconds."""
        ...


class RetryableReply(Exception):
    """Raised by an attempt of :func:`with_retries` for a reply worth another try (a 429 or
    5xx, a malformed body). ``reason`` names it in the final error and the debug log (after
    :func:`scrub_text` with the client's secrets); ``retry_after``: the server's
    ``Retry-After`` in seconds, if it sent one."""

    reason: str
    retry_after: float | None

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


@dataclass(frozen=True)
class GaveUp:
    """How a call's retries ended, for the caller to build its own error from.

    ``attempts``: attempts made; ``last``: the last failure (a :class:`RetryableReply`'s
    reason or the transport error, scrubbed of the client's secrets, or the caller's words
    for a timed-out attempt); ``timed_out``: the last attempt timed out at the call's
    deadline.
    """

    attempts: int
    last: str
    timed_out: bool

    @property
    def summary(self) -> str:
        """``failed after N attempt(s); last: ...``, the words both clients' errors use."""
        return f"failed after {self.attempts} attempt(s); last: {self.last}"


async def with_retries(attempt: Callable[[float], Awaitable[T]], *, policy: RetryPolicy,
                       deadline: float, give_up: Callable[[GaveUp], Exception],
                       where: str, log: logging.Logger, timed_out: str,
                       slots: asyncio.Semaphore | None = None,
                       secrets: Sequence[str | None] = ()) -> T:
    """One logical request: ``await attempt(per_try)`` until it returns, at most
    ``policy.max_retries + 1`` times, each under ``slots`` (the client's bound on requests
    in flight) and given ``per_try`` seconds (``policy.attempt_timeout``, cut to what is
    left before ``deadline``, a ``time.monotonic()`` value).

    An attempt is retried when it raises :class:`RetryableReply`, times out (``TimeoutError``
    or httpx's), or fails in transport (refused, reset, dropped mid-reply); anything else it
    raises (a refusal, an unreadable reply) ends the call as it is. Between attempts it waits
    :func:`backoff_delay`, and gives up early rather than sleep past ``deadline``. Once it
    gives up it raises ``give_up(GaveUp(...))``. Every failure's words (a transport error's,
    a :class:`RetryableReply`'s reason) pass through :func:`scrub_text` with ``secrets`` (the
    keys the client sends) before they are kept, so neither the error nor the debug line
    (``log``, naming ``where``) can repeat a key; ``timed_out`` is the reason a timed-out
    attempt is given.

    Example:
        >>> replies = [503, 200]
        >>> async def flaky(per_try: float) -> int:
        ...     status = replies.pop(0)
        ...     if retryable_status(status):
        ...         raise RetryableReply(f"HTTP {status}")
        ...     return status
        >>> class Policy:
        ...     max_retries, attempt_timeout, backoff_base, backoff_max = 2, 1.0, 0.0, 0.0
        >>> asyncio.run(with_retries(
        ...     flaky, policy=Policy(), deadline=time.monotonic() + 5,
        ...     give_up=lambda g: RuntimeError(g.summary), where="example",
        ...     log=logging.getLogger("example"), timed_out="timed out"))
        200
    """
    # The caller's client is an httpx client, so httpx is installed (imported here, not at
    # the top: this module is imported by clients whose extra may not be installed).
    import httpx

    shown = [s for s in secrets if s]
    last = "no attempt made"
    attempts = 0
    for number in range(policy.max_retries + 1):
        attempts = number + 1
        retry_after: float | None = None
        try:
            async with slots if slots is not None else contextlib.nullcontext():
                per_try = max(0.001, min(policy.attempt_timeout, deadline - time.monotonic()))
                return await attempt(per_try)
        except RetryableReply as reply:
            # Fail closed: a reply body is scrubbed as it is read, and once more here.
            last, retry_after = scrub_text(reply.reason, shown), reply.retry_after
        except (TimeoutError, httpx.TimeoutException):
            last = timed_out
        except httpx.TransportError as exc:  # refused, reset, dropped mid-reply, ...
            last = scrub_text(f"{type(exc).__name__}: {exc}", shown)
        if number == policy.max_retries:
            break
        delay = backoff_delay(number, retry_after, policy.backoff_base, policy.backoff_max)
        if time.monotonic() + delay >= deadline:
            break
        log.debug("retrying %s after %s (%.2f s)", where, last, delay)
        await asyncio.sleep(delay)
    raise give_up(GaveUp(attempts=attempts, last=last,
                         timed_out=last == timed_out and time.monotonic() >= deadline - 0.05))


def redact_url(url: str) -> str:
    """``url`` with any credentials (``user:password@``) and query string replaced by ``***``,
    safe to show in an error or a log line.

    Example:
        >>> redact_url("http://user:sk-123@host:8000/v1?key=sk-123")
        'http://***@host:8000/v1?***'
    """
    shown = _USERINFO.sub(lambda m: f"{m.group(1) or ''}{_REDACTED}@", url, count=1)
    return _QUERY.sub(f"?{_REDACTED}", shown, count=1)


def is_http_url(text: str) -> bool:
    """Does ``text`` start with an ``http://`` or ``https://`` scheme, in any case (a URL's
    scheme is case-insensitive: ``HTTP://host`` is a server, not a local path)?

    Example:
        >>> is_http_url("HTTP://host:6333"), is_http_url("indexes/qdrant")
        (True, False)
    """
    return text[:8].lower().startswith(("http://", "https://"))


def looks_like_server(text: str) -> bool:
    """Does ``text`` look like a server address given without its scheme
    (``user:key@host:6333``, ``host:6333/path``), which must not be taken as a local path
    (an error naming that path would show the credentials)?

    Example:
        >>> looks_like_server("admin:KEY@host:6333"), looks_like_server("localhost:6333")
        (True, True)
        >>> looks_like_server("/data/qdrant"), looks_like_server("indexes/qdrant")
        (False, False)
    """
    return is_http_url(text) or "://" in text or _SCHEMELESS.match(text) is not None


def check_server_url(url: str, what: str, key_hint: str) -> str:
    """Return ``url`` if it is an ``http(s)://HOST...`` URL without credentials or a query
    string; else raise ValueError showing it only through :func:`redact_url`. The one check
    of every server URL a client is given (a URL ends up in reprs, traces, run directories
    and httpx's logs, so a secret in it would too). ``key_hint`` says where a key goes.

    Example:
        >>> check_server_url("http://127.0.0.1:8000/v1", "base_url", "")
        'http://127.0.0.1:8000/v1'
    """
    shown = redact_url(url)
    if not is_http_url(url):
        raise ValueError(f"{what} must start with http:// or https://, got {shown!r}")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        # A space pasted with the URL went into every request path ('/v1 /completions'),
        # and urlsplit drops tabs and newlines silently.
        raise ValueError(f"{what} {shown!r} holds whitespace or a control character: "
                         "remove it")
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:  # e.g. an unclosed '[' of an IPv6 address
        host = None
    if not host:
        raise ValueError(f"{what} names no host: {shown!r}")
    try:
        parts.port  # noqa: B018 - raises on a port that is no number
    except ValueError:
        raise ValueError(f"{what} {shown!r} has a port that is not a number from 0 to "
                         f"65535 (or a password holding ':' or '/'): give "
                         f"http(s)://HOST:PORT/PATH. {key_hint}") from None
    if "@" in parts.netloc or "@" in parts.path:  # a password holding '/' ends in the path
        raise ValueError(f"{what} {shown!r} carries credentials (user:password@), which would "
                         f"be shown in reprs, traces and logs: remove them. {key_hint}")
    if parts.query:
        raise ValueError(f"{what} {shown!r} carries a query string, which would be shown in "
                         f"reprs, traces and logs (and may hold a key): remove it. {key_hint}")
    return url


#: The prefix of a served model's ``--model`` value: ``openai:URL[#model-name]``.
SERVED_PREFIX = "openai:"


def check_served_spec(spec: str) -> None:
    """Refuse an ``openai:URL`` whose URL carries credentials or a query string, without
    repeating them: a run directory or spec records the value, and an API key belongs in the
    environment (the check is :func:`check_server_url`, as for the client)."""
    url = spec[len(SERVED_PREFIX):].partition("#")[0]
    check_server_url(url, "the URL of --model openai:http(s)://HOST[:PORT]/PATH[#model-name]",
                     "Put the API key in the environment variable OPENAI_API_KEY")


def check_api_key(key: str, where: str) -> str:
    """``key`` if an HTTP header can carry it; else ValueError naming ``where`` (the
    option or environment variable it came from) and never the key. A key read from a
    file keeps its trailing newline, and the HTTP stack's refusal of such a header
    ("Illegal header value b'Bearer KEY\\n'") would print the key, escaped so that no
    scrub of the key as sent matches it.

    Example:
        >>> check_api_key("sk-example-key", "OPENAI_API_KEY")
        'sk-example-key'
    """
    if key != key.strip() or any(ord(c) < 0x20 or ord(c) == 0x7F for c in key):
        raise ValueError(f"the API key in {where} has leading or trailing whitespace or a "
                         "control character (a newline kept from a file?): strip it")
    if not key.isascii():  # else the HTTP stack's bare UnicodeEncodeError, naming nothing
        raise ValueError(f"the API key in {where} holds a character that is not ASCII (a "
                         "typographic quote pasted with it?): an HTTP header cannot carry "
                         "it; copy the key again")
    return key


def _variants(secret: str) -> list[str]:
    """A secret as sent, stripped, and as Python's repr escapes it (a header refusal
    prints ``b'KEY\\n'``): each form a message may show."""
    forms = {secret, secret.strip(), repr(secret)[1:-1]}
    return sorted((f for f in forms if len(f) >= MIN_SECRET_CHARS), key=len, reverse=True)


def scrub(data: bytes, secrets: Sequence[bytes]) -> bytes:
    """``data`` with every occurrence of each secret replaced by ``***`` (secrets shorter than
    :data:`MIN_SECRET_CHARS` are placeholders, left alone).

    Example:
        >>> scrub(b'{"auth": "Bearer sk-123456"}', [b"sk-123456"])
        b'{"auth": "Bearer ***"}'
    """
    for secret in secrets:
        if len(secret) >= MIN_SECRET_CHARS:
            data = data.replace(secret, _REDACTED.encode())
    return data


def scrub_text(text: str, secrets: Sequence[str | None]) -> str:
    """``text`` (an error message, a server's reply) with each secret sent and any URL
    credentials or query string replaced by ``***``: the one scrub of every message built
    from a remote server's words (placeholders shorter than :data:`MIN_SECRET_CHARS` stay).

    Example:
        >>> scrub_text("403: bad key sk-123456 for http://u:sk-123456@h/x?k=1", ["sk-123456"])
        '403: bad key *** for http://***@h/x?***'
    """
    for secret in secrets:
        for form in _variants(secret) if secret else ():
            text = text.replace(form, _REDACTED)
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)


_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def _too_large(where: str, limit: int, setting: str) -> str:
    return (f"{where} sent a reply larger than {limit:,} bytes ({setting}={limit}); it was "
            f"refused without reading the rest. If the server's replies really are this "
            f"large, raise {setting}")


async def read_body(response: Any, limit: int, *, where: str, setting: str,
                    error: Callable[[str], Exception], secrets: Sequence[bytes] = (),
                    truncate: bool = False) -> bytes:
    """The body of an httpx streamed ``response``, read in chunks, at most ``limit`` bytes
    (after decompression), scrubbed of ``secrets``. Beyond the limit: with ``truncate`` the
    first ``limit`` bytes (an error reply, read only for its message); else
    ``error(message)`` is raised, naming the limit and ``setting`` (the option to raise)."""
    declared = response.headers.get("Content-Length")
    if not truncate and declared is not None and declared.isdigit() and int(declared) > limit:
        raise error(_too_large(where, limit, setting))
    chunks: list[bytes] = []
    total = 0
    async for chunk in response.aiter_bytes():
        total += len(chunk)
        if total > limit:
            if not truncate:
                raise error(_too_large(where, limit, setting))
            chunks.append(chunk[: len(chunk) - (total - limit)])
            break
        chunks.append(chunk)
    return scrub(b"".join(chunks), secrets)


async def read_lines(response: Any, limit: int, *, where: str, setting: str,
                     error: Callable[[str], Exception], secrets: Sequence[bytes] = ()
                     ) -> AsyncIterator[str]:
    """The lines of a streamed (server-sent events) ``response``, scrubbed of ``secrets``;
    ``error(message)`` is raised once the stream has sent more than ``limit`` bytes in all,
    so neither one endless line nor an endless stream is held in memory."""
    total = 0
    line = bytearray()  # the line being read: appended to, never copied whole per chunk
    async for chunk in response.aiter_bytes():
        total += len(chunk)
        if total > limit:
            raise error(_too_large(where, limit, setting))
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            line += chunk[start:end]
            yield scrub(bytes(line), secrets).decode("utf-8", "replace").rstrip("\r")
            line.clear()
            start = end + 1
        line += chunk[start:]
    if line:
        yield scrub(bytes(line), secrets).decode("utf-8", "replace").rstrip("\r")
