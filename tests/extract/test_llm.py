"""LLMExtractor: prompt format, robust parsing of malformed replies, a random model."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest

from rag_gates.errors import ExtractionError
from rag_gates.extract import Claim, Extractor, LLMExtractor, parse_items
from rag_gates.extract.llm import FEW_SHOT, INSTRUCTION
from rag_gates.lm.base import BaseTextLM, Prompt
from rag_gates.types import Generation


class CannedLM(BaseTextLM):
    """A fake of the *model*: always replies with the same text; records the prompts."""

    def __init__(self, reply: str) -> None:
        self.reply = reply
        self.prompts: list[Prompt] = []
        self.stops: list[Sequence[str] | None] = []

    @property
    def model_id(self) -> str:
        return "canned"

    def generate(self, prompt: Prompt, *, max_new_tokens: int = 128,
                 stop: Sequence[str] | None = None, temperature: float = 0.0,
                 logprobs: int | None = None, **kwargs: Any) -> Generation:
        self.prompts.append(prompt)
        self.stops.append(stop)
        return Generation(text=self.reply, finish_reason="stop")


def triples(claims: list[Claim]) -> list[tuple[str, str, str | None]]:
    return [(c.head, c.relation, c.tail) for c in claims]


def test_well_formed_statement_and_question() -> None:
    lm = CannedLM('[["Coulson Wallop", "father", "Nigel Wallop"], '
                  '["Nigel Wallop", "studied at", "Eton College"]]')
    ex = LLMExtractor(lm)
    assert isinstance(ex, Extractor)
    assert triples(ex.claims("Coulson Wallop's father, Nigel Wallop, studied at Eton College.")) \
        == [("Coulson Wallop", "father", "Nigel Wallop"),
            ("Nigel Wallop", "studied at", "Eton College")]
    lm.reply = '[["Kumbasaram", "came out"], ["Mystery of the 13th Guest", "came out"]]'
    q = "Which film came out first, Kumbasaram or Mystery Of The 13th Guest?"
    assert ex.entities(q) == ["Kumbasaram", "Mystery of the 13th Guest"]
    assert all(c.is_partial for c in ex.claims(q))


def test_prompt_is_the_paper_format() -> None:
    lm = CannedLM("[]")
    ex = LLMExtractor(lm)
    ex.claims("Kumbasaram was released in 2017.")
    prompt = lm.prompts[-1]
    assert isinstance(prompt, str)
    assert prompt.startswith(INSTRUCTION)
    for source, target in FEW_SHOT:
        assert f"Input: {source}\nOutput: {target}" in prompt
    assert prompt.endswith("Input: Kumbasaram was released in 2017.\nOutput:")
    assert lm.stops[-1] == ["\n"]
    chat = LLMExtractor(lm, chat=True).prompt("Who wrote Hamlet?")
    assert isinstance(chat, list)
    assert chat[0] == {"role": "system", "content": INSTRUCTION}
    assert chat[-1] == {"role": "user", "content": "Who wrote Hamlet?"}
    assert len(chat) == 2 + 2 * len(FEW_SHOT)


def test_non_factual_shortcut_skips_the_model() -> None:
    lm = CannedLM('[["Kumbasaram", "came out", "first"]]')
    assert LLMExtractor(lm).claims("Thus, Kumbasaram came out first.") == []
    assert lm.prompts == []
    raw = LLMExtractor(lm, skip_non_factual=False)
    assert len(raw.claims("Thus, Kumbasaram came out first.")) == 1


def test_a_question_that_opens_like_a_conclusion_still_reaches_the_model() -> None:
    """Before, "So who directed Ed Wood?" matched the conclusion shortcut: no entity, and
    QuCo skipped retrieval on it."""
    lm = CannedLM('[["Ed Wood", "director", ""]]')
    assert LLMExtractor(lm).entities("So who directed Ed Wood?") == ["Ed Wood"]
    assert len(lm.prompts) == 1


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("[]", []),
        ("Output: [[\"Kumbasaram\", \"released in\", \"2017\"]]",
         [("Kumbasaram", "released in", "2017")]),
        ("[['Kumbasaram', 'released in', '2017']]", [("Kumbasaram", "released in", "2017")]),
        ('["Kumbasaram", "released in", "2017"]', [("Kumbasaram", "released in", "2017")]),
        ('[["Kumbasaram", "released in", "2017"]', [("Kumbasaram", "released in", "2017")]),
        ('[["Kumbasaram", "released in", "2017"], ["Kumbasa', [("Kumbasaram", "released in",
                                                                "2017")]),
        ('[["The film "Big Stone Gap" is set in", "Virginia"]]',
         [('The film "Big Stone Gap" is set in', "Virginia", None)]),
        ('[["A", "r", "B"], ["A", "r", "B"]]', [("A", "r", "B")]),
        ('[["A", "r", ""]]', [("A", "r", None)]),
    ],
)
def test_parse_variants(reply: str, expected: list[tuple[str, str, str | None]]) -> None:
    assert triples(parse_items(reply)) == expected


@pytest.mark.parametrize(
    "reply",
    ["", "   ", "I cannot help with that.", "{\"head\": \"A\"}", "[[[[[[", "[1, 2, 3]",
     '[["", "relation", "tail"]]', '[["A"]]', '[["A", "b", "c", "d"]]', '[["A", 3]]',
     "null", "[[null, null]]", "]]][[[", "\x00\x01\x02", "[" * 5000],
)
def test_malformed_replies_raise_or_give_empty_and_warn(
        reply: str, caplog: pytest.LogCaptureFixture) -> None:
    """A reply with no usable item is not the model's "[]": by default it raises (a gate
    then cannot decide and retrieves); with on_unreadable="empty" it is [] and a warning."""
    with pytest.raises(ExtractionError, match="canned"):
        LLMExtractor(CannedLM(reply)).claims("Kumbasaram was released in 2017.")
    with pytest.raises(ExtractionError):
        LLMExtractor(CannedLM(reply)).entities("When was Kumbasaram released?")
    ex = LLMExtractor(CannedLM(reply), on_unreadable="empty")
    with caplog.at_level(logging.WARNING, logger="rag_gates.extract.llm"):
        assert ex.claims("Kumbasaram was released in 2017.") == []
        assert ex.entities("When was Kumbasaram released?") == []
    assert caplog.records, "a malformed reply must be logged"


@pytest.mark.parametrize("reply", ["[]", "[ ]", "[].", "Output: []", "[[]]"])
def test_the_models_own_empty_list_is_no_entity(reply: str) -> None:
    ex = LLMExtractor(CannedLM(reply))
    assert ex.claims("It was a good year.") == [] and ex.entities("Why not?") == []


def test_question_items_drop_tails() -> None:
    ex = LLMExtractor(CannedLM('[["Diane Meyer Simon", "husband", "Bill Simon"]]'))
    assert triples(ex.claims("Where did Diane Meyer Simon's husband graduate from?")) == [
        ("Diane Meyer Simon", "husband", None)]


@pytest.mark.parametrize("text", ["", "   ", "\n"])
def test_empty_input_does_not_call_the_model(text: str) -> None:
    lm = CannedLM("garbage")
    ex = LLMExtractor(lm)
    assert ex.entities(text) == [] and ex.claims(text) == []
    assert lm.prompts == []


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="TextLM"):
        LLMExtractor(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_new_tokens"):
        LLMExtractor(CannedLM("[]"), max_new_tokens=0)
    with pytest.raises(ValueError, match="on_unreadable"):
        LLMExtractor(CannedLM("[]"), on_unreadable="skip")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        LLMExtractor(CannedLM("[]")).claims(None)  # type: ignore[arg-type]


async def test_async_and_batch() -> None:
    ex = LLMExtractor(CannedLM('[["A", "r", "B"]]'))
    assert triples(await ex.aclaims("A r B.")) == [("A", "r", "B")]
    with pytest.raises(ExtractionError, match="absent from the input"):
        ex.entities_batch(["A?", "B?"])  # "A" is not in "B?": nothing of the input's found
    lenient = LLMExtractor(CannedLM('[["A", "r", "B"]]'), on_unreadable="empty")
    assert lenient.entities_batch(["A?", "B?"]) == [["A"], []]


def test_grounding_drops_copied_examples() -> None:
    # Small models copy the few-shot examples: items absent from the input are dropped.
    lm = CannedLM('[["Diane Meyer Simon", "husband"], ["Scott Derrickson", "born in", "1966"]]')
    sentence = "Scott Derrickson was born in 1966."
    assert triples(LLMExtractor(lm).claims(sentence)) == [("Scott Derrickson", "born in", "1966")]
    assert len(LLMExtractor(lm, grounded=False).claims(sentence)) == 2
    lm.reply = '[["Scott Derrickson", "born in", "1970"]]'  # a tail not in the text
    with pytest.raises(ExtractionError, match="absent from the input"):
        LLMExtractor(lm).claims(sentence)
    assert LLMExtractor(lm, on_unreadable="empty").claims(sentence) == []


def test_tiny_random_model_never_raises() -> None:
    """Garbage from a random-weight model, read leniently: lists of claims, never an
    exception (by default the same garbage is an ExtractionError, tested above)."""
    from rag_gates.testing import tiny_lm

    tiny = tiny_lm(seed=1, max_context=2048)  # the few-shot prompt is ~1.1k tiny-BPE tokens
    ex = LLMExtractor(tiny, max_new_tokens=24, on_unreadable="empty")
    for text in ["Kumbasaram was released in 2017.",
                 "Which film came out first, Kumbasaram or Mystery Of The 13th Guest?",
                 "Who created Tom and Jerry?"]:
        claims = ex.claims(text)
        assert isinstance(claims, list) and all(isinstance(c, Claim) for c in claims)
        assert isinstance(ex.entities(text), list)
    chat = LLMExtractor(tiny, max_new_tokens=8, chat=True, on_unreadable="empty")
    assert isinstance(chat.claims("Kumbasaram was released in 2017."), list)
