"""CBDR core on the tiny random-weight model: probe persistence and training, the gate's
single-prefill skip path, the confidence-gain reranker and the pipeline.

Quality claims (AUROC, ranking) are measured on the embedded model in benchmarks/; here each
test checks behaviour that a wrong implementation would break."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from rag_gates.cbdr import (
    CBDRGate,
    CBDRPipeline,
    ConfidenceGainReranker,
    ConfidenceProbe,
    ProbeConfig,
    ProbePrompts,
    train_probe,
)
from rag_gates.errors import ProbeMismatchError, WhiteBoxRequiredError
from rag_gates.methods import MethodContext, make_method
from rag_gates.retrieval.bm25 import BM25Retriever
from rag_gates.testing import tiny_lm
from rag_gates.types import Generation, Passage
from rag_gates_lab.datasets import load_dataset

SLICE = Path(__file__).resolve().parents[2] / "examples" / "data"


def make_probe(lm: Any, seed: int = 0, layer: int = 2) -> ConfidenceProbe:
    torch.manual_seed(seed)
    return ConfidenceProbe(ProbeConfig(model_id=lm.model_id, hidden_size=lm.hidden_size,
                                       num_layers=lm.num_layers, layer=layer,
                                       prompts=ProbePrompts(style="rag-gates")))


@pytest.fixture(scope="module")
def probe(tiny: Any) -> ConfidenceProbe:
    return make_probe(tiny)


@pytest.fixture(scope="module")
def passages() -> list[Passage]:
    rows = load_dataset("hotpotqa", SLICE / "hotpotqa_dev_sample.jsonl", n=3).examples
    # Short texts: the tiny model's byte-level tokens fill its 256-token context quickly.
    return [p.model_copy(update={"text": p.text[:60]}) for row in rows
            for p in row.context][:12]


class TextOnly:
    model_id = "api-model"
    supports_logprobs = False

    def generate(self, prompt: Any, **kwargs: Any) -> Generation:
        return Generation(text="x", finish_reason="stop")


# ---------------------------------------------------------------------- probe
def test_probe_round_trips_and_refuses_another_model(tmp_path: Path, tiny: Any,
                                                     probe: ConfidenceProbe) -> None:
    questions = ["Who wrote Hamlet?", "What is the capital of Peru?"]
    before = probe.confidence(tiny, questions)
    probe.save(tmp_path / "p")
    loaded = ConfidenceProbe.load(tmp_path / "p", lm=tiny)
    assert loaded.confidence(tiny, questions) == pytest.approx(before, abs=1e-6)
    assert json.loads((tmp_path / "p" / "probe.json").read_text())["model_id"] == tiny.model_id
    with pytest.raises(ProbeMismatchError, match="trained on model 'tiny-llama-seed0'"):
        ConfidenceProbe.load(tmp_path / "p", lm=tiny_lm(seed=1))
    bigger = tiny_lm(seed=0, hidden_size=32)
    with pytest.raises(ProbeMismatchError, match="hidden size"):
        loaded.check_compatible(bigger)


def test_probe_load_errors_say_what_is_wrong(tmp_path: Path, probe: ConfidenceProbe) -> None:
    with pytest.raises(FileNotFoundError, match="train-probe"):
        ConfidenceProbe.load(tmp_path / "missing")
    probe.save(tmp_path / "p")
    (tmp_path / "p" / "probe.json").write_text('{"model_id": 3}')
    with pytest.raises(ValueError, match="not a valid probe config"):
        ConfidenceProbe.load(tmp_path / "p")


def test_training_learns_a_real_signal_and_keeps_the_best_dev_epoch(tiny: Any) -> None:
    # Label: the question comes from PopQA (1) or HotpotQA (0). The tiny model's hidden
    # states separate the two styles of question, so a working probe must find it.
    pop = load_dataset("popqa", SLICE / "popqa_dev_sample.jsonl", n=40).examples
    hot = load_dataset("hotpotqa", SLICE / "hotpotqa_dev_sample.jsonl", n=40).examples
    probe = make_probe(tiny)
    prompts = [probe.prompts.qa(e.question) for e in pop + hot]
    x = probe.features(tiny, prompts)
    y = [1] * len(pop) + [0] * len(hot)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0)).tolist()
    train, dev = order[: len(order) * 3 // 4], order[len(order) * 3 // 4:]
    trained, report = train_probe(probe.config, x[train], [y[i] for i in train], x[dev],
                                  [y[i] for i in dev], epochs=40, lr=1e-3)
    assert report.best_dev_auroc > 0.8
    assert report.best_dev_auroc == max(report.dev_auroc)
    assert trained.config.metrics["dev_auroc"] == report.best_dev_auroc
    with pytest.raises(ValueError, match="both classes"):
        train_probe(probe.config, x[train], [0] * len(train), x[dev], [y[i] for i in dev])


# ---------------------------------------------------------------------- gate
def test_gate_refuses_text_only_models_and_bad_beta(tiny: Any, probe: ConfidenceProbe) -> None:
    with pytest.raises(WhiteBoxRequiredError,
                       match=r"does not offer.*white-box model"):
        CBDRGate(TextOnly(), probe)
    with pytest.raises(ValueError, match=r"beta is a confidence in \[0, 1\]"):
        CBDRGate(tiny, probe, beta=1.5)
    with pytest.raises(ProbeMismatchError):
        CBDRGate(tiny_lm(seed=1), probe)


def test_skip_path_continues_from_the_probe_pass(tiny: Any, probe: ConfidenceProbe) -> None:
    q = "Who wrote Hamlet?"
    conf = probe.confidence(tiny, [q])[0]
    gate = CBDRGate(tiny, probe, beta=conf - 1e-3)  # conf > beta: skip
    probed = gate.prefill(q, max_new_tokens=12)
    assert probed.decision.retrieve is False
    assert probed.confidence == pytest.approx(conf, abs=1e-5)
    assert probed.decision.evidence["confidence"] == pytest.approx(conf, abs=1e-5)
    assert "> beta" in probed.decision.reason
    # Same tokens as a fresh generation of the QA prompt: the reused cache is the prompt's.
    fresh = tiny.generate(probe.prompts.qa(q), max_new_tokens=12)
    g = probed.generate(max_new_tokens=12)
    assert g.text == fresh.text and g.completion_tokens == fresh.completion_tokens
    with pytest.raises(RuntimeError, match="already generated"):
        probed.generate(max_new_tokens=2)
    assert CBDRGate(tiny, probe, beta=conf + 1e-3).prefill(q).decision.retrieve is True


def test_decide_batch_matches_single_decisions(tiny: Any, probe: ConfidenceProbe) -> None:
    qs = ["Who wrote Hamlet?", "Where is the Eiffel Tower located?", "Who was Ed Wood?"]
    confs = probe.confidence(tiny, qs)
    low, mid = sorted(confs)[:2]
    beta = (low + mid) / 2  # away from any confidence: padding changes the last digits
    gate = CBDRGate(tiny, probe, beta=beta)
    batch = gate.decide_batch(qs)
    single = [gate.decide(q) for q in qs]
    assert [d.retrieve for d in batch] == [d.retrieve for d in single]
    assert [d.score for d in batch] == pytest.approx([d.score for d in single], abs=1e-5)
    assert [d.retrieve for d in batch] == [c <= beta for c in confs]


# ---------------------------------------------------------------------- reranker
def test_reranker_scores_are_confidence_gains_best_first(
        tiny: Any, probe: ConfidenceProbe, passages: list[Passage]) -> None:
    q = "Which magazine came first?"
    reranker = ConfidenceGainReranker(tiny, probe)
    result = reranker.rerank(q, passages, top_n=4)
    feats = probe.features(tiny, [probe.prompts.qa(q)] + [probe.prompts.rag(q, [p])
                                                          for p in passages])
    confs = probe.confidence_from_hidden(feats).tolist()
    gains = [c - confs[0] for c in confs[1:]]
    assert len(result.ranked) == 4 and result.candidates == len(passages)
    assert [s.index for s in result.ranked] == sorted(range(len(gains)),
                                                      key=lambda i: -gains[i])[:4]
    assert [s.score for s in result.ranked] == pytest.approx(
        sorted(gains, reverse=True)[:4], abs=1e-5)
    assert result.evidence["question_confidence"] == pytest.approx(confs[0], abs=1e-5)
    # Reusing the gate's Conf(q) gives the same gains without the question's pass.
    reused = reranker.rerank(q, passages, top_n=4, question_confidence=confs[0])
    assert [s.index for s in reused.ranked] == [s.index for s in result.ranked]
    assert passages[result.ranked[0].index] == result.ranked[0].passage  # input unchanged


def test_reranker_edge_cases(tiny: Any, probe: ConfidenceProbe) -> None:
    long = Passage(title="Long", text="word " * 400)  # longer than the 256-token context
    short = Passage(title="Short", text="Hamlet is a tragedy by Shakespeare.")
    cap = len(tiny.tokenizer(short.text, add_special_tokens=False)["input_ids"]) + 2
    reranker = ConfidenceGainReranker(tiny, probe, max_passage_tokens=cap)
    assert reranker.rerank("Who wrote Hamlet?", []).ranked == []
    result = reranker.rerank("Who wrote Hamlet?", [long, short])
    assert result.evidence["truncated"] == 1
    by_title = {s.passage.title: s.evidence for s in result.ranked}
    assert by_title["Long"]["truncated_tokens"] == len(
        tiny.tokenizer(long.text, add_special_tokens=False)["input_ids"]) - cap
    assert by_title["Short"]["truncated_tokens"] == 0
    # Without the per-passage cap the context window still applies: cut to fit, no error.
    wide = ConfidenceGainReranker(tiny, probe, max_passage_tokens=10_000)
    assert wide.rerank("Who wrote Hamlet?", [long]).evidence["truncated"] == 1
    with pytest.raises(ValueError, match="top_n"):
        reranker.rerank("q", [short], top_n=0)
    with pytest.raises(WhiteBoxRequiredError):
        ConfidenceGainReranker(TextOnly(), probe)


# ---------------------------------------------------------------------- pipeline
def test_pipeline_paths_and_trace(tiny: Any, probe: ConfidenceProbe,
                                  passages: list[Passage]) -> None:
    bm25 = BM25Retriever.from_passages(passages)
    q = "Who directed the film Ed Wood?"
    never = CBDRPipeline(tiny, bm25, probe, beta=0.0, candidates=5, k=2, max_new_tokens=8)
    skipped = never.answer(q)
    assert [e.kind for e in skipped.trace.events] == ["decision", "llm_call"]
    assert skipped.answer == tiny.generate(probe.prompts.qa(q), max_new_tokens=8).text
    always = CBDRPipeline(tiny, bm25, probe, beta=1.0, candidates=5, k=2, max_new_tokens=8)
    result = always.answer(q)
    assert [e.kind for e in result.trace.events] == ["decision", "retrieval", "llm_call",
                                                     "llm_call"]
    assert result.trace.retrievals == 1 and len(result.passages) == 2
    rerank = result.trace.events[2].data
    assert rerank["candidates"] == 5 and len(rerank["kept_ids"]) == 2
    assert result.answer == tiny.generate(probe.prompts.rag(q, result.passages),
                                          max_new_tokens=8).text
    with pytest.raises(ValueError, match="cannot come from"):
        CBDRPipeline(tiny, bm25, probe, candidates=2, k=3)


def test_bench_method_names_take_beta(tiny: Any, probe: ConfidenceProbe, tmp_path: Path,
                                      passages: list[Passage],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    probe.save(tmp_path / "p")
    monkeypatch.setenv("RAG_GATES_CBDR_PROBE", str(tmp_path / "p"))
    ctx = MethodContext(lm=tiny, retriever=BM25Retriever.from_passages(passages))
    method = make_method("cbdr@0.25", ctx)
    assert method.name == "cbdr@0.25" and method.gate.beta == 0.25  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"beta, a number in \[0, 1\]"):
        make_method("cbdr@2", ctx)
    with pytest.raises(ValueError, match="takes no @option"):
        make_method("single@3", ctx)
    with pytest.raises(ValueError, match="valid names"):
        make_method("cbdrx@0.5", ctx)
    monkeypatch.delenv("RAG_GATES_CBDR_RERANKER", raising=False)
    with pytest.raises(ValueError, match="set RAG_GATES_CBDR_RERANKER"):
        make_method("cbdr-ce@0.5", ctx)
