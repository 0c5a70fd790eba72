"""``rag-gates srrag ...`` on a saved tiny model and the PopQA slice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rag_gates.testing import save_tiny_lm
from rag_gates_lab.commands.srrag import srrag_app

SLICE = Path(__file__).resolve().parents[2] / "examples" / "data"
runner = CliRunner()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_lm(tmp_path_factory.mktemp("tiny"))


def label_args(model: Path, out: Path, *extra: str) -> list[str]:
    return ["label", "--model", str(model), "--dataset", "popqa", "--data",
            str(SLICE / "popqa_dev_sample.jsonl"), "--n", "3", "--offset", "0",
            "--n-retrieved", "2", "--n-verbalized", "2", "--max-verbalize-tokens", "3",
            "--out", str(out), *extra]


def test_label_writes_and_resumes(model: Path, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path / "home"))
    out = tmp_path / "labels.jsonl"
    result = runner.invoke(srrag_app, label_args(model, out))
    assert result.exit_code == 0, result.output
    assert "popqa: 3 questions, retrieval preferred" in result.output
    lines = out.read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[0])["header"]["n_retrieved"] == 2
    again = runner.invoke(srrag_app, label_args(model, out))
    assert again.exit_code == 0 and out.read_text().splitlines() == lines
    changed = runner.invoke(srrag_app, label_args(model, out, "--seed", "5"))
    assert changed.exit_code == 1 and "other settings" in changed.output
    bad = runner.invoke(srrag_app, label_args(model, tmp_path / "x.jsonl", "--rule", "max"))
    assert bad.exit_code == 1 and "rule" in bad.output


def test_build_policy_from_labels(model: Path, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from rag_gates.lm.hf import HFWhiteBoxLM
    from rag_gates.srrag.labels import read_labels
    from rag_gates.srrag.policy import HiddenStateKeys, SourcePolicy

    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path / "home"))
    labels = tmp_path / "labels.jsonl"
    assert runner.invoke(srrag_app, label_args(model, labels)).exit_code == 0
    store = tmp_path / "policy"
    build = ["build-policy", "--labels", str(labels), "--model", str(model), "--path",
             str(store)]
    result = runner.invoke(srrag_app, [*build, "--layer", "2"])
    assert result.exit_code == 0, result.output
    assert "3 questions" in result.output
    lm = HFWhiteBoxLM.from_pretrained(model, model_id=str(model))
    policy = SourcePolicy.open(HiddenStateKeys(lm, layer=2), path=store, create=False)
    _, rows = read_labels(labels)
    assert {(e.id, e.source) for e in policy.entries()} == {(r.id, r.source) for r in rows}
    vote = policy.vote_question(rows[0].question)
    assert vote.neighbours[0].id == rows[0].id and vote.found == 3
    policy.close()
    other = runner.invoke(srrag_app, [*build, "--layer", "3"])
    assert other.exit_code == 1 and "layer: datastore 2, now 3" in other.output
    replaced = runner.invoke(srrag_app, [*build, "--layer", "3", "--replace"])
    assert replaced.exit_code == 0, replaced.output
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text(labels.read_text().replace(str(model), "someone-else"))
    refused = runner.invoke(srrag_app, ["build-policy", "--labels", str(foreign), "--model",
                                        str(model), "--path", str(tmp_path / "p2")])
    assert refused.exit_code == 1 and "preferences of 'someone-else'" in refused.output


def test_routing_auroc_scores_gates_against_the_labels(model: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from rag_gates.srrag.labels import read_labels

    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path / "home"))
    labels = tmp_path / "labels.jsonl"
    assert runner.invoke(srrag_app, label_args(model, labels)).exit_code == 0
    store = tmp_path / "policy"
    assert runner.invoke(srrag_app, ["build-policy", "--labels", str(labels), "--model",
                                     str(model), "--path", str(store)]).exit_code == 0
    _, rows = read_labels(labels)
    monkeypatch.setenv("RAG_GATES_SRRAG_POLICY", str(store))
    scored = runner.invoke(srrag_app, [
        "routing-auroc", "--labels", str(labels), "--model", str(model), "--gate",
        "srrag-no-knn", "--gate", "srrag-knn-only", "--out", str(tmp_path / "auroc.json")])
    assert scored.exit_code == 0, scored.output
    report = json.loads((tmp_path / "auroc.json").read_text())
    assert report["questions"] == 3 and set(report["gates"]) == {"srrag-no-knn",
                                                                "srrag-knn-only"}
    assert report["retrieval_better_share"] == sum(r.source == "retrieval" for r in rows) / 3
    assert "AUROC" in scored.output
    knn = report["gates"]["srrag-knn-only"]
    assert report["ids"] == [[r.dataset, r.id] for r in rows] and len(knn["scores"]) == 3
    assert knn["by_dataset"].keys() == {r.dataset for r in rows}
    assert sum(d["questions"] for d in knn["by_dataset"].values()) == 3


def test_label_finds_a_testbed_split_corpus(model: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Testbed questions all say ``dataset="testbed"``; the corpus is found by the name given
    (``testbed-probe:DIR``), so the labels retrieve from the testbed's own passages."""
    from rag_gates.srrag.labels import read_labels
    from rag_gates_lab.datasets import load_dataset
    from rag_gates_lab.testbed.build import TestbedConfig, write_plan

    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path / "home"))
    planned = tmp_path / "testbed"
    write_plan(TestbedConfig(base_model=str(model), n_facts=40, ladder=[0, 2],
                             general_paragraphs=4, reading_examples=0), planned)
    out = tmp_path / "labels.jsonl"
    result = runner.invoke(srrag_app, [
        "label", "--model", str(model), "--dataset", f"testbed-probe:{planned}",
        "--dataset", f"testbed-calibration:{planned}", "--n", "2", "--offset", "0",
        "--n-retrieved", "2", "--n-verbalized", "1", "--max-verbalize-tokens", "3",
        "--out", str(out)])
    assert result.exit_code == 0, result.output
    _, rows = read_labels(out)
    probe = load_dataset(f"testbed-probe:{planned}", n=2).examples
    calibration = load_dataset(f"testbed-calibration:{planned}", n=2).examples
    assert [r.id for r in rows] == [e.id for e in [*probe, *calibration]]
    corpus = {json.loads(line)["id"] for line in (planned / "passages.jsonl").open()}
    for row in rows:  # BM25 returns at most --n-retrieved (fewer when few terms match)
        retrieved = [c.passage_id for c in row.contexts if c.source == "retrieval"]
        assert 1 <= len(retrieved) <= 2 and set(retrieved) <= corpus
