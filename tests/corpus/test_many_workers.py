"""Corpus clients built in a parent and used in a forked worker (gunicorn --preload, Celery
prefork): the child opens its own SQLite connection and event-loop thread instead of using
the parent's, which cannot survive a fork."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rag_gates.corpus import CachedCorpusStats, HostedInfiniGram, LocalInfiniGram
from tests.forked import run_in_forked_child

from .protocol_server import ProtocolServer

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="fork is POSIX")


@pytest.fixture()
def server(wiki_index: Path) -> Iterator[ProtocolServer]:
    with ProtocolServer(wiki_index, "test-index") as srv:
        yield srv


def test_a_forked_worker_opens_its_own_cache_connection(wiki_index: Path,
                                                        tmp_path: Path) -> None:
    cache = CachedCorpusStats(LocalInfiniGram(wiki_index), tmp_path / "counts.sqlite")
    parent_count = cache.count("Paris").value
    parent_connection = id(cache._connect())

    def in_child() -> tuple[int, float, float]:
        return id(cache._connect()), cache.count("film").value, cache.count("Paris").value

    child_connection, film, paris = run_in_forked_child(in_child)
    assert child_connection != parent_connection
    assert paris == parent_count
    # What the child wrote is in the shared file: the parent reads it as a cache hit.
    hits = cache.hits
    assert cache.count("film").value == film and cache.hits == hits + 1
    cache.close()


def test_a_forked_worker_gets_its_own_event_loop_for_the_hosted_client(
        server: ProtocolServer) -> None:
    client = HostedInfiniGram("test-index", url=server.url, trust_env=False, timeout=5.0,
                              attempt_timeout=2.0, backoff_base=0.01, backoff_max=0.05)
    expected = client.count("Paris").value  # the parent's loop thread is running now
    assert expected > 0

    # Without a new loop in the child, the call waits for the parent's thread, which does
    # not exist there, until its backstop timeout (10 s): the 8 s limit catches that.
    assert run_in_forked_child(lambda: client.count("Paris").value, timeout=8.0) == expected
    assert client.count("Paris").value == expected  # the parent's client still works
    client.close()


def test_a_write_locked_out_by_another_worker_returns_the_answer_uncached(
        wiki_index: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Many workers share one cache file; one holding the write lock past the busy timeout
    must not turn a good corpus answer into a corpus failure (which QuCo reads as "could not
    decide")."""
    import sqlite3

    path = tmp_path / "counts.sqlite"
    cache = CachedCorpusStats(LocalInfiniGram(wiki_index), path, busy_timeout_s=0.2)
    expected = LocalInfiniGram(wiki_index).count("Paris").value
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another worker mid-write
    try:
        assert cache.count("Paris").value == expected
        assert cache.count_batch(["Paris", "film"])[0].value == expected
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert cache.write_errors == 2 and "returned uncached" in caplog.text
    assert cache.count("Paris").cached is False  # nothing was stored; now it is
    assert cache.count("Paris").cached is True and cache.write_errors == 2
    cache.close()
