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
from rag_gates.methods import MethodContext, make_method

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
    (["--bound", "hoeffding"],
     "--bound must be one of auto, exact, exact-random, wsr, binomial"),
    (["--chat-template", "default"],  # the embedded model, in process
     "--chat-template default is for a served model (--model openai:URL[#model-name])"),
])
def test_bad_options_fail_before_the_model_loads(args: list[str], message: str,
                                                 tmp_path: Path) -> None:
    result = _invoke("--data", str(SAMPLE), "--corpus", str(CORPUS),
                     "--out", str(tmp_path / "gate.json"), *args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "gate-work").exists()  # nothing ran


def test_an_output_path_that_cannot_be_made_fails_before_the_model_loads(
        tmp_path: Path) -> None:
    taken = tmp_path / "runs"
    taken.write_text("a file, not a folder")
    for args, message in (
            (["--out", str(taken / "gate.json")],
             f"--out: {taken} is a file, so {taken / 'gate.json'} cannot be created"),
            (["--out", str(tmp_path / "gate.json"), "--work-dir", str(taken)],
             f"--work-dir: {taken} is a file; give a directory")):
        result = _invoke("--data", str(SAMPLE), "--corpus", str(CORPUS), *args)
        assert result.exit_code == 2, result.output
        assert message in " ".join(result.output.split())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # nothing ran


def test_bad_data_line_is_named(tmp_path: Path) -> None:
    data = tmp_path / "q.jsonl"
    data.write_text('{"question": "Who?", "answers": ["x"]}\n{"question": "no answers"}\n')
    result = _invoke("--data", str(data), "--corpus", str(CORPUS),
                     "--out", str(tmp_path / "gate.json"))
    assert result.exit_code == 2 and "q.jsonl:2" in result.output


def test_too_few_questions(tmp_path: Path) -> None:
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question": f"Q{i}?", "answers": ["x"]}) + "\n"
                            for i in range(10)))
    result = _invoke("--data", str(data), "--corpus", str(CORPUS),
                     "--out", str(tmp_path / "gate.json"))
    assert result.exit_code == 2 and "at least 30" in result.output


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rag_gates.testing import save_tiny_lm

    return save_tiny_lm(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def tiny_inputs(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """40 sample questions with gold answers the tiny model gets right closed book on every
    other one (a word of its own answer), never on the rest: both classes, as calibration
    needs; and a corpus of short passages (the tiny model reads 256 tokens at most)."""
    from rag_gates.lm import load_lm

    lm = load_lm(str(tiny_dir))
    questions = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:40]]
    closed = make_method("no-rag", MethodContext(lm=lm, max_new_tokens=4))
    rows = []
    for i, q in enumerate(questions):
        words = normalize_answer(closed.answer(q["question"]).answer).split()
        gold = words[0] if i % 2 == 0 and words else "zzqqxx"
        rows.append({"id": q["id"], "question": q["question"], "answers": [gold]})
    where = tmp_path_factory.mktemp("inputs")
    data = where / "q.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    corpus = where / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"title": p["title"], "text": p["text"][:60]}) + "\n"
                              for p in map(json.loads, CORPUS.read_text().splitlines()[:300])))
    return data, corpus


def test_calibrates_writes_a_loadable_spec_and_resumes(tiny_dir: Path, tiny_inputs: tuple[
        Path, Path], tmp_path: Path) -> None:
    from rag_gates.calibration import GateSpec, load_gate, read_records
    from rag_gates.lm import load_lm

    lm = load_lm(str(tiny_dir))
    data, corpus = tiny_inputs
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
    # --bound auto: the exact test, tabulated up to 600 certification questions, and said.
    assert "bound: exact (40 certification questions)" in " ".join(result.output.split())
    assert spec.bound == "exact"
    gate = load_gate(out, lm=lm)
    assert gate.decide("Who wrote Hamlet?").evidence["spec"]["epsilon"] == 0.2
    before = (tmp_path / "gate-work" / "records.jsonl").read_text()
    again = _invoke(*args)
    assert again.exit_code == 0, again.output
    assert (tmp_path / "gate-work" / "records.jsonl").read_text() == before
    randomised = _invoke(*args, "--bound", "exact-random")  # the records are reused
    assert randomised.exit_code == 0, randomised.output
    assert GateSpec.load(out).bound == "exact-random"
    assert (tmp_path / "gate-work" / "records.jsonl").read_text() == before
    changed = _invoke(*args[:-2], "--max-loss", "0.2", "--gates", "answer-logprob")
    assert changed.exit_code == 2 and "another gates" in " ".join(changed.output.split())


def test_a_folder_of_txt_files_is_a_corpus_as_the_readme_says(
        tiny_dir: Path, tiny_inputs: tuple[Path, Path], tmp_path: Path) -> None:
    """README: `--corpus my_docs/`, a folder of .txt files (BM25). The same passages as the
    JSONL corpus, one file each (title = file name), give the same answers with retrieval."""
    from rag_gates.calibration import GateSpec, read_records

    data, corpus = tiny_inputs
    docs = tmp_path / "my_docs"
    (docs / "sub").mkdir(parents=True)
    rows = [json.loads(line) for line in corpus.read_text().splitlines()]
    titles = [r["title"].replace("/", "_") for r in rows]
    for i, (title, row) in enumerate(zip(titles, rows, strict=True)):
        where = docs / "sub" if i % 2 else docs  # read recursively
        (where / f"{title}.txt").write_text(row["text"] + "\n", encoding="utf-8")
    (docs / "empty.txt").write_text("  \n")  # skipped, not a passage
    (docs / "notes.md").write_text("not a .txt file")
    as_jsonl = tmp_path / "jsonl.json"
    (tmp_path / "rows.jsonl").write_text("".join(
        json.dumps({"title": t, "text": r["text"]}) + "\n" for t, r in zip(titles, rows,
                                                                          strict=True)))
    common = ["--data", str(data), "--k", "1", "--model", str(tiny_dir), "--gates",
              "answer-logprob", "--max-new-tokens", "4", "--max-loss", "0.2"]
    result = _invoke(*common, "--corpus", f"{docs}/", "--out", str(tmp_path / "gate.json"))
    assert result.exit_code == 0, result.output
    n = len(set(titles))
    assert f"bm25 over my_docs ({n} passages" in GateSpec.load(tmp_path / "gate.json").retriever
    again = _invoke(*common, "--corpus", str(tmp_path / "rows.jsonl"), "--out", str(as_jsonl))
    assert again.exit_code == 0, again.output
    assert n == len(titles)  # no two passages share a title (a file name)
    # A renamed file is another passage title: another corpus, refused on resume.
    first = next(f for f in sorted(docs.glob("*.txt")) if f.name != "empty.txt")
    first.rename(first.with_name("renamed.txt"))
    renamed = _invoke(*common, "--corpus", str(docs), "--out", str(tmp_path / "gate.json"))
    assert renamed.exit_code == 2 and "another corpus" in " ".join(renamed.output.split())
    folder = read_records(tmp_path / "gate-work" / "records.jsonl")
    jsonl = read_records(tmp_path / "jsonl-work" / "records.jsonl")
    assert len(folder) == 40
    assert [r.retrieved_correct for r in folder] == [r.retrieved_correct for r in jsonl]


def test_a_text_only_model_gets_the_log_probability_gate_and_says_why_not_others() -> None:
    """A model behind a text interface (here LangChain's, as a served model is) keeps the
    gates its replies allow (answer-logprob, first-token-logprob from the reply's
    log-probabilities, sample-agreement from its text); the white-box gates are skipped,
    p-true-sampling (it scores a prompt) and QuCo without corpus statistics, each with its
    reason."""
    pytest.importorskip("langchain_rag_gates")
    from langchain_rag_gates import ChatRagGates, as_text_lm
    from rag_gates.commands.calibrate import applicable_gates
    from rag_gates.testing import tiny_lm

    text_only = as_text_lm(ChatRagGates(lm=tiny_lm(), max_tokens=8))
    built, skipped = applicable_gates(text_only, None, {"max_new_tokens": 8})
    assert list(built) == ["answer-logprob", "first-token-logprob", "sample-agreement"]
    assert set(skipped) == {"first-token-prob", "p-true-sampling", "cbdr", "quco"}
    assert "reads logits/hidden states" in skipped["first-token-prob"]
    assert "needs score" in skipped["p-true-sampling"]
    with pytest.raises(ValueError, match="--gates first-token-prob"):
        applicable_gates(text_only, ["first-token-prob"], {})


# ------------------------------------------------------------ --corpus qdrant:PATH#COLLECTION
def _passages(n: int, skip: int = 0) -> list[Any]:
    """Real passages of the sample corpus, cut short for the tiny model."""
    from rag_gates.types import Passage

    rows = [json.loads(line) for line in CORPUS.read_text().splitlines()[skip: skip + n]]
    return [Passage(id=str(i), title=r["title"], text=r["text"][:60]) for i, r in
            enumerate(rows, skip)]


@pytest.fixture(scope="module")
def qdrant_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local Qdrant folder: 'docs' (30 passages) and 'other' (20 others), embedded with
    the embedded MiniLM; 'small' (8-d vectors) and 'empty' (no points), as a user's
    collections may be."""
    pytest.importorskip("qdrant_client")
    from qdrant_client import models

    from rag_gates.retrieval.dense import QdrantDenseRetriever

    where = tmp_path_factory.mktemp("qdrant") / "store"
    docs = QdrantDenseRetriever.build(_passages(30), path=str(where), collection="docs")
    docs.client.close()  # a local folder admits one client at a time
    other = QdrantDenseRetriever.build(_passages(20, skip=100), path=str(where),
                                       collection="other", embedder=docs.embedder)
    client = other.client
    client.create_collection("small", vectors_config=models.VectorParams(
        size=8, distance=models.Distance.COSINE))
    client.upsert("small", points=[models.PointStruct(
        id=0, vector=[0.1] * 8, payload=_passages(1)[0].model_dump(mode="json"))])
    client.create_collection("empty", vectors_config=models.VectorParams(
        size=384, distance=models.Distance.COSINE))
    client.close()
    return where


def test_calibrates_against_a_local_qdrant_collection(tiny_dir: Path, tiny_inputs: tuple[
        Path, Path], qdrant_dir: Path, tmp_path: Path) -> None:
    """Retrieval from a Qdrant collection (MiniLM embeddings): the spec's retriever names the
    collection, its size and vectors; resuming against another collection is refused."""
    from rag_gates.calibration import GateSpec

    data, _ = tiny_inputs
    out = tmp_path / "gate.json"
    args = ["--data", str(data), "--out", str(out), "--k", "1", "--model", str(tiny_dir),
            "--gates", "answer-logprob", "--max-new-tokens", "4", "--max-loss", "0.2"]
    result = _invoke(*args, "--corpus", f"qdrant:{qdrant_dir}#docs")
    assert result.exit_code == 0, result.output
    retriever = GateSpec.load(out).retriever
    assert "Qdrant collection 'docs'" in retriever and str(qdrant_dir) in retriever
    assert "30 points" in retriever and "384-d" in retriever and "all-MiniLM-L6-v2" in retriever
    config = json.loads((tmp_path / "gate-work" / "config.json").read_text())
    assert config["corpus"]["collection"] == "docs" and config["corpus"]["points"] == 30
    other = _invoke(*args, "--corpus", f"qdrant:{qdrant_dir}#other")
    assert other.exit_code == 2 and "another corpus" in " ".join(other.output.split())


@pytest.mark.parametrize(("corpus", "message"), [
    ("{store}#nope", "has no collection 'nope' (collections: docs, empty, other, small)"),
    ("{store}#small", "holds 8-d vectors, but all-MiniLM-L6-v2 embeds in 384-d"),
    ("{store}#empty", "collection 'empty' at {store} holds no points"),
    ("{store}-missing#docs", "no Qdrant folder at {store}-missing"),
    ("http://127.0.0.1:9#docs", "cannot reach the Qdrant server at http://127.0.0.1:9"),
    ("#docs", "--corpus qdrant:PATH_OR_URL[#COLLECTION]"),
])
def test_a_bad_qdrant_corpus_is_refused_before_the_model_loads(
        corpus: str, message: str, qdrant_dir: Path, tmp_path: Path) -> None:
    result = _invoke("--data", str(SAMPLE), "--out", str(tmp_path / "gate.json"),
                     "--corpus", "qdrant:" + corpus.format(store=qdrant_dir))
    assert result.exit_code == 2, result.output
    assert message.format(store=qdrant_dir) in " ".join(result.output.split())
    assert not (tmp_path / "gate-work").exists()  # nothing ran


def test_qdrant_client_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "qdrant_client", None)  # as if not installed
    result = _invoke("--data", str(SAMPLE), "--out", str(tmp_path / "gate.json"),
                     "--corpus", f"qdrant:{tmp_path}#docs")
    assert result.exit_code == 2
    assert 'pip install "rag-gates[qdrant]"' in " ".join(result.output.split())


# ------------------------------------------------------------------------- the skip plot
def test_the_plot_draws_the_composite_as_it_was_certified(tmp_path: Path) -> None:
    """On the committed 200-question run (records written in the gates' auto order, the
    report's gates sorted): every row of the report is a drawn series, the composite too,
    and each curve at --max-loss is the table's observed skip rate."""
    pytest.importorskip("matplotlib")
    from rag_gates.calibration import CalibrationReport, read_records
    from rag_gates.commands.calibrate import plot_skip_curves

    run = ROOT / "benchmarks" / "results" / "calibrate" / "smollm2-200" / "work"
    records = read_records(run / "records.jsonl")
    report = CalibrationReport.model_validate_json((run / "report.json").read_text())
    assert report.composite_name == "weighted(answer-logprob,cbdr,first-token-prob)"
    assert list(records[0].scores) == ["answer-logprob", "first-token-prob", "cbdr"]
    plot = plot_skip_curves(records, report, tmp_path / "gate.png")
    assert plot.path == tmp_path / "gate.png" and plot.path.is_file()
    assert plot.series == [row.gate for row in report.rows] and not plot.not_drawn
    for row in report.rows:
        assert dict(plot.curves[row.gate])[report.epsilon] == pytest.approx(
            row.observed_skip_rate), row.gate


def test_a_row_that_cannot_be_drawn_is_named_not_dropped(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    """Records that lost two gates' scores (here erased) cannot refit the composite: the
    other rows are drawn, the composite is named with why, not silently left out."""
    pytest.importorskip("matplotlib")
    from rag_gates.calibration import CalibrationReport, read_records
    from rag_gates.commands.calibrate import plot_skip_curves

    run = ROOT / "benchmarks" / "results" / "calibrate" / "smollm2-200" / "work"
    records = [r.model_copy(update={"scores": {**r.scores, "cbdr": None,
                                               "first-token-prob": None}})
               for r in read_records(run / "records.jsonl")]
    report = CalibrationReport.model_validate_json((run / "report.json").read_text())
    plot = plot_skip_curves(records, report, tmp_path / "gate.png")
    composite = "weighted(answer-logprob,cbdr,first-token-prob)"
    assert plot.series == ["answer-logprob", "cbdr", "first-token-prob"]
    assert list(plot.not_drawn) == [composite]
    assert f"not drawn {composite}: no gate" in " ".join(capsys.readouterr().out.split())


# ----------------------------------------------------- the work dir: which questions it holds
TINY_GATES = "first-token-prob,answer-logprob"  # not sorted: the composite's name is


@pytest.fixture(scope="module")
def first_run(tiny_dir: Path, tiny_inputs: tuple[Path, Path],
              tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run over the 40 tiny questions; each test below resumes a copy of its work dir."""
    where = tmp_path_factory.mktemp("first")
    result = _invoke(*_tiny_args(tiny_dir, tiny_inputs, tiny_inputs[0], where / "gate.json"))
    assert result.exit_code == 0, result.output
    return where / "gate-work"


def _tiny_args(tiny_dir: Path, tiny_inputs: tuple[Path, Path], data: Path, out: Path
               ) -> list[str]:
    return ["--data", str(data), "--corpus", str(tiny_inputs[1]), "--out", str(out),
            "--k", "1", "--model", str(tiny_dir), "--gates", TINY_GATES,
            "--max-new-tokens", "4", "--max-loss", "0.2"]


def _resume(first_run: Path, tiny_dir: Path, tiny_inputs: tuple[Path, Path], tmp_path: Path,
            lines: list[str] | None = None, *extra: str) -> tuple[Any, Path]:
    """Copy the first run's work dir to ``tmp_path`` and run again on ``lines`` (default:
    the same data file); returns the result and the work dir."""
    import shutil

    work = tmp_path / "gate-work"
    shutil.copytree(first_run, work)
    data = tiny_inputs[0]
    if lines is not None:
        data = tmp_path / "q.jsonl"
        data.write_text("".join(line + "\n" for line in lines))
    args = _tiny_args(tiny_dir, tiny_inputs, data, tmp_path / "gate.json")
    return _invoke(*args, *extra), work


def _flat(result: Any) -> str:
    return " ".join(result.output.split())


def test_reordered_data_resumes(first_run: Path, tiny_dir: Path,
                                tiny_inputs: tuple[Path, Path], tmp_path: Path) -> None:
    lines = tiny_inputs[0].read_text().splitlines()[::-1]
    result, work = _resume(first_run, tiny_dir, tiny_inputs, tmp_path, lines)
    assert result.exit_code == 0, result.output
    assert (work / "records.jsonl").read_text() == (first_run / "records.jsonl").read_text()


def test_a_smaller_limit_uses_only_the_first_questions(first_run: Path, tiny_dir: Path,
                                                       tiny_inputs: tuple[Path, Path],
                                                       tmp_path: Path) -> None:
    result, work = _resume(first_run, tiny_dir, tiny_inputs, tmp_path, None, "--limit", "35")
    assert result.exit_code == 0, result.output
    assert "5 records of questions beyond --limit kept in the work dir, not used" \
        in _flat(result)
    assert json.loads((work / "report.json").read_text())["questions"] == 35
    assert (work / "records.jsonl").read_text() == (first_run / "records.jsonl").read_text()


@pytest.mark.parametrize("change", ["answer", "drop", "add"])
def test_another_question_set_is_refused(change: str, first_run: Path, tiny_dir: Path,
                                         tiny_inputs: tuple[Path, Path],
                                         tmp_path: Path) -> None:
    lines = tiny_inputs[0].read_text().splitlines()
    if change == "answer":
        row = json.loads(lines[3])
        lines[3] = json.dumps({**row, "answers": ["something else"]})
    elif change == "drop":
        del lines[7]
    else:
        lines.append(json.dumps({"id": "new", "question": "Who?", "answers": ["x"]}))
    result, _ = _resume(first_run, tiny_dir, tiny_inputs, tmp_path, lines)
    assert result.exit_code == 2
    assert "holds records made with another question set (--data" in _flat(result)


def test_records_of_questions_not_in_data_are_refused(first_run: Path, tiny_dir: Path,
                                                      tiny_inputs: tuple[Path, Path],
                                                      tmp_path: Path) -> None:
    """A record the work dir should not hold (a hand-edited records.jsonl) is still refused."""
    import shutil

    work = tmp_path / "gate-work"
    shutil.copytree(first_run, work)
    stranger = json.loads((work / "records.jsonl").read_text().splitlines()[0])
    stranger["id"] = "stranger"
    with (work / "records.jsonl").open("a") as handle:
        handle.write(json.dumps(stranger) + "\n")
    result = _invoke(*_tiny_args(tiny_dir, tiny_inputs, tiny_inputs[0], tmp_path / "gate.json"))
    assert result.exit_code == 2 and "questions not in --data" in _flat(result)


def test_an_old_work_dir_is_upgraded_only_for_the_same_file(first_run: Path, tiny_dir: Path,
                                                            tiny_inputs: tuple[Path, Path],
                                                            tmp_path: Path) -> None:
    """A work dir made before question-set identities (config.json "data": the file's
    SHA-256) is upgraded when the file is byte for byte the same; otherwise refused with
    what to do."""
    import hashlib
    import shutil

    data = tiny_inputs[0]
    for case in ("same", "reordered"):
        where = tmp_path / case
        where.mkdir()
        work = where / "gate-work"
        shutil.copytree(first_run, work)
        config = json.loads((work / "config.json").read_text())
        config.pop("questions")
        config["data"] = hashlib.sha256(data.read_bytes()).hexdigest()
        (work / "config.json").write_text(json.dumps(config))
        if case == "same":
            result = _invoke(*_tiny_args(tiny_dir, tiny_inputs, data, where / "gate.json"))
            assert result.exit_code == 0, result.output
            assert "upgraded" in _flat(result)
            assert "questions" in json.loads((work / "config.json").read_text())
        else:
            lines = data.read_text().splitlines()[::-1]
            moved = where / "q.jsonl"
            moved.write_text("".join(line + "\n" for line in lines))
            result = _invoke(*_tiny_args(tiny_dir, tiny_inputs, moved, where / "gate.json"))
            assert result.exit_code == 2
            assert "identified --data by its bytes" in _flat(result)


def test_the_run_draws_the_composite(first_run: Path, tiny_dir: Path,
                                     tiny_inputs: tuple[Path, Path], tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the command (gates given unsorted, so the records' gate order is not the
    composite's): the saved figure's lines include the composite."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    drawn: list[str] = []
    save = Figure.savefig

    def spy(self: Figure, *args: Any, **kwargs: Any) -> Any:
        drawn.extend(line.get_label() for ax in self.axes for line in ax.get_lines())
        return save(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    result, _ = _resume(first_run, tiny_dir, tiny_inputs, tmp_path)
    assert result.exit_code == 0, result.output
    assert "weighted(answer-logprob,first-token-prob)" in drawn, drawn
    assert {"answer-logprob", "first-token-prob"} <= set(drawn)


def test_the_docs_qdrant_snippet_and_command_run(tiny_dir: Path, tiny_inputs: tuple[Path, Path],
                                                 tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/calibration.md's snippet runs as written (my_docs.jsonl: 30 real passages, cut
    short for the tiny model), then the command it names, as written plus the tiny model
    and short answers (my_questions.jsonl: the tiny questions)."""
    import re
    import shlex
    import shutil

    pytest.importorskip("qdrant_client")
    from rag_gates.calibration import GateSpec

    doc = (ROOT / "docs" / "calibration.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- run by tests/unit/test_calibrate_cli.py -->\n```python\n(.*?)```",
                      doc, re.S)
    assert match, "the tested snippet is marked in docs/calibration.md"
    monkeypatch.chdir(tmp_path)
    Path("my_docs.jsonl").write_text("".join(p.model_dump_json() + "\n" for p in _passages(30)))
    shutil.copy(tiny_inputs[0], "my_questions.jsonl")
    exec(compile(match.group(1), "docs/calibration.md", "exec"), {})
    command = " ".join(line.lstrip("# ").removesuffix("\\").strip()
                       for line in match.group(1).splitlines() if line.startswith("#"))
    words = shlex.split(command.removeprefix("then: "))
    assert words[:2] == ["rag-gates", "calibrate"]
    result = CliRunner().invoke(app, [*words[1:], "--model", str(tiny_dir), "--k", "1",
                                      "--gates", "answer-logprob", "--max-new-tokens", "4",
                                      "--max-loss", "0.2"])
    assert result.exit_code == 0, result.output
    retriever = GateSpec.load(tmp_path / "gate.json").retriever
    assert f"Qdrant collection 'docs' at {tmp_path / 'my-qdrant'} (30 points" in retriever


def test_too_few_questions_to_certify_says_how_many_are_needed(
        tiny_dir: Path, tiny_inputs: tuple[Path, Path], tmp_path: Path) -> None:
    """40 questions cannot certify a skip at epsilon 0.01 whatever the bound (0.99^40 is
    0.67): the run says so and how many would be needed, instead of a bare 'always
    retrieve'."""
    from rag_gates.calibration import GateSpec
    from rag_gates.commands.calibrate import questions_needed

    data, corpus = tiny_inputs
    out = tmp_path / "gate.json"
    result = _invoke("--data", str(data), "--corpus", str(corpus), "--out", str(out),
                     "--k", "1", "--model", str(tiny_dir), "--gates", "answer-logprob",
                     "--max-new-tokens", "4", "--max-loss", "0.01", "--delta", "0.1")
    assert result.exit_code == 0, result.output
    spec = GateSpec.load(out)
    assert not spec.certified
    needed = questions_needed(0.01, 0.1 / spec.family)
    assert needed > 40 and 0.99 ** needed <= 0.1 / spec.family < 0.99 ** (needed - 1)
    text = " ".join(result.output.split())
    assert f"needs at least {needed} questions" in text and "you gave 40" in text


# ------------------------------------------------------------ --chat-template (a served model)
#: A served model no test contacts: every refusal below comes before a request would.
NO_SERVER = "openai:http://127.0.0.1:9/v1"


def test_chat_template_is_refused_for_an_in_process_model(tiny_dir: Path, tmp_path: Path
                                                          ) -> None:
    """A local model directory renders with its own tokenizer's template: --chat-template
    is refused before it loads, and load_model refuses a template for it too."""
    from rag_gates.commands.calibrate import load_model

    result = _invoke("--data", str(SAMPLE), "--corpus", str(CORPUS), "--model", str(tiny_dir),
                     "--out", str(tmp_path / "gate.json"), "--chat-template", "default")
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "--chat-template default is for a served model" in said
    assert "drop --chat-template" in said
    assert not (tmp_path / "gate-work").exists()
    with pytest.raises(ValueError, match="--chat-template is for a served model"):
        load_model(str(tiny_dir), None, 1, "{{ messages }}")


def test_a_chat_template_that_cannot_be_read_is_refused_before_the_server_is_asked(
        tmp_path: Path) -> None:
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for message in messages %}{{ message['content'] }}")  # no endfor
    empty = tmp_path / "model-dir"
    empty.mkdir()
    for source, message in (
            (str(tmp_path / "missing.jinja"), "no such file or directory"),
            (str(broken), f"--chat-template {broken}: not a Jinja template"),
            (str(empty), f"--chat-template: {empty} holds no chat template")):
        result = _invoke("--data", str(SAMPLE), "--corpus", str(CORPUS), "--model", NO_SERVER,
                         "--out", str(tmp_path / "gate.json"), "--chat-template", source)
        assert result.exit_code == 2, result.output
        assert message in " ".join(result.output.split()), result.output
        assert not (tmp_path / "gate-work").exists()


def _served_config(spec: str, **extra: Any) -> dict[str, Any]:
    """The config.json a served run of SAMPLE over CORPUS (k 3, 32 tokens) wrote."""
    import hashlib

    from rag_gates.commands.calibrate import _sha, question_set_sha, read_questions

    return {"questions": question_set_sha(read_questions(SAMPLE)), "corpus": _sha(CORPUS),
            "k": 3, "max_new_tokens": 32,
            "model_files": hashlib.sha256(spec.encode("utf-8")).hexdigest(),
            "model": "0" * 64, "gates": ["answer-logprob"], **extra}


def test_a_changed_chat_template_is_refused_on_resume_saying_what_differs(
        tmp_path: Path) -> None:
    """The template's text is part of the work directory's identity, checked before the
    model loads: another template, or one where the run had none, is refused, naming
    --chat-template and both sides (hashes computed here, from the files' text)."""
    import hashlib

    first, second = tmp_path / "first.jinja", tmp_path / "second.jinja"
    first.write_text("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}")
    second.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}")
    sha = {p: hashlib.sha256(p.read_text().encode("utf-8")).hexdigest() for p in (first, second)}
    work = tmp_path / "work"
    work.mkdir()
    cases: tuple[tuple[dict[str, str], list[str], str], ...] = (
        ({"chat_template": sha[first]}, ["--chat-template", str(second)],
         f"(was: sha256 {sha[first][:12]}; now: sha256 {sha[second][:12]})"),
        ({}, ["--chat-template", str(first)],  # a run made without one (or before the option)
         f"(was: none; now: sha256 {sha[first][:12]})"),
        ({"chat_template": sha[first]}, [], f"(was: sha256 {sha[first][:12]}; now: none)"))
    for stored, args, detail in cases:
        (work / "config.json").write_text(json.dumps(_served_config(NO_SERVER, **stored)))
        result = _invoke("--data", str(SAMPLE), "--corpus", str(CORPUS), "--model", NO_SERVER,
                         "--out", str(tmp_path / "gate.json"), "--work-dir", str(work), *args)
        assert result.exit_code == 2, result.output
        said = " ".join(result.output.split())
        assert (f"{work} holds records made with another --chat-template (the served model's "
                f"chat template, rendered here) {detail}") in said, said
        assert json.loads((work / "config.json").read_text()).get("chat_template") \
            == stored.get("chat_template")  # left as it was


def test_the_work_directory_identity_of_the_chat_template() -> None:
    """_check_work_dir itself: the same template resumes; a work directory without the key
    (written before --chat-template existed) resumes when none is given, and is not
    rewritten; any other combination is refused."""
    import tempfile

    from rag_gates.commands.calibrate import _check_work_dir, chat_template_identity

    template = "{{ messages[0]['content'] }}"
    sha = chat_template_identity(template)
    assert sha == __import__("hashlib").sha256(template.encode("utf-8")).hexdigest()
    old = _served_config(NO_SERVER)
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        for stored, now, refused in ((old, old, False),
                                     ({**old, "chat_template": sha},
                                      {**old, "chat_template": sha}, False),
                                     (old, {**old, "chat_template": sha}, True),
                                     ({**old, "chat_template": sha}, old, True),
                                     ({**old, "chat_template": sha},
                                      {**old, "chat_template": "1" * 64}, True)):
            text = json.dumps(stored)
            (work / "config.json").write_text(text)
            for before_load in (True, False):
                if refused:
                    with pytest.raises(ValueError, match="another --chat-template"):
                        _check_work_dir(work, now, data_bytes_sha="x", before_load=before_load)
                else:
                    _check_work_dir(work, now, data_bytes_sha="x", before_load=before_load)
            assert (work / "config.json").read_text() == text  # never rewritten
