"""``rag-gates calibrate``: options checked before any model loads; on the tiny model, the
records, the spec (loadable by load_gate) and the plot are written, and a second run resumes
instead of answering again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rag_gates.answers import normalize_answer
from rag_gates.cli import app
from rag_gates.eval.methods import MethodContext, make_method

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "data" / "calibration_questions.jsonl"
CORPUS = ROOT / "examples" / "data" / "calibration_corpus.jsonl"


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(app, ["calibrate", *args])


@pytest.mark.parametrize(("args", "message"), [
    (["--max-loss", "1.5"], "--max-loss must be in (0, 1)"),
    (["--delta", "0"], "--delta must be in (0, 1)"),
    (["--gates", "answer-logprob,nope"], "unknown gate(s) nope"),
    (["--model", "/nonexistent/model"], "not a directory"),
    (["--bound", "hoeffding"], "--bound must be wsr or binomial"),
])
def test_bad_options_fail_before_the_model_loads(args: list[str], message: str,
                                                 tmp_path: Path) -> None:
    result = _invoke("--data", str(SAMPLE), "--corpus", str(CORPUS),
                     "--out", str(tmp_path / "gate.json"), *args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "gate-work").exists()  # nothing ran


def test_bad_data_line_is_named(tmp_path: Path) -> None:
    data = tmp_path / "q.jsonl"
    data.write_text('{"question": "Who?", "answers": ["x"]}\n{"question": "no answers"}\n')
    result = _invoke("--data", str(data), "--corpus", str(CORPUS),
                     "--out", str(tmp_path / "gate.json"))
    assert result.exit_code == 2 and "q.jsonl:2" in result.output


def test_too_few_questions(tmp_path: Path) -> None:
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question": f"Q{i}?", "answers": ["a"]}) + "\n"
                            for i in range(10)))
    result = _invoke("--data", str(data), "--corpus", str(CORPUS),
                     "--out", str(tmp_path / "gate.json"))
    assert result.exit_code == 2 and "at least 30" in result.output


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rag_gates.testing import save_tiny_lm

    return save_tiny_lm(tmp_path_factory.mktemp("tiny"))


def test_calibrates_writes_a_loadable_spec_and_resumes(tiny_dir: Path, tmp_path: Path) -> None:
    from rag_gates.calibration import GateSpec, load_gate, read_records
    from rag_gates.lm import load_lm

    lm = load_lm(str(tiny_dir))
    questions = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:40]]
    closed = make_method("no-rag", MethodContext(lm=lm, max_new_tokens=4))
    # Gold answers the tiny model gets right closed book on every other question (a word of
    # its own answer), never on the rest: both classes, as calibration needs.
    rows = []
    for i, q in enumerate(questions):
        words = normalize_answer(closed.answer(q["question"]).answer).split()
        gold = words[0] if i % 2 == 0 and words else "zzqqxx"
        rows.append({"id": q["id"], "question": q["question"], "answers": [gold]})
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # Short passages: the tiny model reads 256 tokens at most.
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"title": p["title"], "text": p["text"][:60]}) + "\n"
                              for p in map(json.loads, CORPUS.read_text().splitlines()[:300])))
    out = tmp_path / "gate.json"
    args = ["--data", str(data), "--corpus", str(corpus), "--out", str(out), "--k", "1",
            "--model", str(tiny_dir), "--gates", "answer-logprob,first-token-prob",
            "--max-new-tokens", "4", "--max-loss", "0.2"]
    result = _invoke(*args)
    assert result.exit_code == 0, result.output
    records = read_records(tmp_path / "gate-work" / "records.jsonl")
    assert len(records) == 40
    assert {r.closed_book_correct for r in records} == {True, False}
    assert set(records[0].scores) == {"answer-logprob", "first-token-prob"}
    assert "AUROC" in result.output and "answer-logprob" in result.output
    assert (tmp_path / "gate.png").is_file()
    spec = GateSpec.load(out)
    assert spec.n > 0 and spec.model.name == lm.model_id
    gate = load_gate(out, lm=lm)
    assert gate.decide("Who wrote Hamlet?").evidence["spec"]["epsilon"] == 0.2
    before = (tmp_path / "gate-work" / "records.jsonl").read_text()
    again = _invoke(*args)
    assert again.exit_code == 0, again.output
    assert (tmp_path / "gate-work" / "records.jsonl").read_text() == before
    changed = _invoke(*args[:-2], "--max-loss", "0.2", "--gates", "answer-logprob")
    assert changed.exit_code == 2 and "another gates" in " ".join(changed.output.split())


def test_a_text_only_model_gets_the_log_probability_gate_and_says_why_not_others() -> None:
    """A model behind a text interface (here LangChain's, as a served model is) keeps
    answer-logprob; the white-box gates are skipped, each with its reason."""
    pytest.importorskip("langchain_rag_gates")
    from langchain_rag_gates import ChatRagGates, as_text_lm

    from rag_gates.commands.calibrate import applicable_gates
    from rag_gates.testing import tiny_lm

    text_only = as_text_lm(ChatRagGates(lm=tiny_lm(), max_tokens=8))
    built, skipped = applicable_gates(text_only, None, {"max_new_tokens": 8})
    assert list(built) == ["answer-logprob"]
    assert set(skipped) == {"first-token-prob", "cbdr", "quco"}
    assert "reads logits/hidden states" in skipped["first-token-prob"]
    with pytest.raises(ValueError, match="--gates first-token-prob"):
        applicable_gates(text_only, ["first-token-prob"], {})
