"""Many worker processes, one app: four real processes (spawn, as uvicorn, gunicorn and
Celery start them) build every component from the same files at once and answer at the
same time, and two eval-gate runs share one label cache.

Tiny random-weight model (plumbing: the files and the processes are what is tested), a
small infini-gram index and SQLite count cache, one SR-RAG policy folder, one CBDR probe,
all built here in a temporary directory.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.workers import app

pytest.importorskip("infini_gram", reason='needs the corpus extra: pip install "rag-gates[corpus]"')
pytest.importorskip("langchain_rag_gates")
pytest.importorskip("llama_index.retrievers.rag_gates")

ROOT = Path(__file__).resolve().parents[2]
POPQA = ROOT / "examples" / "data" / "popqa_dev_sample.jsonl"
WORKERS = 4
# Each process on one thread: four of them share the machine's cores.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
TEXTS = ["William Shakespeare wrote Hamlet in London.", "The capital of France is Paris.",
         "The quick brown fox jumps over the lazy dog near the river bank.",
         "Scientists measure accuracy, recall and precision on real data sets.",
         "Ed Wood is a film directed by Tim Burton.", "Hamlet is a tragedy by Shakespeare.",
         "Paris is the largest city of France.", "William Shakespeare was born in Stratford."]


@pytest.fixture(scope="module")
def environment() -> Iterator[None]:
    """One thread per process and a private RAG_GATES_HOME, inherited by spawned workers."""
    saved = {k: os.environ.get(k) for k in [*ONE_THREAD, "RAG_GATES_HOME"]}
    os.environ.update(ONE_THREAD)
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight model saved to disk (room for a retrieved paragraph)."""
    from rag_gates.testing import tiny_model_and_tokenizer

    path = tmp_path_factory.mktemp("model")
    model, tok = tiny_model_and_tokenizer(seed=0, max_context=4096)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def shared(environment: None, tiny_model: Path,
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The files every worker opens: policy folder, probe, corpus index, count cache."""
    import torch

    from rag_gates.cbdr import ConfidenceProbe, ProbeConfig
    from rag_gates.corpus import build_index
    from rag_gates.lm import load_lm
    from rag_gates.srrag import HiddenStateKeys, PolicyEntry, SelfRoutingGate, SourcePolicy

    root = tmp_path_factory.mktemp("shared")
    os.environ["RAG_GATES_HOME"] = str(root / "home")
    lm = load_lm(tiny_model)
    policy = SourcePolicy.open(HiddenStateKeys(lm), path=root / "policy", k=3)
    policy.add_questions([PolicyEntry(id=str(i), question=q, source=source) for i, (q, source)
                          in enumerate([("Who wrote Macbeth?", "retrieval"),
                                        ("What is the capital of Italy?", "retrieval"),
                                        ("What colour is the sky?", "parametric"),
                                        ("Who painted the Mona Lisa?", "parametric")])])
    # Thresholds at the middle of the scores, so both routes are taken.
    products = sorted(SelfRoutingGate(lm, policy).score(q)[0] for q in app.QUESTIONS)
    policy.close()
    torch.manual_seed(0)
    probe = ConfidenceProbe(ProbeConfig(model_id=lm.model_id, hidden_size=lm.hidden_size,
                                        num_layers=lm.num_layers, layer=2, hidden_dims=(16,),
                                        dropout=0.0))
    probe.save(root / "probe")
    confidences = sorted(probe.confidence(lm, app.QUESTIONS))
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n"
                              for i, t in enumerate(TEXTS)), encoding="utf-8")
    build_index(corpus, root / "index", tokenizer=tiny_model / "tokenizer.json", cpus=1)
    return {"model": str(tiny_model), "policy": str(root / "policy"),
            "probe": str(root / "probe"), "index": str(root / "index"),
            "count_cache": str(root / "counts.sqlite"), "texts": TEXTS,
            "tau": (products[2] + products[3]) / 2, "beta": (confidences[2] + confidences[3]) / 2,
            "tau_entity": 2.0}


def _same(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    for row, expected in zip(got, want, strict=True):
        assert row["question"] == expected["question"]
        for part in ("langchain", "llama_index", "cbdr", "quco"):
            (retrieve, score, *rest), (retrieve0, score0, *rest0) = row[part], expected[part]
            assert (retrieve, rest) == (retrieve0, rest0), (part, row["question"])
            assert score == pytest.approx(score0, abs=1e-6), (part, row["question"])


def test_four_worker_processes_build_and_answer_from_the_same_files(
        shared: dict[str, Any]) -> None:
    import torch

    threads = torch.get_num_threads()
    try:
        expected = app.reference(shared)
    finally:
        torch.set_num_threads(threads)
    routes = {part: {row[part][0] for row in expected} for part in ("langchain", "cbdr")}
    assert routes == {"langchain": {True, False}, "cbdr": {True, False}}  # both routes taken
    assert any(row["quco"][2] for row in expected)  # the index answered counts
    spawn = multiprocessing.get_context("spawn")
    barrier, results = spawn.Barrier(WORKERS), spawn.Queue()
    workers = [spawn.Process(target=app.worker, args=(shared, barrier, results))
               for _ in range(WORKERS)]
    for process in workers:
        process.start()
    try:
        reports = [results.get(timeout=600) for _ in workers]
    finally:
        for process in workers:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    for pid, status, rows in reports:
        assert status == "ok", f"worker {pid} failed:\n{rows}"
        _same(rows, expected)
    assert len({pid for pid, _, _ in reports}) == WORKERS


# ------------------------------------------------------------------- eval-gate label cache
def _eval_gate(gate: str, model: Path, out: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "rag_gates.cli", "eval-gate", "--gate", gate,
               "--dataset", "popqa", "--data", str(POPQA), "--n", "4", "--model", str(model),
               "--k", "1", "--max-new-tokens", "3", "--threads", "1", "--out", str(out)]
    # The CLI of this checkout (spawned workers get the parent's sys.path by themselves).
    path = os.pathsep.join([str(ROOT), str(ROOT / "integrations" / "langchain"),
                            str(ROOT / "integrations" / "llama-index"),
                            os.environ.get("PYTHONPATH", "")])
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, **ONE_THREAD, "PYTHONPATH": path})


def test_two_eval_gate_runs_share_one_label_cache(environment: None, tiny_model: Path,
                                                 tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Both runs decide their gates, wait while the labels are being written elsewhere
    (here: held by the test), then one labels and the other reads: every question is
    labelled once and both reports rest on the same labels."""
    from rag_gates._io import append_locked
    from rag_gates_lab.datasets import load_dataset
    from rag_gates_lab.gate_eval import GateEvalConfig, label_run_dir
    from rag_gates_lab.runner import read_records

    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path / "home"))
    # The same data file as the runs: the label cache is keyed by its questions, answers
    # and corpus.
    config = GateEvalConfig(gate="any", dataset="popqa", data_path=str(POPQA), n=4,
                            model=str(tiny_model), k=1, max_new_tokens=3)
    labels = label_run_dir(config, load_dataset("popqa", POPQA, n=4).fingerprint)
    labels.mkdir(parents=True)
    holder = append_locked(labels / "results.jsonl")  # another run writing the labels
    runs = {gate: _eval_gate(gate, tiny_model, tmp_path / gate)
            for gate in ("first-token-prob", "answer-logprob")}
    try:
        deadline = time.monotonic() + 300
        while any(not (tmp_path / gate / "decisions.jsonl").is_file() or len(
                (tmp_path / gate / "decisions.jsonl").read_text().splitlines()) < 4
                for gate in runs):
            assert all(run.poll() is None for run in runs.values()), \
                {gate: run.communicate()[0][-3000:] for gate, run in runs.items()}
            assert time.monotonic() < deadline, "the gates did not decide in time"
            time.sleep(0.2)
        time.sleep(1.0)
        # Decided, and waiting for the labels rather than failing or labelling them again.
        assert all(run.poll() is None for run in runs.values()), \
            {gate: run.communicate()[0][-3000:] for gate, run in runs.items()}
        assert (labels / "results.jsonl").read_text() == ""
    finally:
        holder.close()
    outputs = {gate: run.communicate(timeout=300)[0] for gate, run in runs.items()}
    for gate, run in runs.items():
        assert run.returncode == 0, outputs[gate][-3000:]
    rows = [(r.id, r.method) for r in read_records(labels)]
    assert len(rows) == 8 and len(set(rows)) == 8  # each question labelled once, per method
    reports = [json.loads((tmp_path / gate / "gate_eval.json").read_text()) for gate in runs]
    for key in ("closed_book_accuracy", "single_retrieval_accuracy", "questions"):
        assert reports[0][key] == reports[1][key]
