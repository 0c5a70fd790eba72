"""as_text_lm: LangChain models behind the rag-gates TextLM protocol."""

from __future__ import annotations

from typing import Any, cast

import pytest
from langchain_core.caches import InMemoryCache
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.fake import FakeListLLM
from langchain_core.language_models.fake_chat_models import (
    FakeListChatModel,
    GenericFakeChatModel,
)
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field

from langchain_rag_gates import ChatRagGates, LangChainTextLM, as_text_lm
from langchain_rag_gates.language_models import _finish_reason
from rag_gates.lm.base import TextLM
from rag_gates.lm.hf import HFWhiteBoxLM
from rag_gates.lm.stops import StopCutter
from rag_gates.types import ChatMessage

QUESTION = "What is the capital of France?"
MESSAGES = [
    ChatMessage(role="system", content="Answer in one word."),
    ChatMessage(role="user", content=QUESTION),
]


class _Recorder(BaseChatModel):
    """A fake chat model that records what reached it and replies with fixed text."""

    reply: str = "Paris is the capital."
    temperature: float | None = None
    reply_metadata: dict[str, Any] = Field(default_factory=dict)
    # A shallow model_copy shares this list, so calls on per-call copies land here too.
    calls: list[dict[str, Any]] = Field(default_factory=list)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.calls.append(
            {
                "messages": messages,
                "stop": stop,
                "max_tokens": getattr(self, "max_tokens", None),
                "num_predict": getattr(self, "num_predict", None),
                "temperature": self.temperature,
                "kwargs": kwargs,
            }
        )
        message = AIMessage(
            content=self.reply,
            response_metadata=dict(self.reply_metadata),
            usage_metadata={"input_tokens": 7, "output_tokens": 5, "total_tokens": 12},
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    @property
    def _llm_type(self) -> str:
        return "recording"


class RecordingChat(_Recorder):
    max_tokens: int | None = None


class PredictChat(_Recorder):
    """Declares Ollama's name for the token limit."""

    num_predict: int | None = None


# ---------------------------------------------------------------- over ChatRagGates
@pytest.fixture
def lm(tiny: HFWhiteBoxLM) -> TextLM:
    return as_text_lm(ChatRagGates(lm=tiny, max_tokens=64))


def test_protocol_and_capabilities(lm: TextLM) -> None:
    assert isinstance(lm, TextLM)
    assert isinstance(lm, LangChainTextLM)
    assert lm.model_id == "tiny-llama-seed0"
    assert lm.supports_logprobs


@pytest.mark.parametrize("prompt", [QUESTION, MESSAGES], ids=["str", "messages"])
def test_generate_round_trips_direct_generate(
    lm: TextLM, tiny: HFWhiteBoxLM, prompt: Any
) -> None:
    g = lm.generate(prompt, max_new_tokens=9, logprobs=2)
    direct = tiny.generate(prompt, max_new_tokens=9, logprobs=2)
    assert g.text == direct.text
    assert g.finish_reason == direct.finish_reason
    assert g.logprobs == direct.logprobs
    assert (g.prompt_tokens, g.completion_tokens) == (
        direct.prompt_tokens,
        direct.completion_tokens,
    )


def test_generate_without_logprobs_and_with_stop(lm: TextLM, tiny: HFWhiteBoxLM) -> None:
    text = tiny.generate(QUESTION, max_new_tokens=12).text
    stop = text[2:4]
    g = lm.generate(QUESTION, max_new_tokens=12, stop=[stop])
    direct = tiny.generate(QUESTION, max_new_tokens=12, stop=[stop])
    assert (g.text, g.finish_reason, g.logprobs) == (direct.text, "stop", None)


def test_stream_joins_to_generate_text(lm: TextLM) -> None:
    pieces = list(lm.stream(MESSAGES, max_new_tokens=10))
    assert len(pieces) > 1
    assert "".join(pieces) == lm.generate(MESSAGES, max_new_tokens=10).text


async def test_async_paths_match_sync(lm: TextLM) -> None:
    sync = lm.generate(MESSAGES, max_new_tokens=10, logprobs=1)
    asynchronous = await lm.agenerate(MESSAGES, max_new_tokens=10, logprobs=1)
    assert asynchronous.latency_ms > 0
    assert asynchronous.model_copy(update={"latency_ms": 0}) == sync.model_copy(
        update={"latency_ms": 0}
    )
    pieces = [p async for p in lm.astream(MESSAGES, max_new_tokens=10)]
    assert "".join(pieces) == sync.text


def test_per_call_settings_leave_the_wrapped_model_unchanged(tiny: HFWhiteBoxLM) -> None:
    chat = ChatRagGates(lm=tiny, max_tokens=64)
    lm = as_text_lm(chat)
    g = lm.generate(QUESTION, max_new_tokens=3, temperature=0.0, logprobs=1)
    assert g.completion_tokens <= 3
    assert (chat.max_tokens, chat.logprobs, chat.top_logprobs) == (64, False, None)


def test_llm_cache_keys_follow_per_call_settings(tiny: HFWhiteBoxLM) -> None:
    # A cache must not hand back a 2-token answer for an 8-token request.
    chat = ChatRagGates(lm=tiny, max_tokens=64, cache=InMemoryCache())
    chat.invoke(QUESTION)
    lm = as_text_lm(chat)
    short = lm.generate(QUESTION, max_new_tokens=2)
    longer = lm.generate(QUESTION, max_new_tokens=8)
    assert short.text == tiny.generate(QUESTION, max_new_tokens=2).text
    assert longer.text == tiny.generate(QUESTION, max_new_tokens=8).text
    assert longer.text != short.text


def test_per_call_copy_drops_the_cached_serialised_form() -> None:
    # Serialisable models key LangChain's LLM cache (and traces) on a cached serialised
    # form; a per-call copy must compute its own, or every setting shares one cache entry.
    class SerialisableChat(RecordingChat):
        @classmethod
        def is_lc_serializable(cls) -> bool:
            return True

        def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
            self.reply = f"limit {self.max_tokens}"
            return super()._generate(messages, *args, **kwargs)

    chat = SerialisableChat(cache=InMemoryCache())
    chat.invoke(QUESTION)  # computes and caches the original's serialised form
    lm = as_text_lm(chat)
    assert lm.generate(QUESTION, max_new_tokens=2).text == "limit 2"
    assert lm.generate(QUESTION, max_new_tokens=8).text == "limit 8"


# ---------------------------------------------------------------- over fake models
def test_generic_fake_chat_model_generate_and_stream() -> None:
    replies = iter([AIMessage("Paris is the capital."), AIMessage("Paris is the capital.")])
    lm = as_text_lm(GenericFakeChatModel(messages=replies))
    assert not lm.supports_logprobs
    g = lm.generate(QUESTION)
    assert (g.text, g.finish_reason, g.logprobs) == ("Paris is the capital.", "stop", None)
    pieces = list(lm.stream(QUESTION))
    assert len(pieces) > 1 and "".join(pieces) == "Paris is the capital."


def test_stop_is_applied_even_when_the_model_ignores_it() -> None:
    reply = "Paris. END of answer"
    lm = as_text_lm(GenericFakeChatModel(messages=iter([AIMessage(reply)] * 3)))
    g = lm.generate(QUESTION, stop=["END"])
    assert (g.text, g.finish_reason) == ("Paris. ", "stop")
    assert "".join(lm.stream(QUESTION, stop=["END"])) == "Paris. "
    assert "".join(lm.stream(QUESTION, stop=["nowhere"])) == reply


async def test_fake_list_chat_model_async_and_empty_reply() -> None:
    lm = as_text_lm(FakeListChatModel(responses=["", "Paris"]))
    g = await lm.agenerate(QUESTION)
    assert (g.text, g.finish_reason, g.logprobs) == ("", "stop", None)
    assert [p async for p in lm.astream(QUESTION)] == ["P", "a", "r", "i", "s"]


def test_llm_is_wrapped_too() -> None:
    lm = as_text_lm(FakeListLLM(responses=["Shakespeare wrote it."]))
    assert not lm.supports_logprobs
    g = lm.generate("Who wrote Hamlet?", stop=["it"])
    assert (g.text, g.finish_reason, g.prompt_tokens) == ("Shakespeare wrote ", "stop", 0)


def test_what_is_passed_to_the_model() -> None:
    chat = RecordingChat()
    lm = as_text_lm(chat)
    g = lm.generate(MESSAGES, max_new_tokens=17, stop=["\n\n"], temperature=0.3)
    call = chat.calls[-1]
    assert [type(m) for m in call["messages"]] == [SystemMessage, HumanMessage]
    assert [m.content for m in call["messages"]] == [m.content for m in MESSAGES]
    assert (call["max_tokens"], call["temperature"], call["stop"]) == (17, 0.3, ["\n\n"])
    assert call["kwargs"] == {}
    assert (chat.max_tokens, chat.temperature) == (None, None)  # set on a copy only
    assert (g.prompt_tokens, g.completion_tokens) == (7, 5)


async def test_extra_keyword_arguments_are_call_options() -> None:
    chat = RecordingChat()
    lm = as_text_lm(chat)
    lm.generate(QUESTION, seed=7, config={"tags": ["gate"]})
    await lm.agenerate(QUESTION, seed=8)
    assert [c["kwargs"] for c in chat.calls] == [{"seed": 7}, {"seed": 8}]
    assert "".join(lm.stream(QUESTION, seed=9)) == chat.reply
    assert chat.calls[-1]["kwargs"] == {"seed": 9}
    assert "".join([p async for p in lm.astream(QUESTION, seed=10)]) == chat.reply
    assert chat.calls[-1]["kwargs"] == {"seed": 10}


def test_other_token_limit_names_and_opt_outs() -> None:
    chat = PredictChat()
    assert LangChainTextLM(chat).max_tokens_field == "num_predict"
    as_text_lm(chat).generate(QUESTION, max_new_tokens=9)
    assert (chat.calls[-1]["num_predict"], chat.calls[-1]["kwargs"]) == (9, {})
    plain = RecordingChat()
    as_text_lm(plain, set_max_tokens=False, set_temperature=False, model_id="x").generate(
        QUESTION, max_new_tokens=9, temperature=0.5
    )
    assert (plain.calls[-1]["max_tokens"], plain.calls[-1]["temperature"]) == (None, None)


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({}, "stop"),
        ({"finish_reason": "stop"}, "stop"),
        ({"finish_reason": "length"}, "length"),
        ({"finish_reason": "eos"}, "eos"),
        ({"stop_reason": "max_tokens"}, "length"),
        ({"stop_reason": "end_turn"}, "stop"),
        ({"done_reason": "length"}, "length"),
        ({"finish_reason": "MAX_TOKENS"}, "length"),
    ],
)
def test_finish_reason_mapping(metadata: dict[str, Any], expected: str) -> None:
    assert _finish_reason(metadata) == expected
    chat = RecordingChat(reply_metadata=metadata)
    assert as_text_lm(chat).generate(QUESTION).finish_reason == expected


def test_stop_cutter_holds_back_partial_stop_strings() -> None:
    cutter = StopCutter(["END"])
    out = [cutter.feed(p) for p in ["ab", "cE", "N", "Dx"]]
    assert "".join(out) == "abc" and cutter.stopped
    cutter = StopCutter(["END"])
    assert "".join(cutter.feed(p) for p in ["ab", "cE", "N"]) + cutter.flush() == "abcEN"


# ---------------------------------------------------------------- errors
def test_logprobs_from_a_model_without_them_is_an_error() -> None:
    lm = as_text_lm(RecordingChat())
    with pytest.raises(ValueError, match="does not offer logprobs"):
        lm.generate(QUESTION, logprobs=1)


def test_missing_logprobs_in_the_reply_is_an_error() -> None:
    class LogprobChat(RecordingChat):
        logprobs: bool | None = None
        top_logprobs: int | None = None

    lm = as_text_lm(LogprobChat())
    assert lm.supports_logprobs
    with pytest.raises(ValueError, match="returned no logprobs"):
        lm.generate(QUESTION, logprobs=1)


def test_a_logprob_above_zero_makes_the_confidence_gates_retrieve() -> None:
    """A provider's reply passed on by the adapter as it came: a log-probability of +0.3 is
    not one, and read as a score it would say "more than certain" and skip retrieval."""
    from rag_gates.confidence import AnswerLogprobGate
    from rag_gates.deeprag.gates import MarkerLikelihoodGate

    class LogprobChat(RecordingChat):
        logprobs: bool | None = None
        top_logprobs: int | None = None

    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": None, "top_logprobs": [
            {"token": token, "logprob": logprob, "bytes": None},
            {"token": "Intermediate", "logprob": -2.0, "bytes": None}]}

    broken = {"logprobs": {"content": [entry("Paris", 0.3), entry(" is", -0.1)]}}
    healthy = {"logprobs": {"content": [entry("Paris", -0.01), entry(" is", -0.1)]}}
    decisions = {}
    for name, metadata in (("broken", broken), ("healthy", healthy)):
        lm = as_text_lm(LogprobChat(reply="Paris is", reply_metadata=metadata))
        decisions[name] = AnswerLogprobGate(lm, threshold=0.5).decide(QUESTION)
    assert decisions["healthy"].retrieve is False  # confident: -mean log p = 0.055
    d = decisions["broken"]
    assert d.retrieve is True and "undecided" in d.evidence
    assert "answer token 0" in d.reason and "above 0.0" in d.reason, d.reason
    marker = MarkerLikelihoodGate(as_text_lm(LogprobChat(reply="Paris", reply_metadata=broken)))
    d = marker.decide("Follow up: Who?", prompt="Follow up: Who?\n")
    assert d.retrieve is True and "unusable" in d.reason and "above 0.0" in d.reason, d.reason


def test_logprobs_the_provider_dropped_make_the_confidence_gates_retrieve() -> None:
    """A model configured for logprobs whose reply lacks them: the adapter's error is a
    LogprobsMissingError (still a ValueError), and a gate reading them cannot decide, so it
    retrieves and says why, instead of failing the user's chain."""
    from rag_gates.confidence import AnswerLogprobGate
    from rag_gates.deeprag.gates import MarkerLikelihoodGate
    from rag_gates.errors import LogprobsMissingError

    class LogprobChat(RecordingChat):
        logprobs: bool | None = None
        top_logprobs: int | None = None

    lm = as_text_lm(LogprobChat(reply="Paris"))
    with pytest.raises(LogprobsMissingError, match="returned no logprobs"):
        lm.generate(QUESTION, logprobs=1)
    for gate, signals in ((AnswerLogprobGate(lm, threshold=0.5), {}),
                          (MarkerLikelihoodGate(lm), {"prompt": "Follow up: Who?\n"})):
        d = gate.decide(QUESTION, **signals)
        assert d.retrieve is True and "undecided" in d.evidence, d.reason
        assert "returned no logprobs" in d.reason, d.reason


def test_a_marker_outside_the_top_k_decides_only_on_the_far_side_of_the_threshold() -> None:
    """The direct marker missing from the top 20 bounds the score from below (its log p is
    at most the 20th value): above the threshold that decides, below it does not."""
    from rag_gates.deeprag.gates import MarkerLikelihoodGate

    class LogprobChat(RecordingChat):
        logprobs: bool | None = None
        top_logprobs: int | None = None

    top = [{"token": "Let", "logprob": -3.0, "bytes": None}] + [
        {"token": f"w{i}", "logprob": -3.0 - i * 0.05, "bytes": None} for i in range(1, 20)]
    floor = top[-1]["logprob"]  # -3.95: "Intermediate answer:" is somewhere below it
    metadata = {"logprobs": {"content": [{"token": "Let", "logprob": -3.0, "bytes": None,
                                          "top_logprobs": top}]}}
    lm = as_text_lm(LogprobChat(reply="Let", reply_metadata=metadata))
    bound = -3.0 - floor  # the true score is at least 0.95
    below = MarkerLikelihoodGate(lm, threshold=0.5).decide(QUESTION,
                                                           prompt="Follow up: Who?\n")
    assert below.retrieve is True and "undecided" not in below.evidence  # certain: decided
    assert below.score == pytest.approx(bound)
    above = MarkerLikelihoodGate(lm, threshold=2.0).decide(QUESTION, prompt="Follow up: Who?\n")
    assert above.retrieve is True and "undecided" in above.evidence, above.reason
    assert above.evidence["bounded_score"] == pytest.approx(bound)
    assert "only known to be >=" in above.reason
    # The retrieve marker missing instead: the score is at most floor - log p(direct).
    top = [{"token": "Intermediate", "logprob": -3.0, "bytes": None}, *top[1:]]
    metadata = {"logprobs": {"content": [{"token": "Intermediate", "logprob": -3.0,
                                          "bytes": None, "top_logprobs": top}]}}
    lm = as_text_lm(LogprobChat(reply="Intermediate", reply_metadata=metadata))
    skip = MarkerLikelihoodGate(lm, threshold=0.0).decide(QUESTION, prompt="Follow up: Who?\n")
    assert skip.retrieve is False and skip.score == pytest.approx(-bound)  # -0.95 < 0: certain
    unsure = MarkerLikelihoodGate(lm, threshold=-2.0).decide(QUESTION,
                                                             prompt="Follow up: Who?\n")
    assert unsure.retrieve is True and "only known to be <=" in unsure.reason, unsure.reason


def test_prompts_and_arguments_are_validated() -> None:
    lm = as_text_lm(RecordingChat())
    with pytest.raises(ValueError, match="empty"):
        lm.generate("  ")
    with pytest.raises(TypeError, match="str or a list of chat messages"):
        lm.generate(cast(Any, 42))
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        lm.generate(QUESTION, max_new_tokens=0)
    with pytest.raises(ValueError, match="role"):
        list(lm.stream([{"content": "no role"}]))


def test_only_language_models_are_accepted() -> None:
    chat = RecordingChat()
    with pytest.raises(TypeError, match="pass the configured model itself"):
        as_text_lm(cast(Any, chat.bind(stop=["x"])))
