"""HFWhiteBoxLM on a tiny random-weight Llama: every access path against a plain forward pass."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rag_gates.errors import ContextLengthError, ModelNotFoundError
from rag_gates.lm.hf import HFWhiteBoxLM
from rag_gates.testing import tiny_model_and_tokenizer

PROMPTS = ["What is the capital of France?", "hi", "Who wrote Hamlet in London?"]


def forward_logprobs(lm: HFWhiteBoxLM, ids: list[int]) -> torch.Tensor:
    """log p(. | ids[:i+1]) for every position, from one plain full forward pass."""
    with torch.inference_mode():
        out = lm.model(input_ids=torch.tensor([ids]))
    return torch.log_softmax(out.logits[0].float(), dim=-1)


def greedy_reference(lm: HFWhiteBoxLM, ids: list[int], steps: int) -> list[int]:
    """Greedy decoding by repeated full forward passes, no cache."""
    ids = list(ids)
    out = []
    for _ in range(steps):
        token = int(forward_logprobs(lm, ids)[-1].argmax())
        out.append(token)
        ids.append(token)
    return out


# ---------------------------------------------------------------- generation
def test_greedy_generation_matches_uncached_reference(tiny: HFWhiteBoxLM) -> None:
    g = tiny.generate(PROMPTS[0], max_new_tokens=8, logprobs=3)
    ids = tiny.encode(PROMPTS[0])
    reference = greedy_reference(tiny, ids, 8)
    eos = [i for i, t in enumerate(reference) if t in tiny.eos_token_ids]
    expected = reference[: eos[0]] if eos else reference
    assert g.completion_tokens == len(expected)
    assert g.text == tiny.tokenizer.decode(expected, skip_special_tokens=True)
    assert g.prompt_tokens == len(ids)
    # Logprobs are the model's own distribution at each step, best alternative first.
    assert g.logprobs is not None and len(g.logprobs) == len(expected)
    for step, item in enumerate(g.logprobs):
        ref = forward_logprobs(tiny, ids + expected[:step])[-1]
        assert item.logprob == pytest.approx(float(ref[expected[step]]), abs=1e-4)
        assert len(item.top_logprobs) == 3
        assert item.top_logprobs[0].logprob == pytest.approx(float(ref.max()), abs=1e-4)
        assert item.top_logprobs[0].token == item.token  # greedy: chosen = most likely


def test_generation_respects_max_new_tokens_and_reports_length(tiny: HFWhiteBoxLM) -> None:
    g = tiny.generate(PROMPTS[2], max_new_tokens=3)
    assert g.completion_tokens <= 3
    if g.finish_reason == "length":
        assert g.completion_tokens == 3


def test_stop_string_is_excluded_and_reported(tiny: HFWhiteBoxLM) -> None:
    full = tiny.generate(PROMPTS[0], max_new_tokens=12).text
    assert len(full) >= 4
    stop = full[2:4]
    g = tiny.generate(PROMPTS[0], max_new_tokens=12, stop=[stop])
    assert g.finish_reason == "stop"
    assert g.text == full[: full.find(stop)]


@pytest.mark.parametrize("stop", [None, ["zz-never"], "STOP"])
def test_stream_pieces_join_to_generate_text(tiny: HFWhiteBoxLM, stop: object) -> None:
    for prompt in PROMPTS:
        pieces = list(tiny.stream(prompt, max_new_tokens=10, stop=stop))  # type: ignore[arg-type]
        assert "".join(pieces) == tiny.generate(prompt, max_new_tokens=10, stop=stop).text  # type: ignore[arg-type]


def test_stream_holds_back_a_partial_stop_string(tiny: HFWhiteBoxLM) -> None:
    full = tiny.generate(PROMPTS[1], max_new_tokens=12).text
    stop = full[3:6]
    pieces = list(tiny.stream(PROMPTS[1], max_new_tokens=12, stop=[stop]))
    assert "".join(pieces) == full[: full.find(stop)]
    assert all(stop not in p for p in pieces)


def test_sampling_is_seeded(tiny: HFWhiteBoxLM) -> None:
    a = tiny.generate(PROMPTS[0], max_new_tokens=12, temperature=1.5, seed=7)
    b = tiny.generate(PROMPTS[0], max_new_tokens=12, temperature=1.5, seed=7)
    others = {tiny.generate(PROMPTS[0], max_new_tokens=12, temperature=1.5, seed=s).text
              for s in range(5)}
    assert a == b.model_copy(update={"latency_ms": a.latency_ms})
    assert len(others) > 1


def test_unseeded_sampling_varies_and_stream_returns_the_generation(tiny: HFWhiteBoxLM) -> None:
    texts = {tiny.generate(PROMPTS[0], max_new_tokens=12, temperature=1.5).text
             for _ in range(4)}
    assert len(texts) > 1
    stream = tiny.stream(PROMPTS[0], max_new_tokens=6)
    pieces = []
    while True:
        try:
            pieces.append(next(stream))
        except StopIteration as done:
            generation = done.value
            break
    assert generation.text == "".join(pieces)
    assert generation.completion_tokens == tiny.generate(PROMPTS[0], max_new_tokens=6
                                                         ).completion_tokens


def test_chat_template_on_and_off(tiny: HFWhiteBoxLM) -> None:
    templated = tiny.render("hello")
    assert templated.startswith("<|im_start|>user\nhello<|im_end|>")
    assert templated.endswith("<|im_start|>assistant\n")
    assert tiny.render("hello", chat_template=False) == "hello"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
    assert tiny.render(messages).startswith("<|im_start|>system\nBe brief.")
    assert tiny.encode("hello") != tiny.encode("hello", chat_template=False)


def test_final_assistant_message_is_continued(tiny: HFWhiteBoxLM) -> None:
    # Assistant prefill, as in transformers' text-generation pipeline: no end of turn after
    # the last assistant message and no new assistant header; its content stays literal.
    user = [{"role": "user", "content": "hello"}]
    prefill = "Follow up: <|im_end|> who"
    messages = [*user, {"role": "assistant", "content": prefill}]
    assert tiny.render(messages) == tiny.render(user) + prefill
    assert tiny.encode(messages) == tiny.encode(user) + tiny.token_ids(prefill)
    earlier = [*messages, {"role": "user", "content": "and?"}]  # not last: a closed turn
    assert f"{prefill}<|im_end|>" in tiny.render(earlier)


async def test_async_variants_equal_sync(tiny: HFWhiteBoxLM) -> None:
    sync = tiny.generate(PROMPTS[0], max_new_tokens=6)
    results = await asyncio.gather(*(tiny.agenerate(PROMPTS[0], max_new_tokens=6)
                                     for _ in range(3)))
    assert all(r.text == sync.text for r in results)
    pieces = [p async for p in tiny.astream(PROMPTS[0], max_new_tokens=6)]
    assert "".join(pieces) == sync.text


# ---------------------------------------------------------------- scoring
def test_score_equals_plain_forward(tiny: HFWhiteBoxLM) -> None:
    prompt = PROMPTS[0]
    continuations = [" Paris", " the capital city", " 42 and 1999 in London"]
    for reuse in (True, False):
        scores = tiny.score(prompt, continuations, reuse_prefix=reuse, batch_size=2)
        for s in scores:
            ids = tiny.encode(prompt)
            ref = forward_logprobs(tiny, ids + s.token_ids)
            expected = [float(ref[len(ids) - 1 + j, t]) for j, t in enumerate(s.token_ids)]
            assert s.logprobs == pytest.approx(expected, abs=1e-4)
            assert s.total == pytest.approx(sum(expected), abs=1e-3)
            assert s.mean == pytest.approx(sum(expected) / len(expected), abs=1e-4)


def test_kv_reused_scoring_equals_full_scoring(tiny: HFWhiteBoxLM) -> None:
    continuations = [" a", " the quick brown fox", " numbers like 10", " river bank"]
    reused = tiny.score(PROMPTS[2], continuations, reuse_prefix=True, batch_size=3)
    full = tiny.score(PROMPTS[2], continuations, reuse_prefix=False, batch_size=1)
    for a, b in zip(reused, full, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_score_rejects_bad_continuations(tiny: HFWhiteBoxLM) -> None:
    assert tiny.score(PROMPTS[0], []) == []
    with pytest.raises(ValueError, match="empty"):
        tiny.score(PROMPTS[0], [""])
    with pytest.raises(TypeError):
        tiny.score(PROMPTS[0], " Paris")
    with pytest.raises(TypeError):
        tiny.score(PROMPTS[0], [3])  # type: ignore[list-item]


def test_next_token_logprobs_is_a_distribution(tiny: HFWhiteBoxLM) -> None:
    logp = tiny.next_token_logprobs(PROMPTS[0])
    ref = forward_logprobs(tiny, tiny.encode(PROMPTS[0]))[-1]
    assert torch.allclose(logp, ref, atol=1e-4)
    assert float(logp.exp().sum()) == pytest.approx(1.0, abs=1e-4)
    top = tiny.top_next_tokens(PROMPTS[0], k=4)
    assert [t.logprob for t in top] == sorted((t.logprob for t in top), reverse=True)


# ---------------------------------------------------------------- hidden states
@pytest.mark.parametrize("side", ["left", "right"])
def test_batched_hidden_states_equal_one_by_one(tiny: HFWhiteBoxLM, side: str) -> None:
    layers = [0, 2, -1]
    batched = tiny.hidden_states(PROMPTS, layers, padding_side=side)  # type: ignore[arg-type]
    assert batched.shape == (len(PROMPTS), 3, tiny.hidden_size)
    for i, prompt in enumerate(PROMPTS):
        single = tiny.hidden_states([prompt], layers)[0]
        assert torch.allclose(batched[i], single, atol=1e-4)
        # ...and equal to output_hidden_states of a plain unpadded forward pass.
        with torch.inference_mode():
            out = tiny.model(input_ids=torch.tensor([tiny.encode(prompt)]),
                             output_hidden_states=True)
        for j, layer in enumerate(layers):
            assert torch.allclose(single[j], out.hidden_states[layer][0, -1], atol=1e-4)


def test_hidden_states_at_an_inner_position(tiny: HFWhiteBoxLM) -> None:
    h = tiny.hidden_states(PROMPTS, [1], position=0, padding_side="left")
    for i, prompt in enumerate(PROMPTS):
        with torch.inference_mode():
            out = tiny.model(input_ids=torch.tensor([tiny.encode(prompt)]),
                             output_hidden_states=True)
        assert torch.allclose(h[i, 0], out.hidden_states[1][0, 0], atol=1e-4)


def test_hidden_layer_out_of_range(tiny: HFWhiteBoxLM) -> None:
    with pytest.raises(ValueError, match="out of range"):
        tiny.hidden_states(PROMPTS, [tiny.num_layers + 1])
    with pytest.raises(ValueError, match="empty"):
        tiny.hidden_states(PROMPTS, [])


# ---------------------------------------------------------------- attention
def eager_attention(lm: HFWhiteBoxLM, ids: list[int], layer: int) -> torch.Tensor:
    """Reference: the same weights in eager attention with output_attentions."""
    model, _ = tiny_model_and_tokenizer(0)
    model.set_attn_implementation("eager")
    model.load_state_dict(lm.model.state_dict())
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True)
    return out.attentions[layer][0]  # [heads, T, T]


@pytest.mark.parametrize("layer", [0, 3])
def test_attention_row_equals_eager_attention(tiny: HFWhiteBoxLM, layer: int) -> None:
    ids = tiny.encode(PROMPTS[0])
    reference = eager_attention(tiny, ids, layer)
    for position in (-1, 5, 0):
        row = tiny.attention_row(PROMPTS[0], layer, position=position)
        p = position % len(ids)
        assert row.shape == (tiny.config.num_attention_heads, p + 1)
        assert torch.allclose(row, reference[:, p, : p + 1], atol=1e-5)


# ---------------------------------------------------------------- lockstep streams
def test_two_streams_follow_separate_greedy_runs(tiny: HFWhiteBoxLM) -> None:
    prompts = [PROMPTS[0], PROMPTS[1]]
    for leader in (0, 1):
        group = tiny.open_streams(prompts)
        for _ in range(6):
            group.advance(group.greedy_tokens()[leader])
        ids = [tiny.encode(p) for p in prompts]
        assert group.generated_ids == greedy_reference(tiny, ids[leader], 6)
        # The follower's distribution is teacher-forced on the shared suffix.
        follower = 1 - leader
        ref = forward_logprobs(tiny, ids[follower] + group.generated_ids)[-1]
        assert torch.allclose(group.logprobs[follower], ref, atol=1e-4)


def test_stream_hidden_states_and_attention_track_the_newest_token(tiny: HFWhiteBoxLM) -> None:
    prompts = [PROMPTS[2], PROMPTS[1]]
    group = tiny.open_streams(prompts, hidden_layers=[2], attention_layers=[1])
    for _ in range(3):
        group.advance(group.greedy_tokens()[0])
    for stream, prompt in enumerate(prompts):
        ids = tiny.encode(prompt) + group.generated_ids
        assert group.stream_length(stream) == len(ids)
        with torch.inference_mode():
            out = tiny.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        # float32 sums in another order (cache vs full pass): tolerance scaled to the vector.
        ref = out.hidden_states[2][0, -1]
        tolerance = 1e-4 + 1e-5 * float(ref.abs().max())
        assert torch.allclose(group.hidden(2)[stream], ref, atol=tolerance)
        reference = eager_attention(tiny, ids, 1)[:, -1]
        assert torch.allclose(group.attention(stream, 1), reference, atol=1e-5)
    with pytest.raises(KeyError, match="not captured"):
        group.hidden(3)
    with pytest.raises(IndexError):
        group.attention(0, 1, position=0)  # only the newest token was fed in the last pass


def test_streams_prefill_only_their_own_tokens(tiny: HFWhiteBoxLM) -> None:
    # A short prompt beside a long one costs its own tokens: no forward pass over padding.
    prompts = ["Retrieval augmented generation reads passages before it answers. " * 3,
               PROMPTS[1]]
    lengths = [len(tiny.encode(p)) for p in prompts]
    fed: list[int] = []
    handle = tiny.model.model.embed_tokens.register_forward_pre_hook(
        lambda _m, args: fed.append(int(args[0].numel())))
    try:
        group = tiny.open_streams(prompts, hidden_layers=[0, 2], attention_layers=[1])
        group.advance(group.greedy_tokens()[0])
        group.logits  # noqa: B018 - runs the step
    finally:
        handle.remove()
    assert fed == [lengths[0], lengths[1], 2]  # each prompt alone, then one batched step
    # The short stream's prefill is exactly its run alone.
    alone = tiny.open_streams([prompts[1]], hidden_layers=[0, 2])
    fresh = tiny.open_streams(prompts, hidden_layers=[0, 2])
    assert torch.equal(fresh.logits[1], alone.logits[0])
    assert torch.equal(fresh.hidden(2)[1], alone.hidden(2)[0])
    assert torch.equal(fresh.hidden(0)[1], alone.hidden(0)[0])
    # Only the newest position is kept for attention: earlier rows come from attention_row.
    with pytest.raises(IndexError):
        tiny.open_streams(prompts, attention_layers=[1]).attention(0, 1, position=0)


def test_stream_group_rejects_bad_tokens(tiny: HFWhiteBoxLM) -> None:
    group = tiny.open_streams([PROMPTS[0]])
    with pytest.raises(ValueError, match="vocabulary"):
        group.advance(10**9)
    with pytest.raises(TypeError):
        group.advance("a")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        tiny.open_streams(PROMPTS[0])  # a bare string, not a list


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("prompt", ["", "   \n\t", [], [{"role": "user", "content": " "}]])
def test_empty_prompt_is_a_value_error(tiny: HFWhiteBoxLM, prompt: object) -> None:
    with pytest.raises(ValueError):
        tiny.generate(prompt)  # type: ignore[arg-type]


@pytest.mark.parametrize("prompt", [None, 42, b"bytes", [42]])
def test_wrong_prompt_type_is_a_type_error(tiny: HFWhiteBoxLM, prompt: object) -> None:
    with pytest.raises(TypeError):
        tiny.generate(prompt)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_new_tokens": 0}, ValueError),
        ({"max_new_tokens": 2.5}, TypeError),
        ({"temperature": -1}, ValueError),
        ({"stop": [""]}, ValueError),
        ({"logprobs": 99}, ValueError),
        ({"top_p": 0.0, "temperature": 1.0}, ValueError),
    ],
)
def test_bad_generation_arguments(tiny: HFWhiteBoxLM, kwargs: dict, error: type) -> None:
    with pytest.raises(error):
        tiny.generate(PROMPTS[0], **kwargs)


def test_prompt_longer_than_context(tiny: HFWhiteBoxLM) -> None:
    long_prompt = "the quick brown fox " * 200  # well over the tiny model's 256 tokens
    with pytest.raises(ContextLengthError, match="truncation='left'"):
        tiny.generate(long_prompt, max_new_tokens=4)
    with pytest.raises(ContextLengthError):
        tiny.score(long_prompt, [" fox"])
    g = tiny.generate(long_prompt, max_new_tokens=4, truncation="left")
    assert g.prompt_tokens == tiny.max_context - 4
    # Left truncation keeps the end of the prompt.
    kept = tiny.encode(long_prompt, reserve=4, truncation="left")
    assert kept == tiny.encode(long_prompt, truncation="left", reserve=0)[-len(kept):]


def test_unknown_model_path_names_what_was_tried(tmp_path: object) -> None:
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        HFWhiteBoxLM.from_pretrained("./no/such/model")
    with pytest.raises(ModelNotFoundError, match="could not load"):
        HFWhiteBoxLM.from_pretrained("no-such-org/no-such-model-xyz", local_files_only=True)


def test_load_from_a_saved_directory(tmp_path: object) -> None:
    from pathlib import Path

    from rag_gates.lm import load_lm
    from rag_gates.testing import save_tiny_lm, tiny_lm

    path = save_tiny_lm(Path(str(tmp_path)) / "tiny", seed=3)
    loaded = load_lm(path, num_threads=1)
    direct = tiny_lm(seed=3)
    assert loaded.generate("hi", max_new_tokens=5).text == direct.generate(
        "hi", max_new_tokens=5).text
    assert loaded.model_id == str(path)


def test_wrong_model_and_dtype_types() -> None:
    with pytest.raises(TypeError):
        HFWhiteBoxLM("not a model", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dtype"):
        HFWhiteBoxLM.from_pretrained("x", dtype="float8")


def test_generate_from_a_prefilled_group_reuses_the_prefill(tiny: HFWhiteBoxLM) -> None:
    group = tiny.open_streams([PROMPTS[0]], hidden_layers=[2], reserve=8)
    prefill_hidden = group.hidden(2)[0]
    assert torch.allclose(prefill_hidden, tiny.hidden_states([PROMPTS[0]], [2])[0, 0],
                          atol=1e-4)
    g = tiny.generate_from(group, max_new_tokens=8, logprobs=0)
    plain = tiny.generate(PROMPTS[0], max_new_tokens=8, logprobs=0)
    assert g.model_copy(update={"latency_ms": 0}) == plain.model_copy(update={"latency_ms": 0})
    with pytest.raises(ValueError, match="single-stream"):
        tiny.generate_from(tiny.open_streams(PROMPTS[:2]), max_new_tokens=2)


async def test_async_passes_extra_arguments(tiny: HFWhiteBoxLM) -> None:
    plain = await tiny.agenerate("hello", max_new_tokens=5, chat_template=False)
    assert plain.text == tiny.generate("hello", max_new_tokens=5, chat_template=False).text
    pieces = [p async for p in tiny.astream("hello", max_new_tokens=5, chat_template=False)]
    assert "".join(pieces) == plain.text


def test_hidden_states_early_exit_matches_the_full_pass(tiny: HFWhiteBoxLM) -> None:
    prompts = ["Who wrote Hamlet?", "What is the capital of France and why is it there?"]
    hooks_before = [len(layer._forward_hooks) for layer in tiny.model.model.layers]
    early = tiny.hidden_states(prompts, [1, 2], early_exit=True)
    full = tiny.hidden_states(prompts, [1, 2], early_exit=False)
    assert torch.equal(early, full)
    # Its hooks are gone afterwards, so later passes run every layer.
    assert [len(layer._forward_hooks) for layer in tiny.model.model.layers] == hooks_before
    # The last layer or the embeddings need the full pass; it is taken automatically.
    last = tiny.hidden_states(prompts, [0, tiny.num_layers])
    assert last.shape == (2, 2, tiny.hidden_size)


# ---------------------------------------------------------------- transformers' cache keyword
def test_forward_passes_the_cache_under_the_name_the_model_accepts(tiny: HFWhiteBoxLM) -> None:
    # transformers 5.x warns on every forward that gets the old ``past_key_values`` name; an
    # application logging warnings would see one per token.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        g = tiny.generate(PROMPTS[0], max_new_tokens=4)
        scores = tiny.score(PROMPTS[0], [" Paris", " London"])
    assert g.completion_tokens >= 1 and len(scores) == 2


def test_forward_falls_back_to_past_key_values_for_models_without_the_new_name() -> None:
    from rag_gates.lm.hooks import cache_keyword

    class OldStyle(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, past_key_values: object = None) -> None:
            return None

    class NewStyle(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, cache: object = None) -> None:
            return None

    assert cache_keyword(OldStyle()) == "past_key_values"
    assert cache_keyword(NewStyle()) == "cache"
