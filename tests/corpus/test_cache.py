"""CachedCorpusStats: same answers as the backend, persistent, safe across threads and
processes, keyed by backend, index and query."""

from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from rag_gates.corpus import (
    CachedCorpusStats,
    CorpusError,
    EmptyPhraseError,
    LocalInfiniGram,
    Window,
    build_index,
)
from rag_gates.testing import loop_ticks

from .conftest import write_jsonl

PHRASES = ["film", "Paris", "the", "American", "Tom AND Jerry", "zzz unseen", "born in"]
PAIRS = [("film", "American"), ("Paris", "New York"), ("the", "of"), ("Tom", "Jerry")]
VOLATILE = {"cached", "latency_ms"}


def _same(a: Any, b: Any) -> bool:
    return bool(a.model_dump(exclude=VOLATILE) == b.model_dump(exclude=VOLATILE))


def test_cache_returns_what_the_backend_returned(wiki: Any, tmp_path: Path) -> None:
    cache = CachedCorpusStats(LocalInfiniGram(wiki.path), tmp_path / "c.sqlite")
    for phrase in PHRASES:
        miss, hit, direct = cache.count(phrase), cache.count(phrase), wiki.count(phrase)
        assert miss.cached is False and hit.cached is True
        assert _same(miss, direct) and _same(hit, direct)
    for scope in ("document", Window(tokens=10), 3):
        for a, b in PAIRS:
            miss, hit = cache.cooccurrence(a, b, scope), cache.cooccurrence(a, b, scope)
            assert hit.cached and _same(miss, hit)
            assert _same(hit, wiki.cooccurrence(a, b, scope))
    assert cache.hits == len(PHRASES) + 3 * len(PAIRS)
    # The window size is part of the key.
    assert cache.cooccurrence("the", "of", 1).value != cache.cooccurrence("the", "of").value


def test_persistence_and_normalised_keys(wiki_index: Path, tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    first = CachedCorpusStats(LocalInfiniGram(wiki_index), path)
    answer = first.count("United States")
    first.close()
    second = CachedCorpusStats(LocalInfiniGram(wiki_index), path)
    again = second.count("  United \n States")
    assert again.cached and again.value == answer.value


def test_batch_forms_mix_hits_and_misses_in_order(wiki: Any, tmp_path: Path) -> None:
    cache = CachedCorpusStats(LocalInfiniGram(wiki.path), tmp_path / "c.sqlite")
    cache.count("Paris")
    cache.cooccurrence("film", "American")
    batch = cache.count_batch(PHRASES)
    assert [r.phrase for r in batch] == PHRASES
    assert [r.cached for r in batch] == [p == "Paris" for p in PHRASES]
    assert all(_same(r, wiki.count(p)) for r, p in zip(batch, PHRASES, strict=True))
    pairs = cache.cooccurrence_batch(PAIRS)
    assert [(r.a, r.b) for r in pairs] == PAIRS
    assert [r.cached for r in pairs] == [i == 0 for i in range(len(PAIRS))]
    assert all(r.cached for r in cache.count_batch(PHRASES))

    async def run() -> list[Any]:
        return [await cache.acount("Paris"), await cache.acount("new phrase here"),
                await cache.acooccurrence("Tom", "Jerry"),
                *(await cache.acount_batch(["film", "x y z"]))]

    results = asyncio.run(run())
    assert [r.cached for r in results] == [True, False, True, True, False]


def test_errors_are_not_cached(wiki: Any, tmp_path: Path) -> None:
    cache = CachedCorpusStats(LocalInfiniGram(wiki.path), tmp_path / "c.sqlite")
    for _ in range(2):
        with pytest.raises(EmptyPhraseError):
            cache.count("   ")
    assert len(cache) == 0


def test_a_rebuilt_index_does_not_see_old_answers(tmp_path: Path, tokenizer_path: Path) -> None:
    src = write_jsonl(tmp_path / "a.jsonl", [{"text": "Paris Paris"}])
    out = tmp_path / "idx"
    build_index(src, out, tokenizer=tokenizer_path, cpus=1)
    path = tmp_path / "c.sqlite"
    assert CachedCorpusStats(LocalInfiniGram(out), path).count("Paris").value == 2
    write_jsonl(src, [{"text": "Paris"}])
    build_index(src, out, tokenizer=tokenizer_path, cpus=1, force=True)
    fresh = CachedCorpusStats(LocalInfiniGram(out), path).count("Paris")
    assert fresh.value == 1 and not fresh.cached
    # Options that change answers are part of the key too.
    other = CachedCorpusStats(LocalInfiniGram(out, spaces="leading"), path).count("Paris")
    assert not other.cached


def test_ttl_and_clear(wiki: Any, tmp_path: Path) -> None:
    cache = CachedCorpusStats(LocalInfiniGram(wiki.path), tmp_path / "c.sqlite",
                              ttl_seconds=1e-9)
    cache.count("Paris")
    assert cache.count("Paris").cached is False  # expired at once
    keep = CachedCorpusStats(LocalInfiniGram(wiki.path), tmp_path / "c.sqlite")
    assert keep.count("Paris").cached is True
    assert keep.clear() >= 1 and len(keep) == 0
    with pytest.raises(ValueError):
        CachedCorpusStats(wiki, tmp_path / "x.sqlite", ttl_seconds=0)


def test_many_threads_share_one_cache(wiki: Any, tmp_path: Path) -> None:
    cache = CachedCorpusStats(LocalInfiniGram(wiki.path), tmp_path / "c.sqlite")
    expected = {p: wiki.count(p).value for p in PHRASES}
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in range(60):
                phrase = PHRASES[(seed + i) % len(PHRASES)]
                assert cache.count(phrase).value == expected[phrase]
                a, b = PAIRS[(seed * 3 + i) % len(PAIRS)]
                cache.cooccurrence(a, b)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(cache) == len(PHRASES) + len(PAIRS)
    cache.close()


def _process_worker(index: str, cache_path: str, seed: int, out: Any) -> None:
    backend = CachedCorpusStats(LocalInfiniGram(index), cache_path)
    values = {}
    for i in range(80):
        phrase = PHRASES[(seed + i) % len(PHRASES)]
        values[phrase] = backend.count(phrase).value
        backend.cooccurrence(*PAIRS[(seed + i) % len(PAIRS)], scope=5)
    out.put((seed, values, backend.hits, backend.misses))


def test_many_processes_share_one_cache(wiki: Any, tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_process_worker, args=(str(wiki.path), str(path), s, queue))
             for s in range(3)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    expected = {p: wiki.count(p).value for p in PHRASES}
    for _, values, hits, misses in results:
        assert values == expected
        assert hits + misses == 160
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM answers").fetchone()[0] == \
            len(PHRASES) + len(PAIRS)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_unusable_cache_path_is_a_clear_error(wiki: Any, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CorpusError, match="cannot create the corpus cache folder"):
        CachedCorpusStats(wiki, blocker / "c.sqlite")
    with pytest.raises(CorpusError, match="cannot open the corpus cache"):
        CachedCorpusStats(wiki, tmp_path)  # a directory, not a file


# ------------------------------------------------------------------ damaged or foreign files
def test_a_file_with_another_schema_is_refused_naming_it(wiki: Any, tmp_path: Path) -> None:
    from rag_gates.corpus import CorpusCacheError

    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as conn:  # some other program's database, same table name
        conn.execute("CREATE TABLE answers (key TEXT PRIMARY KEY, value TEXT)")
    with pytest.raises(CorpusCacheError) as caught:  # when the cache is made, before a gate
        CachedCorpusStats(wiki, path)
    message = str(caught.value)
    assert str(path) in message and "not a rag-gates corpus cache" in message
    assert "another path" in message
    with sqlite3.connect(path) as conn:  # the foreign table is left as it was
        assert [r[1] for r in conn.execute("PRAGMA table_info(answers)")] == ["key", "value"]



def _foreign_answers(path: Path) -> None:
    with sqlite3.connect(path) as conn:  # same table name, other columns
        conn.execute("CREATE TABLE answers (key TEXT PRIMARY KEY, value TEXT)")
        conn.execute("INSERT INTO answers VALUES ('a', 'b')")


def _foreign_tables(path: Path) -> None:
    with sqlite3.connect(path) as conn:  # another program's tables, no 'answers'
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        conn.execute("INSERT INTO notes (body) VALUES ('keep me')")


def _not_sqlite(path: Path) -> None:
    path.write_bytes(b"plain text, not a database\n" * 40)


@pytest.mark.parametrize("make", [_foreign_answers, _foreign_tables, _not_sqlite])
def test_a_refused_file_is_left_byte_for_byte_as_it_was(wiki: Any, tmp_path: Path,
                                                         make: Any) -> None:
    """Issue 32, item 9c: the refusal came after ``PRAGMA journal_mode=WAL``, which rewrote
    header bytes 18-19 of the other program's file (and a file without an 'answers' table
    got one). The schema is read first; nothing is written to a file that is refused."""
    from rag_gates.corpus import CorpusCacheError

    path = tmp_path / "other.sqlite"
    make(path)
    before = path.read_bytes()
    with pytest.raises(CorpusCacheError, match=r"other\.sqlite"):
        CachedCorpusStats(wiki, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.sqlite"]  # no -wal, -shm


def test_an_empty_file_becomes_a_cache(wiki: Any, tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite"
    path.touch()  # e.g. made by mktemp
    cache = CachedCorpusStats(LocalInfiniGram(wiki.path), path)
    assert cache.count("film").value == wiki.count("film").value
    assert cache.count("film").cached


def _corrupt_rows(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE answers SET payload = '{\"value\": \"many\"'")


def test_a_corrupt_payload_row_is_a_typed_error_naming_the_file(wiki: Any,
                                                                 tmp_path: Path) -> None:
    from rag_gates.corpus import CorpusCacheError

    path = tmp_path / "c.sqlite"
    cache = CachedCorpusStats(LocalInfiniGram(wiki.path), path)
    cache.count("Paris")
    cache.cooccurrence("film", "American")
    _corrupt_rows(path)
    for call in (lambda: cache.count("Paris"), lambda: cache.count_batch(["film", "Paris"]),
                 lambda: cache.cooccurrence("film", "American"),
                 lambda: asyncio.run(cache.acount("Paris"))):
        with pytest.raises(CorpusCacheError, match=r"c\.sqlite.*unreadable.*clear\(\)"):
            call()


@pytest.mark.parametrize("policy", ["retrieve", "skip", "raise"])
def test_quco_gate_routes_cache_faults_through_on_error(wiki: Any, tmp_path: Path,
                                                        policy: str) -> None:
    from rag_gates.corpus import CorpusCacheError
    from rag_gates.quco import QuCoGate

    path = tmp_path / "c.sqlite"
    cache = CachedCorpusStats(LocalInfiniGram(wiki.path), path)
    question = "Did Ed Wood live in Paris?"
    gate = QuCoGate(cache, tau_entity=0, on_error=policy)  # type: ignore[arg-type]
    healthy = gate.decide(question)
    assert healthy.evidence["entities"] and "error" not in healthy.evidence
    _corrupt_rows(path)
    if policy == "raise":
        with pytest.raises(CorpusCacheError):
            gate.decide(question)
        return
    d = gate.decide(question)
    assert d.retrieve is (policy == "retrieve")
    assert "CorpusCacheError" in str(d.evidence["error"]) and "on_error" in d.reason
    assert gate.errors == 1


def test_async_lookups_wait_for_another_writer_off_the_event_loop(wiki: Any,
                                                                  tmp_path: Path) -> None:
    """Another process holding the cache's write lock (the documented shared use): the
    async forms wait for it in a worker thread, so other coroutines keep running (before,
    SQLite's busy wait ran on the event loop and stalled them)."""
    path = tmp_path / "c.sqlite"
    cache = CachedCorpusStats(LocalInfiniGram(wiki.path), path, busy_timeout_s=10.0)
    cache.count("film")  # creates the file and its table
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # the other writer
    release = threading.Timer(0.8, lambda: other.execute("COMMIT"))

    async def run() -> tuple[Any, int]:
        async with loop_ticks(0.02) as ticks:
            release.start()
            answer = await cache.acount("Paris")  # a miss: its write waits for the lock
        return answer, ticks[0]

    answer, ticks = asyncio.run(run())
    other.close()
    assert _same(answer, wiki.count("Paris")) and cache.write_errors == 0
    assert ticks >= 20  # the loop ran through the 0.8 s wait
    assert cache.count("Paris").cached
