"""Checks of the benchmark CLI that must come before anything is loaded or written: method
names and options, data files that hold no usable or duplicated questions, run directories
with a damaged config.json, eval-gate's labels directory and its label cache key."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rag_gates.cli import app
from rag_gates.methods import available_methods, check_method_name
from rag_gates.retrieval.bm25 import BM25Retriever
from rag_gates_lab.corpus import corpus_passages
from rag_gates_lab.datasets import load_dataset
from rag_gates_lab.gate_eval import GateEvalConfig, evaluate_gate, label_run_dir
from rag_gates_lab.runner import BenchConfig, run_bench

SLICES = Path(__file__).resolve().parents[2] / "examples" / "data"
HOTPOT = SLICES / "hotpotqa_dev_sample.jsonl"


@pytest.fixture(scope="module")
def tiny() -> Any:
    from rag_gates.testing import tiny_lm

    return tiny_lm(seed=0, max_context=4096)


@pytest.fixture()
def no_model_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every attempt to load a model (and refuses it): these checks must come first."""
    import rag_gates.lm.defaults as defaults

    calls: list[str] = []

    def refuse(model: str, **_: Any) -> Any:
        calls.append(model)
        raise AssertionError(f"a model was loaded ({model}) before the check")

    monkeypatch.setattr(defaults, "load_lm", refuse)
    return calls


@pytest.mark.parametrize("command", [
    ["bench", "--dataset", "hotpotqa", "--methods", "no-rag"],
    ["eval-gate", "--gate", "first-token-prob", "--dataset", "hotpotqa"]])
def test_an_out_that_is_a_file_is_refused_before_a_model_loads(
        command: list[str], tmp_path: Path, no_model_loads: list[str]) -> None:
    taken = tmp_path / "afile"
    taken.write_text("not a run directory")
    for out, message in ((taken, f"{taken} is a file; give a directory"),
                         (taken / "run", f"{taken} is a file, so {taken / 'run'} cannot")):
        result = CliRunner().invoke(app, [*command, "--out", str(out)],
                                    env={"COLUMNS": "500"})  # the path on one line
        assert result.exit_code == 2, result.output
        assert message in " ".join(result.output.split())
    assert no_model_loads == []


def _rows(n: int) -> list[str]:
    return HOTPOT.read_text(encoding="utf-8").splitlines()[:n]


# ---------------------------------------------------------------- method names and options
@pytest.mark.parametrize("name", ["cbdr@2", "cbdr@-0.1", "cbdr@high", "cbdr-ce@1.5"])
def test_a_bad_method_option_is_refused_by_the_registry_without_a_model(name: str) -> None:
    with pytest.raises(ValueError, match=re.escape(name) + ": the option is beta"):
        check_method_name(name, available_methods())


@pytest.mark.parametrize("name", ["quco@-1", "quco@many", "quco@nan", "quco-no-runtime@inf"])
def test_a_bad_tau_entity_is_refused_by_the_registry(name: str) -> None:
    # The message names the method as typed (quco-no-runtime@inf, not quco@inf).
    with pytest.raises(ValueError, match=re.escape(name) + r": the option is tau_entity "
                       r"\(an entity count\), a number >= 0"):
        check_method_name(name, available_methods())


def test_the_option_hook_accepts_good_options() -> None:
    methods = available_methods()
    for name in ("cbdr", "cbdr@0", "cbdr@0.9", "cbdr@1", "quco", "quco@0", "quco@82",
                 "quco-no-precheck@12.5"):
        check_method_name(name, methods)
    assert callable(methods["cbdr"].validate_option)  # type: ignore[attr-defined]


@pytest.mark.parametrize("expression", [
    "cbdr:2", "cbdr:-0.5", "first-token-prob:7", "first-token-prob:-3", "answer-logprob:1e9",
    "answer-logprob:-1", "srrag:1.5", "quco:2", "quco&cbdr:2", "cascade(quco,cbdr:2,0.2,0.8)"])
def test_a_gate_threshold_outside_the_gates_range_is_refused_before_anything_is_built(
        expression: str, no_model_loads: list[str]) -> None:
    from rag_gates.methods import MethodContext
    from rag_gates.registry import make_gate

    # The lm is never reached: the range is checked (for every term) before any gate is built.
    ctx = MethodContext(lm=object())
    with pytest.raises(ValueError, match=r"the threshold is on .* score scale, a number "
                                         r"(in \[0, 1\]|in \[0, 100\])") as info:
        make_gate(expression, ctx)
    assert "beta" not in str(info.value)  # never clamped to, or explained as, a beta
    for method in ("selective", "deeprag-gate"):  # the bench refuses them up front too
        with pytest.raises(ValueError, match="score scale"):
            check_method_name(f"{method}@{expression}", available_methods())
    assert no_model_loads == []


def test_the_bench_option_and_the_gate_threshold_share_one_range_check() -> None:
    # cbdr@BETA and cbdr:THRESHOLD (= 1 - beta) are checked by the same function, so a value
    # one refuses the other refuses too, with the same words for the range.
    from rag_gates.registry import check_gate_threshold

    with pytest.raises(ValueError, match=r"a number in \[0, 1\]"):
        check_method_name("cbdr@2", available_methods())
    with pytest.raises(ValueError, match=r"a number in \[0, 1\]"):
        check_gate_threshold("cbdr", 2.0)
    assert check_gate_threshold("cbdr", 0.4) == 0.4


def test_a_weights_file_that_names_itself_is_refused(tmp_path: Path,
                                                     no_model_loads: list[str]) -> None:
    from rag_gates.errors import WeightsFileError
    from rag_gates.methods import MethodContext
    from rag_gates.registry import make_gate

    ctx = MethodContext(lm=object())
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    one.write_text(json.dumps({"gates": [f"weighted({one})"], "weights": [1.0], "bias": 0.0,
                               "center": [0.0], "scale": [1.0], "threshold": 0.5}))
    two.write_text(json.dumps({"gates": [f"weighted({tmp_path / 'three.json'})"],
                               "weights": [1.0], "bias": 0.0}))
    (tmp_path / "three.json").write_text(json.dumps({"gates": [f"(quco|weighted({two}))"],
                                                     "weights": [1.0], "bias": 0.0}))
    for file in (one, two):
        with pytest.raises(WeightsFileError, match="names itself") as info:
            make_gate(f"weighted({file})", ctx)
        assert str(file) in str(info.value)
        with pytest.raises(WeightsFileError, match="names itself"):
            check_method_name(f"selective@weighted({file})", available_methods())
    assert no_model_loads == []


def test_a_5000_term_expression_is_refused_at_once(no_model_loads: list[str]) -> None:
    import time

    from rag_gates.methods import MethodContext
    from rag_gates.registry import make_gate

    start = time.monotonic()
    with pytest.raises(ValueError, match="limit of"):
        make_gate("|".join(["first-token-prob"] * 5000), MethodContext(lm=object()))
    with pytest.raises(ValueError, match="limit of 64 gates"):
        make_gate("|".join(["first-token-prob"] * 65), MethodContext(lm=object()))
    with pytest.raises(ValueError, match="limit of"):
        check_method_name("selective@" + "|".join(["quco"] * 5000), available_methods())
    assert time.monotonic() - start < 10  # it took minutes


def test_bench_refuses_a_bad_option_before_loading_or_writing(
        tmp_path: Path, no_model_loads: list[str]) -> None:
    run = tmp_path / "run"
    config = BenchConfig(dataset="hotpotqa", methods=["no-rag", "cbdr@2"], n=2,
                         data_path=str(SLICES))
    with pytest.raises(ValueError, match=r"cbdr@2: the option is beta, a number in \[0, 1\]"):
        run_bench(config, run)
    assert no_model_loads == [] and not run.exists()


def test_bench_cli_refuses_a_bad_option_with_exit_2(tmp_path: Path,
                                                    no_model_loads: list[str]) -> None:
    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["bench", "--dataset", "hotpotqa", "--out", str(run),
                                      "--methods", "no-rag,cbdr@2", "--n", "2",
                                      "--data", str(SLICES)])
    assert result.exit_code == 2, result.output
    assert "beta, a number in [0, 1]" in result.output
    assert no_model_loads == [] and not run.exists()


def test_bench_error_text_is_printed_as_written(tmp_path: Path,
                                                 no_model_loads: list[str]) -> None:
    # Brackets in a message must survive rich's markup ("[#model-name]" is a style tag to it).
    result = CliRunner().invoke(app, ["bench", "--dataset", "hotpotqa", "--out",
                                      str(tmp_path / "run"), "--methods", "no-rag",
                                      "--model", "openai:ftp://host/v1", "--n", "2",
                                      "--data", str(SLICES)])
    assert result.exit_code == 2, result.output
    assert "openai:http(s)://HOST[:PORT]/PATH[#model-name]" in " ".join(result.output.split())
    assert no_model_loads == []


# ---------------------------------------------------------------- data files
def test_duplicate_question_ids_are_dropped_with_a_warning_and_the_true_count(
        tmp_path: Path, tiny: Any, caplog: pytest.LogCaptureFixture) -> None:
    first, second = _rows(2)
    path = tmp_path / "hotpotqa_dev.jsonl"
    path.write_text("\n".join([first, first, second, first]) + "\n", encoding="utf-8")
    with caplog.at_level("WARNING", logger="rag_gates_lab.datasets"):
        load = load_dataset("hotpotqa", path)
    ids = [e.id for e in load.examples]
    assert len(ids) == 2 and len(set(ids)) == 2
    assert [number for number, _ in load.skipped] == [2, 4]
    assert all("duplicate id" in reason and "line 1)" in reason for _, reason in load.skipped)
    assert any("duplicate id" in r.getMessage() for r in caplog.records)
    # n counts distinct questions: n=2 reaches past the duplicate to the second question.
    assert [e.id for e in load_dataset("hotpotqa", path, n=2).examples] == ids
    # The run answers and reports both questions, each once.
    retriever = BM25Retriever.from_passages(corpus_passages("hotpotqa", SLICES))
    config = BenchConfig(dataset="hotpotqa", methods=["no-rag"], n=4, max_new_tokens=2,
                         data_path=str(path))
    summary = run_bench(config, tmp_path / "run", lm=tiny, retriever=retriever)
    assert summary["no-rag"]["questions"] == 2
    assert "2 questions" in (tmp_path / "run" / "summary.md").read_text()


def test_a_question_with_a_lone_surrogate_is_skipped_naming_its_position(
        tmp_path: Path) -> None:
    first, second = _rows(2)
    row = json.loads(second)
    bad = json.dumps({**row, "question": "Who \ud800 wrote it?"})  # escaped as "\\ud800"
    path = tmp_path / "hotpotqa_dev.jsonl"
    path.write_text("\n".join([first, bad]) + "\n", encoding="utf-8")
    load = load_dataset("hotpotqa", path)
    assert len(load.examples) == 1
    assert load.skipped[0][0] == 2 and "position 4" in load.skipped[0][1]


def test_a_data_file_without_a_valid_question_is_an_error(tmp_path: Path,
                                                          no_model_loads: list[str]) -> None:
    path = tmp_path / "hotpotqa_dev.jsonl"
    path.write_text('{not json\n{"question": "no answer"}\n[1, 2]\n', encoding="utf-8")
    config = BenchConfig(dataset="hotpotqa", methods=["no-rag"], n=5, data_path=str(path))
    with pytest.raises(ValueError, match=r"no valid question.*hotpotqa_dev\.jsonl.*3 lines"):
        run_bench(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    result = CliRunner().invoke(app, ["bench", "--dataset", "hotpotqa", "--out",
                                      str(tmp_path / "run"), "--methods", "no-rag",
                                      "--data", str(path)])
    assert result.exit_code == 2 and "no valid question" in result.output
    path.write_text("", encoding="utf-8")  # empty: said as such, not "0 lines skipped"
    with pytest.raises(ValueError, match=r"hotpotqa_dev\.jsonl holds no question \(an empty"):
        run_bench(config, tmp_path / "run")
    assert no_model_loads == []


# ---------------------------------------------------------------- run directories
@pytest.mark.parametrize("content", [b"{garbage", b"[1, 2, 3]", b'"a string"', b"\xff\xfe",
                                     b'{"config": [1]}', b'{"config": {"methods": 3}}'])
def test_a_damaged_config_json_is_refused_naming_the_file(
        tmp_path: Path, content: bytes, no_model_loads: list[str]) -> None:
    from rag_gates_lab.runner import RunDirectoryError

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_bytes(content)
    config = BenchConfig(dataset="hotpotqa", methods=["no-rag"], n=2, data_path=str(SLICES))
    with pytest.raises(RunDirectoryError) as caught:
        run_bench(config, run)
    message = str(caught.value)
    assert str(run / "config.json") in message and "new --out directory" in message
    assert (run / "config.json").read_bytes() == content  # left for the user to inspect
    assert no_model_loads == []


# ---------------------------------------------------------------- eval-gate labels
def test_eval_gate_refuses_a_labels_path_that_does_not_exist(
        tmp_path: Path, no_model_loads: list[str]) -> None:
    missing = tmp_path / "no" / "such" / "labels"
    config = GateEvalConfig(gate="first-token-prob", dataset="popqa", n=4,
                            data_path=str(SLICES), labels_dir=str(missing))
    with pytest.raises(FileNotFoundError, match=r"does not exist.*--create-labels"):
        evaluate_gate(config, tmp_path / "gate")
    assert not missing.exists() and not (tmp_path / "no").exists()
    result = CliRunner().invoke(app, ["eval-gate", "--gate", "first-token-prob", "--dataset",
                                      "popqa", "--out", str(tmp_path / "gate"), "--n", "4",
                                      "--data", str(SLICES), "--labels", str(missing)])
    assert result.exit_code == 2 and "--create-labels" in result.output
    assert not (tmp_path / "no").exists() and no_model_loads == []


@pytest.mark.parametrize(("gate", "message"), [
    ("cbdr:2", "score scale"), ("(" * 40 + "quco" + ")" * 40, "nested deeper"),
    ("quco&", "expected a gate name")])
def test_eval_gate_refuses_a_bad_gate_expression_before_loading_a_model(
        tmp_path: Path, no_model_loads: list[str], gate: str, message: str) -> None:
    # Before: the model loaded and the questions were labelled (minutes) before the gate
    # was built and refused.
    config = GateEvalConfig(gate=gate, dataset="popqa", n=4, data_path=str(SLICES),
                            labels_dir=str(tmp_path / "labels"), create_labels=True)
    with pytest.raises(ValueError, match=message):
        evaluate_gate(config, tmp_path / "gate")
    assert no_model_loads == [] and not (tmp_path / "labels").exists()


def test_eval_gate_creates_the_labels_directory_when_asked(tmp_path: Path, tiny: Any,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path / "home"))
    labels = tmp_path / "new-labels"
    retriever = BM25Retriever.from_passages(corpus_passages("popqa", SLICES))
    config = GateEvalConfig(gate="first-token-prob", dataset="popqa", n=3, max_new_tokens=2,
                            data_path=str(SLICES), labels_dir=str(labels), create_labels=True)
    report = evaluate_gate(config, tmp_path / "gate", lm=tiny, retriever=retriever)
    assert report.questions == 3 and (labels / "results.jsonl").is_file()


def test_the_label_cache_is_keyed_by_the_data_not_its_name(tmp_path: Path, tiny: Any,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path / "home"))
    rows = (SLICES / "popqa_dev_sample.jsonl").read_text(encoding="utf-8").splitlines()
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, chunk in ((a, rows[:3]), (b, rows[3:6])):
        folder.mkdir()
        (folder / "popqa_dev.jsonl").write_text("\n".join(chunk) + "\n", encoding="utf-8")
    retriever = BM25Retriever.from_passages(corpus_passages("popqa", SLICES))
    dirs = []
    for folder in (a, b):
        config = GateEvalConfig(gate="first-token-prob", dataset="popqa", n=3,
                                max_new_tokens=2, data_path=str(folder))
        evaluate_gate(config, tmp_path / f"gate-{folder.name}", lm=tiny, retriever=retriever)
        fingerprint = load_dataset("popqa", folder, n=3).fingerprint
        directory = label_run_dir(config, fingerprint)
        assert fingerprint in directory.name
        ids = {json.loads(line)["id"] for line in
               (directory / "results.jsonl").read_text().splitlines()}
        assert ids == {e.id for e in load_dataset("popqa", folder, n=3).examples}
        dirs.append(directory)
    assert dirs[0] != dirs[1]
    # The same questions from another path share their labels.
    c = tmp_path / "c"
    c.mkdir()
    (c / "popqa_dev.jsonl").write_bytes((a / "popqa_dev.jsonl").read_bytes())
    same = GateEvalConfig(gate="first-token-prob", dataset="popqa", n=3, max_new_tokens=2,
                          data_path=str(c))
    assert label_run_dir(same, load_dataset("popqa", c, n=3).fingerprint) == dirs[0]


def test_a_label_cache_of_an_earlier_layout_is_adopted_only_when_it_matches(
        tmp_path: Path, tiny: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache named by the questions' fingerprint alone (or by nothing), recording its data
    path, is renamed to the current key when its records carry the current gold answers and
    its data file has the same corpus; one whose answers differ is left alone."""
    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path / "home"))
    data = _popqa_copy(tmp_path / "data")
    retriever = BM25Retriever.from_passages(corpus_passages("popqa", SLICES))
    config = GateEvalConfig(gate="first-token-prob", dataset="popqa", n=3, max_new_tokens=2,
                            data_path=str(data.parent))
    evaluate_gate(config, tmp_path / "gate", lm=tiny, retriever=retriever)
    load = load_dataset("popqa", data.parent, n=3)
    new = label_run_dir(config, load.fingerprint)
    lines = (new / "results.jsonl").read_text().splitlines()
    key = new.name.split("-n3-")[0].removeprefix("popqa")  # -FINGERPRINT-cCORPUS
    for old_key in (f"-{load.question_fingerprint}", ""):
        old = new.with_name(new.name.replace(key, old_key))
        new.rename(old)  # as an earlier version wrote it: path recorded, questions' hash
        recorded = json.loads((old / "config.json").read_text())
        recorded["config"]["data_path"] = str(data.parent)
        recorded["data_fingerprint"] = load.question_fingerprint
        (old / "config.json").write_text(json.dumps(recorded))
        evaluate_gate(config, tmp_path / "gate", lm=tiny, retriever=retriever)
        assert not old.exists() and (new / "results.jsonl").read_text().splitlines() == lines
        assert json.loads((new / "config.json").read_text())["data_fingerprint"] \
            == load.fingerprint
    # Records scored on other answers: not adopted; the labels are made again.
    old = new.with_name(new.name.replace(key, f"-{load.question_fingerprint}"))
    new.rename(old)
    recorded = json.loads((old / "config.json").read_text())
    recorded["config"]["data_path"] = str(data.parent)
    recorded["data_fingerprint"] = load.question_fingerprint
    (old / "config.json").write_text(json.dumps(recorded))
    rows = [json.loads(line) for line in lines]
    rows[0]["answers"] = ["an older answer"]
    (old / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evaluate_gate(config, tmp_path / "gate-2", lm=tiny, retriever=retriever)
    assert old.is_dir() and len((new / "results.jsonl").read_text().splitlines()) == 6


# ------------------------------------------------- the label cache follows the gold answers
def _popqa_copy(folder: Path, n: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = (SLICES / "popqa_dev_sample.jsonl").read_text(encoding="utf-8").splitlines()[:n]
    (folder / "popqa_dev.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return folder / "popqa_dev.jsonl"


def _label_records(config: GateEvalConfig) -> list[dict[str, Any]]:
    directory = label_run_dir(config, load_dataset("popqa", config.data_path, n=config.n)
                              .fingerprint)
    return [json.loads(line) for line in
            (directory / "results.jsonl").read_text(encoding="utf-8").splitlines()]


def test_gold_answers_edited_in_place_are_labelled_again(tmp_path: Path, tiny: Any,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Issue 32, item 1: the cache key covers the answers, so an edited file is relabelled
    and its figures follow the new answers (before: the old labels were reused)."""
    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path / "home"))
    data = _popqa_copy(tmp_path / "data")
    retriever = BM25Retriever.from_passages(corpus_passages("popqa", SLICES))
    config = GateEvalConfig(gate="first-token-prob", dataset="popqa", n=3, max_new_tokens=3,
                            data_path=str(tmp_path / "data"))
    evaluate_gate(config, tmp_path / "gate-1", lm=tiny, retriever=retriever)
    replies = {r["id"]: r["prediction"] for r in _label_records(config)
               if r["method"] == "no-rag"}
    # Each question's gold answer becomes its own closed-book reply (contained in it), so
    # the closed-book accuracy must become 1.0 with fresh labels.
    edited = []
    for line, example in zip(data.read_text(encoding="utf-8").splitlines(),
                             load_dataset("popqa", data, n=3).examples, strict=True):
        row = json.loads(line)
        row["possible_answers"] = [replies[example.id]]
        edited.append(json.dumps(row))
    data.write_text("\n".join(edited) + "\n", encoding="utf-8")
    report = evaluate_gate(config, tmp_path / "gate-2", lm=tiny, retriever=retriever)
    assert report.closed_book_accuracy == 1.0
    for record in _label_records(config):
        assert record["answers"] == [replies[record["id"]]]


def test_the_same_questions_at_another_path_share_their_labels(tmp_path: Path, tiny: Any,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """Issue 32, item 1: a byte copy of the data file elsewhere reuses the cached labels
    (before: ConfigMismatchError on data_path)."""
    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path / "home"))
    _popqa_copy(tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "popqa_dev.jsonl").write_bytes(
        (tmp_path / "a" / "popqa_dev.jsonl").read_bytes())
    retriever = BM25Retriever.from_passages(corpus_passages("popqa", SLICES))
    reports, caches = [], []
    for folder in ("a", "b"):
        config = GateEvalConfig(gate="first-token-prob", dataset="popqa", n=3,
                                max_new_tokens=3, data_path=str(tmp_path / folder))
        reports.append(evaluate_gate(config, tmp_path / f"gate-{folder}", lm=tiny,
                                     retriever=retriever))
        caches.append(label_run_dir(config, load_dataset("popqa", tmp_path / folder, n=3)
                                    .fingerprint))
    assert caches[0] == caches[1]
    assert len((caches[0] / "results.jsonl").read_text().splitlines()) == 6  # not answered twice
    assert reports[0].closed_book_accuracy == reports[1].closed_book_accuracy
    # Another file whose first questions are the same but whose corpus differs does not.
    other = _popqa_copy(tmp_path / "c", n=5)
    config = GateEvalConfig(gate="first-token-prob", dataset="popqa", n=3, max_new_tokens=3,
                            data_path=str(other.parent))
    assert label_run_dir(config, load_dataset("popqa", other.parent, n=3).fingerprint) \
        != caches[0]


def test_the_dataset_search_path_ends_at_the_shipped_slices() -> None:
    """On a machine without ../shared (CI's fresh clone) the datasets are the slices in
    examples/data: the search path must reach them from the lab's own folder."""
    from pathlib import Path

    from rag_gates_lab.datasets import data_search_path, find_dataset_file

    shipped = Path(__file__).resolve().parents[2] / "examples" / "data"
    assert data_search_path()[-1].resolve() == shipped
    for name in ("hotpotqa", "2wiki", "popqa", "pubmedqa"):
        assert any(find_dataset_file(name).parent == p.resolve()
                   for p in data_search_path() if p.is_dir())
    assert (shipped / "hotpotqa_dev_sample.jsonl").is_file()
