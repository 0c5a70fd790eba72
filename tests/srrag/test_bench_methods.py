"""srrag@TAU, srrag-no-knn@TAU, genread, skr and the SR-RAG gates in the bench registries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rag_gates.methods import MethodContext, available_methods, check_method_name, make_method
from rag_gates.registry import make_gate
from rag_gates.srrag import EmbeddingKeys, HiddenStateKeys, PolicyEntry, SourcePolicy

ENTRIES = [
    PolicyEntry(id="1", question="Who wrote Hamlet in London?", source="parametric"),
    PolicyEntry(id="2", question="What is the capital of France?", source="retrieval"),
    PolicyEntry(id="3", question="Where does the quick brown fox jump?", source="retrieval"),
]


@pytest.mark.parametrize("name", ["srrag@2", "srrag@x", "srrag-no-knn@-0.1", "genread@1",
                                  "skr@1", "srrag-knn-only@1.5"])
def test_bad_options_are_refused_before_any_model(name: str) -> None:
    with pytest.raises(ValueError, match=name.split("@")[0]):
        check_method_name(name, available_methods())


@pytest.fixture(scope="module")
def roomy() -> Any:
    """The tiny model with room for the 150-token verbalization after the prompt."""
    from rag_gates.testing import tiny_lm

    return tiny_lm(seed=0, max_context=1024)


def test_methods_route_verbalize_and_say_what_is_missing(
        roomy: Any, bm25: Any, popqa: list[Any], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = roomy
    ctx = MethodContext(lm=tiny, retriever=bm25, dataset="popqa", k=2, max_new_tokens=4)
    monkeypatch.setenv("RAG_GATES_SRRAG_POLICY", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="rag-gates srrag build-policy"):
        make_method("srrag", ctx)
    store = tmp_path / "policy"
    policy = SourcePolicy.open(HiddenStateKeys(tiny), path=store)
    policy.add_questions(ENTRIES)
    policy.close()
    monkeypatch.setenv("RAG_GATES_SRRAG_POLICY", str(store))
    q = popqa[0].question
    always = make_method("srrag@0", ctx)
    never = make_method("srrag@1", ctx)  # a product of probabilities below 1 never reaches 1
    assert always.name == "srrag@0" and always.answer(q).trace.retrievals == 1
    skipped = never.answer(q)
    assert skipped.trace.retrievals == 0 and skipped.decisions[0].gate == "srrag"
    assert skipped.passages[0].metadata["source"] == "parametric"
    knn_only = make_method("srrag-knn-only", ctx)
    assert knn_only.gate.threshold == 0.5  # the neighbours' majority
    assert make_method("srrag-knn-only@0", ctx).answer(q).trace.retrievals == 1
    no_knn = make_method("srrag-no-knn@0.5", ctx).answer(q)
    assert no_knn.decisions[0].gate == "srrag-no-knn"
    assert "p_datastore" not in no_knn.decisions[0].evidence
    genread = make_method("genread", ctx.model_copy(update={"retriever": None})).answer(q)
    assert genread.decisions == [] and genread.passages[0].metadata["source"] == "parametric"
    # The run's methods share one greedy verbalization of a question; its time is kept.
    assert genread.passages[0].text == skipped.passages[0].text
    (verbalized,) = [e for e in genread.trace.events if e.name == "verbalize"]
    assert verbalized.data["reused"] is True and genread.trace.reused_ms > 0
    assert verbalized.tokens == skipped.passages[0].metadata["tokens"]
    assert genread.trace.reused_ms == skipped.passages[0].metadata["verbalize_ms"]
    gate = make_gate("srrag:0.2", ctx)
    assert gate.threshold == 0.2 and gate.name == "srrag"
    assert make_gate("srrag-knn-only", ctx).decide(q).evidence["found"] == 3


def test_skr_over_minilm_embeddings(roomy: Any, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # The embedded MiniLM: neighbours by meaning, not by a random model's states.
    policy = SourcePolicy.open(EmbeddingKeys(), path=tmp_path / "skr", k=2)
    policy.add_questions(ENTRIES)
    vote = policy.vote_question("Which city is France's capital?")
    assert vote.neighbours[0].id == "2"
    policy.close()
    monkeypatch.setenv("RAG_GATES_SRRAG_SKR_POLICY", str(tmp_path / "skr"))
    from rag_gates.retrieval.bm25 import BM25Retriever
    from rag_gates.types import Passage

    short = BM25Retriever.from_passages([
        Passage(id="p1", title="France", text="The capital of France is Paris."),
        Passage(id="p2", text="William Shakespeare wrote Hamlet in London.")])
    ctx = MethodContext(lm=roomy, retriever=short, k=1, max_new_tokens=3)
    skr = make_method("skr", ctx)
    result = skr.answer("Which city is France's capital?")
    (decision,) = result.decisions
    assert skr.name == "skr" and decision.gate == "skr"
    assert decision.evidence["neighbours"][0]["id"] == "2"  # type: ignore[index]
    assert result.trace.retrievals == int(decision.retrieve)


def test_bench_wall_time_counts_a_shared_verbalization_for_each_method(
        roomy: Any, bm25: Any, popqa: list[Any], tmp_path: Path) -> None:
    from rag_gates_lab.datasets import DatasetLoad
    from rag_gates_lab.runner import BenchConfig, read_records, run_bench

    data = DatasetLoad(name="popqa", path=str(tmp_path / "rows.jsonl"), examples=popqa[:2])
    run_bench(BenchConfig(dataset="popqa", methods=["genread", "srrag-no-knn@1"], n=2,
                          max_new_tokens=3),
              tmp_path / "run", lm=roomy, retriever=bm25, data=data)
    records = {(r.id, r.method): r for r in read_records(tmp_path / "run")}
    for example in popqa[:2]:
        first, second = records[(example.id, "genread")], records[(example.id, "srrag-no-knn@1")]
        (event,) = [e for e in second.trace["events"] if e["name"] == "verbalize"]
        assert event["data"]["reused"] is True
        assert second.wall_s >= event["data"]["reused_ms"] / 1000.0
        assert first.prediction == second.prediction  # same document, same answer prompt
