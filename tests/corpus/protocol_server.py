"""A local HTTP server on 127.0.0.1 that speaks the public infini-gram API protocol.

It answers ``count`` queries from a local index with the infini-gram engine, the way the
public server does (``api/api_server.py`` of infini-gram): a string query is split on
``" AND "`` / ``" OR "`` into a CNF and each term tokenized with a leading space; ``query_ids``
is a list of ids or a triply nested CNF; the API's limits are enforced; errors come back as
``{"error": ...}``. Faults can be queued per request to test the client: slow replies, 5xx,
malformed JSON, dropped connections, bodies trickled byte by byte.
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rag_gates.corpus.index_format import engine_path
from rag_gates.corpus.tokenizer import CorpusTokenizer

MAX_QUERY_CHARS = 1000
MAX_QUERY_TOKENS = 500
MAX_CLAUSES_PER_CNF = 4
MAX_TERMS_PER_CLAUSE = 4
MAX_CLAUSE_FREQ = 500_000
MAX_DIFF_TOKENS = 1000

Fault = tuple[str, float]  # (kind, argument): ok, sleep, status, malformed, drop, trickle, error


class ProtocolServer:
    """Start with ``with ProtocolServer(index_dir, "test-index") as server: server.url``."""

    def __init__(self, index_dir: Path, index_name: str = "test-index") -> None:
        from infini_gram.engine import InfiniGramEngine

        self.index_name = index_name
        self.tokenizer = CorpusTokenizer.from_file(index_dir / "tokenizer.json")
        path, holder = engine_path(index_dir.resolve())
        try:
            self.engine = InfiniGramEngine(index_dir=path, eos_token_id=0, ds_prefetch_depth=0,
                                           sa_prefetch_depth=0, od_prefetch_depth=0)
        finally:
            if holder is not None:
                shutil.rmtree(holder, ignore_errors=True)
        self.faults: deque[Fault] = deque()
        self.default_fault: Fault = ("ok", 0.0)
        self.lock = threading.Lock()
        self.payloads: list[Any] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.client_ports: set[int] = set()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,),
                                       daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}/"

    def __enter__(self) -> ProtocolServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def queue(self, *faults: Fault) -> None:
        self.faults.extend(faults)

    def next_fault(self) -> Fault:
        with self.lock:
            return self.faults.popleft() if self.faults else self.default_fault

    # ----------------------------------------------------------------------------- protocol
    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(" " + text if text else text)

    def answer(self, payload: Any) -> dict[str, Any]:
        if not isinstance(payload, dict):
            return {"error": "payload must be a JSON object"}
        if payload.get("index") != self.index_name:
            return {"error": f"Invalid index: {payload.get('index')!r}"}
        if payload.get("query_type") != "count":
            return {"error": "only count queries are served here"}
        query, query_ids = payload.get("query"), payload.get("query_ids")
        if (query is None) == (query_ids is None):
            return {"error": "exactly one of query and query_ids must be given"}
        if query is not None:
            if not isinstance(query, str):
                return {"error": "query must be a string!"}
            if len(query) > MAX_QUERY_CHARS:
                return {"error": f"Please limit your input to <= {MAX_QUERY_CHARS} characters!"}
            if " AND " in query or " OR " in query:
                query_ids = [[self.tokenize(t) for t in c.split(" OR ")]
                             for c in query.split(" AND ")]
            else:
                query_ids = self.tokenize(query)
        start = time.perf_counter()
        if isinstance(query_ids, list) and all(type(i) is int for i in query_ids):
            if len(query_ids) > MAX_QUERY_TOKENS:
                return {"error": f"Please limit your input to <= {MAX_QUERY_TOKENS} tokens!"}
            result: dict[str, Any] = dict(self.engine.count(input_ids=query_ids))
        elif isinstance(query_ids, list) and all(
                isinstance(c, list) and all(isinstance(t, list) and all(type(i) is int for i in t)
                                            for t in c) for c in query_ids):
            if len(query_ids) > MAX_CLAUSES_PER_CNF or any(
                    len(c) > MAX_TERMS_PER_CLAUSE for c in query_ids):
                return {"error": "too many clauses or terms"}
            freq = payload.get("max_clause_freq")
            diff = payload.get("max_diff_tokens")
            if freq is not None and not (type(freq) is int and 0 < freq <= MAX_CLAUSE_FREQ):
                return {"error": f"max_clause_freq must be an integer in [1, {MAX_CLAUSE_FREQ}]!"}
            if diff is not None and not (type(diff) is int and 0 < diff <= MAX_DIFF_TOKENS):
                return {"error": f"max_diff_tokens must be an integer in [1, {MAX_DIFF_TOKENS}]!"}
            result = dict(self.engine.count_cnf(cnf=query_ids, max_clause_freq=freq,
                                                max_diff_tokens=diff))
        else:
            return {"error": "query_ids must be a list of integers, or a triply-nested list"}
        if "error" in result:
            return result
        result["latency"] = (time.perf_counter() - start) * 1000
        result["token_ids"] = query_ids
        return result


def _make_handler(server: ProtocolServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # Headers and body go out in separate writes; without this, Nagle's algorithm and
            # delayed ACKs add ~40 ms to every reply on a kept-alive connection.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, format: str, *args: Any) -> None:
            return None

        def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()

        def do_POST(self) -> None:
            with server.lock:
                server.in_flight += 1
                server.max_in_flight = max(server.max_in_flight, server.in_flight)
                server.client_ports.add(self.client_address[1])
            try:
                self._post()
            except (BrokenPipeError, ConnectionResetError, OSError):
                self.close_connection = True  # the client gave up; nothing to answer
            finally:
                with server.lock:
                    server.in_flight -= 1

        def _post(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            try:
                payload = json.loads(body)
            except json.JSONDecodeError:
                self._send(400, b'{"error": "malformed JSON payload"}')
                return
            with server.lock:
                server.payloads.append(payload)
            kind, arg = server.next_fault()
            if kind == "sleep":
                time.sleep(arg)
            elif kind == "status":
                headers = {"Retry-After": "0"} if int(arg) == 429 else None
                self._send(int(arg), b"Service Unavailable", headers)
                return
            elif kind == "malformed":
                self._send(200, b'{"count": 12, "appr')
                return
            elif kind == "error":
                self._send(200, b'{"error": "internal server error"}')
                return
            elif kind == "drop":
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            data = json.dumps(server.answer(payload)).encode("utf-8")
            if kind == "trickle":
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                for i in range(len(data)):
                    self.wfile.write(data[i:i + 1])
                    self.wfile.flush()
                    time.sleep(arg)
                return
            self._send(200, data)

    return Handler
