"""The run every framework adapter shares (rag_gates.lm.adapter.FrameworkTextLM): the checks,
the stop-string cut, and streams that end (and close the framework's stream) at a stop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from rag_gates.lm.adapter import FrameworkTextLM, GenerationArgs, cut_at_stop
from rag_gates.types import Generation

REPLY = ["The ", "answer", " is", " Paris", ".\n", "Question", ": more"]


class ScriptedModel(FrameworkTextLM[str]):
    """A 'framework' whose model always writes REPLY, chunk by chunk."""

    model_id = "scripted"

    def __init__(self) -> None:
        self.closed = 0
        self.pulled = 0

    def prepare(self, prompt: Any, args: GenerationArgs, options: dict[str, Any]) -> str:
        if options:
            raise TypeError(f"unexpected {sorted(options)}")
        return str(prompt)

    def invoke(self, call: str) -> Any:
        return "".join(REPLY)

    async def ainvoke(self, call: str) -> Any:
        return "".join(REPLY)

    def _chunks(self) -> Iterator[str]:
        try:
            for chunk in REPLY:
                self.pulled += 1
                yield chunk
        finally:
            self.closed += 1

    def open_stream(self, call: str) -> Iterator[Any]:
        return self._chunks()

    async def aopen_stream(self, call: str) -> AsyncIterator[Any]:
        async def chunks() -> AsyncIterator[str]:
            try:
                for chunk in REPLY:
                    self.pulled += 1
                    yield chunk
            finally:
                self.closed += 1
        return chunks()

    def piece(self, chunk: Any, so_far: str) -> tuple[str, str]:
        return chunk, so_far + chunk

    def read(self, reply: Any, args: GenerationArgs, start: float) -> Generation:
        text, finish, _ = cut_at_stop(reply, args.stop, "eos")
        return Generation(text=text, finish_reason=finish)


def test_generate_cuts_at_the_first_stop_string() -> None:
    lm = ScriptedModel()
    g = lm.generate("Q?", stop=["\nQuestion:", "."])
    assert (g.text, g.finish_reason) == ("The answer is Paris", "stop")
    assert lm.generate("Q?").finish_reason == "eos"
    assert asyncio.run(lm.agenerate("Q?", stop=["."])).text == "The answer is Paris"


def test_a_stream_joins_to_the_generated_text_and_closes_the_framework_stream_at_the_stop(
) -> None:
    lm = ScriptedModel()
    pieces = list(lm.stream("Q?", stop=["\nQuestion:"]))  # the stop spans three chunks
    assert "".join(pieces) == lm.generate("Q?", stop=["\nQuestion:"]).text == \
        "The answer is Paris."
    assert lm.closed == 1 and lm.pulled == 7
    assert "".join(lm.stream("Q?", stop=["."])) == "The answer is Paris"
    assert lm.closed == 2 and lm.pulled == 7 + 5  # the chunks after the stop: never asked for

    async def collect() -> list[str]:
        return [p async for p in lm.astream("Q?", stop=["\nQuestion:"])]

    assert "".join(asyncio.run(collect())) == "The answer is Paris."
    assert lm.closed == 3


def test_arguments_are_checked_before_the_framework_is_called() -> None:
    lm = ScriptedModel()
    with pytest.raises(ValueError):
        lm.generate("Q?", max_new_tokens=0)
    with pytest.raises(ValueError):
        lm.generate("")
    with pytest.raises(TypeError, match="unexpected"):
        lm.generate("Q?", seed=3)
    assert lm.pulled == 0
