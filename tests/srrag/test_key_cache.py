"""The SR-RAG policy keys cached under ``$RAG_GATES_HOME``: a second load of the same labels
with the same model does no forward pass and routes the same; another model's weights or
edited labels miss; a damaged cache file is recomputed; concurrent writers leave a valid one.
(Tiny random-weight model; forward passes counted on the model itself.)"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag_gates.srrag.policy import PolicyEntry
from rag_gates.srrag.shipped import POLICY_ENV, load_default_policy, write_policy_labels

QUESTIONS = [
    ("retrieval", "In what city was Robley Dunglison Evans born?"),
    ("parametric", "What is the capital of France?"),
    ("retrieval", "In what city was Mick Flynn born?"),
    ("parametric", "Who wrote Hamlet?"),
    ("retrieval", "What is Rick Wilson's occupation?"),
    ("parametric", "What is the capital of Italy?"),
]
ENTRIES = [PolicyEntry(id=f"q{i}", dataset="popqa", source=s, question=q)  # type: ignore[arg-type]
           for i, (s, q) in enumerate(QUESTIONS)]
ASKED = ["Who was the screenwriter for Ran?", "In what country is Alexeni River?",
         "Who wrote Hamlet?"]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(POLICY_ENV, raising=False)
    monkeypatch.delenv("RAG_GATES_SRRAG_KEY_CACHE", raising=False)
    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


class Forwards:
    """Counts the model's real forward calls (a hook on the torch module)."""

    def __init__(self, lm: Any) -> None:
        self.calls = 0
        self._handle = lm.model.register_forward_pre_hook(self._count)

    def _count(self, *_: Any) -> None:
        self.calls += 1

    def close(self) -> None:
        self._handle.remove()


@pytest.fixture
def forwards(tiny: Any) -> Iterator[Forwards]:
    counter = Forwards(tiny)
    yield counter
    counter.close()


def _labels(path: Path, lm: Any, entries: list[PolicyEntry] = ENTRIES) -> Path:
    return write_policy_labels(path, entries, lm.model_id, k=3, tau=0.2)


def _vectors(policy: Any) -> np.ndarray:
    points, _ = policy.client.scroll(policy.collection, limit=100, with_vectors=True)
    return np.asarray([p.vector for p in sorted(points, key=lambda p: p.payload["id"])])


def _decisions(lm: Any, policy: Any) -> list[tuple[bool, float]]:
    from rag_gates.srrag.gate import SelfRoutingGate

    gate = SelfRoutingGate(lm, policy)
    return [(d.retrieve, d.score) for d in map(gate.decide, ASKED)]


def _cache_files(home: Path) -> list[Path]:
    from rag_gates.srrag.key_cache import key_cache_dir

    assert key_cache_dir() == home / "srrag" / "key-cache"
    return sorted(key_cache_dir().glob("*.keys"))


def test_second_load_does_no_forward_pass_and_routes_the_same(
        tiny: Any, home: Path, tmp_path: Path, forwards: Forwards) -> None:
    labels = _labels(tmp_path / "p.jsonl", tiny)
    first = load_default_policy(tiny, labels=labels)
    assert forwards.calls > 0
    cold_vectors, cold_routes = _vectors(first), _decisions(tiny, first)
    assert len(_cache_files(home)) == 1

    forwards.calls = 0
    second = load_default_policy(tiny, labels=labels)
    assert forwards.calls == 0  # the keys came from the cache
    np.testing.assert_array_equal(_vectors(second), cold_vectors)
    assert second.tau == first.tau == 0.2 and second.k == first.k == 3
    assert _decisions(tiny, second) == cold_routes


def test_disabled_cache_computes_and_writes_nothing(
        tiny: Any, home: Path, tmp_path: Path, forwards: Forwards,
        monkeypatch: pytest.MonkeyPatch) -> None:
    labels = _labels(tmp_path / "p.jsonl", tiny)
    monkeypatch.setenv("RAG_GATES_SRRAG_KEY_CACHE", "0")
    load_default_policy(tiny, labels=labels)
    load_default_policy(tiny, labels=labels)
    assert forwards.calls > 0 and not (home / "srrag" / "key-cache").exists()
    monkeypatch.delenv("RAG_GATES_SRRAG_KEY_CACHE")
    load_default_policy(tiny, labels=labels, cache_keys=False)
    assert not (home / "srrag" / "key-cache").exists()


def test_other_weights_or_edited_labels_miss(tiny: Any, home: Path, tmp_path: Path,
                                             forwards: Forwards) -> None:
    from rag_gates.lm.hf import HFWhiteBoxLM
    from rag_gates.testing import tiny_model_and_tokenizer

    labels = _labels(tmp_path / "p.jsonl", tiny)
    base = _vectors(load_default_policy(tiny, labels=labels))
    # Another seed under the same model id: only the weights fingerprint tells them apart.
    model, tok = tiny_model_and_tokenizer(seed=1)
    other = HFWhiteBoxLM(model, tok, model_id=tiny.model_id)
    other_forwards = Forwards(other)
    try:
        other_vectors = _vectors(load_default_policy(other, labels=labels))
    finally:
        other_forwards.close()
    assert other_forwards.calls > 0
    assert not np.allclose(other_vectors, base)
    assert len(_cache_files(home)) == 2

    edited = [*ENTRIES[:-1], ENTRIES[-1].model_copy(update={"question": "Who wrote Ulysses?"})]
    forwards.calls = 0
    load_default_policy(tiny, labels=_labels(tmp_path / "p.jsonl", tiny, edited))
    assert forwards.calls > 0
    assert len(_cache_files(home)) == 3


@pytest.mark.parametrize("damage", [
    lambda data: data[: len(data) // 2],                                  # torn write
    lambda data: data[:-9] + bytes([data[-9] ^ 0xFF]) + data[-8:],        # a flipped byte
    lambda data: b"not a cache file",
])
def test_a_damaged_cache_file_is_recomputed(tiny: Any, home: Path, tmp_path: Path,
                                            forwards: Forwards, damage: Any,
                                            caplog: pytest.LogCaptureFixture) -> None:
    labels = _labels(tmp_path / "p.jsonl", tiny)
    cold = _vectors(load_default_policy(tiny, labels=labels))
    [path] = _cache_files(home)
    path.write_bytes(damage(path.read_bytes()))
    forwards.calls = 0
    with caplog.at_level(logging.WARNING, logger="rag_gates.srrag.key_cache"):
        again = load_default_policy(tiny, labels=labels)
    assert forwards.calls > 0  # recomputed, not read
    assert "recomputing" in caplog.text and str(path) in caplog.text
    np.testing.assert_array_equal(_vectors(again), cold)
    forwards.calls = 0
    np.testing.assert_array_equal(_vectors(load_default_policy(tiny, labels=labels)), cold)
    assert forwards.calls == 0  # the rewritten file is whole again


def test_an_unwritable_cache_computes_and_says_why(
        tiny: Any, home: Path, tmp_path: Path, forwards: Forwards,
        caplog: pytest.LogCaptureFixture) -> None:
    labels = _labels(tmp_path / "p.jsonl", tiny)
    home.mkdir(parents=True)
    (home / "srrag").write_text("a file where the cache directory should be")
    with caplog.at_level(logging.WARNING, logger="rag_gates.srrag.key_cache"):
        policy = load_default_policy(tiny, labels=labels)
    assert forwards.calls > 0 and len(policy) == len(ENTRIES)
    assert "computing the keys without the cache" in caplog.text


_WORKER = textwrap.dedent("""
    import sys
    from rag_gates.srrag.shipped import load_default_policy
    from rag_gates.testing import tiny_lm
    lm = tiny_lm(seed=0)
    calls = []
    lm.model.register_forward_pre_hook(lambda *_: calls.append(1))
    policy = load_default_policy(lm, labels=sys.argv[1])
    print(len(policy), len(calls))
""")


def test_concurrent_processes_leave_a_valid_cache(tiny: Any, home: Path, tmp_path: Path,
                                                  forwards: Forwards) -> None:
    labels = _labels(tmp_path / "p.jsonl", tiny)
    env = {**os.environ, "RAG_GATES_HOME": str(home), "OMP_NUM_THREADS": "1"}
    workers = [subprocess.Popen([sys.executable, "-c", _WORKER, str(labels)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for _ in range(2)]
    outputs = [w.communicate(timeout=300) for w in workers]
    for worker, (_, err) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, err
    counts = [tuple(map(int, out.split())) for out, _ in outputs]
    assert all(size == len(ENTRIES) for size, _ in counts)
    # One computed, the other waited for it and read its keys (fresh processes both).
    assert sorted(calls == 0 for _, calls in counts) == [False, True]
    assert len(_cache_files(home)) == 1
    # A fresh process started after them: no forward pass at all.
    later = subprocess.run([sys.executable, "-c", _WORKER, str(labels)], env=env,
                           capture_output=True, text=True, timeout=300, check=True)
    assert later.stdout.split() == [str(len(ENTRIES)), "0"]
    cached = _vectors(load_default_policy(tiny, labels=labels))
    assert forwards.calls == 0
    computed = _vectors(load_default_policy(tiny, labels=labels, cache_keys=False))
    assert forwards.calls > 0
    np.testing.assert_array_equal(cached, computed)

def test_concurrent_threads_leave_a_valid_cache(tiny: Any, home: Path, tmp_path: Path,
                                                forwards: Forwards) -> None:
    from concurrent.futures import ThreadPoolExecutor

    labels = _labels(tmp_path / "p.jsonl", tiny)
    with ThreadPoolExecutor(2) as pool:
        policies = list(pool.map(lambda _: load_default_policy(tiny, labels=labels), range(2)))
    np.testing.assert_array_equal(_vectors(policies[0]), _vectors(policies[1]))
    forwards.calls = 0
    np.testing.assert_array_equal(_vectors(load_default_policy(tiny, labels=labels)),
                                  _vectors(policies[0]))
    assert forwards.calls == 0 and len(_cache_files(home)) == 1


def test_keys_that_are_not_finite_are_refused_and_never_cached(home: Path,
                                                               tmp_path: Path) -> None:
    import torch

    from rag_gates.lm.hf import HFWhiteBoxLM
    from rag_gates.srrag.policy import PolicyKeyError
    from rag_gates.testing import tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer(seed=2)
    with torch.no_grad():
        model.model.embed_tokens.weight.fill_(float("nan"))
    broken = HFWhiteBoxLM(model, tok, model_id="tiny-broken")
    labels = _labels(tmp_path / "p.jsonl", broken)
    for _ in range(2):  # the second load computes again: nothing broken was kept
        with pytest.raises(PolicyKeyError, match="not finite"):
            load_default_policy(broken, labels=labels)
    assert not (home / "srrag" / "key-cache").exists() or not _cache_files(home)


def test_the_cache_keeps_the_most_recently_used_files(
        tiny: Any, home: Path, tmp_path: Path, forwards: Forwards,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every edited labels file is another cache file: beyond the limit the least recently
    used go (a hit counts as use), with their locks."""
    monkeypatch.setenv("RAG_GATES_SRRAG_KEY_CACHE_KEEP", "2")
    files: list[Path] = []
    for i in range(3):  # three labels files, each another question set: three misses
        edited = [*ENTRIES[:-1], ENTRIES[-1].model_copy(update={"question": f"Who wrote {i}?"})]
        load_default_policy(tiny, labels=_labels(tmp_path / f"p{i}.jsonl", tiny, edited))
        [new] = set(_cache_files(home)) - set(files)
        files.append(new)
        os.utime(new, (1_000_000 + i, 1_000_000 + i))  # written in this order, seconds apart
        if i == 1:  # the first file is used again after the second was written
            forwards.calls = 0
            edited0 = [*ENTRIES[:-1], ENTRIES[-1].model_copy(update={"question": "Who wrote 0?"})]
            load_default_policy(tiny, labels=_labels(tmp_path / "p0.jsonl", tiny, edited0))
            assert forwards.calls == 0
            assert files[1].with_suffix(".lock").exists()
    # The third write pruned down to two: the first (used after the second) and the third.
    assert _cache_files(home) == sorted([files[0], files[2]])
    assert not files[1].with_suffix(".lock").exists()
    assert files[0].with_suffix(".lock").exists() and files[2].with_suffix(".lock").exists()


def test_prune_removes_stale_temps_and_free_orphan_locks_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rag_gates._io import append_locked
    from rag_gates.srrag import key_cache

    def file(name: str, age_s: float = 0.0) -> Path:
        path = tmp_path / name
        path.write_bytes(b"x")
        os.utime(path, (time.time() - age_s, time.time() - age_s))
        return path

    keys = [file(f"k{i}.keys", age_s=10 * i) for i in range(3)]  # k0 newest
    kept_lock = file("k0.lock")
    stale_tmp, young_tmp = file(".k9.keys.a.tmp", age_s=2 * 86400), file(".k8.keys.b.tmp")
    orphan_lock, held_lock = file("gone.lock"), file("busy.lock")  # no .keys beside either
    with append_locked(held_lock):  # another writer computing "busy": its lock must stay
        removed = key_cache.prune(tmp_path, keep=2, protect=keys[2])
    # keep 2 = the protected (oldest) file plus the newest other one.
    assert sorted(removed) == sorted([keys[1], stale_tmp, orphan_lock])
    assert keys[0].exists() and keys[2].exists() and kept_lock.exists()
    assert young_tmp.exists() and held_lock.exists()
    with pytest.raises(ValueError, match="at least 1"):
        key_cache.prune(tmp_path, keep=0)
    monkeypatch.setenv("RAG_GATES_SRRAG_KEY_CACHE_KEEP", "x")
    assert key_cache.keep_files() == key_cache.KEY_CACHE_KEEP
    monkeypatch.setenv("RAG_GATES_SRRAG_KEY_CACHE_KEEP", "3")
    assert key_cache.keep_files() == 3
