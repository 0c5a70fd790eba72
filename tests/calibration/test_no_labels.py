"""Calibration without gold answers (issue 60): a question without labels is certified by
whether its closed-book reply and its reply with retrieval are the same answer.

The validity claim of the ``exact`` judge is checked against the package's answer check on
generated replies and gold answers (not restated from the judge's code): two replies equal
after normalisation are right or wrong together for every gold answer, so a disagreement
count can only over-count the harms of skipping."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rag_gates.answers import accuracy
from rag_gates.calibration import CalibrationRecord, GateSpec, ModelIdentity, calibrate
from rag_gates.calibration.judges import parse_same_answer
from rag_gates.cli import app

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "data" / "calibration_questions.jsonl"
CORPUS = ROOT / "examples" / "data" / "calibration_corpus.jsonl"


def test_the_judges_read_replies_as_the_answer_check_does() -> None:
    exact, loose = parse_same_answer("exact"), parse_same_answer("F1:0.5")
    assert exact("The Eiffel Tower.", "eiffel tower") and not exact("Paris", "Lyon")
    assert loose.name == "f1:0.5" and not loose.always_valid and exact.always_valid
    # "city of paris" against "paris": one common token of 3 and 1 -> F1 = 2 * (1/3 * 1) /
    # (1/3 + 1) = 0.5, at the cut; against "lyon": 0.
    assert loose("The city of Paris", "Paris") and not loose("The city of Paris", "Lyon")
    assert exact("", "") and loose("", "the")  # two empty replies are one reply
    for bad in ("f1", "f1:0", "f1:1.5", "f1:x", "bleu:0.5", ""):
        with pytest.raises(ValueError, match=r"exact \| f1:CUT"):
            parse_same_answer(bad)


def test_exact_agreement_never_hides_a_harm() -> None:
    """Over every pair of generated replies and gold answers: where the exact judge says
    the two replies agree, the answer check rates them the same, so a skip there cannot
    lose a right answer; the agreement record's harm is never below the true one."""
    rng = random.Random(0)
    words = ["Paris", "paris.", "The Paris", "Lyon", "an apple", "Apple", "", "  ", "Rome!"]
    replies = [" ".join(rng.sample(words, rng.randint(1, 3))) for _ in range(60)] + words
    golds = [["Paris"], ["apple"], ["Lyon", "Rome"], ["the"], ["Paris Lyon"]]
    exact = parse_same_answer("exact")
    checked = 0
    for closed, retrieved in itertools.product(replies[:40], replies[40:]):
        record = CalibrationRecord.from_agreement(
            id="q", question="?", closed_book_answer=closed, retrieved_answer=retrieved,
            judge=exact, scores={})
        assert not record.help_if_skipped
        for gold in golds:
            truly_lost = accuracy(retrieved, gold) > accuracy(closed, gold)
            assert record.harm_if_skipped or not truly_lost, (closed, retrieved, gold)
            checked += 1
    assert checked > 2000


def test_a_loose_judge_can_hide_a_harm() -> None:
    """Why f1:CUT must state its false-agreement rate: it calls "Paris France" and
    "Paris Texas" the same at 0.5, and only one of them holds the gold "France"."""
    loose = parse_same_answer("f1:0.5")
    record = CalibrationRecord.from_agreement(
        id="q", question="?", closed_book_answer="Paris Texas",
        retrieved_answer="Paris France", judge=loose, scores={})
    assert not record.harm_if_skipped
    assert accuracy("Paris France", ["France"]) > accuracy("Paris Texas", ["France"])


def _agreement_records(n: int, seed: int = 0) -> list[CalibrationRecord]:
    """Replies that agree when a score is low and differ when it is high (a gate that
    knows when retrieval would change the answer)."""
    rng = random.Random(seed)
    exact = parse_same_answer("exact")
    out = []
    for i in range(n):
        score = rng.random()
        differ = rng.random() < score ** 2
        out.append(CalibrationRecord.from_agreement(
            id=f"q{i}", question=f"Question {i}?", closed_book_answer="Paris",
            retrieved_answer="Lyon" if differ else "paris", judge=exact,
            scores={"g": score}))
    return out


def test_agreement_records_certify_and_the_spec_says_how() -> None:
    model = ModelIdentity(name="m", fingerprint="1" * 64)
    records = _agreement_records(400)
    spec = calibrate(records, max_loss=0.1, model=model, retriever="-",
                     composite=False).spec_for("g")
    assert spec.certified and spec.labels == "none" and spec.judge == "exact"
    assert "Certified without labels" in spec.note and "whatever the gold answers" in spec.note
    assert spec.summary()["labels"] == "none"
    again = GateSpec.from_json_dict(spec.model_dump(mode="json"))  # the checksum covers them
    assert again.labels == "none"
    gold = [r.model_copy(update={"labels": "gold", "judge": None}) for r in records[:200]]
    mixed = calibrate(gold + records[200:], max_loss=0.1, model=model, retriever="-",
                      composite=False).spec_for("g")
    assert mixed.labels == "mixed" and "where the data had them" in mixed.note
    loose = [r.model_copy(update={"judge": "f1:0.8"}) for r in records[:10]]
    with pytest.raises(Exception, match="one judge per certificate"):
        calibrate(loose + records[10:], max_loss=0.1, model=model, retriever="-",
                  composite=False)


def test_a_gold_spec_keeps_its_checksum_form() -> None:
    """Specs certified on gold labels hash as before the label fields existed: the shipped
    example spec still loads."""
    spec = GateSpec.load(ROOT / "examples" / "data" / "calibration_gate.json")
    assert spec.labels == "gold" and spec.judge is None


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rag_gates.testing import save_tiny_lm

    return save_tiny_lm(tmp_path_factory.mktemp("tiny"))


def _bare(tmp_path: Path, n: int = 40, labelled: int = 0) -> tuple[Path, Path]:
    """The first ``n`` sample questions (the first ``labelled`` keep their answers) and a
    corpus of 300 of the sample corpus's Wikipedia distractors, cut short for the tiny model.
    Both classes come from retrieval: a question that finds no passage there (a person those
    paragraphs never name) gets the same prompt both ways, so its two replies agree; the
    others' replies, from a random-weight model, differ."""
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines()[:n]]
    data = tmp_path / "bare.jsonl"
    data.write_text("".join(json.dumps({"id": r["id"], "question": r["question"],
                                        **({"answers": r["answers"]} if i < labelled else {})})
                            + "\n" for i, r in enumerate(rows)))
    corpus = tmp_path / "corpus.jsonl"
    distractors = [p for p in map(json.loads, CORPUS.read_text().splitlines())
                   if str(p["id"]).startswith("wiki-")][:300]
    corpus.write_text("".join(json.dumps({"title": p["title"], "text": p["text"][:60]}) + "\n"
                              for p in distractors))
    return data, corpus


def _run(tiny_dir: Path, data: Path, corpus: Path, out: Path, *extra: str) -> Any:
    return CliRunner().invoke(app, [
        "calibrate", "--data", str(data), "--corpus", str(corpus), "--out", str(out),
        "--k", "1", "--model", str(tiny_dir), "--gates", "answer-logprob,first-token-prob",
        "--max-new-tokens", "4", "--max-loss", "0.3", *extra])


def test_bare_questions_need_no_labels_flag_and_are_refused_before_the_model(
        tmp_path: Path) -> None:
    data, corpus = _bare(tmp_path)
    broken = tmp_path / "model"  # would fail to load: every refusal here comes before it
    broken.mkdir()
    (broken / "model.safetensors").write_bytes(b"not weights")
    result = _run(broken, data, corpus, tmp_path / "g.json")
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert f"{data}:1" in said and "--no-labels" in said
    loose = _run(broken, data, corpus, tmp_path / "g.json",
                 "--same-answer", "f1:0.8")
    assert loose.exit_code == 2 and "with --no-labels" in " ".join(loose.output.split())


def test_calibrate_no_labels_writes_a_spec_both_frameworks_load(tiny_dir: Path,
                                                                 tmp_path: Path) -> None:
    from rag_gates.calibration import load_gate, read_records
    from rag_gates.lm import load_lm

    data, corpus = _bare(tmp_path, labelled=10)
    out = tmp_path / "gate.json"
    result = _run(tiny_dir, data, corpus, out, "--no-labels")
    assert result.exit_code == 0, result.output
    records = read_records(tmp_path / "gate-work" / "records.jsonl")
    assert sum(r.labels == "agreement" for r in records) == 30
    for r in records:
        assert r.retrieved_answer is not None and r.closed_book_answer is not None
        if r.labels == "agreement":
            agree = parse_same_answer("exact")(r.closed_book_answer, r.retrieved_answer)
            assert r.closed_book_correct == agree and r.retrieved_correct
    spec = GateSpec.load(out)
    assert spec.labels == "mixed" and spec.judge == "exact"
    assert "30 of 40 questions had no gold answers" in " ".join(result.output.split())
    gate = load_gate(out, lm=load_lm(str(tiny_dir)))
    assert gate.decide("Who wrote Hamlet?").evidence["spec"]["labels"] == "mixed"
    _both_frameworks_carry_the_labels(gate)
    # The judge is part of the work directory's identity: its records are another judge's.
    other = _run(tiny_dir, data, corpus, out, "--no-labels", "--same-answer", "f1:0.8")
    assert other.exit_code == 2 and "--same-answer judge" in " ".join(other.output.split())


def _both_frameworks_carry_the_labels(gate: Any) -> None:
    """A label-free spec's gate in LangChain's and LlamaIndex's GatedRetriever: each
    decision they record names how the spec was certified."""
    pytest.importorskip("langchain_rag_gates")
    pytest.importorskip("llama_index.retrievers.rag_gates")
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
    from llama_index.core.retrievers import BaseRetriever as LIBaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from llama_index.retrievers.rag_gates import GatedRetriever

    import langchain_rag_gates

    class Shelf(BaseRetriever):
        def _get_relevant_documents(self, query: str, *, run_manager: Any) -> list[Document]:
            return [Document(page_content="Hamlet is a play by Shakespeare.")]

    class LIShelf(LIBaseRetriever):
        def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
            return [NodeWithScore(node=TextNode(text="Hamlet is a play."), score=1.0)]

    question = "Who wrote Hamlet?"
    lc = langchain_rag_gates.GatedRetriever(retriever=Shelf(), gate=gate)
    lc.invoke(question)
    li = GatedRetriever(LIShelf(), gate=gate)
    li.retrieve(question)
    for decision in (lc.last_decision, li.last_decision):
        assert decision is not None
        assert decision.evidence["spec"]["labels"] == "mixed"
        assert decision.evidence["spec"]["judge"] == "exact"
