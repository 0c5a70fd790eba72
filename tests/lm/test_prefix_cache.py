"""Prompt-prefix reuse in HFWhiteBoxLM (tiny random model): the same tokens and
log-probabilities as a full prefill, the memory budget, and where it must not apply."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rag_gates.lm.prefix_cache import PrefixCache
from rag_gates.testing import tiny_lm

BASE = "Question: who directed the film Jaws? Follow up: who directed Jaws? " * 2
STEPS = [BASE + "Intermediate answer:",
         BASE + "Intermediate answer: Steven Spielberg\nFollow up:",
         BASE + "Intermediate answer: Steven Spielberg\nFollow up: who was his father?\n"]


@pytest.fixture()
def lm() -> Any:
    return tiny_lm(seed=0)


def _run(lm: Any) -> list[Any]:
    return [lm.generate(p, max_new_tokens=10, logprobs=3) for p in STEPS]


def test_reuse_gives_the_same_generation(lm: Any) -> None:
    plain = _run(lm)
    cache = lm.enable_prefix_cache(16)
    reused = _run(lm)
    for a, b in zip(plain, reused, strict=True):
        assert a.text == b.text
        for x, y in zip(a.logprobs, b.logprobs, strict=True):
            assert x.logprob == pytest.approx(y.logprob, abs=1e-4)
            assert [t.token for t in x.top_logprobs] == [t.token for t in y.top_logprobs]
    assert cache.stats["lookups"] == 3 and cache.stats["hits"] == 2
    prompt_tokens = sum(g.prompt_tokens for g in reused)
    assert cache.stats["reused_tokens"] + cache.stats["prefilled_tokens"] == prompt_tokens
    assert cache.stats["reused_tokens"] > cache.stats["prefilled_tokens"]  # most was reused


def test_the_same_prompt_again_runs_only_its_last_token(lm: Any) -> None:
    cache = lm.enable_prefix_cache(16)
    first = lm.generate(STEPS[0], max_new_tokens=5)
    again = lm.generate(STEPS[0], max_new_tokens=5)
    assert first.text == again.text
    assert cache.stats["reused_tokens"] == first.prompt_tokens - 1


def test_stored_keys_are_not_written_by_later_decoding(lm: Any) -> None:
    cache = lm.enable_prefix_cache(16)
    lm.generate(STEPS[1], max_new_tokens=8)
    ids = lm.encode(STEPS[1])
    stored = [(k.clone(), v.clone()) for k, v in cache._entries[tuple(ids)][0]]
    lm.generate(STEPS[2], max_new_tokens=8)  # reuses and extends that prefix
    for (k0, v0), (k1, v1) in zip(stored, cache._entries[tuple(ids)][0], strict=True):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)


def test_the_budget_drops_the_least_recent_prompt(lm: Any) -> None:
    lm.generate(STEPS[0], max_new_tokens=1)  # no cache yet: nothing stored
    probe = lm.enable_prefix_cache(16)
    lm.generate(STEPS[0], max_new_tokens=1)
    one = probe.bytes
    small = PrefixCache(int(one * 1.5))
    lm.prefix_cache = small
    lm.generate(STEPS[0], max_new_tokens=1)
    lm.generate(STEPS[0].replace("Jaws", "Alien").replace("Question", "Query"),
                max_new_tokens=1)  # as long, no common prefix
    assert len(small) == 1 and small.bytes <= small.max_bytes  # the first was dropped
    tiny = PrefixCache(one // 2)
    lm.prefix_cache = tiny
    lm.generate(STEPS[0], max_new_tokens=1)
    assert len(tiny) == 0  # bigger than the whole budget: not stored


def test_groups_that_read_attention_do_not_reuse(lm: Any) -> None:
    cache = lm.enable_prefix_cache(16)
    lm.generate(STEPS[1], max_new_tokens=1)
    lm.open_streams([STEPS[2]], attention_layers=[0])
    lm.open_streams([STEPS[2], STEPS[0]])  # lockstep streams: not single
    assert cache.stats["lookups"] == 1


def test_arguments_are_checked(lm: Any) -> None:
    with pytest.raises(ValueError, match="max_mb"):
        lm.enable_prefix_cache(-1)
    with pytest.raises(ValueError, match="max_bytes"):
        PrefixCache(0)
    assert lm.enable_prefix_cache(0) is None and lm.prefix_cache is None


def test_the_bench_setting_is_not_part_of_a_runs_identity() -> None:
    from rag_gates_lab.runner import BenchConfig

    a = BenchConfig(dataset="hotpotqa", methods=["deeprag"], prefix_cache_mb=256)
    b = BenchConfig(dataset="hotpotqa", methods=["deeprag"])
    assert a.model_dump() == b.model_dump()


def test_a_prompt_longer_than_a_sliding_window_is_never_reused() -> None:
    """A sliding-window cache keeps only the last window of keys: cutting it to a prefix
    would give the wrong positions, so prompts longer than the window are not stored."""
    transformers = pytest.importorskip("transformers")
    from rag_gates.lm.hf import HFWhiteBoxLM
    from rag_gates.testing import tiny_model_and_tokenizer

    _, tok = tiny_model_and_tokenizer()
    torch.manual_seed(0)
    config = transformers.MistralConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        sliding_window=16, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, initializer_range=0.5)
    lm = HFWhiteBoxLM(transformers.MistralForCausalLM(config).eval(), tok,
                      model_id="tiny-mistral-sw16", chat_template=False)
    plain = lm.generate(STEPS[1], max_new_tokens=6, logprobs=0)
    cache = lm.enable_prefix_cache(16)
    lm.generate(STEPS[1], max_new_tokens=1)
    again = lm.generate(STEPS[1], max_new_tokens=6, logprobs=0)
    assert again.text == plain.text
    assert len(cache) == 0 and cache.stats["hits"] == 0


def test_a_budget_under_one_byte_still_turns_the_cache_on() -> None:
    from rag_gates.testing import tiny_lm

    cache = tiny_lm().enable_prefix_cache(1e-9)
    assert cache is not None and cache.max_bytes >= 1
