"""BaseTextLM's async plumbing, over a slow but real text model."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence

import pytest

from rag_gates.errors import WhiteBoxRequiredError
from rag_gates.lm.base import BaseTextLM, Prompt, TextLM, WhiteBoxLM, require_white_box
from rag_gates.types import Generation


class CountingLM(BaseTextLM):
    """Streams the words of a fixed text slowly and counts how many it produced."""

    def __init__(self, words: int = 1000, delay: float = 0.01) -> None:
        self.words = words
        self.delay = delay
        self.produced = 0

    @property
    def model_id(self) -> str:
        return "counting"

    def generate(self, prompt: Prompt, *, max_new_tokens: int = 128,
                 stop: Sequence[str] | None = None, temperature: float = 0.0,
                 logprobs: int | None = None) -> Generation:
        return Generation(text="".join(self.stream(prompt)), finish_reason="length")

    def stream(self, prompt: Prompt, *, max_new_tokens: int = 128,
               stop: Sequence[str] | None = None, temperature: float = 0.0) -> Iterator[str]:
        for i in range(self.words):
            time.sleep(self.delay)
            self.produced += 1
            yield f"w{i} "


async def test_closing_an_async_stream_stops_the_worker() -> None:
    lm = CountingLM()
    stream = lm.astream("go")
    assert await stream.__anext__() == "w0 "
    await stream.aclose()
    await asyncio.sleep(0.3)
    stopped_at = lm.produced
    await asyncio.sleep(0.3)
    assert lm.produced == stopped_at < 50  # not the 1000 it would produce if left running


async def test_async_stream_delivers_everything_in_order() -> None:
    lm = CountingLM(words=20, delay=0.0)
    pieces = [p async for p in lm.astream("go")]
    assert pieces == [f"w{i} " for i in range(20)]
    assert (await lm.agenerate("go")).text == "".join(pieces)


def test_text_only_model_is_refused_by_white_box_methods() -> None:
    lm = CountingLM()
    assert isinstance(lm, TextLM) and not isinstance(lm, WhiteBoxLM)
    with pytest.raises(WhiteBoxRequiredError, match="Tok-RAG reads logits"):
        require_white_box(lm, "Tok-RAG")
