"""``rag-gates cbdr train-probe`` and its resumable label collection, on a saved tiny model."""

from __future__ import annotations

import json
import pathlib
import threading
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rag_gates.cbdr.data import collect_probe_data
from rag_gates.cbdr.prompts import ProbePrompts
from rag_gates.testing import save_tiny_lm
from rag_gates_lab.commands.cbdr import cbdr_app
from rag_gates_lab.datasets import load_dataset

SLICE = Path(__file__).resolve().parents[2] / "examples" / "data"
runner = CliRunner()


def test_collection_resumes_from_its_cache(tmp_path: Path, tiny: Any) -> None:
    examples = load_dataset("popqa", SLICE / "popqa_dev_sample.jsonl", n=4).examples
    cache = tmp_path / "cache.jsonl"
    prompts = ProbePrompts(style="rag-gates")
    first = collect_probe_data(tiny, examples[:2], prompts, 1, max_new_tokens=3, cache=cache)
    assert len(cache.read_text().splitlines()) == 3  # header + 2 questions
    # A torn last line (interrupted write) is dropped and that question is redone.
    with cache.open("a") as handle:
        handle.write('{"id": "half')
    seen: list[int] = []
    both = collect_probe_data(tiny, examples, prompts, 1, max_new_tokens=3, cache=cache,
                              progress=lambda done, total, right: seen.append(done))
    assert both[:2] == first and seen == [1, 2, 3, 4]
    lines = [json.loads(line) for line in cache.read_text().splitlines()[1:]
             if line.endswith("}")]
    assert [line["id"] for line in lines] == [e.id for e in examples]
    fresh = collect_probe_data(tiny, examples, prompts, 1, max_new_tokens=3)
    for a, b in zip(fresh, both, strict=True):
        assert a.answer == b.answer and a.hidden == pytest.approx(b.hidden, abs=1e-4)
    with pytest.raises(ValueError, match="other settings"):
        collect_probe_data(tiny, examples, prompts, 2, max_new_tokens=3, cache=cache)


def test_two_runs_starting_on_one_new_cache_collect_each_question_once(
        tmp_path: Path, tiny: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two probe trainings sharing the cache (same model and settings) start together: the
    second waits for the first and reuses its examples; one header, each question once."""
    examples = load_dataset("popqa", SLICE / "popqa_dev_sample.jsonl", n=3).examples
    cache = tmp_path / "probe-data.jsonl"
    prompts = ProbePrompts(style="rag-gates")
    # Both runs have looked at the cache before either opens it (the race, made certain).
    both_looked = threading.Barrier(2, timeout=60)
    real_open = pathlib.Path.open

    def open_(self: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if self == cache and mode == "a":
            both_looked.wait()
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "open", open_)
    results: list[Any] = []

    def run() -> None:
        try:
            results.append(collect_probe_data(tiny, examples, prompts, 1, max_new_tokens=3,
                                              cache=cache))
        except BaseException as exc:  # asserted below
            results.append(exc)

    runs = [threading.Thread(target=run) for _ in range(2)]
    for t in runs:
        t.start()
    for t in runs:
        t.join()
    monkeypatch.undo()
    assert len(results) == 2 and not any(isinstance(r, BaseException) for r in results), \
        results
    assert results[0] == results[1]
    header, *rows = cache.read_text().splitlines()
    assert '"identity"' in header
    assert sorted(json.loads(row)["id"] for row in rows) == sorted(e.id for e in examples)


def test_train_probe_reports_one_class_labels(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path / "home"))
    model = save_tiny_lm(tmp_path / "tiny")
    result = runner.invoke(cbdr_app, [
        "train-probe", "--model", str(model), "--dataset", "popqa", "--data",
        str(SLICE / "popqa_dev_sample.jsonl"), "--n", "6", "--offset", "0",
        "--label-max-new-tokens", "2", "--out", str(tmp_path / "probe")])
    assert result.exit_code == 1
    assert "must contain both classes" in result.output
    assert not (tmp_path / "probe").exists()
    bad = runner.invoke(cbdr_app, [
        "train-probe", "--model", str(model), "--dataset", "popqa", "--dataset", "hotpotqa",
        "--n", "6", "--n", "6", "--n", "6", "--out", str(tmp_path / "probe")])
    assert bad.exit_code == 1 and "give --n once, or once per --dataset" in bad.output
