"""``rag-gates index serve``: one local index shared over HTTP in the infini-gram API's protocol.

Many application processes (workers of a web app, benchmark runs, agents) can share one index
instead of each mapping its files: point :class:`~rag_gates.corpus.HostedInfiniGram` at the
server (``HostedInfiniGram("my-index", tokenizer=..., url=server.url)``) and every component
that takes a :class:`~rag_gates.corpus.CorpusStats` (``QuCoGate``, ``ClaimVerifier``) works
unchanged.

The protocol is the public API's (``https://api.infini-gram.io/``, ``api/api_server.py`` of
infini-gram), restricted to what the client uses:

* ``POST /`` with a JSON object ``{"index": NAME, "query_type": "count", "query": text}`` or
  ``"query_ids": [ids]`` answers ``{"count", "approx", "latency", "token_ids", "tokens"}``; a
  string query is tokenized with a leading space (as the public GPT-2/OLMo indexes do) and
  split on ``" AND "`` / ``" OR "``; ``query_ids`` may be a triply nested CNF (at most 4
  clauses of at most 4 terms) with ``max_diff_tokens`` (<= 1000) and ``max_clause_freq``
  (<= 500,000).
* Errors are ``{"error": message}``: HTTP 400 for a malformed request (bad JSON, unknown index
  or field, a query type other than ``count``), HTTP 200 for a query the index cannot answer
  (as the public server does), 400 for a body nested deeper than :data:`MAX_JSON_DEPTH`
  levels (refused before it is parsed) or a query holding a lone surrogate (text that cannot
  be encoded as UTF-8), 413 for a body over ``max_body_bytes``, 411 without a
  ``Content-Length``, 404 for a path other than ``/``, 405 for other methods, 503 with
  ``Retry-After`` when a lookup misses ``request_timeout`` or the server is closing.

Counts are exact (a suffix-array lookup). The AND query counts occurrences of the rarest
clause with an occurrence of every other clause starting within ``max_diff_tokens`` tokens in
the same document, computed exactly (:meth:`LocalInfiniGram.cnf_occurrences`): the public
engine's undercount on short documents does not happen here. On a lower-cased index, ids are
decoded, lower-cased and encoded again, so cased clients still find matches; for counts equal
to the local backend's, give the client ``lowercase=True`` (otherwise " Romeo" and "Romeo",
two variants it keeps apart, both become "romeo"'s matches and are summed). Count replies
carry ``"lowercase"`` so a client can tell.

Safety: the index is fixed when the server starts; no path or file name from a request is ever
opened (a request can only name the served index, and unknown fields are refused). Bodies are
bounded in size and depth, a slow client is dropped after ``io_timeout`` seconds, a lookup
gets ``request_timeout`` seconds, and at most ``workers`` lookups run at once. Connections
wait in a listen backlog of ``backlog`` (128), so a burst of clients that each open a new
connection is queued, not reset.

Example:
    >>> from rag_gates.corpus import HostedInfiniGram                    # doctest: +SKIP
    >>> with serve_index("indexes/wiki", port=0) as server:               # doctest: +SKIP
    ...     stats = HostedInfiniGram(server.index_name, tokenizer="indexes/wiki/tokenizer.json",
    ...                              url=server.url)
    ...     stats.count("Honolulu").value
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rag_gates._json import JSONDepthError, loads_bounded
from rag_gates._text import check_encodable
from rag_gates.corpus.local import LocalInfiniGram

__all__ = ["IndexServer", "ServeConfig", "serve_index"]

logger = logging.getLogger(__name__)

MAX_QUERY_CHARS = 1000
MAX_QUERY_TOKENS = 500
MAX_CLAUSES_PER_CNF = 4
MAX_TERMS_PER_CLAUSE = 4
MAX_CLAUSE_FREQ = 500_000
MAX_DIFF_TOKENS = 1000
#: The deepest a request may nest: an object holding a CNF query (three list levels) is 4.
MAX_JSON_DEPTH = 8
_ENVELOPE = frozenset({"index", "corpus", "query_type", "query", "query_ids"})
_CNF_OPTIONS = frozenset({"max_clause_freq", "max_diff_tokens"})
_QUERY_TYPES = ("count",)


class ServeConfig(BaseModel):
    """Options of :class:`IndexServer` (``rag-gates index serve``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field("127.0.0.1", description="Address to listen on (127.0.0.1: this machine "
                                               "only; 0.0.0.0: every interface).")
    port: int = Field(0, ge=0, le=65535, description="Port; 0 picks a free one.")
    index_name: str | None = Field(None, min_length=1, max_length=200,
                                   description="Name clients send as 'index' (default: the "
                                               "index's own name).")
    max_body_bytes: int = Field(64 * 1024, ge=256, le=16 * 1024 * 1024,
                                description="Larger request bodies get HTTP 413.")
    request_timeout: float = Field(10.0, gt=0, le=3600,
                                   description="Seconds a lookup may take before the request "
                                               "is answered 503 (retryable).")
    io_timeout: float = Field(30.0, gt=0, le=3600,
                              description="Seconds a connection may stay silent (slow bodies, "
                                          "idle keep-alive) before it is closed.")
    workers: int = Field(4, ge=1, le=256, description="Lookups computed at once; further "
                                                      "requests wait (within request_timeout).")
    backlog: int = Field(128, ge=1, le=65535,
                         description="Connections the operating system queues before the "
                                     "server accepts them (the listen backlog; beyond it new "
                                     "connections are reset). Capped by the system's "
                                     "net.core.somaxconn.")


class _Refused(Exception):
    """A request answered with an error JSON and an HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(type(i) is int for i in value)


def _is_cnf(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(c, list) and c and all(_is_ids(t) for t in c) for c in value)


class IndexServer:
    """A local infini-gram index served over HTTP in the hosted API's protocol.

    Args:
        directory: the index (built by ``rag-gates index build``); opened once, read-only.
        config: a :class:`ServeConfig`; keyword overrides (``port=8765``) also work.
        **local_options: options of the :class:`LocalInfiniGram` that answers (e.g.
            ``check_digests="require"``).

    Example:
        >>> with IndexServer("indexes/wiki", port=0).start() as server:   # doctest: +SKIP
        ...     print(server.url, server.index_name)
    """

    def __init__(self, directory: str | os.PathLike[str], config: ServeConfig | None = None,
                 local_options: dict[str, Any] | None = None, **overrides: Any) -> None:
        base = config or ServeConfig()
        self.config = (ServeConfig.model_validate({**base.model_dump(), **overrides})
                       if overrides else base)
        self.stats = LocalInfiniGram(directory, **(local_options or {}))
        self.index_name = self.config.index_name or self.stats.index_name
        self.tokenizer = self.stats.tokenizer
        self._pool = concurrent.futures.ThreadPoolExecutor(
            self.config.workers, thread_name_prefix="rag-gates-index-serve")
        try:
            self.httpd = _HTTPServer((self.config.host, self.config.port),
                                     _make_handler(self), self.config.backlog)
        except OSError:
            self._pool.shutdown(wait=False)
            self.stats.close()
            raise
        self._thread: threading.Thread | None = None
        self._closed = False
        self._close_lock = threading.Lock()

    # ----------------------------------------------------------------------------- lifecycle
    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return f"http://{shown!s}:{port}/"

    def start(self) -> IndexServer:
        """Serve on a background thread; returns self (for ``with server.start():``)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                            name="rag-gates-index-serve", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop accepting, let running lookups finish, release the index. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(timeout=10)
        self.httpd.server_close()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.stats.close()

    def __enter__(self) -> IndexServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------- protocol
    def tokenize(self, text: str) -> list[int]:
        """Token ids of a string query, as the public server tokenizes (a leading space)."""
        return self.tokenizer.encode(" " + text if text else text)

    def respond(self, body: bytes) -> tuple[int, dict[str, Any]]:
        """Status and JSON object answering one request body (never raises)."""
        try:
            payload = loads_bounded(body, max_depth=MAX_JSON_DEPTH, what="the request body")
        except JSONDepthError as exc:
            return 400, {"error": str(exc)}
        except (json.JSONDecodeError, UnicodeDecodeError):
            return 400, {"error": "malformed JSON payload"}
        try:
            query_ids, options = self._parse(payload)
        except _Refused as exc:
            return exc.status, {"error": str(exc)}
        if isinstance(query_ids, dict):  # a validation error the public server answers 200
            return 200, query_ids
        start = time.perf_counter()
        try:
            future = self._pool.submit(self._compute, query_ids, options)
        except RuntimeError:  # the pool was shut down: the server is closing
            return 503, {"error": "the server is shutting down; try another instance"}
        try:
            result = future.result(timeout=self.config.request_timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return 503, {"error": f"the lookup did not finish within "
                                  f"{self.config.request_timeout:g} s; try again later"}
        except concurrent.futures.CancelledError:
            return 503, {"error": "the server is shutting down; try another instance"}
        except Exception as exc:  # a bug or a damaged index: say so, keep serving
            logger.exception("lookup failed")
            return 500, {"error": f"internal server error: {type(exc).__name__}"}
        result["latency"] = (time.perf_counter() - start) * 1000.0
        result["token_ids"] = query_ids
        result["tokens"] = self._tokens(query_ids)
        return 200, result

    def reply(self, handler: Any, body: bytes) -> None:
        """Answer one request body on ``handler`` (a hook: the tests' fault-injecting server
        overrides it)."""
        status, data = self.respond(body)
        handler.send_json(status, data, {"Retry-After": "1"} if status == 503 else None)

    def _parse(self, payload: Any) -> tuple[Any, dict[str, int]]:
        if not isinstance(payload, dict):
            raise _Refused(400, "the payload must be a JSON object")
        unknown = sorted(set(payload) - _ENVELOPE - _CNF_OPTIONS)
        if unknown:
            raise _Refused(400, f"unknown field(s) {unknown}; this server answers only "
                                f"{sorted(_ENVELOPE | _CNF_OPTIONS)}")
        index = payload.get("corpus", payload.get("index"))
        if index != self.index_name:
            raise _Refused(400, f"Invalid index: {index!r}; this server has only "
                                f"{self.index_name!r}")
        query_type = payload.get("query_type")
        if query_type not in _QUERY_TYPES:
            raise _Refused(400, f"Invalid query_type: {query_type!r}; this server answers "
                                f"only {list(_QUERY_TYPES)}")
        query, query_ids = payload.get("query"), payload.get("query_ids")
        if (query is None) == (query_ids is None):
            raise _Refused(400, "Exactly one of query and query_ids must be present!")
        return self._query(query, query_ids, payload)

    def _query(self, query: Any, query_ids: Any,
               payload: dict[str, Any]) -> tuple[Any, dict[str, int]]:
        """The ids to look up and the CNF options, or ``({"error": ...}, {})``."""
        if query is not None:
            if not isinstance(query, str):
                return {"error": "query must be a string!"}, {}
            try:  # a JSON "\ud800" escape: the tokenizer cannot take it
                check_encodable(query, "query")
            except ValueError as exc:
                raise _Refused(400, str(exc)) from None
            if len(query) > MAX_QUERY_CHARS:
                return {"error": f"Please limit your input to <= {MAX_QUERY_CHARS} "
                                 "characters!"}, {}
            if " AND " in query or " OR " in query:
                query_ids = [[self.tokenize(t) for t in c.split(" OR ")]
                             for c in query.split(" AND ")]
            else:
                query_ids = self.tokenize(query)
        vocab = self.tokenizer.vocab_size
        if _is_ids(query_ids):
            if not query_ids:
                return {"error": "Please provide a non-empty query!"}, {}
            if len(query_ids) > MAX_QUERY_TOKENS:
                return {"error": f"Please limit your input to <= {MAX_QUERY_TOKENS} "
                                 "tokens!"}, {}
            if any(i < 0 or i >= vocab for i in query_ids):
                return {"error": "Some item(s) in your query_ids are out-of-range!"}, {}
            if set(payload) & _CNF_OPTIONS:
                return {"error": "max_diff_tokens and max_clause_freq apply to AND queries "
                                 "only"}, {}
            return query_ids, {}
        if not _is_cnf(query_ids):
            return {"error": "query_ids must be a non-empty list of integers, or a "
                             "triply-nested list of integers!"}, {}
        if sum(len(t) for c in query_ids for t in c) > MAX_QUERY_TOKENS:
            return {"error": f"Please limit your input to <= {MAX_QUERY_TOKENS} tokens!"}, {}
        if len(query_ids) > MAX_CLAUSES_PER_CNF:
            return {"error": f"Please enter at most {MAX_CLAUSES_PER_CNF} disjunctive "
                             "clauses!"}, {}
        if any(len(c) > MAX_TERMS_PER_CLAUSE for c in query_ids):
            return {"error": f"Please enter at most {MAX_TERMS_PER_CLAUSE} terms in each "
                             "disjunctive clause!"}, {}
        if any(not t or any(i < 0 or i >= vocab for i in t) for c in query_ids for t in c):
            return {"error": "Some item(s) in your query_ids are out-of-range (or a term is "
                             "empty)!"}, {}
        options = {"max_clause_freq": payload.get("max_clause_freq", MAX_CLAUSE_FREQ),
                   "max_diff_tokens": payload.get("max_diff_tokens", MAX_DIFF_TOKENS)}
        for key, top in (("max_clause_freq", MAX_CLAUSE_FREQ),
                         ("max_diff_tokens", MAX_DIFF_TOKENS)):
            value = options[key]
            if not (type(value) is int and 0 < value <= top):
                return {"error": f"{key} must be an integer in [1, {top}]!"}, {}
        return query_ids, options

    def _compute(self, query_ids: Any, options: dict[str, int]) -> dict[str, Any]:
        if options:
            count, approx = self.stats.cnf_occurrences(
                query_ids, window=options["max_diff_tokens"],
                max_clause_freq=options["max_clause_freq"])
            return {"count": count, "approx": approx, "lowercase": self.stats.lowercase}
        return {"count": self.stats.count_ids(query_ids), "approx": False,
                "lowercase": self.stats.lowercase}

    def _tokens(self, query_ids: Any) -> Any:
        backend = self.tokenizer.backend
        if _is_ids(query_ids):
            return [backend.id_to_token(i) for i in query_ids]
        return [[[backend.id_to_token(i) for i in t] for t in c] for c in query_ids]


def serve_index(directory: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 0,
                **options: Any) -> IndexServer:
    """Start serving ``directory`` on a background thread; close with ``.close()`` or use it as
    a context manager. ``options`` are :class:`ServeConfig` fields.

    Example:
        >>> with serve_index("indexes/wiki") as server:                   # doctest: +SKIP
        ...     server.url
        'http://127.0.0.1:41234/'
    """
    return IndexServer(directory, host=host, port=port, **options).start()


class _HTTPServer(ThreadingHTTPServer):
    """The threading HTTP server with a listen backlog of our choosing (the standard
    library's 5 resets connections in a burst of clients)."""

    daemon_threads = True  # idle keep-alive connections never block closing

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 backlog: int) -> None:
        self.request_queue_size = backlog  # read by server_activate, in the constructor
        super().__init__(address, handler)


def _make_handler(server: IndexServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "rag-gates-index-serve"
        timeout = server.config.io_timeout  # socket timeout: slow bodies, idle connections

        def setup(self) -> None:
            super().setup()
            # Headers and body go out in separate writes; without this, Nagle's algorithm and
            # delayed ACKs add ~40 ms to every reply on a kept-alive connection.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("%s " + format, self.address_string(), *args)

        def send_json(self, status: int, data: dict[str, Any],
                      headers: dict[str, str] | None = None) -> None:
            self.send_raw(status, json.dumps(data).encode("utf-8"), headers)

        def send_raw(self, status: int, body: bytes,
                     headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()

        def _refuse(self, status: int, message: str, **headers: str) -> None:
            self.close_connection = True  # the body (if any) was not read
            self.send_json(status, {"error": message}, headers)

        def do_POST(self) -> None:
            try:
                self._post()
            except (TimeoutError, ConnectionError, OSError):
                self.close_connection = True  # the client went silent or away

        def _post(self) -> None:
            if self.path.split("?", 1)[0] != "/":
                self._refuse(404, "the API is at / (POST); no other path is served")
                return
            if self.headers.get("Transfer-Encoding"):
                self._refuse(411, "send the body with a Content-Length (no chunked encoding)")
                return
            raw = self.headers.get("Content-Length")
            if raw is None:
                self._refuse(411, "a Content-Length header is required")
                return
            try:
                length = int(raw)
            except ValueError:
                self._refuse(400, "Content-Length is not a number")
                return
            if length < 0:
                self._refuse(400, "Content-Length is negative")
                return
            if length > server.config.max_body_bytes:
                self._refuse(413, f"the request body is {length} bytes; the limit is "
                                  f"{server.config.max_body_bytes}")
                return
            body = self.rfile.read(length)
            if len(body) < length:
                self.close_connection = True
                return
            server.reply(self, body)

        def _not_allowed(self) -> None:
            self._refuse(405, "POST a JSON query to this server", Allow="POST")

        do_GET = do_PUT = do_DELETE = do_PATCH = _not_allowed

    return Handler
