"""The package's index server (``rag_gates.corpus.serve``, the public infini-gram API protocol
over a local index) with faults that can be queued per request to test the client: slow
replies, 5xx, malformed JSON, error replies, dropped connections, bodies trickled byte by byte,
``huge`` bodies (a 200 reply of that many bytes), ``deep`` ones (nested that many levels).
It also records every payload, the requests in flight and the client ports.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from rag_gates.corpus.serve import IndexServer

Fault = tuple[str, float]  # (kind, argument): ok, sleep, status, malformed, drop, trickle, error,
#                            huge, deep


class ProtocolServer(IndexServer):
    """Start with ``with ProtocolServer(index_dir, "test-index") as server: server.url``."""

    def __init__(self, index_dir: Path, index_name: str = "test-index") -> None:
        super().__init__(index_dir, index_name=index_name, workers=8)
        self.faults: deque[Fault] = deque()
        self.default_fault: Fault = ("ok", 0.0)
        self.lock = threading.Lock()
        self.payloads: list[Any] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.client_ports: set[int] = set()

    @property
    def engine(self) -> Any:
        """infini-gram's own engine over the same index (to compare with its AND query)."""
        return self.stats.engine

    def queue(self, *faults: Fault) -> None:
        self.faults.extend(faults)

    def next_fault(self) -> Fault:
        with self.lock:
            return self.faults.popleft() if self.faults else self.default_fault

    def reply(self, handler: Any, body: bytes) -> None:
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.client_ports.add(handler.client_address[1])
        try:
            self._faulty_reply(handler, body)
        finally:
            with self.lock:
                self.in_flight -= 1

    def _faulty_reply(self, handler: Any, body: bytes) -> None:
        try:
            payload = json.loads(body)
        except json.JSONDecodeError:
            payload = None
        with self.lock:
            self.payloads.append(payload)
        kind, arg = self.next_fault()
        if kind == "sleep":
            time.sleep(arg)
        elif kind == "status":
            headers = {"Retry-After": "0"} if int(arg) == 429 else None
            handler.send_raw(int(arg), b"Service Unavailable", headers)
            return
        elif kind == "malformed":
            handler.send_raw(200, b'{"count": 12, "appr')
            return
        elif kind == "huge":
            handler.send_raw(200, b'{"count": 1, "pad": "' + b"x" * int(arg) + b'"}')
            return
        elif kind == "deep":
            handler.send_raw(200, b"[" * int(arg) + b"]" * int(arg))
            return
        elif kind == "error":
            handler.send_raw(200, b'{"error": "internal server error"}')
            return
        elif kind == "drop":
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        status, data = self.respond(body)
        if kind == "trickle":
            raw = json.dumps(data).encode("utf-8")
            handler.send_response(status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(raw)))
            handler.end_headers()
            for i in range(len(raw)):
                handler.wfile.write(raw[i:i + 1])
                handler.wfile.flush()
                time.sleep(arg)
            return
        handler.send_json(status, data)

