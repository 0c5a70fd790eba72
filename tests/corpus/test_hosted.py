"""HostedInfiniGram against a real HTTP server on 127.0.0.1 speaking the infini-gram protocol
from a local index: agreement with the local backend, literal queries, faults, bounds."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rag_gates.corpus import (
    CachedCorpusStats,
    CorpusError,
    EmptyPhraseError,
    HostedInfiniGram,
    HostedProtocolError,
    HostedQueryError,
    HostedTimeoutError,
    HostedUnavailableError,
    InvalidPhraseError,
    LocalInfiniGram,
    PhraseTooLongError,
    UnsupportedScopeError,
    Window,
)
from rag_gates.corpus.hosted import split_operator_words

from .brute import index_docs, window_occurrences
from .protocol_server import ProtocolServer

PHRASES = ["film", "Paris", "the", "American", "United States", "born in", "zzz unseen",
           "Tom AND Jerry", "rock OR roll", "(a OR b)", '"quoted words"', "AND", "OR"]


@pytest.fixture()
def server(wiki_index: Path) -> Iterator[ProtocolServer]:
    with ProtocolServer(wiki_index, "test-index") as srv:
        yield srv


def client(server: ProtocolServer, tokenizer: Any = None, **options: Any) -> HostedInfiniGram:
    options.setdefault("timeout", 5.0)
    options.setdefault("attempt_timeout", 2.0)
    options.setdefault("backoff_base", 0.01)
    options.setdefault("backoff_max", 0.05)
    return HostedInfiniGram("test-index", tokenizer=tokenizer, url=server.url, trust_env=False,
                            **options)


def test_counts_agree_with_the_local_backend(server: ProtocolServer, wiki_index: Path) -> None:
    local = LocalInfiniGram(wiki_index)
    with client(server, tokenizer=wiki_index / "tokenizer.json") as hosted:
        for phrase in PHRASES:
            remote = hosted.count(phrase)
            assert remote.value == local.count(phrase).value, phrase
            assert remote.variants == local.count(phrase).variants
            assert remote.backend == "hosted-infini-gram" and remote.index == "test-index"
            assert remote.approximate is False
    # Every query went out as token ids: the server never parsed an operator.
    assert all("query" not in p for p in server.payloads)


def test_without_a_tokenizer_the_server_tokenizes_and_operators_stay_literal(
        server: ProtocolServer, wiki_index: Path) -> None:
    local = LocalInfiniGram(wiki_index, spaces="leading")  # what the server's tokenizer does
    with client(server) as hosted:
        for phrase in PHRASES:
            assert hosted.count(phrase).value == local.count(phrase).value, phrase
    strings = [p["query"] for p in server.payloads if "query" in p]
    assert strings and not any(" AND " in s or " OR " in s for s in strings)
    assert split_operator_words("A AND B OR C AND D") == ["A", "AND B", "OR C", "AND D"]
    assert split_operator_words("Tom AND AND Jerry") == ["Tom", "AND", "AND Jerry"]


def test_cooccurrence_is_the_and_query_counted_exactly_with_the_approx_flag(
        server: ProtocolServer, wiki_index: Path) -> None:
    local = LocalInfiniGram(wiki_index)
    docs = index_docs(local)
    pairs = [("film", "American"), ("the", "of"), ("Paris", "New York"), ("Tom", "Jerry"),
             ("zzz unseen", "the")]
    with client(server, tokenizer=wiki_index / "tokenizer.json") as hosted:
        for a, b in pairs:
            va, vb = [i for _, i in local._variants(a)[1]], [i for _, i in local._variants(b)[1]]
            for window in (1, 10, 1000):
                remote = hosted.cooccurrence(a, b, scope=Window(tokens=window))
                assert remote.value == window_occurrences(docs, va, vb, window), (a, b, window)
                assert remote.unit == "occurrences" and remote.scope == f"window:{window}"
                # infini-gram's own engine (the public API) only ever undercounts: it drops a
                # pair when a nearby partner on the other side is in the previous document.
                cnf = [[list(i) for i in va], [list(i) for i in vb]]
                engine = server.engine.count_cnf(cnf=cnf, max_clause_freq=500_000,
                                                 max_diff_tokens=window)
                assert engine["count"] <= remote.value, (a, b, window)
                # Sound: no pair is found where no document holds both.
                if remote.value > 0:
                    assert local.cooccurrence(a, b).value > 0
        # Subsampling above max_clause_freq surfaces as approximate.
        small = client(server, tokenizer=wiki_index / "tokenizer.json", max_clause_freq=5)
        assert small.cooccurrence("the", "of", scope=50).approximate is True
        assert hosted.cooccurrence("the", "of", scope=50).approximate is False
        small.close()


def test_document_scope_is_an_approximate_window_or_an_error(server: ProtocolServer,
                                                             wiki_index: Path) -> None:
    with client(server, tokenizer=wiki_index / "tokenizer.json") as hosted:
        answer = hosted.cooccurrence("film", "American")
        assert answer.approximate and answer.scope == "window:1000"
        assert answer.requested_scope == "document"
        with pytest.raises(UnsupportedScopeError, match="at most 1000"):
            hosted.cooccurrence("film", "American", scope=1001)
    with client(server, document_scope="error") as strict, \
            pytest.raises(UnsupportedScopeError, match="cannot count documents"):
        strict.cooccurrence("film", "American")


def test_without_a_tokenizer_cooccurrence_still_sends_ids(server: ProtocolServer,
                                                          wiki_index: Path) -> None:
    with client(server) as plain, \
            client(server, tokenizer=wiki_index / "tokenizer.json", spaces="leading") as tok:
        for a, b in [("Tom AND Jerry", "cartoon"), ("film", "American")]:
            assert plain.cooccurrence(a, b, 20).value == tok.cooccurrence(a, b, 20).value
            counted = plain.cooccurrence(a, b, 20)
            assert counted.a_count == tok.count(a).value or counted.a_count is None
    assert not any(" AND " in p.get("query", "") for p in server.payloads)


def test_batch_and_async_forms_keep_order(server: ProtocolServer, wiki_index: Path) -> None:
    local = LocalInfiniGram(wiki_index)
    with client(server, tokenizer=wiki_index / "tokenizer.json") as hosted:
        batch = hosted.count_batch(PHRASES)
        assert [r.phrase for r in batch] == PHRASES
        assert [r.value for r in batch] == [local.count(p).value for p in PHRASES]
        pairs = [("film", "American"), ("Paris", "the"), ("Tom", "Jerry")]
        assert [(r.a, r.b) for r in hosted.cooccurrence_batch(pairs, 10)] == pairs

        async def run() -> list[Any]:
            return [await hosted.acount("film"),
                    await hosted.acooccurrence("film", "American", 10),
                    *(await hosted.acount_batch(["Paris", "the"])),
                    *(await hosted.acooccurrence_batch(pairs, 10))]

        results = asyncio.run(run())
        assert results[0].value == local.count("film").value
        assert [r.value for r in results[2:4]] == [local.count(p).value for p in ("Paris", "the")]
        assert [(r.a, r.b) for r in results[4:]] == pairs


def test_cache_over_the_hosted_backend(server: ProtocolServer, wiki_index: Path,
                                       tmp_path: Path) -> None:
    hosted = client(server, tokenizer=wiki_index / "tokenizer.json")
    cache = CachedCorpusStats(hosted, tmp_path / "c.sqlite")
    first = cache.count("film")
    sent = hosted.requests_sent
    second = cache.count("film")
    assert second.cached and second.value == first.value and hosted.requests_sent == sent
    cache.close()


def test_bad_phrases_fail_before_any_request(server: ProtocolServer) -> None:
    with client(server) as hosted:
        with pytest.raises(EmptyPhraseError):
            hosted.count("  ")
        with pytest.raises(PhraseTooLongError):
            hosted.count("x" * 1001)
        for phrase in ("a\ud800b", "Tom AND \udfff"):
            with pytest.raises(InvalidPhraseError, match=r"position .*lone surrogate"):
                hosted.count(phrase)
            with pytest.raises(InvalidPhraseError, match="position"):
                hosted.cooccurrence("Paris", phrase, scope=Window(tokens=10))
        assert hosted.requests_sent == 0


# ------------------------------------------------------------------------------ faults
def test_5xx_and_429_are_retried_then_succeed(server: ProtocolServer) -> None:
    server.queue(("status", 503), ("status", 500), ("status", 429))
    with client(server, max_retries=3) as hosted:
        answer = hosted.count("film")
        assert answer.value > 0 and hosted.requests_sent == 4


def test_persistent_5xx_gives_up_after_the_retries(server: ProtocolServer) -> None:
    server.default_fault = ("status", 502)
    with client(server, max_retries=2) as hosted:
        start = time.monotonic()
        with pytest.raises(HostedUnavailableError, match="HTTP 502"):
            hosted.count("film")
        assert hosted.requests_sent == 3 and time.monotonic() - start < 2.0


def test_dropped_connections_are_retried(server: ProtocolServer) -> None:
    server.queue(("drop", 0), ("drop", 0))
    with client(server, max_retries=2) as hosted:
        assert hosted.count("film").value > 0
        assert hosted.requests_sent == 3
    server.default_fault = ("drop", 0)
    with client(server, max_retries=1) as hosted, \
            pytest.raises(HostedUnavailableError, match="attempt"):
        hosted.count("film")


def test_malformed_json_is_a_protocol_error(server: ProtocolServer) -> None:
    server.default_fault = ("malformed", 0)
    with client(server, max_retries=1) as hosted, \
            pytest.raises(HostedProtocolError, match="infini-gram protocol"):
        hosted.count("film")
    server.default_fault = ("ok", 0)
    server.queue(("malformed", 0))
    with client(server, max_retries=1) as hosted:
        assert hosted.count("film").value > 0  # a one-off bad reply is retried


def test_a_reply_over_the_size_limit_is_refused_unread(server: ProtocolServer) -> None:
    server.queue(("huge", 64 * 1024))
    with client(server, max_retries=3, max_response_bytes=4096) as hosted:
        with pytest.raises(HostedProtocolError, match=r"4096.*max_response_bytes"):
            hosted.count("film")
        assert hosted.requests_sent == 1  # not retried: the next reply would be as large
        assert hosted.count("film").value > 0  # replies under the limit still work


def test_a_deeply_nested_reply_is_a_protocol_error_not_a_recursion_error(
        server: ProtocolServer) -> None:
    server.queue(("deep", 100_000))
    with client(server, max_retries=3) as hosted:
        with pytest.raises(HostedProtocolError, match="nested deeper than"):
            hosted.count("film")
        assert hosted.requests_sent == 1


def test_error_replies_are_not_retried(server: ProtocolServer) -> None:
    server.default_fault = ("error", 0)
    with client(server, max_retries=3) as hosted:
        with pytest.raises(HostedQueryError, match="internal server error"):
            hosted.count("film")
        assert hosted.requests_sent == 1
    server.default_fault = ("ok", 0)
    with HostedInfiniGram("no-such-index", url=server.url, trust_env=False) as wrong, \
            pytest.raises(HostedQueryError, match="Invalid index"):
        wrong.count("film")


@pytest.mark.parametrize("fault", [("sleep", 3.0), ("trickle", 0.2)])
def test_slow_replies_never_hang_past_the_timeout(server: ProtocolServer, wiki_index: Path,
                                                 fault: tuple[str, float]) -> None:
    server.default_fault = fault
    with client(server, tokenizer=wiki_index / "tokenizer.json", timeout=0.6,
                attempt_timeout=0.25, max_retries=5) as hosted:
        for call in (lambda: hosted.count("film"),
                     lambda: hosted.cooccurrence("film", "American", 10),
                     lambda: asyncio.run(hosted.acount("film"))):
            start = time.monotonic()
            with pytest.raises(HostedTimeoutError):
                call()
            assert time.monotonic() - start < 0.6 + 0.5  # the timeout, plus scheduling slack


def test_a_slow_first_attempt_is_retried_within_the_deadline(server: ProtocolServer) -> None:
    server.queue(("sleep", 2.5))
    with client(server, timeout=4.0, attempt_timeout=0.3, max_retries=2) as hosted:
        start = time.monotonic()
        assert hosted.count("film").value > 0
        assert time.monotonic() - start < 1.5  # did not wait for the slow reply


def test_unreachable_server(wiki_index: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with HostedInfiniGram("x", url=f"http://127.0.0.1:{port}/", trust_env=False, timeout=2.0,
                          max_retries=2, backoff_base=0.01) as hosted:
        start = time.monotonic()
        with pytest.raises(HostedUnavailableError, match="ConnectError"):
            hosted.count("film")
        assert time.monotonic() - start < 2.0


def test_concurrency_is_bounded_and_connections_are_pooled(server: ProtocolServer,
                                                           wiki_index: Path) -> None:
    server.default_fault = ("sleep", 0.05)
    with client(server, tokenizer=wiki_index / "tokenizer.json", max_concurrency=3) as hosted:
        start = time.monotonic()
        answers = hosted.count_batch(PHRASES * 2)
        elapsed = time.monotonic() - start
        assert len(answers) == 2 * len(PHRASES)
        assert server.max_in_flight <= 3
        requests = hosted.requests_sent
        assert elapsed >= (requests / 3) * 0.05 * 0.9
        assert len(server.client_ports) <= 3  # kept-alive connections, reused
        server.default_fault = ("ok", 0)
        for phrase in PHRASES:
            hosted.count(phrase)
        assert len(server.client_ports) <= 3


def test_calls_from_many_threads_share_the_client(server: ProtocolServer,
                                                  wiki_index: Path) -> None:
    local = LocalInfiniGram(wiki_index)
    expected = {p: local.count(p).value for p in PHRASES}
    errors: list[BaseException] = []
    with client(server, tokenizer=wiki_index / "tokenizer.json", max_concurrency=2) as hosted:
        def work(seed: int) -> None:
            try:
                for i in range(10):
                    p = PHRASES[(seed + i) % len(PHRASES)]
                    assert hosted.count(p).value == expected[p]
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    assert server.max_in_flight <= 2


def test_closed_client_says_so(server: ProtocolServer) -> None:
    hosted = client(server)
    assert hosted.count("film").value > 0
    hosted.close()
    with pytest.raises(CorpusError, match="closed"):
        hosted.count("film")
    hosted.close()  # idempotent


def test_config_bounds() -> None:
    for bad in ({"max_clause_freq": 500_001}, {"document_window": 1001}, {"timeout": 0},
                {"max_concurrency": 0}, {"nope": 1}):
        with pytest.raises(ValueError):
            HostedInfiniGram("x", **bad)
    with pytest.raises(ValueError):
        HostedInfiniGram("")
