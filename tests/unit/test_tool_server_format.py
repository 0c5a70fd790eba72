"""The ``smollm2-tools`` chat format of ``examples/llama_cpp_tool_server.py``: how a
conversation with tools is rendered and how a reply becomes tool calls (what
benchmarks/agent_verify.py counts as a valid call). Pure functions: no model, no server."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from llama_cpp_tool_server import _forced, parse_reply, render

TOOLS = [{"type": "function", "function": {
    "name": "verify_claims", "description": "Check a draft.",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                   "required": ["text"]}}}]


def test_render_puts_tools_in_the_system_turn_and_results_in_user_turns() -> None:
    prompt = render([
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Who?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "verify_claims", "arguments": '{"text": "Ed Wood."}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"flagged": []}'},
    ], TOOLS)
    assert prompt.startswith("<|im_start|>system\nAnswer briefly.\n\nYou can call functions.")
    assert '"name": "verify_claims"' in prompt and prompt.count("<|im_start|>system") == 1
    assert ('<|im_start|>assistant\n<tool_call>[{"name": "verify_claims", "arguments": '
            '{"text": "Ed Wood."}}]</tool_call><|im_end|>') in prompt
    assert '<|im_start|>user\n<tool_response>\n{"flagged": []}\n</tool_response>' in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    plain = render([{"role": "user", "content": "Who?"}], None)
    assert plain == "<|im_start|>user\nWho?<|im_end|>\n<|im_start|>assistant\n"


def test_a_parsed_call_becomes_tool_calls() -> None:
    content, calls = parse_reply(
        'Let me check.\n<tool_call>[{"name": "verify_claims", "arguments": {"text": "x"}}]'
        "</tool_call>")
    assert content == "Let me check."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("verify_claims", {"text": "x"})]
    # One object instead of a list, no closing tag, trailing text: still one call.
    _, calls = parse_reply('<tool_call>{"name": "verify_claims", "arguments": {"text": "y"}} ok')
    assert [c["function"]["name"] for c in calls] == ["verify_claims"]


@pytest.mark.parametrize("reply", [
    "The answer is yes.",
    '<tool_call>[{"name": "verify_claims", "arguments": {"text": "unterminated}]</tool_call>',
    '<tool_call>[{"arguments": {"text": "no name"}}]</tool_call>',
    '<tool_call>[{"name": "verify_claims", "arguments": "not an object"}]</tool_call>',
    "<tool_call>[]</tool_call>",
])
def test_anything_else_comes_back_as_text(reply: str) -> None:
    assert parse_reply(reply) == (reply.strip(), [])


def test_forced_choice_names_a_listed_tool() -> None:
    choice = {"type": "function", "function": {"name": "verify_claims"}}
    assert _forced(choice, TOOLS) == ("verify_claims", TOOLS[0]["function"]["parameters"])
    assert _forced("auto", TOOLS) is None and _forced(choice, None) is None
    with pytest.raises(ValueError, match="not among the tools"):
        _forced({"type": "function", "function": {"name": "nope"}}, TOOLS)
