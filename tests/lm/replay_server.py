"""A local HTTP server on 127.0.0.1 that replays recorded OpenAI-API replies (a test fixture).

``record`` mode forwards every request to a real server (llama-cpp-python's) and keeps the
request and the raw reply; ``replay`` mode answers the same requests from the file, byte for
byte (streamed replies included). A request not in the file is answered 404 with the request
in the body, so a test that drifts from the recording fails loudly.

Tests can queue faults (``server.faults.append(("status", 429))``: a status with
``Retry-After: 0``, ``sleep`` seconds, ``malformed`` JSON, ``drop`` the connection, ``body``
replaced, ``echo_auth``: a status whose body and headers repeat the request's
``Authorization`` header, as some servers do; ``big``: a 200 body of that many bytes with a
``Content-Length``, ``big_chunked`` the same in chunks without one; ``reply``: a body made
by a function of the request's JSON, so concurrent requests each get their own) and set
``server.transform`` to edit replayed JSON (a server whose echo carries no prompt
log-probabilities, say). It records every request's headers for the API-key tests.

Re-record with ``RAG_GATES_RECORD_UPSTREAM=http://127.0.0.1:PORT/v1 pytest
tests/lm/test_openai_compat.py`` while a llama.cpp server runs the embedded GGUF (see
tests/server/conftest.py for how to start one): the tests then run through this server as a
recording proxy, and the file is rewritten when they end.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

RECORDING = Path(__file__).parent / "data" / "llamacpp-0.3.36.json"


def request_key(method: str, path: str, body: bytes) -> str:
    payload = json.loads(body) if body else None
    if isinstance(payload, dict):
        payload.pop("model", None)  # the recording machine's model path
    return json.dumps([method, path.split("/v1", 1)[-1], payload], sort_keys=True)


class ReplayServer:
    """``with ReplayServer() as server: server.url`` (the ``/v1`` root)."""

    def __init__(self, recording: Path = RECORDING, upstream: str | None = None) -> None:
        self.recording = recording
        self.upstream = upstream.rstrip("/") if upstream else None
        saved = {} if upstream else json.loads(recording.read_text())
        self.replies: dict[str, dict[str, Any]] = saved.get("replies", {})
        self.chat_template: str | None = saved.get("chat_template")
        self.faults: deque[tuple[str, Any]] = deque()
        self.transform: Callable[[str, dict[str, Any], Any], Any] | None = None
        self.headers_seen: list[dict[str, str]] = []
        self.requests: list[tuple[str, Any]] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,),
                                       daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> ReplayServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self.upstream:
            self.recording.write_text(json.dumps(
                {"server": "llama-cpp-python 0.3.36, SmolLM2-135M-Instruct.Q4_1.gguf, "
                           "--logits_all true", "chat_template": self.chat_template,
                 "replies": self.replies}, indent=1, sort_keys=True) + "\n")

    def answer(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        key = request_key(method, path, body)
        if self.upstream and key not in self.replies:  # a request seen before: its reply
            reply = httpx.request(method, self.upstream + path.split("/v1", 1)[-1],
                                  content=body or None, timeout=600,
                                  headers={"Content-Type": "application/json"})
            record = {"status": reply.status_code,
                      "type": reply.headers.get("content-type", "application/json"),
                      "body": reply.text}
            self.replies[key] = record
        else:
            record = self.replies.get(key)
            if record is None:
                return 404, "application/json", json.dumps({"error": "not recorded",
                                                            "key": key}).encode()
        text = record["body"]
        if self.transform is not None and record["type"].startswith("application/json"):
            payload = json.loads(body) if body else None
            text = json.dumps(self.transform(path, payload, json.loads(text)))
        return record["status"], record["type"], text.encode()


def _handler(server: ReplayServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _serve(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            with server.lock:
                server.headers_seen.append(dict(self.headers.items()))
                server.requests.append((self.path, json.loads(body) if body else None))
                fault = server.faults.popleft() if server.faults else ("ok", None)
                server.in_flight += 1
                server.max_in_flight = max(server.max_in_flight, server.in_flight)
            try:
                kind, arg = fault
                if kind == "sleep":
                    time.sleep(arg)
                if kind == "drop":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                if kind == "status":
                    self._send(arg, "application/json", b'{"error": "injected"}',
                               {"Retry-After": "0"})
                    return
                if kind == "body":
                    self._send(200, "application/json", arg)
                    return
                if kind == "reply":  # a body made from the request's JSON, whatever its order
                    self._send(200, "application/json", arg(json.loads(body)))
                    return
                if kind == "refuse":
                    self._send(400, "application/json", arg)
                    return
                if kind == "echo_auth":
                    auth = self.headers.get("Authorization", "")
                    self._send(arg, "application/json",
                               json.dumps({"error": {"message": "bad request",
                                                     "headers": {"authorization": auth}}}
                                          ).encode(), {"X-Echo-Authorization": auth})
                    return
                if kind == "big":
                    self._send(200, "application/json", b'{"pad": "' + b"x" * arg + b'"}')
                    return
                if kind == "big_chunked":
                    self._send_chunked(b'{"pad": "' + b"x" * arg + b'"}')
                    return
                status, ctype, payload = server.answer(method, self.path, body)
                if kind == "malformed":
                    payload = payload[: len(payload) // 2]
                self._send(status, ctype, payload)
            finally:
                with server.lock:
                    server.in_flight -= 1

        def _send(self, status: int, ctype: str, payload: bytes,
                  extra: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            try:
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeouts)
                self.close_connection = True

        def _send_chunked(self, payload: bytes, size: int = 4096) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for i in range(0, len(payload), size):
                    piece = payload[i:i + size]
                    self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):  # the client stopped reading
                self.close_connection = True

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

    return Handler
