"""as_text_lm: any LlamaIndex LLM as a rag-gates TextLM."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from llama_index.core.base.llms.types import (
    CompletionResponse,
    CompletionResponseGen,
    LLMMetadata,
    LogProb,
)
from llama_index.core.bridge.pydantic import Field
from llama_index.core.llms import CustomLLM, MockLLM
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.llms.rag_gates import (
    LOGPROBS_LAYOUT,
    RagGatesLLM,
    as_text_lm,
    from_llama_index_logprobs,
)

from rag_gates.lm.base import BaseTextLM, TextLM
from rag_gates.lm.hf import HFWhiteBoxLM

PROMPT = "What is the capital of France?"
MESSAGES = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Who wrote Hamlet?"},
]


def _same(a: Any, b: Any) -> bool:
    return bool(a.model_dump(exclude={"latency_ms"}) == b.model_dump(exclude={"latency_ms"}))


# ---------------------------------------------------------------- over RagGatesLLM
@pytest.fixture
def wrapped(tiny_li: HFWhiteBoxLM) -> BaseTextLM:
    return as_text_lm(RagGatesLLM(lm=tiny_li))


def test_is_a_text_lm(wrapped: BaseTextLM, tiny_li: HFWhiteBoxLM) -> None:
    assert isinstance(wrapped, TextLM)
    assert wrapped.model_id == tiny_li.model_id
    assert wrapped.supports_logprobs is True


@pytest.mark.parametrize("prompt", [PROMPT, MESSAGES], ids=["str", "messages"])
def test_generate_over_rag_gates_llm_equals_direct(
    wrapped: BaseTextLM, tiny_li: HFWhiteBoxLM, prompt: Any
) -> None:
    for kwargs in ({}, {"logprobs": 3}, {"max_new_tokens": 5, "logprobs": 0}):
        assert _same(wrapped.generate(prompt, **kwargs), tiny_li.generate(prompt, **kwargs))


def test_stop_over_rag_gates_llm_equals_direct(wrapped: BaseTextLM, tiny_li: HFWhiteBoxLM) -> None:
    full = tiny_li.generate(PROMPT, max_new_tokens=16).text
    stop = [full[4:6]]
    direct = tiny_li.generate(PROMPT, max_new_tokens=16, stop=stop, logprobs=2)
    assert direct.finish_reason == "stop"
    assert _same(wrapped.generate(PROMPT, max_new_tokens=16, stop=stop, logprobs=2), direct)
    assert "".join(wrapped.stream(PROMPT, max_new_tokens=16, stop=stop)) == direct.text


@pytest.mark.parametrize("prompt", [PROMPT, MESSAGES], ids=["str", "messages"])
def test_stream_over_rag_gates_llm_equals_direct(
    wrapped: BaseTextLM, tiny_li: HFWhiteBoxLM, prompt: Any
) -> None:
    assert list(wrapped.stream(prompt, max_new_tokens=10)) == list(
        tiny_li.stream(prompt, max_new_tokens=10)
    )


@pytest.mark.asyncio
@pytest.mark.parametrize("prompt", [PROMPT, MESSAGES], ids=["str", "messages"])
async def test_async_over_rag_gates_llm_equals_sync(wrapped: BaseTextLM, prompt: Any) -> None:
    sync = wrapped.generate(prompt, max_new_tokens=8, logprobs=2)
    assert _same(await wrapped.agenerate(prompt, max_new_tokens=8, logprobs=2), sync)
    pieces = [p async for p in wrapped.astream(prompt, max_new_tokens=8)]
    assert pieces == list(wrapped.stream(prompt, max_new_tokens=8))


# ---------------------------------------------------------------- over MockLLM (echoes)
def test_mock_llm_text_and_stop_by_truncation() -> None:
    lm = as_text_lm(MockLLM())
    assert lm.supports_logprobs is False
    g = lm.generate("hello world")
    assert (g.text, g.finish_reason, g.logprobs) == ("hello world", "eos", None)
    g = lm.generate("hello STOP world", stop=["STOP"])
    assert (g.text, g.finish_reason) == ("hello ", "stop")
    # Nothing was requested, nothing is invented.
    assert lm.generate("hello", logprobs=3).logprobs is None


def test_mock_llm_stream_cuts_at_a_stop_split_over_deltas() -> None:
    lm = as_text_lm(MockLLM())
    # MockLLM streams one character per delta, so "STOP" arrives in four pieces.
    assert "".join(lm.stream("hello world")) == "hello world"
    assert "".join(lm.stream("hello STOP world", stop=["STOP"])) == "hello "
    assert "".join(lm.stream("abc", stop=["c", "zz"])) == "ab"


def test_stop_cut_is_where_the_first_stop_completes() -> None:
    lm = as_text_lm(MockLLM())
    # "c" completes before "abcd" does, as a generating model would stop there.
    text = "xx abcd yy"
    assert lm.generate(text, stop=["abcd", "c"]).text == "xx ab"
    assert "".join(lm.stream(text, stop=["abcd", "c"])) == "xx ab"
    assert lm.generate(text, stop=["cd", "bcd"]).text == "xx a"  # same end: earlier start


def test_mock_llm_messages_go_through_chat() -> None:
    lm = as_text_lm(MockLLM())
    # CustomLLM.chat flattens messages with messages_to_prompt; MockLLM echoes that.
    expected = "system: Answer briefly.\nuser: Who wrote Hamlet?\nassistant: "
    assert lm.generate(MESSAGES).text == expected
    assert "".join(lm.stream(MESSAGES)) == expected


@pytest.mark.asyncio
async def test_mock_llm_async() -> None:
    lm = as_text_lm(MockLLM())
    g = await lm.agenerate("hello STOP world", stop=["STOP"])
    assert (g.text, g.finish_reason) == ("hello ", "stop")
    assert "".join([p async for p in lm.astream("hello STOP world", stop=["STOP"])]) == "hello "
    assert "".join([p async for p in lm.astream(MESSAGES)]) == lm.generate(MESSAGES).text


def test_arguments_are_validated() -> None:
    lm = as_text_lm(MockLLM())
    with pytest.raises(ValueError, match="empty"):
        lm.generate("   ")
    with pytest.raises(ValueError, match="max_new_tokens"):
        lm.generate("hi", max_new_tokens=0)
    with pytest.raises(TypeError, match="LLM"):
        as_text_lm("not an llm")  # type: ignore[arg-type]


# ---------------------------------------------------------------- other LLMs' logprobs
class _OpenAIStyleLLM(CustomLLM):
    """Returns fixed text with OpenAI-layout logprobs (rows of top alternatives only)."""

    with_logprobs: bool = True
    first_logprob: float = -0.1
    text: str = "Paris."  # what the rows' first tokens spell: decoded greedily
    seen: dict[str, Any] = Field(default_factory=dict)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="openai-style")

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self.seen.update(kwargs)
        rows = [
            [
                LogProb(token="Par", logprob=self.first_logprob, bytes=[80, 97, 114]),
                LogProb(token="Lon", logprob=-2.5),
            ],
            [LogProb(token="is", logprob=-0.2), LogProb(token="i", logprob=-1.9)],
            [LogProb(token=".", logprob=-0.3), LogProb(token="!", logprob=-1.4)],
        ]
        return CompletionResponse(
            text=self.text,
            logprobs=rows if self.with_logprobs else None,
            additional_kwargs={"prompt_tokens": 7, "completion_tokens": 3},
        )

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        yield CompletionResponse(text="Paris.", delta="Paris.")


def test_openai_layout_logprobs_are_converted() -> None:
    llm = _OpenAIStyleLLM()
    lm = as_text_lm(
        llm,
        supports_logprobs=True,
        call_kwargs=lambda o: {"max_tokens": o.max_new_tokens, "stop": list(o.stop)},
    )
    assert lm.model_id == "openai-style" and lm.supports_logprobs
    g = lm.generate("Capital of France?", max_new_tokens=9, logprobs=1)
    assert llm.seen == {"max_tokens": 9, "stop": []}
    assert (g.prompt_tokens, g.completion_tokens) == (7, 3)
    assert g.logprobs is not None
    assert [(t.token, t.logprob) for t in g.logprobs] == [("Par", -0.1), ("is", -0.2), (".", -0.3)]
    assert [[a.token for a in t.top_logprobs] for t in g.logprobs] == [["Par"], ["is"], ["."]]
    assert g.logprobs[0].bytes == [80, 97, 114] and g.logprobs[1].bytes is None
    # A stop cut keeps the tokens through the one that completed the stop string.
    cut = lm.generate("Capital of France?", stop=["is"], logprobs=0)
    assert cut.text == "Par" and cut.logprobs is not None
    assert [t.token for t in cut.logprobs] == ["Par", "is"]


def test_a_logprob_above_zero_makes_the_confidence_gate_retrieve() -> None:
    """The adapter passes on what the LLM sent; a log-probability of +0.3 is not one, and
    the gate reading it must not take it for "more than certain" and skip retrieval."""
    from rag_gates.confidence import AnswerLogprobGate

    def decide(first: float) -> Any:
        lm = as_text_lm(_OpenAIStyleLLM(first_logprob=first), supports_logprobs=True)
        return AnswerLogprobGate(lm, threshold=0.5).decide("Capital of France?")

    assert decide(-0.1).retrieve is False  # -mean log p = 0.2: confident
    broken = decide(0.3)
    assert broken.retrieve is True and "undecided" in broken.evidence
    assert "answer token 0" in broken.reason and "above 0.0" in broken.reason, broken.reason


def test_declared_logprobs_missing_raises() -> None:
    from rag_gates.confidence import AnswerLogprobGate
    from rag_gates.errors import LogprobsMissingError

    lm = as_text_lm(_OpenAIStyleLLM(with_logprobs=False), supports_logprobs=True)
    with pytest.raises(LogprobsMissingError, match="supports_logprobs=False"):
        lm.generate("Capital of France?", logprobs=2)
    assert lm.generate("Capital of France?").text == "Paris."
    # A gate reading them cannot decide: it retrieves and says why, not raise.
    d = AnswerLogprobGate(lm, threshold=0.5).decide("Capital of France?")
    assert d.retrieve is True and "undecided" in d.evidence
    assert "LogprobsMissingError" in d.reason, d.reason


def test_a_sampled_answer_has_no_logprobs_to_read_and_the_gate_retrieves() -> None:
    """OpenAI-layout rows list only the likeliest tokens; an LLM that sampled " Paris"'s
    rival wrote "London." while the rows say "Par" "is" ".": reading them as the written
    tokens made the answer look confident and the gate skip (audit s15 #1)."""
    from rag_gates.confidence import AnswerLogprobGate
    from rag_gates.errors import LogprobsMissingError

    lm = as_text_lm(_OpenAIStyleLLM(text="London."), supports_logprobs=True)
    with pytest.raises(LogprobsMissingError, match="do not spell the text it wrote"):
        lm.generate("Capital of France?", logprobs=0)
    assert lm.generate("Capital of France?").text == "London."  # no logprobs asked: fine
    d = AnswerLogprobGate(lm, threshold=1.0).decide("Capital of France?")
    assert d.retrieve is True and "LogprobsMissingError" in d.reason, d.reason
    # Whitespace around the text is no sampling; nor is a stop string the server cut from
    # the text but not from the log-probabilities ("." here), nor a piece of a character a
    # server sent as U+FFFD.
    padded = as_text_lm(_OpenAIStyleLLM(text=" Paris.\n"), supports_logprobs=True)
    assert padded.generate("Capital of France?", logprobs=0).logprobs is not None
    cut = as_text_lm(_OpenAIStyleLLM(text="Paris"), supports_logprobs=True,
                     call_kwargs=lambda o: {"stop": list(o.stop)})
    assert cut.generate("Capital of France?", stop=["."], logprobs=0).logprobs is not None
    from llama_index.llms.rag_gates.text_lm import _first_tokens_spell

    pieces = [[LogProb(token="Caf", logprob=-0.1)], [LogProb(token="\ufffd", logprob=-0.2)]]
    assert _first_tokens_spell(pieces, "Café")
    assert not _first_tokens_spell(pieces, "Cab")


def test_from_llama_index_logprobs_layouts() -> None:
    rows: Sequence[Sequence[LogProb]] = [
        [LogProb(token="a", logprob=-1.0), LogProb(token="b", logprob=-0.5)]
    ]
    chosen_first = from_llama_index_logprobs(rows, 5, layout="chosen_then_top")
    assert chosen_first is not None
    assert chosen_first[0].token == "a"
    assert [t.token for t in chosen_first[0].top_logprobs] == ["b"]
    # RagGatesLLM's rows leave the generated token out of its alternatives: it is put back
    # by its log-probability, so the top-k reads as the model's own.
    alternatives = from_llama_index_logprobs(
        [[LogProb(token="b", logprob=-0.5), LogProb(token="a", logprob=-1.0),
          LogProb(token="c", logprob=-2.0)]], 2, layout=LOGPROBS_LAYOUT)
    assert alternatives is not None and alternatives[0].token == "b"
    assert [t.token for t in alternatives[0].top_logprobs] == ["b", "a"]
    top_only = from_llama_index_logprobs(rows, 5)
    assert top_only is not None
    assert [t.token for t in top_only[0].top_logprobs] == ["a", "b"]
    assert from_llama_index_logprobs([[]], 5) is None
