"""Issue 54, items 6, 9, 10 and 11: every file rag-gates reads goes through one bounded reader
(:mod:`rag_gates._files`), and every damaged input gives one typed error,
:class:`~rag_gates.errors.InputFileError`, naming the file (``FILE:LINE`` for a line of a JSON
Lines file), instead of a raw ``UnicodeDecodeError`` / ``RecursionError`` / ``ValueError``
without the path, a traceback, or a silent acceptance.

Each damaged input here is a real file on disk read by the real reader; the ``calibrate`` cases
run the real command through typer's CliRunner with ``--model`` pointing at an empty directory
(which cannot load), so a refusal that names the input proves it came before the model.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rag_gates.errors import (
    ArtifactError,
    ArtifactFileError,
    CalibrationError,
    InputFileError,
    SpecFileError,
)

DEEP = "[" * 100_000 + "]" * 100_000  # json.loads: RecursionError
NOT_UTF8 = b"\xff\xfe not UTF-8 \xc3\x28"
SURROGATE = '"\\ud800"'  # a JSON escape that decodes to a lone surrogate


def _names(exc: BaseException, path: Path, line: int | None = None) -> None:
    """The typed error, naming the file (and the line)."""
    assert isinstance(exc, InputFileError) and isinstance(exc, ValueError), repr(exc)
    where = f"{path}:{line}" if line is not None else str(path)
    assert where in str(exc), str(exc)
    assert exc.path == str(path) and (line is None or exc.line == line)


# ------------------------------------------------------------------ the reader itself
def test_reader_bounds_size_lines_and_depth(tmp_path: Path) -> None:
    from rag_gates._files import iter_jsonl, read_json, read_text

    big = tmp_path / "big.json"
    big.write_text(" " * 2048 + "{}")
    with pytest.raises(InputFileError, match="larger than 1,024 bytes") as info:
        read_json(big, max_bytes=1024)
    _names(info.value, big)
    long = tmp_path / "long.jsonl"
    long.write_text('{"a": 1}\n{"a": "' + "x" * 4096 + '"}\n')
    with pytest.raises(InputFileError, match="longer than 1,024 bytes") as info:
        list(iter_jsonl(long, max_line_bytes=1024))
    _names(info.value, long, 2)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 65 + "]" * 65)
    with pytest.raises(InputFileError, match="nested deeper than 64"):
        read_json(deep)
    folder = tmp_path / "x.txt"
    folder.mkdir()
    with pytest.raises(InputFileError, match="is a directory") as info:
        read_text(folder)
    _names(info.value, folder)


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
def test_reader_refuses_non_finite_numbers_where_asked(tmp_path: Path, number: str) -> None:
    from rag_gates._files import read_json

    file = tmp_path / "x.json"
    file.write_text(f'{{"threshold": {number}}}')
    with pytest.raises(InputFileError, match="not a finite number") as info:
        read_json(file)
    _names(info.value, file)
    value = read_json(file, finite=False)["threshold"]  # the caller's choice
    assert not math.isfinite(value)


def test_reader_names_the_line_of_bad_utf8_in_a_whole_file(tmp_path: Path) -> None:
    from rag_gates._files import read_text

    file = tmp_path / "t.txt"
    file.write_bytes(b"line one\nline two \xff\n")
    with pytest.raises(InputFileError, match=r"not UTF-8 .* byte 18 of the file") as info:
        read_text(file)
    _names(info.value, file, 2)


# ------------------------------------------------------------------ item 10: gate specs
@pytest.fixture(scope="module")
def spec_text(tmp_path_factory: pytest.TempPathFactory) -> str:
    from rag_gates.calibration import ModelIdentity, calibrate
    from tests.calibration.conftest import synthetic_records

    report = calibrate(synthetic_records(400), max_loss=0.1, composite=False,
                       model=ModelIdentity(name="m", fingerprint="f" * 64), retriever="-")
    spec = report.best
    assert spec.threshold is not None
    return spec.save(tmp_path_factory.mktemp("spec") / "gate.json").read_text()


@pytest.mark.parametrize("number", ["NaN", "Infinity", "1e400"])
def test_a_spec_with_a_non_finite_float_is_refused_naming_the_file(
        tmp_path: Path, spec_text: str, number: str) -> None:
    """Today: a plain ValueError from the checksum's json.dumps (no path)."""
    from rag_gates.calibration import GateSpec

    data = json.loads(spec_text)
    text = json.dumps(data, indent=2).replace(
        f'"threshold": {json.dumps(data["threshold"])}', f'"threshold": {number}')
    assert number in text
    file = tmp_path / "gate.json"
    file.write_text(text)
    with pytest.raises(SpecFileError) as info:
        GateSpec.load(file)
    _names(info.value, file)
    assert isinstance(info.value, CalibrationError)


@pytest.mark.parametrize(("content", "message"), [
    (NOT_UTF8, "not UTF-8"),          # today: UnicodeDecodeError, no path
    (DEEP.encode(), "nested deeper"),  # today: RecursionError
])
def test_a_damaged_spec_file_is_a_typed_error_naming_it(tmp_path: Path, content: bytes,
                                                        message: str) -> None:
    from rag_gates.calibration import GateSpec

    file = tmp_path / "gate.json"
    file.write_bytes(content)
    with pytest.raises(SpecFileError, match=message) as info:
        GateSpec.load(file)
    _names(info.value, file, 1 if message == "not UTF-8" else None)


@pytest.mark.parametrize("field", ["threshold", "observed_drop", "auroc"])
def test_gate_spec_refuses_nan_at_construction(spec_text: str, field: str) -> None:
    """Today GateSpec(threshold=nan) is built and fails only at save()."""
    from pydantic import ValidationError

    from rag_gates.calibration import GateSpec

    data = json.loads(spec_text)
    for bad in (math.nan, math.inf):
        with pytest.raises(ValidationError, match=field):
            GateSpec(**{**data, field: bad})
    with pytest.raises(ValidationError, match=r"options.*not a finite number"):
        GateSpec(**{**data, "options": {"temperature": math.nan}})
    assert GateSpec(**data).threshold == data["threshold"]  # a finite spec still builds


# ------------------------------------------------------------------ item 9: records
@pytest.mark.parametrize(("line", "message"), [
    (NOT_UTF8, "not UTF-8"),          # today: UnicodeDecodeError, no path
    (DEEP.encode(), "nested deeper"),  # today: RecursionError
    (b'{"id": "q2", "question": "Q?", "closed_book_correct": true, '
     b'"retrieved_correct": true, "scores": {"g": NaN}}', "not a finite number"),
])
def test_a_damaged_records_line_names_file_and_line(tmp_path: Path, line: bytes,
                                                    message: str) -> None:
    from rag_gates.calibration import CalibrationRecord, read_records

    good = CalibrationRecord(id="q1", question="Q?", closed_book_correct=True,
                             retrieved_correct=False, scores={"g": 0.5})
    file = tmp_path / "records.jsonl"
    file.write_bytes(good.model_dump_json().encode() + b"\n" + line + b"\n")
    with pytest.raises(InputFileError, match=message) as info:
        read_records(file)
    _names(info.value, file, 2)


def test_a_damaged_jsonl_log_names_file_and_line(tmp_path: Path) -> None:
    """JsonlLog (bench runs, labels, syntheses): a deep line was a RecursionError."""
    from rag_gates._io import JsonlLog

    file = tmp_path / "log.jsonl"
    file.write_text(json.dumps({"header": {"a": 1}}) + "\n" + DEEP + "\n{}\n")
    with pytest.raises(ArtifactFileError, match="nested deeper") as info:
        JsonlLog(file, {"a": 1}).open()
    _names(info.value, file, 2)


# ------------------------------------------------------------------ items 6, 9, 11: calibrate
QUESTIONS = [{"id": f"q{i}", "question": f"Who wrote book {i}?", "answers": [f"Author {i}"]}
             for i in range(40)]


def _calibrate(tmp_path: Path, data: Path, corpus: Path, *extra: str) -> Any:
    from rag_gates.cli import app

    no_model = tmp_path / "no-model"  # a directory holding no model: loading it fails
    no_model.mkdir(exist_ok=True)
    return CliRunner().invoke(app, [
        "calibrate", "--data", str(data), "--corpus", str(corpus),
        "--out", str(tmp_path / "gate.json"), "--work-dir", str(tmp_path / "work"),
        "--model", str(no_model), *extra])


def _refused_before_the_model(result: Any, *names: str) -> None:
    output = result.output
    assert result.exit_code == 2, (result.output, result.exception)
    for name in names:
        assert name in output, output
    assert "no-model" not in output  # the model was never tried


def _write_jsonl(path: Path, rows: list[Any], extra: bytes = b"") -> Path:
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in rows) + extra)
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return _write_jsonl(tmp_path / "corpus.jsonl",
                        [{"text": f"Book {i} was written by Author {i}."} for i in range(40)])


@pytest.mark.parametrize(("bad", "message"), [
    (NOT_UTF8, "not UTF-8"),                                            # a codec error today
    (b'{"question": ' + SURROGATE.encode() + b', "answers": ["x"]}', "lone surrogate"),
    (b'{"question": "Q?", "answers": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested deeper"),
    (b'{"question": "Q?", "answers": [""]}', "empty once normalised"),  # item 6
    (b'{"question": "Q?", "answers": ["  "]}', "empty once normalised"),
    (b'{"question": "Q?", "answers": ["The"]}', "empty once normalised"),
    (b'{"question": "Q?", "answers": ["Paris", "?!"]}', "empty once normalised"),
])
def test_bad_data_lines_are_refused_with_file_and_line_before_the_model(
        tmp_path: Path, corpus: Path, bad: bytes, message: str) -> None:
    """Items 6 and 11: a surrogate failed after the model loaded, with an internal position;
    empty answers were accepted (a question nobody can answer right, hiding its harm)."""
    data = _write_jsonl(tmp_path / "q.jsonl", QUESTIONS, bad + b"\n")  # line 41
    result = _calibrate(tmp_path, data, corpus)
    _refused_before_the_model(result, f"{data}:41", message)
    from rag_gates.commands.calibrate import read_questions

    with pytest.raises(InputFileError) as info:
        read_questions(data)
    _names(info.value, data, 41)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return _write_jsonl(tmp_path / "q.jsonl", QUESTIONS)


@pytest.mark.parametrize(("name", "content", "message"), [
    ("latin1.txt", "Caf\xe9 au lait".encode("latin-1"), "not UTF-8"),   # a codec error today
    ("image.txt", b"\x00\x01\x02\x03binary\x00", "NUL byte"),          # accepted today
])
def test_a_corpus_folder_file_that_is_not_text_is_named(
        tmp_path: Path, data: Path, name: str, content: bytes, message: str) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("Book 1 was written by Author 1.")
    (folder / name).write_bytes(content)
    result = _calibrate(tmp_path, data, folder)
    _refused_before_the_model(result, str(folder / name), message)


def test_a_directory_named_txt_in_a_corpus_folder_is_named(tmp_path: Path,
                                                           data: Path) -> None:
    """Today: IsADirectoryError, a traceback."""
    folder = tmp_path / "docs"
    (folder / "x.txt").mkdir(parents=True)
    (folder / "a.txt").write_text("Book 1 was written by Author 1.")
    result = _calibrate(tmp_path, data, folder)
    _refused_before_the_model(result, str(folder / "x.txt"), "is a directory")


def test_a_non_utf8_jsonl_corpus_names_file_and_line(tmp_path: Path, data: Path) -> None:
    corpus = _write_jsonl(tmp_path / "corpus.jsonl", [{"text": "Book 1."}],
                          b'{"text": "' + "Caf\xe9".encode("latin-1") + b'"}\n')
    result = _calibrate(tmp_path, data, corpus)
    _refused_before_the_model(result, f"{corpus}:2", "not UTF-8")


@pytest.mark.parametrize(("content", "message"), [
    (b"[1, 2, 3]", "holds a JSON array, not a JSON object"),  # today: AttributeError
    (DEEP.encode(), "nested deeper"),                         # today: RecursionError
    (NOT_UTF8, "not UTF-8"),                                  # today: codec error, no file
    (b"\x00garbage{", "NUL byte"),
    (b"garbage{", "not JSON"),
])
def test_a_damaged_work_dir_config_is_named_before_the_model(
        tmp_path: Path, data: Path, corpus: Path, content: bytes, message: str) -> None:
    """Item 9: read through the bounded reader (the call in _check_work_dir)."""
    config = tmp_path / "work" / "config.json"
    config.parent.mkdir()
    config.write_bytes(content)
    result = _calibrate(tmp_path, data, corpus)
    _refused_before_the_model(result, str(config), message)


def test_a_damaged_qdrant_meta_json_is_named(tmp_path: Path) -> None:
    """The collections of a local Qdrant folder, for an error message: a deeply nested
    meta.json was a RecursionError (only OSError/ValueError were caught)."""
    from rag_gates.commands.calibrate import _local_collections

    (tmp_path / "meta.json").write_text(DEEP)
    with pytest.raises(ArtifactFileError, match="nested deeper") as info:
        _local_collections(tmp_path)
    _names(info.value, tmp_path / "meta.json")


# ------------------------------------------------------------------ artifacts
def test_a_truncated_probe_safetensors_is_a_typed_error_naming_it(
        tmp_path: Path) -> None:
    """Today an ArtifactError naming the file too; now also an InputFileError (one type)."""
    from rag_gates.cbdr.probe import ConfidenceProbe, ProbeConfig

    saved = ConfidenceProbe(ProbeConfig(model_id="m", hidden_size=4, num_layers=2, layer=1,
                                        hidden_dims=(3,))).save(tmp_path / "probe")
    weights = saved / "probe.safetensors"
    ConfidenceProbe.load(saved)  # the sound file loads
    whole = weights.read_bytes()
    for cut in (4, 40, len(whole) - 3):  # in the length, in the header, in the tensors
        weights.write_bytes(whole[:cut])
        with pytest.raises(ArtifactFileError) as info:
            ConfidenceProbe.load(saved)
        _names(info.value, weights)
        assert isinstance(info.value, ArtifactError) and "train-probe" in str(info.value)


def test_srrag_label_files_refuse_deep_and_non_finite_lines(tmp_path: Path) -> None:
    """read_labels: a deep first line was a RecursionError. read_policy_labels: a deep line
    was a RecursionError, and NaN in the header's calibration was accepted."""
    from rag_gates.srrag.labels import read_labels
    from rag_gates.srrag.policy import PolicyEntry
    from rag_gates.srrag.shipped import read_policy_labels, write_policy_labels

    labels = tmp_path / "labels.jsonl"
    labels.write_text(DEEP + "\n")
    with pytest.raises(ArtifactFileError, match="not an SR-RAG label file") as info:
        read_labels(labels)
    _names(info.value, labels)

    entries = [PolicyEntry(id=f"q{i}", question=f"Q{i}?", source="parametric")
               for i in range(3)]
    policy = write_policy_labels(tmp_path / "p.jsonl", entries, "m", tau=0.3,
                                 calibration={"agreement": 0.7})
    lines = policy.read_text().splitlines()
    policy.write_text("\n".join([lines[0], lines[1], DEEP, lines[3]]) + "\n")
    with pytest.raises(ArtifactFileError, match="nested deeper") as info:
        read_policy_labels(policy)
    _names(info.value, policy, 3)
    policy.write_text("\n".join([lines[0].replace("0.7", "NaN"), *lines[1:]]) + "\n")
    with pytest.raises(ArtifactFileError, match="NaN is not a finite number") as info:
        read_policy_labels(policy)
    _names(info.value, policy, 1)


def test_a_key_cache_file_with_a_deep_header_is_recomputed_not_a_crash(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The cache is best effort: a damaged file is a warning and a recompute. A deeply
    nested header escaped as a RecursionError (only ValueError was caught)."""
    from rag_gates.srrag.key_cache import _read

    file = tmp_path / "x.keys"
    file.write_bytes(DEEP.encode() + b"\n" + b"\x00" * 16)
    with caplog.at_level("WARNING"):
        assert _read(file, {"a": 1}, (2, 2)) is None
    assert str(file) in caplog.text


def test_a_damaged_bm25_passages_file_names_file_and_line(tmp_path: Path) -> None:
    """Today: UnicodeDecodeError with no file."""
    from rag_gates.retrieval.bm25 import BM25Retriever
    from rag_gates.types import Passage

    saved = BM25Retriever.from_passages(
        [Passage(id=str(i), text=f"Book {i} by Author {i}.") for i in range(3)]
    ).save(tmp_path / "bm25")
    passages = saved / "passages.jsonl"
    lines = passages.read_bytes().splitlines(keepends=True)
    passages.write_bytes(lines[0] + NOT_UTF8 + b"\n" + lines[2])
    with pytest.raises(ArtifactFileError, match="not UTF-8") as info:
        BM25Retriever.load(saved)
    _names(info.value, passages, 2)


def test_a_deep_index_manifest_is_a_corrupt_index_naming_it(tmp_path: Path) -> None:
    """Today: RecursionError (the except clause lacked it)."""
    from rag_gates.corpus.errors import CorruptIndexError
    from rag_gates.corpus.index_format import MANIFEST_NAME, read_manifest

    (tmp_path / MANIFEST_NAME).write_text(DEEP)
    with pytest.raises(CorruptIndexError, match="nested deeper") as info:
        read_manifest(tmp_path)
    _names(info.value, tmp_path / MANIFEST_NAME)


@pytest.mark.parametrize(("header", "message"), [
    (DEEP.encode(), "nested deeper"),  # today: RecursionError
    (NOT_UTF8, "not UTF-8"),          # today: UnicodeDecodeError, no file
])
def test_a_damaged_cbdr_probe_data_cache_is_named(tmp_path: Path, header: bytes,
                                                  message: str) -> None:
    from rag_gates.cbdr.data import _read_cache

    file = tmp_path / "probe-data.jsonl"
    file.write_bytes(header + b"\n")
    with pytest.raises(ArtifactFileError, match=message) as info:
        _read_cache(file, {"a": 1})
    _names(info.value, file, 1)


def test_a_deep_deeprag_training_line_names_file_and_line(tmp_path: Path) -> None:
    """Today: RecursionError (only ValueError was caught)."""
    from rag_gates.deeprag.train import read_training_records

    file = _write_jsonl(tmp_path / "sft.jsonl", [{"input_ids": [1], "labels": [1]}],
                        DEEP.encode() + b"\n")
    with pytest.raises(ArtifactFileError, match="nested deeper") as info:
        read_training_records(file, "sft")
    _names(info.value, file, 2)


# ------------------------------------------------------------------ this sweep's own finds
def test_a_deep_preferences_line_names_file_and_line(tmp_path: Path) -> None:
    """CBDR reranker preferences: a deep line before the last was a RecursionError."""
    from rag_gates.cbdr.preferences import _read_lines

    file = tmp_path / "prefs.jsonl"
    file.write_text('{"a": 1}\n' + DEEP + '\n{"b": 2}\n')
    with pytest.raises(ArtifactFileError, match="nested deeper") as info:
        _read_lines(file)
    _names(info.value, file, 2)


def test_a_non_utf8_synthesis_file_is_named(tmp_path: Path) -> None:
    """DeepRAG synthesis rows: a UnicodeDecodeError without the file."""
    from rag_gates.deeprag.synthesis import read_rows

    file = tmp_path / "rows.jsonl"
    file.write_bytes(b'{"header": {"kind": "deeprag-synthesis"}}\n' + NOT_UTF8 + b"\n")
    with pytest.raises(ArtifactFileError, match="not UTF-8") as info:
        read_rows(file)
    _names(info.value, file, 2)


def test_a_deep_corpus_line_is_skipped_as_invalid_json_not_a_crash(tmp_path: Path) -> None:
    """rag-gates index build skips bad JSONL rows and counts them; a deeply nested row
    escaped as a RecursionError and ended the build."""
    from rag_gates.corpus.build import _jsonl_docs, _Skips

    file = _write_jsonl(tmp_path / "c.jsonl", [{"text": "one"}], DEEP.encode() + b"\n")
    skips = _Skips()
    docs = list(_jsonl_docs(file, "c.jsonl", skips, lambda _: None))
    assert [d.text for d in docs] == ["one"]
    assert skips.counts == {"invalid_json": 1} and skips.examples == [
        "c.jsonl:2: invalid_json"]


@pytest.mark.parametrize(("name", "content", "message"), [
    ("tokenizer_config.json", DEEP.encode(), "nested deeper"),  # today: RecursionError
    ("chat_template.jinja", NOT_UTF8, "not UTF-8"),               # today: no file named
])
def test_a_damaged_chat_template_source_is_named(tmp_path: Path, name: str, content: bytes,
                                                 message: str) -> None:
    from rag_gates.lm.openai_compat import load_chat_template

    (tmp_path / name).write_bytes(content)
    with pytest.raises(InputFileError, match=message) as info:
        load_chat_template(str(tmp_path))
    _names(info.value, tmp_path / name)
