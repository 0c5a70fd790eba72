"""Tok-RAG as the paper and the authors' code compute it (docs/fidelity.md, Tok-RAG section).

Each reference below is re-derived here from the paper's equations (Eq. 14-16 and the
expected-embedding score) or from reading the authors' ``get_predict_emb_contrastive`` /
primary-experiment loop, on real tensors of the embedded SmolLM2 from one independent
transformers forward pass (eager attention, ``output_attentions`` / ``output_hidden_states``,
no KV cache, no stream group), and compared with our decoder at the same step.

Tolerances: scores and cosines agree to 2e-4 absolute (float32; the decoder reads
attention recomputed from cached keys after SDPA, the reference eager attention; their
difference on these inputs is ~1e-6); layers and token ids exactly.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from rag_gates.types import Passage

pytestmark = pytest.mark.integration  # all but the tiny-model test read SmolLM2

Q = "Who directed the 2019 film Grublings?"
PASSAGES = [Passage(title="Grublings", text="Grublings is a 2019 Norwegian comedy film "
                    "directed by Marta Kellerud."),
            Passage(title="Kellerud", text="Marta Kellerud (born 1971) is a Norwegian "
                    "director and screenwriter from Bergen.")]
TOL = 2e-4
# The authors' skip_words (Tok-RAG_for_ODQA.py), compared on each token's text stripped of
# its leading space (their LLaMA tokens carry it as "▁").
AUTHORS_SKIP = {"1", "2", "3", "4", "5", "6", "7", "8", "9", "0", ".", "<s>", "'", " ", ")",
                "-", "]:", "]", "}:", ":", "", "[", "▁", "▁["}


@pytest.fixture(scope="module")
def step(smol: Any) -> dict[str, Any]:
    """Both streams at their first disagreement, our decoder's view and an eager reference
    forward pass of the same token sequences."""
    from rag_gates.tokrag import TokRAGDecoder

    class EveryLayer(TokRAGDecoder):
        def capture(self) -> tuple[list[int], list[int]]:
            return list(range(self.lm.num_layers)), list(range(self.lm.num_layers))

    decoder = EveryLayer(smol)
    streams = decoder.open(Q, PASSAGES, max_new_tokens=16)
    group = streams.group
    for _ in range(12):
        t_rag, t_llm = group.greedy_tokens()
        if t_rag != t_llm:
            break
        group.advance(t_rag)
    else:
        pytest.fail("the streams never disagreed in 12 tokens")
    rag_prompt, llm_prompt = decoder.prompts(Q, streams.passages)
    generated = list(group.generated_ids)
    model = smol.model
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            rag = model(torch.tensor([smol.encode(rag_prompt) + generated]),
                        output_hidden_states=True, output_attentions=True, use_cache=False)
            llm = model(torch.tensor([smol.encode(llm_prompt) + generated]),
                        output_hidden_states=True, use_cache=False)
    finally:
        model.set_attn_implementation(previous)
    return {"decoder": decoder, "streams": streams, "smol": smol, "rag": rag, "llm": llm,
            "t_rag": t_rag, "t_llm": t_llm}


def _lens(smol: Any, hidden: torch.Tensor) -> torch.Tensor:
    model = smol.model
    with torch.inference_mode():
        return torch.log_softmax(model.lm_head(model.model.norm(hidden)).float(), dim=-1)


def _jsd(p: torch.Tensor, q: torch.Tensor) -> float:
    """JSD in nats from log-probabilities, written out: 0.5 KL(P||M) + 0.5 KL(Q||M)."""
    pp, qq = p.exp(), q.exp()
    m = 0.5 * (pp + qq)
    return float(0.5 * (pp * (p - m.log())).sum() + 0.5 * (qq * (q - m.log())).sum())


def test_next_token_distributions_match(step: dict[str, Any]) -> None:
    logp = step["streams"].group.logprobs
    ref_rag = torch.log_softmax(step["rag"].logits[0, -1].float(), -1)
    ref_llm = torch.log_softmax(step["llm"].logits[0, -1].float(), -1)
    assert int(ref_rag.argmax()) == step["t_rag"] and int(ref_llm.argmax()) == step["t_llm"]
    assert torch.allclose(logp[0], ref_rag, atol=TOL)
    assert torch.allclose(logp[1], ref_llm, atol=TOL)


def _reference_paper(step: dict[str, Any], a: float = 5e-7) -> dict[str, Any]:
    """Eq. 14-16 and the expected-embedding score, from the paper's text."""
    smol, streams = step["smol"], step["streams"]
    rag, llm = step["rag"], step["llm"]
    layers = range(1, smol.num_layers)
    positions = streams.passage_positions
    # f(l): attention mass of the newest RAG position on the passage tokens, heads averaged.
    f = {layer: float(rag.attentions[layer][0, :, -1, positions].mean(0).sum())
         for layer in layers}
    g: dict[int, float] = {}
    first_above = max(layers)
    for layer in layers:
        h_rag = [_lens(smol, rag.hidden_states[x][0, -1]) for x in (layer - 1, layer)]
        h_llm = [_lens(smol, llm.hidden_states[x][0, -1]) for x in (layer - 1, layer)]
        g[layer] = abs(_jsd(*h_rag) - _jsd(*h_llm))
        if g[layer] > a:
            first_above = layer
            break
    l_star = (max(f, key=f.__getitem__) + first_above) // 2
    emb = smol.model.get_input_embeddings().weight.detach().float()
    p_rag = torch.softmax(rag.logits[0, -1].float(), -1)
    p_llm = torch.softmax(llm.logits[0, -1].float(), -1)
    rising = int((p_rag.log() - _lens(smol, rag.hidden_states[l_star][0, -1])).argmax())
    att = rag.attentions[l_star][0, :, -1, positions].mean(0)
    att = att / att.sum()
    e_pass = emb[torch.tensor(streams.passage_ids)]
    sim = torch.softmax(e_pass @ emb[rising], -1)
    literal = torch.softmax(att * sim, -1)
    renormalised = att * sim / (att * sim).sum()
    cos = torch.nn.functional.cosine_similarity
    w_rag, w_llm = p_rag @ emb, p_llm @ emb
    base = float(cos(w_rag, w_llm, dim=0))
    return {"layer": l_star, "rising": rising,
            "literal": float(cos(w_rag, literal @ e_pass, dim=0)) - base,
            "renormalised": float(cos(w_rag, renormalised @ e_pass, dim=0)) - base}


def test_paper_fusion_layer_and_score(step: dict[str, Any]) -> None:
    """Eq. 14 (l*), Eq. 15-16 (p_R, both forms) and the score, against ours."""
    ref = _reference_paper(step)
    layer, _ = step["decoder"].fusion_layer(step["streams"])
    assert layer == ref["layer"]
    verdict = step["decoder"].judge(step["streams"])
    assert verdict.layer == ref["layer"] and verdict.rising_token == ref["rising"]
    assert abs(verdict.score_literal - ref["literal"]) < TOL
    assert abs(verdict.score_renormalised - ref["renormalised"]) < TOL


def _authors_qa(step: dict[str, Any], layer: int) -> float:
    """``get_predict_emb_contrastive``, re-read loop by loop (score = rag - no-rag side)."""
    smol, streams = step["smol"], step["streams"]
    emb = smol.model.get_input_embeddings().weight.detach().float()
    cos = torch.nn.functional.cosine_similarity
    p_rag = torch.softmax(step["rag"].logits[0, -1].float(), -1)
    p_llm = torch.softmax(step["llm"].logits[0, -1].float(), -1)
    values, indices = torch.topk(p_rag, 2)
    rag_emb = sum(values[i] * emb[indices[i]] for i in range(2))
    values, indices = torch.topk(p_llm, 3)
    no_rag_emb = sum(values[i] * emb[indices[i]] for i in range(3))
    no_rag_score = float(cos(rag_emb, no_rag_emb, dim=0))
    ids = streams.passage_ids
    att = step["rag"].attentions[layer][0, :, -1, streams.passage_positions].mean(0)
    order = torch.topk(att, att.shape[0]).indices.tolist()
    best, count = 0.0, 0
    for idx in order:
        text = smol.tokenizer.convert_ids_to_tokens([ids[idx]])[0].replace("Ġ", "")
        if text in AUTHORS_SKIP or ids[idx] in smol.tokenizer.all_special_ids:
            continue
        if count == 3:
            break
        for t in range(max(0, idx - 2), min(len(ids) - 1, idx + 2 - 1) + 1):
            best = max(best, float(cos(rag_emb, emb[ids[t]], dim=0)))
        count += 1
    return best - no_rag_score


def _authors_token(step: dict[str, Any], layer: int) -> float:
    """The primary experiment's loop: top-3 both sides, attention ranks 3-7 of the top 10."""
    smol, streams = step["smol"], step["streams"]
    emb = smol.model.get_input_embeddings().weight.detach().float()
    cos = torch.nn.functional.cosine_similarity
    p_rag = torch.softmax(step["rag"].logits[0, -1].float(), -1)
    p_llm = torch.softmax(step["llm"].logits[0, -1].float(), -1)
    v, i = torch.topk(p_rag, 3)
    rag_emb = (v[:, None] * emb[i]).sum(0)
    v, i = torch.topk(p_llm, 3)
    no_rag_emb = (v[:, None] * emb[i]).sum(0)
    att = step["rag"].attentions[layer][0, :, -1, streams.passage_positions].mean(0)
    top10 = torch.topk(att, 10).indices
    tokens = torch.tensor(streams.passage_ids)[top10]
    sims = cos(rag_emb[None], emb[tokens], dim=1)
    return float(sims[2:7].max()) - float(cos(rag_emb, no_rag_emb, dim=0))


@pytest.mark.parametrize("layer", [0, 7, 15, 29])
def test_authors_judges_match_their_code(step: dict[str, Any], layer: int) -> None:
    decoder = step["decoder"]
    for variant, reference in (("authors-qa", _authors_qa), ("authors-token", _authors_token)):
        decoder.config = decoder.config.model_copy(update={"judge": variant})
        ours = decoder.judge_authors(step["streams"], layer=layer)
        assert abs(ours.score - reference(step, layer)) < TOL, variant
    decoder.config = decoder.config.model_copy(update={"judge": "paper"})


def test_authors_judge_decodes_with_their_prefix(tiny: Any) -> None:
    """The selectable variant end to end (tiny random model: plumbing only): the RAG prompt
    carries the authors' "[Reference]: " blocks, every disagreement is judged at the fixed
    layer, and a score > 0 (only) keeps the RAG token."""
    from rag_gates.tokrag import TokRAGConfig, TokRAGDecoder

    decoder = TokRAGDecoder(tiny, TokRAGConfig(judge="authors-qa", fusion_layer=0,
                                               passage_prefix=True))
    rag_prompt, _ = decoder.prompts("Who wrote it?", [Passage(title="T", text="x y z")])
    assert "[Reference]: T: x y z" in rag_prompt
    g = decoder.generate("Who wrote it?", passages=["alpha beta gamma", "delta epsilon"],
                         max_new_tokens=12)
    assert g.disagreements
    for c in g.disagreements:
        assert c.layer == 0 and c.score is not None
        assert c.side == ("rag" if c.score > 0 else "llm")


def test_decision_rules() -> None:
    """Which side a score keeps, hand-computed: the paper's ``>= 0`` keeps RAG (a tie goes
    to the passages), the authors' ``max_rag_score > no_rag_score`` is strict."""
    from rag_gates.tokrag.authors import authors_score

    emb = torch.eye(4)
    # Both sides put all mass on token 0: w_rag = w_llm, cos = 1 = the passage side's best.
    probs = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    tie = authors_score(probs, emb, torch.tensor([0.9, 0.1]), torch.tensor([0, 1]),
                        torch.tensor([False, False]))
    assert tie.score == 0.0 and tie.rag_side == 1.0 and tie.llm_side == 1.0
    # Closed book on token 3 (cos 0 with token 0), passage has token 0: rag side wins by 1.
    probs = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    win = authors_score(probs, emb, torch.tensor([0.1, 0.9]), torch.tensor([2, 0]),
                        torch.tensor([False, False]))
    assert win.score == pytest.approx(1.0, abs=1e-6)
    # Only skipped tokens in the passage: the running maximum stays at its start, 0.
    skipped = authors_score(probs, emb, torch.tensor([0.5, 0.5]), torch.tensor([0, 0]),
                            torch.tensor([True, True]))
    assert skipped.rag_side == 0.0
    # A NaN passage embedding: the passage side is NaN, not the running maximum's 0 (which
    # would silently keep the closed-book token); the decoder then keeps the passage's.
    emb_nan = emb.clone()
    emb_nan[2] = float("nan")
    broken = authors_score(probs, emb_nan, torch.tensor([0.9, 0.1]), torch.tensor([2, 2]),
                           torch.tensor([False, False]))
    assert math.isnan(broken.rag_side) and math.isnan(broken.score)


def test_adacad_alpha_is_the_jsd_in_bits(tiny: Any) -> None:
    """AdaCAD: alpha = JSD(p_RAG, p_LLM) in bits. Hand-computed: disjoint -> 1; equal -> 0;
    (3/4, 1/4) against (1/4, 3/4) -> 3/4 log2(3/2) + 1/4 log2(1/2) = 0.188722 (tol 1e-5)."""
    from rag_gates.tokrag import AdaCADDecoder

    decoder = AdaCADDecoder(tiny)

    def alpha(p: list[float], q: list[float]) -> float:
        return decoder.weight(torch.tensor([p, q]).clamp_min(1e-30).log())

    assert alpha([1.0, 0.0], [0.0, 1.0]) == pytest.approx(1.0, abs=1e-5)
    assert alpha([0.5, 0.5], [0.5, 0.5]) == pytest.approx(0.0, abs=1e-5)
    assert alpha([0.75, 0.25], [0.25, 0.75]) == pytest.approx(0.188722, abs=1e-5)


def test_bench_options_select_the_judge(tiny: Any) -> None:
    """``tokrag@paper`` / ``tokrag@N`` (the paper's judge, searched or fixed layer, as every
    committed table ran it) and ``tokrag@authors`` / ``tokrag@authors-N`` (the released
    code's judge at attention layer N) in ``rag-gates bench``; bad options fail first."""
    from rag_gates.eval.methods import (
        MethodContext,
        available_methods,
        check_method_name,
        make_method,
    )
    from rag_gates.eval.plugins.tokrag import parse_tokrag_option
    from rag_gates.retrieval.bm25 import BM25Retriever

    assert parse_tokrag_option(None) == (None, None)
    assert parse_tokrag_option("12") == ("paper", 12)
    assert parse_tokrag_option("paper") == ("paper", None)
    assert parse_tokrag_option("authors") == ("authors-qa", None)
    assert parse_tokrag_option("authors-0") == ("authors-qa", 0)
    for bad in ("tokrag@authors-x", "tokrag@authors--1", "tokrag@judge", "tokrag@0"):
        with pytest.raises(ValueError, match="tokrag"):
            check_method_name(bad, available_methods())
    ctx = MethodContext(lm=tiny, retriever=BM25Retriever.from_passages(
        [Passage(id="p", text="The capital of France is Paris.")]), k=1, max_new_tokens=4)
    method = make_method("tokrag@authors-1", ctx)
    assert (method.decoder.config.judge, method.decoder.authors_layer) == ("authors-qa", 1)
    assert make_method("tokrag@paper", ctx).decoder.config.judge == "paper"


def test_default_is_the_judge_with_the_higher_auc(smol: Any) -> None:
    """benchmarks/results/tokrag_authors_auc.json, the 491 tokens of today's table: the
    authors' QA judge at layer 20 of 30 has AUC 79.97 against the paper judge's 64.51, so it
    is the default, at two thirds of the depth (layer 20 on SmolLM2)."""
    import json
    from pathlib import Path

    from rag_gates.tokrag import TokRAGConfig, TokRAGDecoder

    results = json.loads((Path(__file__).parents[2] / "benchmarks/results/"
                          "tokrag_authors_auc.json").read_text())
    authors = results["authors"]["authors-qa"]["by_layer"]["20"]["auc"]
    assert authors > results["ours"]["tokrag_literal"]["auc"]
    assert TokRAGConfig().judge == "authors-qa"
    assert TokRAGDecoder(smol).authors_layer == 20
