"""ChatRagGates against the HFWhiteBoxLM it wraps: same text, tokens, logprobs, every path."""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages import ChatMessage as LCChatMessage

from langchain_rag_gates import ChatRagGates
from rag_gates.lm.base import BaseTextLM
from rag_gates.lm.hf import HFWhiteBoxLM
from rag_gates.testing import model_load_threads, tiny_model_and_tokenizer
from rag_gates.types import ChatMessage, Generation

QUESTION = "What is the capital of France?"
SYSTEM = "Answer in one word."
LC_MESSAGES = [SystemMessage(SYSTEM), HumanMessage(QUESTION)]
RG_MESSAGES = [
    ChatMessage(role="system", content=SYSTEM),
    ChatMessage(role="user", content=QUESTION),
]


def joined(chunks: list[AIMessageChunk]) -> str:
    return "".join(str(c.content) for c in chunks)


# ---------------------------------------------------------------- invoke
def test_invoke_equals_lm_generate_with_usage_and_metadata(
    chat: ChatRagGates, tiny: HFWhiteBoxLM
) -> None:
    msg = chat.invoke(LC_MESSAGES)
    g = tiny.generate(RG_MESSAGES, max_new_tokens=12)
    assert isinstance(msg, AIMessage)
    assert msg.content == g.text
    assert msg.usage_metadata == {
        "input_tokens": g.prompt_tokens,
        "output_tokens": g.completion_tokens,
        "total_tokens": g.prompt_tokens + g.completion_tokens,
    }
    assert msg.response_metadata["finish_reason"] == g.finish_reason
    assert msg.response_metadata["model_name"] == "tiny-llama-seed0"
    assert msg.response_metadata["model_provider"] == "rag_gates"
    assert "logprobs" not in msg.response_metadata


def test_system_prompt_is_rendered_through_the_chat_template(
    chat: ChatRagGates, tiny: HFWhiteBoxLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []
    original = tiny.generate

    def spy(prompt: Any, **kwargs: Any) -> Any:
        seen.append(prompt)
        return original(prompt, **kwargs)

    monkeypatch.setattr(tiny, "generate", spy)
    msg = chat.invoke([("system", SYSTEM), ("human", QUESTION)])
    assert seen == [RG_MESSAGES]
    rendered = tiny.render(seen[0])
    assert rendered == (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
        f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    )
    # The model saw exactly the rendered template: the token count says so.
    assert msg.usage_metadata is not None
    assert msg.usage_metadata["input_tokens"] == len(tiny.encode(RG_MESSAGES))


def test_multi_turn_history_keeps_roles(chat: ChatRagGates, tiny: HFWhiteBoxLM) -> None:
    history = [
        SystemMessage(SYSTEM),
        HumanMessage("hi"),
        AIMessage("hello"),
        LCChatMessage(role="user", content=[{"type": "text", "text": QUESTION}]),
    ]
    expected = tiny.generate(
        [
            ChatMessage(role="system", content=SYSTEM),
            ChatMessage(role="user", content="hi"),
            ChatMessage(role="assistant", content="hello"),
            ChatMessage(role="user", content=QUESTION),
        ],
        max_new_tokens=12,
    )
    assert chat.invoke(history).content == expected.text


def test_per_call_options_override_fields(chat: ChatRagGates, tiny: HFWhiteBoxLM) -> None:
    full = tiny.generate(QUESTION, max_new_tokens=12)
    short = chat.invoke(QUESTION, max_tokens=3)
    assert short.usage_metadata is not None
    assert short.usage_metadata["output_tokens"] <= 3
    assert full.text.startswith(str(short.content))
    assert chat.max_tokens == 12  # the instance is unchanged


def test_stop_strings_match_lm_generate(chat: ChatRagGates, tiny: HFWhiteBoxLM) -> None:
    text = tiny.generate(QUESTION, max_new_tokens=12).text
    stop = text[2:4]
    assert stop.strip(), "fixture text should give a usable stop string"
    expected = tiny.generate(QUESTION, max_new_tokens=12, stop=[stop])
    for msg in (chat.invoke(QUESTION, stop=[stop]), ChatRagGates(lm=tiny, max_tokens=12,
                                                                  stop=[stop]).invoke(QUESTION)):
        assert msg.content == expected.text
        assert msg.response_metadata["finish_reason"] == "stop"
        assert stop not in str(msg.content)


def test_model_without_chat_template_takes_a_plain_question() -> None:
    model, tok = tiny_model_and_tokenizer(0)
    base = HFWhiteBoxLM(model, tok, model_id="base", chat_template=False)
    msg = ChatRagGates(lm=base, max_tokens=6).invoke("hello")
    g = base.generate("hello", max_new_tokens=6)
    assert msg.content == g.text
    assert msg.usage_metadata is not None
    assert msg.usage_metadata["input_tokens"] == len(base.encode("hello"))


# ---------------------------------------------------------------- logprobs
def test_logprobs_match_lm_generate(tiny: HFWhiteBoxLM) -> None:
    chat = ChatRagGates(lm=tiny, max_tokens=6, logprobs=True, top_logprobs=3)
    msg = chat.invoke(QUESTION)
    g = tiny.generate(QUESTION, max_new_tokens=6, logprobs=3)
    assert g.logprobs is not None
    assert msg.response_metadata["logprobs"] == {
        "content": [t.model_dump() for t in g.logprobs]
    }
    first = msg.response_metadata["logprobs"]["content"][0]
    assert set(first) == {"token", "logprob", "bytes", "top_logprobs"}
    assert len(first["top_logprobs"]) == 3


def test_logprobs_per_call_and_chosen_token_only(chat: ChatRagGates, tiny: HFWhiteBoxLM) -> None:
    msg = chat.invoke(QUESTION, logprobs=True, max_tokens=4)
    g = tiny.generate(QUESTION, max_new_tokens=4, logprobs=0)
    assert g.logprobs is not None
    content = msg.response_metadata["logprobs"]["content"]
    assert content == [t.model_dump() for t in g.logprobs]
    assert all(item["top_logprobs"] == [] for item in content)


def test_top_logprobs_needs_logprobs(chat: ChatRagGates, tiny: HFWhiteBoxLM) -> None:
    with pytest.raises(ValueError, match="logprobs=True"):
        ChatRagGates(lm=tiny, top_logprobs=2)
    with pytest.raises(ValueError, match="logprobs=True"):
        chat.invoke(QUESTION, top_logprobs=2)
    with pytest.raises(ValueError, match="less than or equal to 20"):
        chat.invoke(QUESTION, logprobs=True, top_logprobs=21)


# ---------------------------------------------------------------- streaming
def test_stream_chunks_join_to_invoke_text(chat: ChatRagGates) -> None:
    text = chat.invoke(LC_MESSAGES).content
    chunks = list(chat.stream(LC_MESSAGES))
    assert len([c for c in chunks if c.content]) > 1, "expected several text deltas"
    assert joined(chunks) == text
    last = chunks[-1]
    assert last.chunk_position == "last"
    assert last.response_metadata["model_name"] == "tiny-llama-seed0"
    # The model's stream returns its whole Generation: the last chunk carries its finish
    # reason and token counts, so the merged stream is the same reply as invoke's.
    invoked = chat.invoke(LC_MESSAGES)
    assert sum(chunks[1:], chunks[0]).usage_metadata == invoked.usage_metadata


def test_stream_with_logprobs_is_one_chunk_with_all_metadata(tiny: HFWhiteBoxLM) -> None:
    chat = ChatRagGates(lm=tiny, max_tokens=5, logprobs=True, top_logprobs=2)
    chunks = list(chat.stream(QUESTION))
    assert len(chunks) == 1
    invoked = chat.invoke(QUESTION)
    assert chunks[0].content == invoked.content
    assert chunks[0].response_metadata["logprobs"] == invoked.response_metadata["logprobs"]
    assert chunks[0].usage_metadata == invoked.usage_metadata


def test_streaming_field_routes_invoke_through_stream(tiny: HFWhiteBoxLM) -> None:
    """LangChain streams invoke under streaming=True (and under astream_events): the reply
    must still say why it stopped, or a loop reading finish_reason (QuCo's) stops early."""
    for max_tokens in (4, 40):  # cut by the budget ("length"), then ended by the model
        plain = ChatRagGates(lm=tiny, max_tokens=max_tokens).invoke(QUESTION)
        streamed = ChatRagGates(lm=tiny, max_tokens=max_tokens, streaming=True).invoke(QUESTION)
        assert streamed.content == plain.content
        assert streamed.response_metadata["finish_reason"] == \
            plain.response_metadata["finish_reason"]
        assert streamed.usage_metadata == plain.usage_metadata
    assert ChatRagGates(lm=tiny, max_tokens=4, streaming=True).invoke(
        QUESTION).response_metadata["finish_reason"] == "length"


# ---------------------------------------------------------------- async
async def test_ainvoke_equals_invoke(chat: ChatRagGates) -> None:
    sync = chat.invoke(LC_MESSAGES)
    msg = await chat.ainvoke(LC_MESSAGES)
    assert msg.content == sync.content
    assert msg.usage_metadata == sync.usage_metadata
    assert msg.response_metadata["finish_reason"] == sync.response_metadata["finish_reason"]


async def test_ainvoke_logprobs(tiny: HFWhiteBoxLM) -> None:
    chat = ChatRagGates(lm=tiny, max_tokens=5, logprobs=True, top_logprobs=2)
    msg = await chat.ainvoke(QUESTION)
    assert msg.response_metadata["logprobs"] == chat.invoke(QUESTION).response_metadata[
        "logprobs"
    ]
    chunks = [c async for c in chat.astream(QUESTION)]
    assert len(chunks) == 1 and chunks[0].response_metadata["logprobs"]


async def test_astream_chunks_join_to_invoke_text(chat: ChatRagGates) -> None:
    text = chat.invoke(LC_MESSAGES).content
    chunks = [c async for c in chat.astream(LC_MESSAGES)]
    assert len([c for c in chunks if c.content]) > 1
    assert joined(chunks) == text
    assert chunks[-1].response_metadata["model_name"] == "tiny-llama-seed0"
    merged = sum(chunks[1:], chunks[0])
    invoked = chat.invoke(LC_MESSAGES)
    assert merged.usage_metadata == invoked.usage_metadata
    assert merged.response_metadata["finish_reason"] == invoked.response_metadata["finish_reason"]


async def test_abatch(chat: ChatRagGates) -> None:
    prompts: list[Any] = [QUESTION, "Who wrote Hamlet?"]
    results = await chat.abatch(prompts)
    assert [r.content for r in results] == [chat.invoke(p).content for p in prompts]


# ---------------------------------------------------------------- loading
def test_model_path_loads_lazily_once_and_copies_share_it(
    tiny_dir: Path, tiny: HFWhiteBoxLM
) -> None:
    chat = ChatRagGates(model=str(tiny_dir), max_tokens=8)
    assert chat._cell.lm is None  # nothing loaded at construction
    assert chat.model_name == str(tiny_dir)
    msg = chat.invoke(QUESTION)
    assert msg.content == tiny.generate(QUESTION, max_new_tokens=8).text  # same weights
    lm = chat.get_lm()
    assert chat.get_lm() is lm
    assert chat.model_copy(update={"max_tokens": 2}).get_lm() is lm
    assert copy.deepcopy(chat).get_lm() is lm


async def test_first_async_call_loads_the_model_off_the_event_loop(
    tiny_dir: Path, tiny: HFWhiteBoxLM
) -> None:
    expected = tiny.generate(QUESTION, max_new_tokens=8).text
    chat = ChatRagGates(model=str(tiny_dir), max_tokens=8)
    with model_load_threads() as threads:
        assert (await chat.ainvoke(QUESTION)).content == expected
        await chat.ainvoke(QUESTION)
    assert len(threads) == 1 and threads[0] is not threading.current_thread()
    streamed = ChatRagGates(model=str(tiny_dir), max_tokens=8)
    with model_load_threads() as threads:
        assert "".join([str(c.content) async for c in streamed.astream(QUESTION)]) == expected
    assert len(threads) == 1 and threads[0] is not threading.current_thread()


def test_default_model_is_named_without_loading() -> None:
    chat = ChatRagGates()
    assert chat.model == "default"
    assert chat.model_name == "SmolLM2-135M-Instruct"
    assert chat._cell.lm is None


def test_missing_model_path_error_says_what_to_pass(tmp_path: Path) -> None:
    chat = ChatRagGates(model=str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="pass an existing directory"):
        chat.invoke(QUESTION)


# ---------------------------------------------------------------- parameters
def test_remote_api_params_are_accepted_and_dropped(tiny: HFWhiteBoxLM) -> None:
    remote = {"api_key": "x", "timeout": 5, "max_retries": 2, "base_url": "http://x"}
    chat = ChatRagGates(lm=tiny, **remote)
    assert not {"api_key", "timeout", "max_retries", "base_url"} & set(chat.model_dump())


def test_unknown_init_argument_is_an_error(tiny: HFWhiteBoxLM) -> None:
    with pytest.raises(ValueError, match="max_new_tokens"):
        ChatRagGates(lm=tiny, **{"max_new_tokens": 5})


def test_lm_must_be_a_rag_gates_model() -> None:
    with pytest.raises(ValueError, match="HFWhiteBoxLM"):
        ChatRagGates(lm=object())


def test_unknown_call_option_and_other_model_are_errors(chat: ChatRagGates) -> None:
    with pytest.raises(TypeError, match="unsupported call options \\['tools'\\]"):
        chat.invoke(QUESTION, tools=[])
    with pytest.raises(ValueError, match="create another ChatRagGates"):
        chat.invoke(QUESTION, model="gpt-4o")
    chat.invoke(QUESTION, model="tiny-llama-seed0", max_tokens=1)  # its own name is fine


def test_tool_messages_and_images_are_rejected_clearly(chat: ChatRagGates) -> None:
    with pytest.raises(ValueError, match="no tool calling"):
        chat.invoke([HumanMessage("hi"), ToolMessage("42", tool_call_id="1")])
    image = {"type": "image", "url": "https://example.com/cat.png"}
    with pytest.raises(ValueError, match="text-only"):
        chat.invoke([HumanMessage(content=[{"type": "text", "text": "what?"}, image])])
    with pytest.raises(ValueError, match="empty"):
        chat.invoke("   ")


def test_ls_params_and_identifying_params(tiny: HFWhiteBoxLM) -> None:
    chat = ChatRagGates(lm=tiny, max_tokens=7, temperature=0.5, stop=["\n"])
    assert chat._get_ls_params() == {
        "ls_provider": "rag_gates",
        "ls_model_name": "tiny-llama-seed0",
        "ls_model_type": "chat",
        "ls_temperature": 0.5,
        "ls_max_tokens": 7,
        "ls_stop": ["\n"],
    }
    per_call = chat._get_ls_params(stop=["x"], max_tokens=3, temperature=0)
    assert (per_call["ls_max_tokens"], per_call["ls_temperature"]) == (3, 0.0)
    assert per_call["ls_stop"] == ["x"]
    assert chat._identifying_params["model"] == "tiny-llama-seed0"
    assert chat._llm_type == "rag-gates-chat"


# ---------------------------------------------------------------- odd text, long prompts
def test_lone_surrogate_is_a_value_error_naming_the_position(chat: ChatRagGates) -> None:
    with pytest.raises(ValueError, match=r"message 1 content .* position 9 \(U\+D800"):
        chat.invoke([SystemMessage(SYSTEM), HumanMessage("Who wrote\ud800 Hamlet?")])
    with pytest.raises(ValueError, match=r"position 9 \(U\+D800"):
        list(chat.stream("Who wrote\ud800 Hamlet?"))


def test_truncation_left_is_accepted_as_field_and_per_call(
    chat: ChatRagGates, tiny: HFWhiteBoxLM
) -> None:
    from rag_gates.errors import ContextLengthError

    long = "word " * 400  # beyond the tiny model's 256-token context
    # The error's advice must work here: pass truncation='left'.
    with pytest.raises(ContextLengthError, match="truncation='left'"):
        chat.invoke(long)
    expected = tiny.generate([ChatMessage(role="user", content=long)], max_new_tokens=12,
                             truncation="left")
    per_call = chat.invoke(long, truncation="left")
    assert per_call.content == expected.text
    assert per_call.usage_metadata is not None
    assert per_call.usage_metadata["input_tokens"] == expected.prompt_tokens
    field = ChatRagGates(lm=tiny, max_tokens=12, truncation="left")
    assert field.invoke(long).content == expected.text
    assert joined(list(field.stream(long))) == expected.text
    with pytest.raises(ValueError, match="truncation"):
        ChatRagGates(lm=tiny, truncation="right")

    class Api(BaseTextLM):  # a text-only model with no way to truncate
        model_id = "api"

        def generate(self, prompt: Any, **kwargs: Any) -> Generation:
            return Generation(text="ok", finish_reason="stop")

    with pytest.raises(ValueError, match="cannot truncate prompts"):
        ChatRagGates(lm=Api()).invoke(long, truncation="left")
    assert ChatRagGates(lm=Api()).invoke(long).content == "ok"
