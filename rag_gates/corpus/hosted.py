"""``HostedInfiniGram``: a client of the public infini-gram API (``https://api.infini-gram.io/``).

The protocol: POST a JSON object ``{"index": ..., "query_type": "count", "query": text}`` or
``"query_ids": ids``; an AND/OR (CNF) query is a triply nested ``query_ids`` list and takes
``max_diff_tokens`` (<= 1000) and ``max_clause_freq`` (<= 500,000). The reply carries ``count``
and ``approx`` (true when the server subsampled a clause), or an ``error`` string.

Literal matching: the server splits a *string* query on ``" AND "`` and ``" OR "``. This client
never sends a phrase that could be split: with a ``tokenizer`` (the index's, e.g. Llama-2 for
the ``v4_*_llama`` indexes) it sends token ids; without one it cuts the phrase just before each
operator word, lets the server tokenize the pieces (the server's tokenizers split at spaces, so
the pieces' ids concatenate to the phrase's ids) and sends the ids. Co-occurrence is always sent
as ids.

Co-occurrence values are the API's: occurrences of the rarer phrase with the other starting
within ``max_diff_tokens`` tokens in the same document (``unit="occurrences"``). The API cannot
count documents: ``scope="document"`` is answered with the largest window (1,000 tokens) and
flagged ``approximate`` (or refused with ``document_scope="error"``). The engine also drops an
occurrence whose nearest partners on both sides are in range but one of them is in the previous
document, so it undercounts on short documents; the local backend does not.

Robustness: one pooled HTTP/1.1 connection pool (httpx), at most ``max_concurrency`` requests
in flight, a per-attempt timeout, bounded retries with exponential backoff and jitter on
timeouts, dropped connections, 429/5xx and malformed replies (``Retry-After`` honoured), and a
hard total ``timeout`` per call (retries included) that is never exceeded. Reply bodies are
read in chunks and refused beyond ``max_response_bytes`` (32 MiB by default); a URL carrying
credentials or a query string is refused without repeating them. At most
``max_concurrency`` calls run at once; a call's timeout starts when it gets one of those slots,
so the items of a large batch queue without timing out. Errors are typed
(:mod:`rag_gates.corpus.errors`). Requests run on a private event loop thread, so the sync,
batch and async forms, from any thread, share the pool and the concurrency bound.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Coroutine, Sequence
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rag_gates._http import (
    DEFAULT_MAX_RESPONSE_BYTES,
    ERROR_BODY_BYTES,
    ClientLoop,
    GaveUp,
    RetryableReply,
    check_server_url,
    read_body,
    retry_after_seconds,
    retryable_status,
    with_retries,
)
from rag_gates._json import JSONDepthError, loads_bounded
from rag_gates._optional import require
from rag_gates.corpus.base import CorpusStats
from rag_gates.corpus.errors import (
    CorpusError,
    HostedProtocolError,
    HostedQueryError,
    HostedTimeoutError,
    HostedUnavailableError,
    UnsupportedScopeError,
)
from rag_gates.corpus.phrases import normalize_phrase, surface_forms, token_variants
from rag_gates.corpus.tokenizer import CorpusTokenizer
from rag_gates.corpus.types import (
    CaseMode,
    CooccurrenceResult,
    CountResult,
    Scope,
    SpaceMode,
    parse_scope,
    window_tokens,
)

__all__ = ["DEFAULT_URL", "HostedConfig", "HostedInfiniGram", "split_operator_words"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_URL = "https://api.infini-gram.io/"
API_MAX_DIFF_TOKENS = 1000
API_MAX_CLAUSE_FREQ = 500_000
API_MAX_TERMS_PER_CLAUSE = 4
_OPERATOR_CUT = re.compile(r" (?=(?:AND|OR) )")
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "rag_gates_hosted_deadline", default=None)


class HostedConfig(BaseModel):
    """Options of :class:`HostedInfiniGram`."""

    # A refused value is never echoed: a URL may carry a key (refused below).
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    url: str = Field(DEFAULT_URL, description="API endpoint (POST); no credentials or query "
                                              "string.")
    timeout: float = Field(30.0, gt=0, le=3600, description="Hard limit, in seconds, for one "
                                                            "call including every retry.")
    attempt_timeout: float = Field(10.0, gt=0, le=3600,
                                   description="Limit for one HTTP attempt (connect + reply).")
    max_retries: int = Field(3, ge=0, le=20, description="Retries after the first attempt.")
    backoff_base: float = Field(0.25, ge=0, le=60, description="First backoff, seconds.")
    backoff_max: float = Field(4.0, ge=0, le=600, description="Largest backoff, seconds.")
    max_concurrency: int = Field(8, ge=1, le=256, description="Requests in flight at once "
                                                              "(also the connection pool size).")
    max_clause_freq: int = Field(API_MAX_CLAUSE_FREQ, ge=1, le=API_MAX_CLAUSE_FREQ,
                                 description="Above this many matches a clause is subsampled "
                                             "by the server (answer flagged approximate).")
    document_window: int = Field(API_MAX_DIFF_TOKENS, ge=1, le=API_MAX_DIFF_TOKENS,
                                 description="Window used for scope='document'.")
    document_scope: Literal["window", "error"] = Field(
        "window", description="'window': answer scope='document' with document_window tokens, "
                              "flagged approximate; 'error': raise UnsupportedScopeError.")
    case: CaseMode = Field("sensitive", description="Case handling (see CaseMode).")
    spaces: SpaceMode = Field("both", description="Variants; needs a tokenizer (without one "
                                                  "the server's own tokenization is used).")
    lowercase: bool = Field(False, description="The index holds lower-cased text (a "
                                               "`rag-gates index serve` of an index built "
                                               "with lowercase=True): phrases are lower-cased "
                                               "before tokenizing, as LocalInfiniGram does, so "
                                               "counts match it exactly.")
    max_phrase_chars: int = Field(1000, ge=1, le=1000, description="The API's limit.")
    max_phrase_tokens: int = Field(500, ge=1, le=500, description="The API's limit.")
    user_agent: str = Field("rag-gates", description="User-Agent header.")
    trust_env: bool = Field(True, description="Use proxy settings from the environment.")
    max_response_bytes: int = Field(DEFAULT_MAX_RESPONSE_BYTES, ge=1024, le=2 ** 34,
                                    description="Largest reply body read; a larger one is "
                                                "refused with HostedProtocolError.")

    @field_validator("url")
    @classmethod
    def _no_secrets_in_url(cls, value: str) -> str:
        return check_server_url(value, "url", "The infini-gram API takes no key.")


def split_operator_words(phrase: str) -> list[str]:
    """Cut a phrase before each `` AND ``/`` OR `` so no piece can be parsed as an operator."""
    return _OPERATOR_CUT.split(phrase)


class HostedInfiniGram(CorpusStats):
    """Counts and co-occurrence from a hosted infini-gram index over HTTP.

    Args:
        index: the API index name, e.g. ``"v4_olmo-2-0325-32b-instruct_llama"``.
        tokenizer: the index's tokenizer (a path to a tokenizer.json / folder, or a tokenizer
            object). Optional; with it queries go as token ids, both space variants are
            matched and fewer requests are made.
        config: a :class:`HostedConfig`; keyword overrides also work (``url=``, ``timeout=``).
    """

    backend_name = "hosted-infini-gram"

    def __init__(self, index: str, tokenizer: Any = None, config: HostedConfig | None = None,
                 **overrides: Any) -> None:
        if not isinstance(index, str) or not index:
            raise ValueError("index must be a non-empty API index name")
        base = config or HostedConfig()
        self.config = (HostedConfig.model_validate({**base.model_dump(), **overrides})
                       if overrides else base)
        self.index = index
        self.tokenizer = CorpusTokenizer.resolve(tokenizer) if tokenizer is not None else None
        self._loop = ClientLoop("rag-gates-hosted")
        self._requests: asyncio.Semaphore | None = None
        self._items: asyncio.Semaphore | None = None
        self._ids_cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._closed = False
        self._warned_lowercase = False
        self.requests_sent = 0

    # ----------------------------------------------------------------------------- identity
    @property
    def index_name(self) -> str:
        return self.index

    @property
    def index_key(self) -> str:
        return f"hosted:{self.config.url}#{self.index}"

    def options_key(self) -> dict[str, Any]:
        return {"case": self.config.case, "spaces": self.config.spaces if self.tokenizer else
                "server", **({"lowercase": True} if self.config.lowercase else {}),
                "max_clause_freq": self.config.max_clause_freq,
                "document_window": self.config.document_window,
                "document_scope": self.config.document_scope,
                "tokenizer": self.tokenizer.sha256()[:16] if self.tokenizer else None}

    # ----------------------------------------------------------------------------- plumbing
    def _check_open(self) -> None:
        if self._closed:
            raise CorpusError("this HostedInfiniGram client was closed")

    def _run(self, coro: Coroutine[Any, Any, T], items: int = 1) -> T:
        self._check_open()
        waves = -(-max(1, items) // self.config.max_concurrency)
        # Every item enforces its own deadline; this is only a backstop.
        return self._loop.result(coro, timeout=self.config.timeout * waves + 5.0,
                                 on_timeout=lambda: HostedTimeoutError(
                                     f"no answer from {self.config.url} within "
                                     f"{self.config.timeout:.1f} s"))

    async def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        self._check_open()
        return await self._loop.on_loop(coro)

    def _new_client(self) -> Any:
        httpx = require("httpx", "corpus")
        n = self.config.max_concurrency
        self._requests = asyncio.Semaphore(n)
        self._items = asyncio.Semaphore(n)
        return httpx.AsyncClient(
            limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
            headers={"User-Agent": self.config.user_agent},
            trust_env=self.config.trust_env, follow_redirects=True)

    async def _http(self) -> Any:
        return self._loop.http(self._new_client)

    async def _item(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run one count/co-occurrence under the total deadline (and the item bound)."""
        await self._http()
        assert self._items is not None
        async with self._items:
            token = _DEADLINE.set(time.monotonic() + self.config.timeout)
            try:
                async with asyncio.timeout(self.config.timeout):
                    return await coro
            except TimeoutError as exc:
                raise HostedTimeoutError(
                    f"no answer from {self.config.url} within the {self.config.timeout:.1f} s "
                    "timeout (retries included)") from exc
            finally:
                _DEADLINE.reset(token)

    async def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        """One logical request: bounded retries with backoff, within the item's deadline."""
        client = await self._http()
        assert self._requests is not None  # made with the client
        deadline = _DEADLINE.get() or time.monotonic() + self.config.timeout
        url = self.config.url

        async def attempt(per_try: float) -> dict[str, Any]:
            self.requests_sent += 1
            async with asyncio.timeout(per_try):
                reply = await client.send(client.build_request(
                    "POST", url, json=payload, timeout=per_try), stream=True)
                try:
                    failed = reply.status_code >= 400
                    body = await read_body(
                        reply, ERROR_BODY_BYTES if failed else self.config.max_response_bytes,
                        where=url, setting="max_response_bytes", error=HostedProtocolError,
                        truncate=failed)
                finally:
                    await reply.aclose()
            text = body.decode("utf-8", "replace")
            if retryable_status(reply.status_code):
                raise RetryableReply(f"HTTP {reply.status_code}",
                                     retry_after_seconds(reply.headers))
            if reply.status_code >= 400:
                raise HostedQueryError(
                    f"{url} refused the query (HTTP {reply.status_code}): {text[:300]}")
            try:
                data = loads_bounded(body, what=f"the reply of {url}")
            except JSONDepthError as exc:
                raise HostedProtocolError(str(exc)) from None
            except ValueError:  # JSONDecodeError and UnicodeDecodeError
                data = None
            if isinstance(data, dict) and "error" in data:
                raise HostedQueryError(
                    f"{url} answered with an error for index {self.index!r}: {data['error']}")
            if isinstance(data, dict) and type(data.get("count")) is int and data["count"] >= 0:
                if data.get("lowercase") is True and not self.config.lowercase and \
                        not self._warned_lowercase:
                    self._warned_lowercase = True
                    logger.warning(
                        "%s serves a lower-cased index; pass lowercase=True to "
                        "HostedInfiniGram for counts equal to the local backend's", url)
                return data
            raise RetryableReply(f"malformed reply: {text[:200]!r}")

        def give_up(failure: GaveUp) -> Exception:
            if failure.last.startswith("malformed"):
                return HostedProtocolError(
                    f"{url} does not speak the infini-gram protocol: {failure.last}")
            if failure.timed_out:
                return HostedTimeoutError(
                    f"no answer from {url} within {self.config.timeout:.1f} s")
            return HostedUnavailableError(
                f"{url} {failure.summary}. Try later, or raise max_retries/timeout")

        return await with_retries(attempt, policy=self.config, deadline=deadline,
                                  give_up=give_up, where=url, log=logger,
                                  timed_out="attempt timed out", slots=self._requests)

    # ----------------------------------------------------------------------------- phrases
    def _normalize(self, phrase: str) -> str:
        return normalize_phrase(phrase, self.config.max_phrase_chars)

    def _local_variants(self, text: str) -> list[tuple[str, tuple[int, ...]]]:
        assert self.tokenizer is not None
        forms = surface_forms(text, self.config.case, self.config.spaces, self.config.lowercase)
        return token_variants(forms, self.tokenizer.encode, self.config.max_phrase_tokens)

    async def _server_ids(self, form: str) -> tuple[tuple[int, ...], int | None]:
        """Token ids of ``form`` as the server tokenizes it, and its count when known."""
        cached = self._ids_cache.get(form)
        if cached is not None:
            self._ids_cache.move_to_end(form)
            return cached, None
        pieces = split_operator_words(form)
        replies = await asyncio.gather(*(self._post(
            {"index": self.index, "query_type": "count", "query": piece}) for piece in pieces))
        ids: list[int] = []
        for reply in replies:
            piece_ids = reply.get("token_ids")
            if not isinstance(piece_ids, list) or not all(isinstance(i, int) for i in piece_ids):
                raise HostedProtocolError(f"{self.config.url} returned no token_ids for a count")
            ids.extend(piece_ids)
        if not ids:
            raise CorpusError(f"the server tokenized {form!r} to no tokens")
        if len(ids) > self.config.max_phrase_tokens:
            from rag_gates.corpus.errors import PhraseTooLongError

            raise PhraseTooLongError(
                f"the phrase is {len(ids)} tokens long, more than the API's "
                f"{self.config.max_phrase_tokens}")
        self._ids_cache[form] = tuple(ids)
        if len(self._ids_cache) > 4096:
            self._ids_cache.popitem(last=False)
        return tuple(ids), int(replies[0]["count"]) if len(pieces) == 1 else None

    async def _variants(self, text: str) -> list[tuple[str, tuple[int, ...], int | None]]:
        if self.tokenizer is not None:
            return [(form, ids, None) for form, ids in self._local_variants(text)]
        forms = surface_forms(text, self.config.case, "none", self.config.lowercase)
        out = []
        seen: set[tuple[int, ...]] = set()
        for form, (ids, count) in zip(forms, await asyncio.gather(
                *(self._server_ids(f) for f in forms)), strict=True):
            if ids not in seen:
                seen.add(ids)
                out.append((form, ids, count))
        return out

    # ----------------------------------------------------------------------------- queries
    async def _count(self, phrase: str) -> CountResult:
        start = time.perf_counter()
        text = self._normalize(phrase)
        variants = await self._variants(text)

        async def one(ids: tuple[int, ...], known: int | None) -> tuple[int, bool]:
            if known is not None:
                return known, False
            reply = await self._post({"index": self.index, "query_type": "count",
                                      "query_ids": list(ids)})
            return int(reply["count"]), bool(reply.get("approx", False))

        answers = await asyncio.gather(*(one(ids, known) for _, ids, known in variants))
        approximate = any(a for _, a in answers) or (self.config.case == "insensitive"
                                                      and not self.config.lowercase)
        return CountResult(
            value=sum(v for v, _ in answers), approximate=approximate,
            backend=self.backend_name, index=self.index,
            latency_ms=(time.perf_counter() - start) * 1000.0, phrase=text,
            variants=tuple(form for form, _, _ in variants))

    async def _cooc(self, a: str, b: str, scope: Scope) -> CooccurrenceResult:
        start = time.perf_counter()
        requested = parse_scope(scope)
        window = window_tokens(requested)
        approximate = self.config.case == "insensitive" and not self.config.lowercase
        if window is None:
            if self.config.document_scope == "error":
                raise UnsupportedScopeError(
                    "the infini-gram API cannot count documents; use scope=Window(tokens=n) "
                    "(n <= 1000) or a local index")
            window, approximate = self.config.document_window, True
        elif window > API_MAX_DIFF_TOKENS:
            raise UnsupportedScopeError(
                f"the infini-gram API allows windows of at most {API_MAX_DIFF_TOKENS} tokens, "
                f"got {window}; use a local index for larger windows")
        text_a, text_b = self._normalize(a), self._normalize(b)
        va, vb = await asyncio.gather(self._variants(text_a), self._variants(text_b))
        if len(va) > API_MAX_TERMS_PER_CLAUSE or len(vb) > API_MAX_TERMS_PER_CLAUSE:
            va, vb = va[:API_MAX_TERMS_PER_CLAUSE], vb[:API_MAX_TERMS_PER_CLAUSE]
            approximate = True
        reply = await self._post({
            "index": self.index, "query_type": "count",
            "query_ids": [[list(ids) for _, ids, _ in va], [list(ids) for _, ids, _ in vb]],
            "max_diff_tokens": window, "max_clause_freq": self.config.max_clause_freq})

        def known(vs: list[tuple[str, tuple[int, ...], int | None]]) -> int | None:
            counts = [c for _, _, c in vs if c is not None]
            return sum(counts) if len(counts) == len(vs) else None

        return CooccurrenceResult(
            value=int(reply["count"]), approximate=approximate or bool(reply.get("approx")),
            backend=self.backend_name, index=self.index,
            latency_ms=(time.perf_counter() - start) * 1000.0, a=text_a, b=text_b,
            scope=f"window:{window}", requested_scope=requested, unit="occurrences",
            a_count=known(va), b_count=known(vb))

    def count(self, phrase: str) -> CountResult:
        self._check_open()
        return self._run(self._item(self._count(phrase)))

    def cooccurrence(self, a: str, b: str, scope: Scope = "document") -> CooccurrenceResult:
        self._check_open()
        return self._run(self._item(self._cooc(a, b, scope)))

    async def _gather(self, coros: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
        return list(await asyncio.gather(*(self._item(c) for c in coros)))

    def count_batch(self, phrases: Sequence[str]) -> list[CountResult]:
        self._check_open()
        return self._run(self._gather([self._count(p) for p in phrases]), len(phrases))

    def cooccurrence_batch(self, pairs: Sequence[tuple[str, str]],
                           scope: Scope = "document") -> list[CooccurrenceResult]:
        self._check_open()
        return self._run(self._gather([self._cooc(a, b, scope) for a, b in pairs]), len(pairs))

    async def acount(self, phrase: str) -> CountResult:
        self._check_open()
        return await self._on_loop(self._item(self._count(phrase)))

    async def acooccurrence(self, a: str, b: str,
                            scope: Scope = "document") -> CooccurrenceResult:
        self._check_open()
        return await self._on_loop(self._item(self._cooc(a, b, scope)))

    async def acount_batch(self, phrases: Sequence[str]) -> list[CountResult]:
        self._check_open()
        return await self._on_loop(self._gather([self._count(p) for p in phrases]))

    async def acooccurrence_batch(self, pairs: Sequence[tuple[str, str]],
                                  scope: Scope = "document") -> list[CooccurrenceResult]:
        self._check_open()
        return await self._on_loop(self._gather([self._cooc(a, b, scope) for a, b in pairs]))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.close()
