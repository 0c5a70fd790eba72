"""Tok-RAG, CAD and AdaCAD plumbing on the tiny random-weight Llama (no quality claims)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from rag_gates.errors import ContextLengthError, WhiteBoxRequiredError  # noqa: E402
from rag_gates.lm.base import BaseTextLM  # noqa: E402
from rag_gates.prompts import qa_prompt  # noqa: E402
from rag_gates.tokrag import (  # noqa: E402
    AdaCADDecoder,
    CADDecoder,
    TokRAGConfig,
    TokRAGDecoder,
    TwoStreamGeneration,
)
from rag_gates.types import Generation, Passage, TokenChoice  # noqa: E402

Q = "What is the capital of France?"
# These tests exercise the paper's judge (l*, p_R); tests/fidelity covers the authors'.
PAPER = TokRAGConfig(judge="paper")
PASSAGES = [Passage(title="France", text="The capital of France is Paris."),
            Passage(text="Who wrote Hamlet? William Shakespeare wrote Hamlet in London.")]


class TextOnly(BaseTextLM):
    model_id = "text-only"

    def generate(self, prompt: Any, **kwargs: Any) -> Generation:
        return Generation(text="x", finish_reason="eos")


def test_choices_follow_the_streams(tiny: Any) -> None:
    decoder = TokRAGDecoder(tiny, PAPER)
    g = decoder.generate(Q, passages=PASSAGES, max_new_tokens=12, logprobs=2)
    assert isinstance(g, TwoStreamGeneration)
    assert len(g.choices) == g.completion_tokens or g.finish_reason == "eos"
    assert [c.position for c in g.choices] == list(range(len(g.choices)))
    kept = [c.token_id for c in g.choices][: g.completion_tokens]
    assert tiny.tokenizer.decode(kept, skip_special_tokens=True) == g.text
    for c in g.choices:
        if c.side == "agree":
            assert c.rag_token_id == c.llm_token_id == c.token_id and c.score is None
        else:
            assert c.rag_token_id != c.llm_token_id
            assert c.token_id == (c.rag_token_id if c.side == "rag" else c.llm_token_id)
            assert (c.score >= 0) == (c.side == "rag")
            assert c.layer is not None and 1 <= c.layer < tiny.num_layers
    assert g.disagreements, "random weights: the streams should disagree somewhere"
    event = g.trace.events[-1]
    assert event.kind == "llm_call" and event.data["disagreements"] == len(g.disagreements)
    assert g.logprobs is not None and len(g.logprobs) == g.completion_tokens
    assert TokenChoice.model_validate_json(g.choices[0].model_dump_json()) == g.choices[0]


def test_stream_and_async_match_generate(tiny: Any) -> None:
    decoder = TokRAGDecoder(tiny, PAPER)
    whole = decoder.generate(Q, passages=PASSAGES, max_new_tokens=10)
    assert "".join(decoder.stream(Q, passages=PASSAGES, max_new_tokens=10)) == whole.text
    again = asyncio.run(decoder.agenerate(Q, passages=PASSAGES, max_new_tokens=10))
    assert again.text == whole.text and again.choices == whole.choices

    async def pieces() -> str:
        return "".join([p async for p in decoder.astream(Q, passages=PASSAGES,
                                                          max_new_tokens=10)])

    assert asyncio.run(pieces()) == whole.text


def test_stop_string_and_max_tokens(tiny: Any) -> None:
    decoder = TokRAGDecoder(tiny, PAPER)
    full = decoder.generate(Q, passages=PASSAGES, max_new_tokens=12)
    assert full.finish_reason == "length" and full.completion_tokens == 12
    stop = full.text[3:5]
    cut = decoder.generate(Q, passages=PASSAGES, max_new_tokens=12, stop=[stop])
    assert cut.finish_reason == "stop" and cut.text == full.text[: full.text.find(stop)]


def test_eos_ends_generation(tiny: Any) -> None:
    # CAD with a huge alpha toward a stream whose EOS is forced: use the real EOS path by
    # asking for enough tokens that a random model hits EOS in one of the seeds tried.
    eos = next(iter(tiny.eos_token_ids))
    for seed_q in range(40):
        g = CADDecoder(tiny, alpha=0.0).generate(f"{Q} {seed_q}", passages=PASSAGES,
                                                 max_new_tokens=40)
        if g.finish_reason == "eos":
            assert g.choices[-1].token_id == eos
            assert g.completion_tokens == len(g.choices) - 1
            return
    # The tiny model is seeded, so this is deterministic: a failure means the EOS path broke.
    pytest.fail("no generation ended at EOS in 40 prompts")


def test_fixed_layer_and_both_pr_forms(tiny: Any) -> None:
    fixed = TokRAGDecoder(tiny, TokRAGConfig(judge="paper", fusion_layer=2))
    assert fixed.capture() == ([2], [2])
    g = fixed.generate(Q, passages=PASSAGES, max_new_tokens=8)
    assert {c.layer for c in g.disagreements} <= {2}
    decoder = TokRAGDecoder(tiny, TokRAGConfig(judge="paper", pr_form="renormalised"))
    streams = decoder.open(Q, PASSAGES, max_new_tokens=8)
    verdict = decoder.judge(streams)
    assert verdict.score == verdict.score_renormalised
    assert TokRAGConfig().pr_form == "literal"  # the default chosen by measured AUC
    literal = TokRAGDecoder(tiny, TokRAGConfig(judge="paper", pr_form="literal"))
    assert literal.judge(literal.open(Q, PASSAGES, max_new_tokens=8),
                         layer=verdict.layer).score == pytest.approx(verdict.score_literal)
    _, curves = decoder.fusion_layer(streams)
    assert len(curves["f"]) == tiny.num_layers - 1
    assert 1 <= len(curves["g"]) <= tiny.num_layers - 1
    assert all(g <= decoder.config.a for g in curves["g"][:-1])  # stops at the first above a
    assert all(0.0 <= f <= 1.0 + 1e-6 for f in curves["f"])
    with pytest.raises(ValueError, match="fusion_layer=9 out of range"):
        TokRAGDecoder(tiny, TokRAGConfig(judge="paper", fusion_layer=9))


def test_threshold_a_and_layers_searched(tiny: Any) -> None:
    """layer_rule="paper-jsd" (the reading before issue 55): |g| from layer 1, deepest if
    none passes."""
    top = tiny.num_layers - 1
    # a = 0: g(l) exceeds it at the first searched layer, so the lens stops there.
    eager = TokRAGDecoder(tiny, TokRAGConfig(judge="paper", a=0.0, layer_rule="paper-jsd"))
    _, curves = eager.fusion_layer(eager.open(Q, PASSAGES, max_new_tokens=8))
    assert len(curves["g"]) == 1 and curves["g"][0] > 0.0 and curves["fired"] == 1
    # An a no JSD difference can exceed: every searched layer is read, l* leans to the top.
    never = TokRAGDecoder(tiny, TokRAGConfig(judge="paper", a=10.0, layer_rule="paper-jsd"))
    layer, curves = never.fusion_layer(never.open(Q, PASSAGES, max_new_tokens=8))
    assert len(curves["g"]) == top and max(curves["g"]) <= 10.0 and curves["fired"] is None
    by_attention = never.searched[max(range(top), key=curves["f"].__getitem__)]
    assert layer == (by_attention + top) // 2
    # Two layers searched: the ends of the range; l* snaps to one of them.
    thin = TokRAGDecoder(tiny, TokRAGConfig(judge="paper", search_layers=2,
                                            layer_rule="paper-jsd"))
    assert thin.searched == [1, top]
    assert set(thin.capture()[1]) == {1, top} and set(thin.capture()[0]) == {0, 1, top - 1, top}
    g = thin.generate(Q, passages=PASSAGES, max_new_tokens=8)
    assert g.disagreements and {c.layer for c in g.disagreements} <= {1, top}


def test_authors_layer_rule_plumbing(tiny: Any) -> None:
    """layer_rule="authors" (the default) on the tiny model's 4 layers: pairs of hidden
    states (i, i + 1) with i > 10/32 * 4 = 1.25, i.e. (2, 3) and (3, 4 = the output);
    a signed test; d = i - 1; none -> round(20/32 * 4) = 2. (Values on SmolLM2 against the
    authors' formula: tests/fidelity/test_tokrag_fidelity.py.)"""
    from rag_gates.tokrag.decoder import authors_search_bounds

    assert tiny.num_layers == 4 and TokRAGConfig().layer_rule == "authors"
    assert authors_search_bounds(32) == (10.0, 20) and authors_search_bounds(4) == (1.25, 2)
    never = TokRAGDecoder(tiny, TokRAGConfig(judge="paper", a=10.0))
    assert never.candidates == [0, 1, 2, 3, 4] and never.searched == [1, 2, 3]
    layer, curves = never.fusion_layer(never.open(Q, PASSAGES, max_new_tokens=8))
    assert len(curves["g"]) == 2 and curves["fired"] is None
    by_attention = never.searched[max(range(3), key=curves["f"].__getitem__)]
    assert layer == (by_attention + 2) // 2
    # a = 0: the first pair whose signed difference is positive (not |.|) fires.
    eager = TokRAGDecoder(tiny, TokRAGConfig(judge="paper", a=0.0))
    layer, curves = eager.fusion_layer(eager.open(Q, PASSAGES, max_new_tokens=8))
    assert all(x <= 0.0 for x in curves["g"][:-1])
    if curves["fired"] is not None:
        assert curves["g"][-1] > 0.0 and curves["fired"] == 1 + len(curves["g"])
        assert layer == (by_attention + curves["fired"] - 1) // 2
    # Thinned: the pairs run over the searched layers between the two ends.
    thin = TokRAGDecoder(tiny, TokRAGConfig(judge="paper", search_layers=2))
    assert thin.searched == [1, 3] and thin.candidates == [0, 1, 3, 4]
    g = thin.generate(Q, passages=PASSAGES, max_new_tokens=8)
    assert g.disagreements and {c.layer for c in g.disagreements} <= {1, 3}


def test_passage_positions_are_the_passage_tokens(tiny: Any) -> None:
    decoder = TokRAGDecoder(tiny, PAPER)
    streams = decoder.open(Q, PASSAGES, max_new_tokens=4)
    text = tiny.tokenizer.decode(streams.passage_ids)
    assert "The capital of France is Paris." in text and "Question" not in text
    assert streams.passage_positions == sorted(streams.passage_positions)


def test_cad_alpha_zero_is_standard_rag(tiny: Any) -> None:
    single = tiny.generate(qa_prompt(Q, PASSAGES), max_new_tokens=10)
    cad = CADDecoder(tiny, alpha=0.0).generate(Q, passages=PASSAGES, max_new_tokens=10)
    assert cad.text == single.text
    ada = AdaCADDecoder(tiny).generate(Q, passages=PASSAGES, max_new_tokens=6)
    assert all(c.alpha is not None and 0.0 <= c.alpha <= 1.0 for c in ada.choices)
    with pytest.raises(ValueError, match="alpha"):
        CADDecoder(tiny, alpha=-1.0)


def test_no_passages_is_plain_generation_with_a_warning(tiny: Any) -> None:
    g = TokRAGDecoder(tiny, PAPER).generate(Q, passages=[], max_new_tokens=8)
    assert g.text == tiny.generate(qa_prompt(Q), max_new_tokens=8).text
    assert g.choices == [] and g.warnings
    assert g.trace.events[0].kind == "note" and "no passages" in g.trace.events[0].data["message"]


def test_long_passages_are_cut_and_counted(tiny: Any) -> None:
    long = [Passage(text="Paris is the capital. " * 10), Passage(text="London words " * 200)]
    g = TokRAGDecoder(tiny, PAPER).generate(Q, passages=long, max_new_tokens=8)
    assert g.truncated_tokens > 0 and any("cut" in w for w in g.warnings)
    assert g.passages[0] == long[0] and len(g.passages[-1].text) < len(long[1].text)
    assert g.prompt_tokens + 8 <= tiny.max_context
    assert long[1].text == "London words " * 200  # the caller's passage is unchanged


def test_bad_input(tiny: Any) -> None:
    with pytest.raises(WhiteBoxRequiredError):
        TokRAGDecoder(TextOnly())
    with pytest.raises(WhiteBoxRequiredError):
        CADDecoder(TextOnly())
    for config in (5e-7, {"a": 5e-7}):  # the settings positionally, not a TokRAGConfig
        with pytest.raises(TypeError, match=r"config must be a TokRAGConfig \(e.g."):
            TokRAGDecoder(tiny, config)  # type: ignore[arg-type]
    decoder = TokRAGDecoder(tiny, PAPER)
    with pytest.raises(ValueError, match="question is empty"):
        decoder.generate("  ", passages=PASSAGES)
    with pytest.raises(TypeError, match="passages must be a list"):
        decoder.generate(Q, passages="a passage")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="greedily"):
        decoder.generate(Q, passages=PASSAGES, temperature=0.7)
    with pytest.raises(ContextLengthError):
        decoder.generate("why " * 300 + "?", passages=PASSAGES, max_new_tokens=4)
