"""Datasets, retrieval corpus, methods, the resumable runner, gate evaluation and reports,
end to end on the shipped data slices with the tiny random-weight model."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rag_gates._io import append_locked
from rag_gates.errors import FileInUseError
from rag_gates.methods import MethodContext, first_sentence, make_method
from rag_gates.retrieval.bm25 import BM25Retriever
from rag_gates_lab.corpus import corpus_passages
from rag_gates_lab.datasets import DATASETS, load_dataset
from rag_gates_lab.gate_eval import GateEvalConfig, calibrate, evaluate_gate, threshold_curve
from rag_gates_lab.report import pareto_front, write_report
from rag_gates_lab.runner import (
    RESULTS,
    BenchConfig,
    ConfigMismatchError,
    read_records,
    run_bench,
)

SLICES = Path(__file__).resolve().parents[2] / "examples" / "data"


@pytest.fixture(scope="module")
def tiny() -> Any:
    """The tiny random model with room for prompts holding three real paragraphs."""
    from rag_gates.testing import tiny_lm

    return tiny_lm(seed=0, max_context=4096)


@pytest.fixture(scope="module")
def bm25() -> BM25Retriever:
    return BM25Retriever.from_passages(corpus_passages("hotpotqa", SLICES))


# ---------------------------------------------------------------- datasets
@pytest.mark.parametrize("name", sorted(DATASETS))
def test_loaders_read_the_shipped_slices(name: str) -> None:
    load = load_dataset(name, SLICES, n=10)
    assert len(load.examples) == 10 and not load.skipped
    for e in load.examples:
        assert e.question.strip() and e.answers and all(a for a in e.answers)
        assert e.dataset == name
    ids = [e.id for e in load.examples]
    assert len(set(ids)) == len(ids)


def test_dataset_specifics() -> None:
    hotpot = load_dataset("hotpotqa", SLICES, n=1).examples[0]
    assert hotpot.answers == ["yes"] and len(hotpot.context) == 10
    assert set(hotpot.supporting_titles) == {"Scott Derrickson", "Ed Wood"}
    wiki = load_dataset("2wiki", SLICES, n=1).examples[0]
    assert "The Mask of Fu Manchu" in wiki.answers and "Mask of Fu Manchu" in wiki.answers
    pop = load_dataset("popqa", SLICES, n=1).examples[0]
    assert "politician" in pop.answers and pop.meta["s_pop"] == 58
    pub = load_dataset("pubmedqa", SLICES, n=1).examples[0]
    assert pub.answers[0] in ("yes", "no", "maybe") and pub.context


def test_malformed_lines_are_reported_and_skipped(tmp_path: Path) -> None:
    good = (SLICES / "hotpotqa_dev_sample.jsonl").read_text().splitlines()[:3]
    lines = [good[0], "{not json", json.dumps({"question": "no answer field"}), good[1],
             "[1, 2]", good[2]]
    path = tmp_path / "hotpotqa_dev.jsonl"
    path.write_bytes(("\n".join(lines) + "\n").encode() + b"\xff\xfe broken utf8\n")
    load = load_dataset("hotpotqa", path)
    assert len(load.examples) == 3
    assert [number for number, _ in load.skipped] == [2, 3, 5, 7]


def test_unknown_names_list_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="valid names: 2wiki, hotpotqa, popqa, pubmedqa"):
        load_dataset("squad")
    with pytest.raises(ValueError, match=r"valid names:.*fs-rag.*no-rag.*single"):
        make_method("always-rag", MethodContext(lm=None))
    with pytest.raises(FileNotFoundError):
        load_dataset("hotpotqa", "/no/such/file.jsonl")


def test_union_corpus_is_deduplicated() -> None:
    passages = corpus_passages("hotpotqa", SLICES)
    keys = [(p.title, p.text) for p in passages]
    assert len(keys) == len(set(keys))
    total = sum(len(e.context) for e in load_dataset("hotpotqa", SLICES).examples)
    assert 0 < len(passages) <= total


def test_bm25_open_retrieval_finds_gold_paragraphs(bm25: BM25Retriever, tmp_path: Path) -> None:
    examples = load_dataset("hotpotqa", SLICES, n=20).examples
    hits = sum(bool({p.title for p in bm25.retrieve(e.question, 3)} & set(e.supporting_titles))
               for e in examples)
    assert hits >= 15  # real BM25 on real questions: most find a gold paragraph in the top 3
    bm25.save(tmp_path / "bm25")
    again = BM25Retriever.load(tmp_path / "bm25")
    q = examples[0].question
    assert [p.id for p in again.retrieve(q, 5)] == [p.id for p in bm25.retrieve(q, 5)]
    with pytest.raises(ValueError):
        bm25.retrieve("   ")


def test_a_cache_built_twice_at_once_keeps_the_first_copy(tmp_path: Path) -> None:
    """Two processes building one dataset's BM25 cache: the second keeps the first's copy
    (which readers may already be using) instead of deleting it under them."""
    from rag_gates.types import Passage

    first = BM25Retriever.from_passages([Passage(id="a", text="Paris is in France.")])
    second = BM25Retriever.from_passages([Passage(id="b", text="Rome is in Italy.")])
    first.save(tmp_path / "bm25")
    second.save(tmp_path / "bm25", replace=False)
    assert [p.id for p in BM25Retriever.load(tmp_path / "bm25").passages] == ["a"]
    assert [p.name for p in tmp_path.iterdir()] == ["bm25"]  # the second build is gone
    second.save(tmp_path / "bm25")  # a deliberate save replaces
    assert [p.id for p in BM25Retriever.load(tmp_path / "bm25").passages] == ["b"]


# ---------------------------------------------------------------- methods
def test_first_sentence() -> None:
    assert first_sentence("It is Paris. It is big.") == "It is Paris."
    assert first_sentence("Born in St. Louis in 1950") == "Born in St. Louis in 1950"
    assert first_sentence("") == ""


def test_methods_record_their_work(tiny: Any, bm25: BM25Retriever) -> None:
    ctx = MethodContext(lm=tiny, retriever=bm25, dataset="hotpotqa", max_new_tokens=8)
    question = load_dataset("hotpotqa", SLICES, n=1).examples[0].question
    closed = make_method("no-rag", ctx).answer(question)
    assert (closed.trace.retrievals, closed.trace.llm_calls) == (0, 1)
    single = make_method("single", ctx).answer(question)
    assert single.trace.retrievals == 1 and len(single.passages) == 3
    assert single.trace.events[0].data["query"] == question
    fs = make_method("fs-rag", ctx).answer(question)
    assert fs.trace.retrievals == fs.trace.llm_calls >= 1
    assert fs.trace.generated_tokens <= 8 + 8  # the budget, plus one call's overshoot at most
    with pytest.raises(ValueError, match="retriever"):
        make_method("single", MethodContext(lm=tiny))


# ---------------------------------------------------------------- runner
def _config(**kw: Any) -> BenchConfig:
    base: dict[str, Any] = {"dataset": "hotpotqa", "methods": ["no-rag", "single"], "n": 4,
                            "max_new_tokens": 4, "data_path": str(SLICES)}
    return BenchConfig(**{**base, **kw})


def test_bench_end_to_end(tiny: Any, bm25: BM25Retriever, tmp_path: Path) -> None:
    summary = run_bench(_config(), tmp_path / "run", lm=tiny, retriever=bm25)
    assert set(summary) == {"no-rag", "single"}
    assert summary["single"]["retrievals_per_question"] == 1.0
    assert summary["no-rag"]["retrievals_per_question"] == 0.0
    records = read_records(tmp_path / "run")
    assert len(records) == 8
    assert (tmp_path / "run" / "summary.md").read_text().count("|") > 10
    # A later invocation with another method extends the run; the summary covers both.
    extended = run_bench(_config(methods=["fs-rag"]), tmp_path / "run", lm=tiny, retriever=bm25)
    assert set(extended) == {"no-rag", "single", "fs-rag"}
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["config"]["methods"] == ["no-rag", "single", "fs-rag"]


class Interrupt(Exception):
    pass


def test_resume_after_interruption_loses_and_duplicates_nothing(
        tiny: Any, bm25: BM25Retriever, tmp_path: Path) -> None:
    run = tmp_path / "run"

    def stop_after_three(done: int, total: int, _: Any) -> None:
        if done == 3:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_bench(_config(), run, lm=tiny, retriever=bm25, progress=stop_after_three)
    assert len(read_records(run)) == 3
    # A write cut off mid-line by the interruption.
    with (run / RESULTS).open("a") as handle:
        handle.write('{"id": "5a8b57f25542995d1e6f1371", "method": "sin')
    run_bench(_config(), run, lm=tiny, retriever=bm25)
    keys = Counter((r.id, r.method) for r in read_records(run))
    assert len(keys) == 8 and set(keys.values()) == {1}
    assert all(line.endswith("}") for line in (run / RESULTS).read_text().splitlines())
    # Extending the run with another method keeps the earlier records.
    run_bench(_config(methods=["fs-rag"]), run, lm=tiny, retriever=bm25)
    assert len(read_records(run)) == 12


def test_a_second_writer_of_the_same_run_is_refused_before_it_writes(
        tiny: Any, bm25: BM25Retriever, tmp_path: Path) -> None:
    # Two benches resuming one --out used to both append every missing row (duplicates).
    run = tmp_path / "run"
    run_bench(_config(n=2, methods=["no-rag"]), run, lm=tiny, retriever=bm25)
    before = (run / RESULTS).read_text()
    # another process's bench, mid-run:
    with append_locked(run / RESULTS), \
            pytest.raises(FileInUseError, match="being written by another process"):
        run_bench(_config(n=2), run, lm=tiny, retriever=bm25)
    assert (run / RESULTS).read_text() == before
    run_bench(_config(n=2), run, lm=tiny, retriever=bm25)  # once it is done: resumes
    keys = Counter((r.id, r.method) for r in read_records(run))
    assert len(keys) == 4 and set(keys.values()) == {1}


def test_a_different_configuration_is_refused(tiny: Any, bm25: BM25Retriever,
                                              tmp_path: Path) -> None:
    run_bench(_config(n=2), tmp_path / "run", lm=tiny, retriever=bm25)
    with pytest.raises(ConfigMismatchError, match="'n': \\(2, 3\\)"):
        run_bench(_config(n=3), tmp_path / "run", lm=tiny, retriever=bm25)
    with pytest.raises(ValueError, match="valid names"):
        run_bench(_config(methods=["nope"]), tmp_path / "run2", lm=tiny, retriever=bm25)


# ---------------------------------------------------------------- gates and reports
def test_threshold_curve_and_calibration() -> None:
    scores = [0.9, 0.1, 0.5, 0.7]
    closed = [0.0, 1.0, 1.0, 0.0]      # questions 0 and 3 are wrong without retrieval
    retrieved = [1.0, 1.0, 0.0, 1.0]   # retrieval fixes them, but breaks question 2
    curve = threshold_curve(scores, closed, retrieved)
    by_t = {p.threshold: p for p in curve}
    assert by_t[0.7].retrieval_rate == 0.5 and by_t[0.7].accuracy == 1.0
    assert by_t[0.1].retrieval_rate == 1.0 and by_t[0.1].accuracy == 0.75
    assert curve[-1].retrieval_rate == 0.0 and curve[-1].accuracy == 0.5
    assert calibrate(curve, None).threshold == 0.7
    assert calibrate(curve, 0.3).retrieval_rate == 0.25


def test_eval_gate_and_report_on_the_tiny_model(tiny: Any, bm25: BM25Retriever,
                                                tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path / "home"))
    config = GateEvalConfig(gate="first-token-prob", dataset="popqa", n=6, max_new_tokens=4,
                            data_path=str(SLICES), target_retrieval_rate=0.5)
    pop_bm25 = BM25Retriever.from_passages(corpus_passages("popqa", SLICES))
    report = evaluate_gate(config, tmp_path / "gate", lm=tiny, retriever=pop_bm25)
    assert report.questions == 6 and report.calibrated.retrieval_rate <= 0.5
    assert report.popularity_spearman is not None
    decisions = (tmp_path / "gate" / "decisions.jsonl").read_text().splitlines()
    assert len(decisions) == 6
    assert all(0.0 <= json.loads(d)["score"] <= 1.0 for d in decisions)
    saved = json.loads((tmp_path / "gate" / "gate.json").read_text())
    assert saved["threshold"] == report.calibrated_threshold
    run_bench(_config(), tmp_path / "bench", lm=tiny, retriever=bm25)
    path = write_report([tmp_path / "bench", tmp_path / "gate"], tmp_path / "report")
    text = path.read_text()
    assert "| no-rag |" in text and "first-token-prob" in text
    for png in ("accuracy_vs_retrievals.png", "roc.png"):
        data = (tmp_path / "report" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_pareto_front() -> None:
    points = [("no-rag", 0.0, 20.0), ("single", 1.0, 30.0), ("fs-rag", 2.0, 29.0),
              ("flare", 1.5, 35.0)]
    assert pareto_front(points) == ["no-rag", "single", "flare"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("He met Dr. Smith in Washington. Then he left.", "He met Dr. Smith in Washington."),
        ("J. R. R. Tolkien wrote it. Yes.", "J. R. R. Tolkien wrote it."),
        ("It cost 3.5 million dollars! Wow.", "It cost 3.5 million dollars!"),
        ('He said "no." Then he went.', 'He said "no."'),
        ("no sentence end here", "no sentence end here"),
    ],
)
def test_first_sentence_edge_cases(text: str, expected: str) -> None:
    assert first_sentence(text) == expected


def test_accuracy_by_popularity_quartile() -> None:
    from rag_gates_lab.report import accuracy_by_quartile
    from rag_gates_lab.runner import RunRecord

    def record(i: int, pop: int, acc: float) -> RunRecord:
        return RunRecord(id=str(i), method="no-rag", question="q", answers=["a"], prediction="",
                         em=0, f1=0, accuracy=acc, retrievals=0, llm_calls=1,
                         generated_tokens=1, wall_s=0.1, trace={}, meta={"s_pop": pop})

    records = [record(i, pop=i * 10, acc=float(i >= 6)) for i in range(8)]
    rows = accuracy_by_quartile(records, "no-rag")
    assert [r["accuracy"] for r in rows] == [0.0, 0.0, 0.0, 100.0]
    assert rows[0]["min"] == 0 and rows[-1]["max"] == 70 and rows[2]["questions"] == 2


# ---------------------------------------------------------------- selective@GATE
def test_selective_method_follows_its_gate_and_records_the_decision(
        tiny: Any, bm25: BM25Retriever) -> None:
    from rag_gates.registry import make_gate

    ctx = MethodContext(lm=tiny, retriever=bm25, dataset="hotpotqa", max_new_tokens=6)
    questions = [e.question for e in load_dataset("hotpotqa", SLICES, n=4).examples]
    for option in ("first-token-prob:0", "first-token-prob:1",
                   "answer-logprob&first-token-prob",
                   "cascade(first-token-prob,answer-logprob,0,1)"):
        method = make_method(f"selective@{option}", ctx)
        gate = make_gate(option, ctx)
        for question in questions[:2]:
            result = method.answer(question)
            expected = gate.decide(question)
            (decision,) = result.trace.decisions()
            assert decision.retrieve is expected.retrieve and decision.gate == expected.gate
            assert result.trace.retrievals == int(expected.retrieve)
            assert len(result.passages) == (3 if expected.retrieve else 0)
    # 1 - max p never reaches 1 (max p > 0): that gate never retrieves; at 0 it always does.
    # (A threshold above 1 is off the gate's score scale: refused.)
    assert make_method("selective@first-token-prob:1", ctx).answer(questions[0]) \
        .trace.retrievals == 0
    assert make_method("selective@first-token-prob:0", ctx).answer(questions[0]) \
        .trace.retrievals == 1


def test_selective_names_are_checked_before_any_model_loads() -> None:
    from rag_gates.methods import available_methods, check_method_name, split_method_list

    methods = available_methods()
    check_method_name("selective@cascade(quco,cbdr,0.2,0.8)", methods)
    for bad, message in (("selective", "needs a gate"), ("selective@quco&", "expected"),
                         ("selective@cascade(quco,cbdr,0.8,0.2)", "is empty")):
        with pytest.raises(ValueError, match=message):
            check_method_name(bad, methods)
    assert split_method_list("no-rag, selective@cascade(quco,cbdr,0.2,0.8),single") == [
        "no-rag", "selective@cascade(quco,cbdr,0.2,0.8)", "single"]


def test_two_selective_methods_in_one_run_are_both_answered(
        tiny: Any, bm25: BM25Retriever, tmp_path: Path) -> None:
    names = ["selective@first-token-prob:0", "selective@first-token-prob:1"]
    summary = run_bench(_config(methods=names, n=2), tmp_path / "run", lm=tiny, retriever=bm25)
    assert set(summary) == set(names)
    assert summary[names[0]]["retrievals_per_question"] == 1.0
    assert summary[names[1]]["retrievals_per_question"] == 0.0


def test_eval_gate_scores_a_composite_gate(tiny: Any, bm25: BM25Retriever,
                                           tmp_path: Path) -> None:
    config = GateEvalConfig(gate="cascade(first-token-prob,answer-logprob,0.0,0.5)",
                            dataset="hotpotqa", n=4, max_new_tokens=4, data_path=str(SLICES),
                            labels_dir=str(tmp_path / "labels"), create_labels=True)
    report = evaluate_gate(config, tmp_path / "out", lm=tiny, retriever=bm25)
    assert report.questions == 4
    rows = [json.loads(line) for line in (tmp_path / "out" / "decisions.jsonl").open()]
    assert all(r["gate"] == "cascade(first-token-prob,answer-logprob,0,0.5)" for r in rows)
    assert all(isinstance(r["evidence"]["expensive_called"], bool) for r in rows)


def test_a_run_of_edited_gold_answers_is_refused_and_an_older_run_is_checked_by_answers(
        tiny: Any, bm25: BM25Retriever, tmp_path: Path) -> None:
    """Issue 32, item 1: the data fingerprint covers the gold answers, so resuming a run
    after the answers were edited in place is refused (before: resumed, mixing records
    scored on the old answers with new ones). A run directory of an earlier version (the
    questions' fingerprint) resumes when its records carry the current answers."""
    folder = tmp_path / "data"
    folder.mkdir()
    rows = (SLICES / "hotpotqa_dev_sample.jsonl").read_text(encoding="utf-8").splitlines()[:2]
    data = folder / "hotpot.jsonl"
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    config = _config(n=2, data_path=str(data))
    run_bench(config, tmp_path / "run", lm=tiny, retriever=bm25)
    stored = json.loads((tmp_path / "run" / "config.json").read_text())
    stored["data_fingerprint"] = load_dataset("hotpotqa", data, n=2).question_fingerprint
    (tmp_path / "run" / "config.json").write_text(json.dumps(stored))
    run_bench(config, tmp_path / "run", lm=tiny, retriever=bm25)  # older layout: resumes
    edited = json.loads(rows[0])
    edited["answer"] = "a different answer"
    data.write_text("\n".join([json.dumps(edited), rows[1]]) + "\n", encoding="utf-8")
    with pytest.raises(ConfigMismatchError, match="gold answers"):
        run_bench(config, tmp_path / "run", lm=tiny, retriever=bm25)
