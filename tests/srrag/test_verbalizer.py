"""The verbalizer on a tiny random-weight model (plumbing, not quality)."""

from __future__ import annotations

from typing import Any

import pytest

from rag_gates.lm.base import BaseTextLM
from rag_gates.srrag import GENREAD_PROMPT, Verbalizer
from rag_gates.types import Generation


def test_greedy_verbalization_is_a_flagged_parametric_passage(tiny: Any) -> None:
    v = Verbalizer(tiny, max_new_tokens=6)
    prompt = v.prompt("  Who wrote Hamlet? ")
    assert prompt == GENREAD_PROMPT.format(question="Who wrote Hamlet?")
    assert prompt.startswith("Generate a background document from Wikipedia")
    a = v.verbalize("Who wrote Hamlet?")
    b = v.verbalize("Who wrote Hamlet?")
    assert a == b  # greedy: the same document, the same id
    g = tiny.generate(prompt, max_new_tokens=6)
    assert a.text == g.text.strip()
    assert a.metadata["source"] == "parametric"
    assert a.metadata["model_id"] == "tiny-llama-seed0"
    assert a.metadata["tokens"] == g.completion_tokens
    assert a.metadata["hit_token_cap"] is (g.finish_reason == "length")
    assert a.id is not None and a.id.startswith("parametric-")


def test_sampling_is_seeded(tiny: Any) -> None:
    v = Verbalizer(tiny, max_new_tokens=8)
    s1 = v.verbalize("Who wrote Hamlet?", temperature=1.0, seed=1)
    s2 = v.verbalize("Who wrote Hamlet?", temperature=1.0, seed=1)
    others = {v.verbalize("Who wrote Hamlet?", temperature=1.0, seed=s).text for s in range(2, 6)}
    assert s1 == s2 and s1.metadata["seed"] == 1
    assert len(others | {s1.text}) > 1


def test_token_cap_flag_follows_the_finish_reason(tiny: Any) -> None:
    v = Verbalizer(tiny, max_new_tokens=5)
    capped = v.passage("q?", Generation(text=" text ", finish_reason="length",
                                        completion_tokens=5))
    ended = v.passage("q?", Generation(text="text", finish_reason="eos", completion_tokens=2))
    assert capped.metadata["hit_token_cap"] is True and capped.text == "text"
    assert ended.metadata["hit_token_cap"] is False


class _Echo(BaseTextLM):
    """A text-only model that repeats the last prompt line."""

    @property
    def model_id(self) -> str:
        return "echo"

    def generate(self, prompt: Any, *, max_new_tokens: int = 128, stop: Any = None,
                 temperature: float = 0.0, logprobs: int | None = None) -> Generation:
        words = str(prompt).splitlines()[-2].split()
        return Generation(text=" ".join(words[:max_new_tokens]),
                          finish_reason="length" if len(words) > max_new_tokens else "eos",
                          completion_tokens=min(len(words), max_new_tokens))


async def test_any_text_model_verbalizes() -> None:
    v = Verbalizer(_Echo(), max_new_tokens=3)
    p = await v.averbalize("Who wrote Hamlet?")
    assert p.text == "Question: Who wrote" and p.metadata["hit_token_cap"] is True


def test_bad_input_is_refused(tiny: Any) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        Verbalizer(tiny, prompt="no field")
    with pytest.raises(ValueError, match="valid template"):
        Verbalizer(tiny, prompt="{question} {other}")
    with pytest.raises(TypeError, match="TextLM"):
        Verbalizer(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="question is empty"):
        Verbalizer(tiny).verbalize("  ")
    with pytest.raises(ValueError):
        Verbalizer(tiny, max_new_tokens=0)


def test_reuse_returns_the_same_greedy_document_and_says_so(tiny: Any) -> None:
    fresh = Verbalizer(tiny, max_new_tokens=6).verbalize("Who wrote Hamlet?")
    v = Verbalizer(tiny, max_new_tokens=6, reuse=1)
    first = v.verbalize("Who wrote Hamlet?")
    again = v.verbalize("Who wrote Hamlet?")
    assert first.text == again.text == fresh.text and first.id == again.id == fresh.id
    assert first.metadata["reused"] is False and again.metadata["reused"] is True
    assert again.metadata["verbalize_ms"] == first.metadata["verbalize_ms"] > 0
    # Sampling is never reused; one remembered question: another evicts it.
    sampled = v.verbalize("Who wrote Hamlet?", temperature=1.0, seed=3)
    assert "reused" not in sampled.metadata
    v.verbalize("Who painted the Mona Lisa?")
    assert v.verbalize("Who wrote Hamlet?").metadata["reused"] is False
    assert "reused" not in Verbalizer(tiny, max_new_tokens=6).verbalize("q?").metadata
    with pytest.raises(ValueError, match="reuse"):
        Verbalizer(tiny, reuse=-1)
