"""CBDR preference data (tiny random-weight model) and reranker fine-tuning (embedded MiniLM).

The preference test checks each record against the reranker's own Inc scores, and that an
interrupted build resumes to the same file; the fine-tuning test checks that training lowers
the library's InfoNCE loss on its data and that the saved model reranks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from rag_gates._io import append_locked
from rag_gates.cbdr import (
    ConfidenceGainReranker,
    ConfidenceProbe,
    CrossEncoderReranker,
    ProbeConfig,
    ProbePrompts,
)
from rag_gates.cbdr.preferences import (
    PreferenceRecord,
    build_preferences,
    passage_text,
    read_preferences,
    state_path,
)
from rag_gates.errors import FileInUseError
from rag_gates.types import Passage
from rag_gates_lab.commands.cbdr import cbdr_app
from rag_gates_lab.datasets import load_dataset

SLICE = Path(__file__).resolve().parents[2] / "examples" / "data" / "hotpotqa_dev_sample.jsonl"


@pytest.fixture(scope="module")
def reranker(tiny: Any) -> ConfidenceGainReranker:
    # Seed 1 gives this random probe both kinds of question on the slice: some with
    # positives and negatives, one where no paragraph lowers the confidence.
    torch.manual_seed(1)
    probe = ConfidenceProbe(ProbeConfig(
        model_id=tiny.model_id, hidden_size=tiny.hidden_size, num_layers=tiny.num_layers,
        layer=1, prompts=ProbePrompts(style="rag-gates")))  # paper prompts overflow 256 tokens
    return ConfidenceGainReranker(tiny, probe)


# ---------------------------------------------------------------------- preferences
def test_preferences_follow_inc_and_resume(tmp_path: Path,
                                           reranker: ConfidenceGainReranker) -> None:
    examples = load_dataset("hotpotqa", SLICE, n=3).examples
    out = tmp_path / "prefs.jsonl"
    stats = build_preferences(reranker, examples, max_pos=5, max_neg=5, out=out)
    assert stats.questions == 3
    assert stats.written >= 1
    assert (stats.written + stats.skipped_no_pos + stats.skipped_no_neg
            + stats.skipped_no_context) == 3
    records = read_preferences(out)
    assert len(records) == stats.written
    by_id = {e.id: e for e in examples}
    for record in records:
        assert record.pos_inc and all(x > 0 for x in record.pos_inc)
        assert record.neg_inc and all(x < 0 for x in record.neg_inc)
        assert record.pos_inc == sorted(record.pos_inc, reverse=True)
        assert record.neg_inc == sorted(record.neg_inc)
        # The record holds exactly the top / bottom passages by the reranker's own Inc.
        example = by_id[record.id]
        scores = reranker.score_passages(example.question, example.context).scores
        inc = sorted(zip(scores, [passage_text(p) for p in example.context], strict=True),
                     key=lambda t: -t[0])
        want_pos = [(s, t) for s, t in inc if s > 0][:5]
        want_neg = [(s, t) for s, t in reversed(inc) if s < 0][:5]
        assert record.pos == [t for _, t in want_pos]
        assert record.neg == [t for _, t in want_neg]
        assert record.pos_inc == pytest.approx([s for s, _ in want_pos], abs=1e-5)
        assert record.neg_inc == pytest.approx([s for s, _ in want_neg], abs=1e-5)
        assert record.query == example.question
        assert all(": " in t for t in record.pos + record.neg)  # "Title: text"
    # A question with positives but no negative is skipped and counted, not written.
    assert stats.skipped_no_neg == 1

    content = out.read_bytes()
    again = build_preferences(reranker, examples, max_pos=5, max_neg=5, out=out)
    assert again.written == 0
    assert again.already_written == stats.written
    assert again.skipped_no_neg == stats.skipped_no_neg  # remembered, not scored again
    assert out.read_bytes() == content

    # An interruption mid-write: drop the last record and leave half of it behind.
    lines = content.decode().splitlines(keepends=True)
    out.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2], encoding="utf-8")
    resumed = build_preferences(reranker, examples, max_pos=5, max_neg=5, out=out)
    assert resumed.written == 1
    assert resumed.already_written == stats.written - 1
    assert out.read_bytes() == content

    with pytest.raises(ValueError, match="other settings"):
        build_preferences(reranker, examples, max_pos=2, max_neg=5, out=out)
    assert state_path(out).is_file()


def test_a_second_run_on_the_same_out_is_refused_before_it_writes(
        tmp_path: Path, reranker: ConfidenceGainReranker) -> None:
    """Two `cbdr build-preferences` on one --out would each write every record: the one
    that finds the file held stops with FileInUseError, writing nothing."""
    examples = load_dataset("hotpotqa", SLICE, n=1).examples
    out = tmp_path / "prefs.jsonl"
    with append_locked(out):  # the other run, holding the file
        with pytest.raises(FileInUseError, match="another process"):
            build_preferences(reranker, examples, out=out)
        assert out.read_bytes() == b"" and not state_path(out).exists()
    stats = build_preferences(reranker, examples, out=out)  # once it has finished
    assert stats.questions == 1 and state_path(out).is_file()


def test_preferences_refuse_bad_input(tmp_path: Path, reranker: ConfidenceGainReranker
                                      ) -> None:
    examples = load_dataset("hotpotqa", SLICE, n=1).examples
    no_context = [e.model_copy(update={"context": []}) for e in examples]
    with pytest.raises(ValueError, match="hotpotqa or 2wiki"):
        build_preferences(reranker, no_context, out=tmp_path / "p.jsonl")
    with pytest.raises(ValueError, match="max_pos"):
        build_preferences(reranker, examples, max_pos=0, out=tmp_path / "p.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "query": "q"}\n{"id": "2"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:1 is not a preference record"):
        read_preferences(bad)
    with pytest.raises(FileNotFoundError, match="build-preferences"):
        read_preferences(tmp_path / "missing.jsonl")


# ---------------------------------------------------------------------- fine-tuning
FACTS = {
    "Hamlet": "Hamlet is a tragedy written by William Shakespeare around 1600.",
    "Paris": "Paris is the capital and largest city of France.",
    "Mount Everest": "Everest is Earth's highest mountain above sea level.",
    "Python": "Python is a programming language created by Guido van Rossum.",
    "Jupiter": "Jupiter is the fifth planet from the Sun.",
    "Violin": "The violin is a bowed string instrument.",
}
QUESTIONS = [
    ("Who wrote Hamlet?", "Hamlet",
     "William Shakespeare: Shakespeare was an English playwright, author of Hamlet."),
    ("What is the capital of France?", "Paris", "France: France's capital is Paris."),
    ("Which is the highest mountain on Earth?", "Mount Everest",
     "Himalayas: The Himalayas hold Mount Everest, the highest peak."),
    ("Who created the Python programming language?", "Python",
     "Guido van Rossum: Van Rossum is a Dutch programmer, the creator of Python."),
    ("Which planet is fifth from the Sun?", "Jupiter",
     "Solar System: The planets in order are Mercury, Venus, Earth, Mars, Jupiter."),
]


def _write_preferences(path: Path) -> list[PreferenceRecord]:
    records = []
    for i, (question, title, extra) in enumerate(QUESTIONS):
        others = [t for t in FACTS if t != title]
        # Three negatives for one record, fewer for others (padding by repetition).
        neg = [f"{t}: {FACTS[t]}" for t in others[: 3 if i == 0 else 1 + i % 2]]
        records.append(PreferenceRecord(
            id=str(i), query=question, pos=[f"{title}: {FACTS[title]}", extra], neg=neg,
            pos_inc=[0.2, 0.1], neg_inc=[-0.1 * (k + 1) for k in range(len(neg))]))
    path.write_text("".join(r.model_dump_json() + "\n" for r in records), encoding="utf-8")
    return records


def _infonce(model: Any, records: list[PreferenceRecord]) -> float:
    """The library's InfoNCE on each record's first positive against its negatives and every
    other row's passages (all in-batch negatives: deterministic), in eval mode."""
    from sentence_transformers.cross_encoder.losses import MultipleNegativesRankingLoss

    from rag_gates.cbdr.finetune import columns, training_rows

    rows = [r for r in training_rows(records, 3) if r.positive == records[r.record].pos[0]]
    loss = MultipleNegativesRankingLoss(model, num_negatives=None)
    model.eval()
    with torch.no_grad():
        return float(loss(columns(rows), None))


def _fact_ranks(reranker: CrossEncoderReranker) -> list[int]:
    """Rank (0 = first) of each question's own fact among all six facts."""
    passages = [Passage(text=text, title=t) for t, text in FACTS.items()]
    ranks = []
    for question, title, _ in QUESTIONS:
        result = reranker.rerank(question, passages)
        assert result.reranker == "cross-encoder" and len(result.ranked) == len(FACTS)
        ranks.append([s.passage.title for s in result.ranked].index(title))
    return ranks


def test_train_reranker_lowers_infonce_and_saves_a_loadable_model(tmp_path: Path) -> None:
    from rag_gates.cbdr.finetune import (
        METADATA_FILE,
        load_cross_encoder,
        resolve_base,
        train_reranker,
    )

    prefs = tmp_path / "prefs.jsonl"
    records = _write_preferences(prefs)
    torch.manual_seed(0)  # the same fresh head train_reranker starts from (seed=0)
    start = load_cross_encoder(resolve_base(None), max_length=64)
    before = _infonce(start, records)
    before_ranks = _fact_ranks(CrossEncoderReranker(start))
    steps: list[tuple[int, int, float]] = []
    out = tmp_path / "reranker"
    training = train_reranker(prefs, out, epochs=3, lr=1e-4, batch_size=5, num_negatives=3,
                              max_length=64, seed=0,
                              progress=lambda s, t, loss: steps.append((s, t, loss)))
    assert training.records == 5 and training.rows == 10
    assert training.steps == len(steps) >= 6
    assert [s for s, _, _ in steps] == list(range(1, len(steps) + 1))
    meta = json.loads((out / METADATA_FILE).read_text())
    assert meta["loss"].endswith("MultipleNegativesRankingLoss")
    assert meta["final_loss"] == pytest.approx(training.final_loss)
    assert meta["preferences"] == str(prefs.resolve())
    assert not list(out.glob("*.bin")) and not list(out.glob("*.pkl"))  # safetensors only

    loaded = CrossEncoderReranker(out, max_length=64)
    after = _infonce(loaded.model, records)
    assert after < before - 0.1, (before, after)

    # Each question's own fact moves up among the six facts (ranks summed: 14 -> 6 when
    # written; a head that learned nothing stays near the random start).
    after_ranks = _fact_ranks(loaded)
    assert sum(after_ranks) <= sum(before_ranks) - 4, (before_ranks, after_ranks)

    # A second run replaces the reranker it wrote; an unrelated directory is refused.
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a rag-gates reranker"):
        train_reranker(prefs, tmp_path / "other", max_length=64)


# ---------------------------------------------------------------------- CLI
def test_cli_train_reranker_missing_preferences(tmp_path: Path) -> None:
    result = CliRunner().invoke(cbdr_app, [
        "train-reranker", "--preferences", str(tmp_path / "nope.jsonl"),
        "--out", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "build-preferences" in result.output
    assert not (tmp_path / "out").exists()


def test_cli_build_preferences(tmp_path: Path) -> None:
    """The command writes records and a summary; a probe trained for another model is
    refused with what to do, before any scoring."""
    from rag_gates.lm.defaults import load_lm
    from rag_gates.testing import save_tiny_lm

    model_dir = save_tiny_lm(tmp_path / "tiny")
    lm = load_lm(str(model_dir))
    torch.manual_seed(1)
    ConfidenceProbe(ProbeConfig(model_id=lm.model_id, hidden_size=lm.hidden_size,
                                num_layers=lm.num_layers, layer=1,
                                prompts=ProbePrompts(style="rag-gates"))).save(tmp_path / "mine")
    ConfidenceProbe(ProbeConfig(model_id="some-other-model", hidden_size=lm.hidden_size,
                                num_layers=lm.num_layers, layer=1)).save(tmp_path / "foreign")
    args = ["build-preferences", "--data", str(SLICE), "--n", "3", "--offset", "0",
            "--model", str(model_dir), "--threads", "1"]
    out = tmp_path / "prefs.jsonl"
    result = CliRunner().invoke(cbdr_app, [*args, "--probe", str(tmp_path / "mine"),
                                           "--out", str(out)])
    assert result.exit_code == 0, result.output
    records = read_preferences(out)
    text = " ".join(result.output.split())  # rich wraps at the terminal width
    assert records and f"{len(records)} records" in text and "from 3 questions" in text

    result = CliRunner().invoke(cbdr_app, [*args, "--probe", str(tmp_path / "foreign"),
                                           "--out", str(tmp_path / "other.jsonl")])
    assert result.exit_code == 1, result.output
    assert "train-probe" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "other.jsonl").exists()
