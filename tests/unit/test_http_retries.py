"""The one retry loop of the HTTP clients (``rag_gates._http.with_retries``), against a real
HTTP server on 127.0.0.1 that answers from a script of statuses: what is retried, when it
gives up, and that a key never reaches the error or the debug log."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from rag_gates._http import GaveUp, RetryableReply, retryable_status, with_retries

SECRET = "sk-retry-test-0123456789abcdef"
LOG = logging.getLogger("rag_gates.test_http_retries")


class ScriptedServer:
    """Answers each request with the next status of ``script`` (then ``default``); the body
    of an error reply echoes the request's Authorization header, as some servers do."""

    def __init__(self) -> None:
        self.script: list[int] = []
        self.default = 200
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests += 1
                status = outer.script.pop(0) if outer.script else outer.default
                body = (b'{"ok": true}' if status < 400 else
                        f"failed; you sent {self.headers.get('Authorization')}".encode())
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # keep pytest's output clean
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"


@dataclass(frozen=True)
class Policy:
    max_retries: int = 3
    attempt_timeout: float = 2.0
    backoff_base: float = 0.0
    backoff_max: float = 0.0


class CallerRefused(Exception):
    """The caller's own error for a refused request (a 4xx)."""


class CallerUnavailable(Exception):
    """The caller's own error once the retries are spent."""


@pytest.fixture()
def server() -> Iterator[ScriptedServer]:
    srv = ScriptedServer()
    threading.Thread(target=srv.httpd.serve_forever, args=(0.02,), daemon=True).start()
    try:
        yield srv
    finally:
        srv.httpd.shutdown()
        srv.httpd.server_close()


def fetch(url: str, *, policy: Policy = Policy(), timeout: float = 10.0) -> Any:
    """One logical GET of ``url`` through ``with_retries``, written as a client writes it:
    the attempt reads the reply, raises RetryableReply for 429/5xx, the caller's error for
    another 4xx."""

    async def run() -> Any:
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {SECRET}"},
                                     trust_env=False) as client:

            async def attempt(per_try: float) -> Any:
                reply = await client.get(url, timeout=per_try)
                if retryable_status(reply.status_code):
                    raise RetryableReply(f"HTTP {reply.status_code}: {reply.text}")
                if reply.status_code >= 400:
                    raise CallerRefused(f"{url} refused (HTTP {reply.status_code})")
                return reply.json()

            def give_up(failure: GaveUp) -> Exception:
                return CallerUnavailable(f"{url} {failure.summary}. Try later")

            return await with_retries(
                attempt, policy=policy, deadline=time.monotonic() + timeout,
                give_up=give_up, where=url, log=LOG, timed_out="the attempt timed out",
                slots=asyncio.Semaphore(2), secrets=[SECRET])

    return asyncio.run(run())


def test_a_503_is_retried_then_the_reply_is_returned(server: ScriptedServer) -> None:
    server.script = [503, 503]
    assert fetch(server.url) == {"ok": True}
    assert server.requests == 3


def test_it_gives_up_after_the_budget_with_the_callers_error(server: ScriptedServer) -> None:
    server.default = 503
    with pytest.raises(CallerUnavailable) as info:
        fetch(server.url, policy=Policy(max_retries=2))
    assert server.requests == 3  # the first attempt and two retries, no more
    assert str(info.value).startswith(
        f"{server.url} failed after 3 attempt(s); last: HTTP 503: failed; you sent Bearer ")
    assert str(info.value).endswith(". Try later")


def test_a_400_is_not_retried(server: ScriptedServer) -> None:
    server.script = [400]
    with pytest.raises(CallerRefused, match=r"HTTP 400"):
        fetch(server.url)
    assert server.requests == 1


def test_the_key_an_error_body_echoes_reaches_neither_the_error_nor_the_log(
        server: ScriptedServer, caplog: pytest.LogCaptureFixture) -> None:
    server.default = 500
    with caplog.at_level(logging.DEBUG, logger=LOG.name), \
            pytest.raises(CallerUnavailable) as info:
        fetch(server.url, policy=Policy(max_retries=1))
    assert "Bearer ***" in str(info.value)  # the echo was there, scrubbed
    assert "retrying" in caplog.text
    assert SECRET not in str(info.value) + repr(info.value) + caplog.text


def test_transport_errors_are_retried_and_named() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(CallerUnavailable, match=r"failed after 2 attempt\(s\); last: Connect"):
        fetch(f"http://127.0.0.1:{port}/v1", policy=Policy(max_retries=1))


def test_no_retry_sleeps_past_the_deadline(server: ScriptedServer) -> None:
    server.default = 503
    start = time.monotonic()
    with pytest.raises(CallerUnavailable, match=r"failed after 1 attempt\(s\)"):
        fetch(server.url, policy=Policy(max_retries=5, backoff_base=5.0, backoff_max=5.0),
              timeout=1.0)
    assert server.requests == 1 and time.monotonic() - start < 1.0
