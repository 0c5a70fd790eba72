"""A white-box model used in the parent, then forked (gunicorn ``--preload``, a Celery prefork
pool): torch's thread pool does not survive fork, so a worker forked after a forward pass on
several threads used to hang in its first forward pass, silently, until it was killed."""

from __future__ import annotations

import faulthandler
import json
import os
import warnings
from typing import Any

import pytest
import torch

fork_only = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _in_a_forked_child(check: Any, timeout_s: int = 60) -> dict[str, Any]:
    """Run ``check()`` in a forked child (warnings recorded from the fork on) and return
    what it returns; a child that hangs is stopped by a watchdog and reported as such."""
    read, write = os.pipe()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pid = os.fork()
        if pid == 0:  # the worker: report, then leave without running the parent's atexit
            os.close(read)
            with open(os.devnull, "w") as devnull:
                faulthandler.dump_traceback_later(timeout_s, exit=True, file=devnull)
                try:
                    try:
                        out = check()
                        out["warnings"] = [str(w.message) for w in caught]
                    except BaseException as exc:  # reported, not mistaken for a hang
                        out = {"error": f"{type(exc).__name__}: {exc}"}
                    os.write(write, json.dumps(out).encode())
                finally:
                    os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        reported = pipe.read()
    os.waitpid(pid, 0)
    assert reported, f"the forked worker hung for {timeout_s} s in its first forward pass"
    result: dict[str, Any] = json.loads(reported)
    assert "error" not in result, f"the forked worker failed: {result['error']}"
    return result


@fork_only
def test_a_worker_forked_after_a_forward_on_two_threads_answers_on_one_and_says_so(
        tiny: Any) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # any multi-core worker: intra-op parallelism on
    try:
        tiny.enable_prefix_cache(1)
        tiny.generate("Who wrote Hamlet?", max_new_tokens=2)  # the parent used it
        parent_locks = (tiny._lock, tiny.prefix_cache._lock)

        def worker() -> dict[str, Any]:
            answer = tiny.generate("Who wrote Hamlet?", max_new_tokens=2)
            return {"threads": torch.get_num_threads(), "tokens": answer.completion_tokens,
                    "fresh_locks": tiny._lock is not parent_locks[0]
                    and tiny.prefix_cache._lock is not parent_locks[1]}

        child = _in_a_forked_child(worker)
        assert torch.get_num_threads() == 2  # the parent keeps its threads
    finally:
        torch.set_num_threads(threads)
        tiny.enable_prefix_cache(0)
    assert child["threads"] == 1 and child["tokens"] >= 1 and child["fresh_locks"]
    assert any("forked after its parent ran a model on 2 torch threads" in w
               and "spawn" in w for w in child["warnings"]), child["warnings"]


@fork_only
def test_a_worker_forked_after_one_thread_forwards_keeps_its_threads_without_a_warning(
        tiny: Any) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tiny.generate("Who wrote Hamlet?", max_new_tokens=2)
        torch.set_num_threads(2)  # set after the last forward: no pool ran in the parent
        child = _in_a_forked_child(lambda: {"threads": torch.get_num_threads()})
    finally:
        torch.set_num_threads(threads)
    assert child == {"threads": 2, "warnings": []}


@fork_only
def test_the_default_embedder_used_in_the_parent_does_not_hang_a_forked_worker() -> None:
    """The embedded all-MiniLM-L6-v2 (a plain sentence-transformers model hangs the same way:
    docs/scaling.md)."""
    pytest.importorskip("sentence_transformers")
    from rag_gates.lm.defaults import load_default_embedder

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        embedder = load_default_embedder()
        embedder.encode(["Paris is the capital of France."] * 4)
        child = _in_a_forked_child(lambda: {
            "dims": len(embedder.encode(["Who wrote Hamlet?"])[0]),
            "threads": torch.get_num_threads()})
    finally:
        torch.set_num_threads(threads)
    assert child["dims"] == 384 and child["threads"] == 1
    assert any("2 torch threads" in w for w in child["warnings"]), child["warnings"]
