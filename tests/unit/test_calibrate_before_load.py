"""``rag-gates calibrate`` says what is wrong with its output paths and work directory
before the model loads (issue 54, cases 8 and 12): a ``--out`` that is a directory, a work
directory another run holds, one made with another model, or one whose config.json is
damaged.

"Before the model loads" is made observable: ``--model`` is a directory whose weights file
is garbage, so a run that got as far as loading it would fail with a load error instead of
the refusal asserted here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rag_gates.cli import app

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "data" / "calibration_questions.jsonl"
CORPUS = ROOT / "examples" / "data" / "calibration_corpus.jsonl"


@pytest.fixture()
def broken_model(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(b"not a safetensors file" * 100)
    return folder


def _invoke(tmp_path: Path, model: Path, *args: str) -> Any:
    return CliRunner().invoke(app, ["calibrate", "--data", str(SAMPLE), "--corpus",
                                    str(CORPUS), "--model", str(model), *args])


def _said(result: Any) -> str:
    return " ".join(result.output.split())


def test_out_naming_a_directory_is_refused_at_once(tmp_path: Path, broken_model: Path) -> None:
    out = tmp_path / "gate.json"
    out.mkdir()
    result = _invoke(tmp_path, broken_model, "--out", str(out))
    assert result.exit_code == 2, result.output
    assert f"--out: {out} is a directory; give a file path" in _said(result)
    assert not (tmp_path / "gate-work").exists()


def test_a_work_directory_in_use_is_refused_before_the_model_loads(
        tmp_path: Path, broken_model: Path) -> None:
    from rag_gates._io import append_locked
    from rag_gates.commands.calibrate import WORK_LOCK

    work = tmp_path / "work"
    work.mkdir()
    with append_locked(work / WORK_LOCK):  # another run holds it
        result = _invoke(tmp_path, broken_model, "--out", str(tmp_path / "g.json"),
                         "--work-dir", str(work))
    assert result.exit_code == 2, result.output
    said = _said(result)
    assert f"another rag-gates calibrate is using the work directory {work}" in said
    assert "another --work-dir" in said and "another --out" not in said


def _config_for(model: Path, *, model_files: str) -> dict[str, Any]:
    """The config a run on these inputs would write, as if made with another model."""
    from rag_gates.commands.calibrate import _sha, question_set_sha, read_questions

    return {"model": "0" * 64, "questions": question_set_sha(read_questions(SAMPLE)),
            "corpus": _sha(CORPUS), "gates": ["answer-logprob"], "k": 3,
            "max_new_tokens": 32, "model_files": model_files}


def test_a_work_directory_of_another_model_is_refused_before_it_loads(
        tmp_path: Path, broken_model: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "config.json").write_text(json.dumps(_config_for(broken_model,
                                                             model_files="f" * 64)))
    result = _invoke(tmp_path, broken_model, "--out", str(tmp_path / "g.json"),
                     "--work-dir", str(work))
    assert result.exit_code == 2, result.output
    assert "holds records made with another model (its files differ)" in _said(result)


def test_the_same_models_files_pass_the_early_check(tmp_path: Path,
                                                    broken_model: Path) -> None:
    """With the model's own file fingerprint the early check passes, and the run goes on
    to load the model, whose garbage weights then fail: the check is not a blanket refusal."""
    from rag_gates.commands.calibrate import model_files_fingerprint

    work = tmp_path / "work"
    work.mkdir()
    files = model_files_fingerprint(str(broken_model))
    assert files is not None
    (work / "config.json").write_text(json.dumps(_config_for(broken_model, model_files=files)))
    result = _invoke(tmp_path, broken_model, "--out", str(tmp_path / "g.json"),
                     "--work-dir", str(work))
    assert "holds records made with another" not in _said(result)
    assert result.exit_code != 0  # the garbage weights, when loaded


@pytest.mark.parametrize("content", [
    b"[1, 2, 3]",                      # a list, not an object
    b"[" * 100_000,                    # deep nesting
    b'{"model": "\xff\xfe"}',          # not UTF-8
    b"\x00\x01garbage",                # garbage
])
def test_a_damaged_work_config_names_the_file_before_the_model_loads(
        content: bytes, tmp_path: Path, broken_model: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "config.json").write_bytes(content)
    result = _invoke(tmp_path, broken_model, "--out", str(tmp_path / "g.json"),
                     "--work-dir", str(work))
    assert result.exit_code == 2, result.output
    assert str(work / "config.json") in _said(result)
    assert not isinstance(result.exception, (AttributeError, RecursionError,
                                             UnicodeDecodeError))


def test_a_damaged_records_file_is_named_before_the_model_loads(
        tmp_path: Path, broken_model: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "records.jsonl").write_bytes(b'{"id": "1"}\n' + b"[" * 100_000 + b"\n")
    result = _invoke(tmp_path, broken_model, "--out", str(tmp_path / "g.json"),
                     "--work-dir", str(work))
    assert result.exit_code == 2, result.output
    assert str(work / "records.jsonl") in _said(result)
