"""SelfRoutingGate, SKRGate and SRRAGPipeline on a tiny random-weight model (plumbing)."""

from __future__ import annotations

from typing import Any

import pytest

from rag_gates.lm.base import BaseTextLM
from rag_gates.prompts import qa_prompt
from rag_gates.srrag import (
    HiddenStateKeys,
    PolicyEntry,
    RoutingPrompt,
    SelfRoutingGate,
    SKRGate,
    SourcePolicy,
    SRRAGPipeline,
    Verbalizer,
    route_features,
)
from rag_gates.testing import tiny_lm
from rag_gates.types import Generation

Q = "Who wrote Hamlet?"
ENTRIES = [
    PolicyEntry(id="1", question="Who wrote Hamlet in London?", source="parametric"),
    PolicyEntry(id="2", question="What is the capital of France?", source="retrieval"),
    PolicyEntry(id="3", question="Where does the quick brown fox jump?", source="retrieval"),
    PolicyEntry(id="4", question="Do scientists measure recall?", source="parametric"),
    PolicyEntry(id="5", question="Which numbers appear in documents?", source="retrieval"),
]


@pytest.fixture()
def policy(tiny: Any) -> Any:
    p = SourcePolicy.open(HiddenStateKeys(tiny, layer=2), path=":memory:")
    p.add_questions(ENTRIES)
    yield p
    p.close()


def test_product_gate_multiplies_the_two_factors(tiny: Any, policy: Any) -> None:
    gate = SelfRoutingGate(tiny, policy, tau=0.0)
    d = gate.decide(Q)
    f = route_features(tiny, Q, RoutingPrompt(), 2)
    vote = policy.vote_question(Q)
    assert d.gate == "srrag" and d.retrieve  # tau 0: any product retrieves
    assert d.evidence["p_model"] == pytest.approx(f.p_model)
    assert d.evidence["p_datastore"] == vote.p_retrieve == 3 / 5
    assert d.score == pytest.approx(f.p_model * 3 / 5)
    assert d.evidence["one_pass"] is True and d.evidence["found"] == 5
    assert "fewer than k=30" in str(d.evidence["datastore_note"])
    assert [n["id"] for n in d.evidence["neighbours"]] == [n.id for n in vote.neighbours]
    assert "p_M" in d.reason and "3/5 neighbours prefer retrieval" in d.reason
    high = SelfRoutingGate(tiny, policy, tau=d.score + 1e-6).decide(Q)
    assert not high.retrieve and "verbalize" in high.reason


def test_a_threshold_in_the_policys_place_is_refused(tiny: Any) -> None:
    with pytest.raises(TypeError, match=r"policy must be a SourcePolicy .* tau="):
        SelfRoutingGate(tiny, 0.5)  # type: ignore[arg-type]


def test_single_factor_modes(tiny: Any, policy: Any) -> None:
    f = route_features(tiny, Q, RoutingPrompt(), 2)
    no_knn = SelfRoutingGate(tiny, tau=0.5, mode="model", layer=2)
    d = no_knn.decide(Q)
    assert d.gate == "srrag-no-knn" and d.score == pytest.approx(f.p_model)
    assert "p_datastore" not in d.evidence
    only = SelfRoutingGate(tiny, policy, tau=0.5, mode="policy").decide(Q)
    assert only.gate == "srrag-knn-only" and only.score == pytest.approx(0.6)
    # The vote alone: no routing distribution read, the same neighbours as the full pass.
    assert "p_model" not in only.evidence and "p_M" not in only.reason
    product = SelfRoutingGate(tiny, policy, tau=0.5).decide(Q)
    assert only.evidence["neighbours"] == product.evidence["neighbours"]
    with pytest.raises(ValueError, match="needs the kNN policy"):
        SelfRoutingGate(tiny, tau=0.5)
    with pytest.raises(ValueError, match="mode"):
        SelfRoutingGate(tiny, policy, mode="both")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keyed by 'tiny-llama-seed0'"):
        SelfRoutingGate(tiny_lm(seed=1), policy)


def test_fails_closed_on_an_empty_or_broken_datastore(tiny: Any) -> None:
    empty = SourcePolicy.open(HiddenStateKeys(tiny, layer=2), path=":memory:")
    d = SelfRoutingGate(tiny, empty, tau=0.9).decide(Q)
    assert d.retrieve and "datastore is empty" in d.reason
    empty.client.delete_collection(empty.collection)  # the collection vanished under us
    empty.refresh()  # (an edit by other means than this SourcePolicy: re-read)
    broken = SelfRoutingGate(tiny, empty, tau=0.9).decide(Q)
    assert broken.retrieve and "lookup failed" in broken.reason
    assert "srrag-policy" in str(broken.evidence["lookup_error"])
    empty.close()


def test_skr_corrects_votes_by_the_label_prior(tiny: Any, policy: Any) -> None:
    gate = SKRGate(policy, k=3)
    assert gate.prior == (3, 2)
    d = gate.decide(Q)
    vote = policy.vote_question(Q, 3)
    r, p = vote.retrieval / 3, vote.parametric / 2
    assert d.score == pytest.approx(r / (r + p))
    assert d.retrieve is (d.score >= 0.5)
    assert d.evidence["votes_retrieval"] == vote.retrieval


def test_pipeline_retrieves_or_verbalizes(tiny: Any, policy: Any, bm25: Any,
                                          popqa: list[Any]) -> None:
    q = popqa[0].question
    ret = SRRAGPipeline(tiny, bm25, SelfRoutingGate(tiny, policy, tau=0.0), k=2,
                        max_new_tokens=4).answer(q)
    passages = bm25.retrieve(q, 2)
    assert ret.trace.retrievals == 1 and ret.passages == passages
    assert ret.answer == tiny.generate(qa_prompt(q, passages), max_new_tokens=4).text
    verbalizer = Verbalizer(tiny, max_new_tokens=5)
    skip = SRRAGPipeline(tiny, bm25, SelfRoutingGate(tiny, policy, tau=1.0), k=2,
                         max_new_tokens=4, verbalizer=verbalizer).answer(q)
    assert skip.trace.retrievals == 0 and skip.decisions[0].retrieve is False
    (doc,) = skip.passages
    assert doc.metadata["source"] == "parametric" and doc == verbalizer.verbalize(q)
    assert [e.name for e in skip.trace.events] == ["srrag", "verbalize", "answer"]
    assert skip.answer == tiny.generate(qa_prompt(q, [doc]), max_new_tokens=4).text


async def test_genread_always_verbalizes(tiny: Any) -> None:
    pipe = SRRAGPipeline(tiny, None, None, max_new_tokens=3,
                         verbalizer=Verbalizer(tiny, max_new_tokens=4), name="genread")
    result = await pipe.aanswer(Q)
    assert result.decisions == [] and result.trace.retrievals == 0
    assert result.passages[0].metadata["source"] == "parametric"
    assert result.trace.events[0].data["hit_token_cap"] == \
        result.passages[0].metadata["hit_token_cap"]
    with pytest.raises(TypeError, match="Retriever"):
        SRRAGPipeline(tiny, None, SelfRoutingGate(tiny, mode="model", layer=2))


@pytest.mark.parametrize("tau", [0.5, 0.9])
@pytest.mark.parametrize("mode", ["policy", "product"])
def test_a_non_finite_hidden_state_fails_closed(mode: str, tau: float) -> None:
    """Issue 32, item 2: one NaN in a layer-0 weight made every key NaN, and the kNN-only
    gate voted 2/5 from NaN similarities: no retrieval at tau 0.5 and 0.9."""
    import torch

    lm = tiny_lm(seed=0)  # its own copy: the weights are damaged below
    policy = SourcePolicy.open(HiddenStateKeys(lm, layer=2), path=":memory:", k=5)
    policy.add_questions([e.model_copy(update={"source": s}) for e, s in zip(
        ENTRIES, ["parametric", "parametric", "retrieval", "parametric", "retrieval"],
        strict=True)])
    with torch.no_grad():
        lm.model.model.layers[0].self_attn.q_proj.weight[0, 0] = float("nan")
    d = SelfRoutingGate(lm, policy, tau=tau, mode=mode).decide(Q)  # type: ignore[arg-type]
    assert d.retrieve and "could not decide" in d.reason
    if mode == "policy":
        assert "not finite" in str(d.evidence["undecided"])
        assert "vote_error" in d.evidence
    policy.close()


class SaysNothing(BaseTextLM):
    """A model whose reply is blank, as a served model's is when a stop sequence comes
    first: the verbalization has nothing in it."""

    model_id = "says-nothing"

    def generate(self, prompt: Any, **kwargs: Any) -> Generation:
        return Generation(text=" \n", finish_reason="stop")


def test_an_empty_verbalization_retrieves_instead(tiny: Any, bm25: Any,
                                                  popqa: list[Any]) -> None:
    """Review s12 #7: routed to the model, a blank verbalization went through as the whole
    context. Now the pipeline retrieves and the trace says why."""
    q = popqa[0].question
    gate = SelfRoutingGate(tiny, mode="model", tau=1.0, layer=2)  # p_M < 1: verbalize
    verbalizer = Verbalizer(SaysNothing(), max_new_tokens=5, reuse=4)
    result = SRRAGPipeline(tiny, bm25, gate, k=2, max_new_tokens=4,
                           verbalizer=verbalizer).answer(q)
    assert result.passages == bm25.retrieve(q, 2) and result.trace.retrievals == 1
    first, overturned = result.decisions
    assert first.retrieve is False and overturned.retrieve is True
    assert overturned.evidence == {**first.evidence, "verbalization": "empty"}
    assert overturned.reason.startswith(first.reason) and "verbalization was empty" in \
        overturned.reason
    assert [e.name for e in result.trace.events] == [
        "srrag-no-knn", "verbalize", "srrag-no-knn", "bm25", "answer"]
    again = verbalizer.verbalize(q)  # generated again: an empty one is not kept for reuse
    assert again.text == "" and "reused" not in again.metadata
    genread = SRRAGPipeline(tiny, None, None, verbalizer=verbalizer).answer(q)
    assert genread.passages[0].text == "" and genread.trace.retrievals == 0  # no retriever
