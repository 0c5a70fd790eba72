"""The routing pass: p_M and the kNN key from one forward pass (tiny random-weight model)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from rag_gates.lm.hf import HFWhiteBoxLM
from rag_gates.srrag.routing import RoutingPrompt, question_keys, route_features

QUESTIONS = ["Who wrote Hamlet?", "What is the capital of France, the country of wine?",
             "Which river runs through the city near the lazy dog?"]


def test_one_pass_reads_the_last_question_token(tiny: Any) -> None:
    prompt = RoutingPrompt()
    f = route_features(tiny, QUESTIONS[0], prompt, layer=2)
    assert f.one_pass
    ids = tiny.encode(prompt.text(QUESTIONS[0]))
    assert tiny.tokenizer.decode(ids[: f.key_position + 1]).endswith("Who wrote Hamlet?")
    assert tiny.tokenizer.decode(ids[f.key_position + 1:]) == "<|im_end|>\n<|im_start|>assistant\n"
    direct = tiny.hidden_states([prompt.text(QUESTIONS[0])], [2], position=f.key_position)
    assert torch.allclose(f.key, direct[0, 0], atol=1e-5)
    # p_M: the retrieval words' share of the two options' first-token probability.
    logp = tiny.next_token_logprobs(prompt.text(QUESTIONS[0]))
    def firsts(word: str) -> set[int]:
        return {tiny.token_ids(v)[0] for v in (word, f" {word}", word.lower(),
                                                f" {word.lower()}")}

    # A first token both replies share (a bare space in this tokenizer) is dropped.
    shared = firsts("Search") & firsts("Memory")
    assert shared
    r = sum(math.exp(float(logp[t])) for t in firsts("Search") - shared)
    p = sum(math.exp(float(logp[t])) for t in firsts("Memory") - shared)
    assert f.p_model == pytest.approx(r / (r + p), rel=1e-4)
    assert f.option_mass == pytest.approx(r + p, rel=1e-4)


def test_batched_keys_equal_the_routing_keys(tiny: Any) -> None:
    prompt = RoutingPrompt()
    batch = question_keys(tiny, QUESTIONS, prompt, 3, batch_size=2)
    assert batch.shape == (3, tiny.hidden_size)
    for i, q in enumerate(QUESTIONS):
        assert torch.allclose(batch[i], route_features(tiny, q, prompt, 3).key, atol=1e-4)


def test_plain_prompts_without_a_chat_template(tiny: Any) -> None:
    plain = HFWhiteBoxLM(tiny.model, tiny.tokenizer, model_id="plain", chat_template=False)
    prompt = RoutingPrompt()
    f = route_features(plain, QUESTIONS[1], prompt, 2)
    ids = plain.encode(prompt.text(QUESTIONS[1]))
    assert f.one_pass and f.key_position == len(ids) - 1  # the question ends the prompt
    assert torch.allclose(question_keys(plain, QUESTIONS[1:2], prompt, 2)[0], f.key, atol=1e-5)


def test_bad_settings_are_refused(tiny: Any) -> None:
    with pytest.raises(ValueError, match="must end with"):
        RoutingPrompt(template="Question: {question}\nSource:")
    with pytest.raises(ValueError, match="same token"):
        route_features(tiny, "q?", RoutingPrompt(retrieve_words=("Search",),
                                                 parametric_words=("Sea",)), 2)
    with pytest.raises(ValueError, match="out of range"):
        route_features(tiny, "q?", RoutingPrompt(), 0)
    with pytest.raises(ValueError, match="out of range"):
        question_keys(tiny, ["q?"], RoutingPrompt(), 5)
    with pytest.raises(ValueError, match="question is empty"):
        route_features(tiny, " ", RoutingPrompt(), 2)
