"""The embedded SmolLM2-135M-Instruct through HFWhiteBoxLM: real model, real answers."""

from __future__ import annotations

import time

import pytest
import torch

from rag_gates.cli import DEMO_DATA, gold_passages, load_hotpotqa_rows
from rag_gates.lm import defaults
from rag_gates.lm.hf import HFWhiteBoxLM
from rag_gates.prompts import qa_prompt

pytestmark = pytest.mark.integration


def test_answers_the_capital_of_france(smol: HFWhiteBoxLM) -> None:
    g = smol.generate("What is the capital of France?", max_new_tokens=24, logprobs=1)
    assert "Paris" in g.text
    assert g.finish_reason == "eos"
    paris = next(item for item in g.logprobs or [] if "Paris" in item.token)
    assert paris.logprob > -1.0  # the model is confident about it


def test_score_agrees_with_a_plain_forward_pass(smol: HFWhiteBoxLM) -> None:
    prompt = "Question: What is the capital of France?\nAnswer:"
    continuations = [" Paris", " London", " The capital of France is Paris."]
    for s in smol.score(prompt, continuations, chat_template=False):
        ids = smol.encode(prompt, chat_template=False)
        with torch.inference_mode():
            logits = smol.model(input_ids=torch.tensor([ids + s.token_ids])).logits[0]
        logp = torch.log_softmax(logits.float(), dim=-1)
        expected = [float(logp[len(ids) - 1 + j, t]) for j, t in enumerate(s.token_ids)]
        assert s.logprobs == pytest.approx(expected, abs=1e-4)
    paris, london, _ = smol.score(prompt, continuations, chat_template=False)
    assert paris.total > london.total


def test_kv_reused_scoring_equals_full_scoring(smol: HFWhiteBoxLM) -> None:
    row = load_hotpotqa_rows(DEMO_DATA, 1)[0]
    prompt = qa_prompt(row["question"], gold_passages(row))
    continuations = [" yes", " no", " Both are American.", " They were not."]
    reused = smol.score(prompt, continuations, reuse_prefix=True)
    full = smol.score(prompt, continuations, reuse_prefix=False, batch_size=1)
    for a, b in zip(reused, full, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


@pytest.mark.parametrize("side", ["left", "right"])
def test_batched_hidden_states_equal_one_by_one(smol: HFWhiteBoxLM, side: str) -> None:
    rows = load_hotpotqa_rows(DEMO_DATA, 4)
    prompts = [r["question"] for r in rows] + ["Hi"]
    layers = [smol.num_layers // 2, -1]
    batched = smol.hidden_states(prompts, layers, padding_side=side)  # type: ignore[arg-type]
    for i, prompt in enumerate(prompts):
        single = smol.hidden_states([prompt], layers)[0]
        assert torch.allclose(batched[i], single, atol=1e-4, rtol=0), (
            float((batched[i] - single).abs().max()))


def test_two_stream_stepper_equals_two_greedy_runs(smol: HFWhiteBoxLM) -> None:
    row = load_hotpotqa_rows(DEMO_DATA, 3)[2]
    prompts = [qa_prompt(row["question"], gold_passages(row)), qa_prompt(row["question"])]
    steps = 16
    for leader, prompt in enumerate(prompts):
        alone = smol.generate(prompt, max_new_tokens=steps)
        group = smol.open_streams(prompts)
        for _ in range(alone.completion_tokens):
            group.advance(group.greedy_tokens()[leader])
        assert group.text == alone.text


def test_attention_row_is_a_distribution_over_the_prompt(smol: HFWhiteBoxLM) -> None:
    row = smol.attention_row("What is the capital of France?", smol.num_layers // 2)
    assert row.shape[0] == smol.config.num_attention_heads
    assert torch.allclose(row.sum(-1), torch.ones(row.shape[0]), atol=1e-5)


def test_warm_load_is_fast() -> None:
    defaults.load_default_lm()  # converts on a cold cache
    start = time.perf_counter()
    defaults.load_default_lm()
    assert defaults._is_complete(defaults.default_lm_dir())
    assert time.perf_counter() - start < 10  # generous: the benchmark measures the real figure


def test_default_embedder_embeds_offline() -> None:
    embedder = defaults.load_default_embedder()
    vectors = embedder.encode(["Paris is the capital of France.", "The capital of France?",
                               "Bananas are yellow."], normalize_embeddings=True)
    assert vectors.shape == (3, 384)
    assert float(vectors[0] @ vectors[1]) > float(vectors[0] @ vectors[2])


def test_control_tokens_in_passages_stay_literal_on_smollm2(smol: HFWhiteBoxLM) -> None:
    from tests.unit.test_text_boundaries import assert_no_forged_turns

    assert_no_forged_turns(smol)


def test_ordinary_prompts_encode_as_before_on_smollm2(smol: HFWhiteBoxLM) -> None:
    # Encoding content and template apart must not change the ids of ordinary prompts (the
    # shipped probe was trained on them): compare with one pass over the rendered text.
    rows = load_hotpotqa_rows(DEMO_DATA, 20)
    prompts = [r["question"] for r in rows] + [qa_prompt(r["question"], gold_passages(r))
                                               for r in rows]
    for prompt in prompts:
        whole = smol.tokenizer(smol.render(prompt), add_special_tokens=False)["input_ids"]
        assert smol.encode(prompt) == whole
