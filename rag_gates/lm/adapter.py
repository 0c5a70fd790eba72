"""The run every framework's model adapter shares: a framework's model as a ``TextLM``.

LangChain's ``as_text_lm`` and LlamaIndex's ``as_text_lm`` differ only in how a call reaches
the framework's model and how its reply is read. The rest lives here once: the argument and
prompt checks, the timing, cutting a reply at the first stop string (some models ignore
``stop``), and streaming through the stop-string holdback while the framework's stream is
closed as soon as a stop string ends the text (so no more tokens are paid for).

A framework adapter subclasses :class:`FrameworkTextLM` and writes its hooks:

- :meth:`~FrameworkTextLM.prepare`: the checked arguments -> the framework call;
- :meth:`~FrameworkTextLM.invoke` / :meth:`~FrameworkTextLM.ainvoke`: run it, return the
  reply as the framework gives it;
- :meth:`~FrameworkTextLM.open_stream` / :meth:`~FrameworkTextLM.aopen_stream`: start
  streaming it;
- :meth:`~FrameworkTextLM.piece`: one streamed chunk -> its new text;
- :meth:`~FrameworkTextLM.read`: the reply -> a :class:`~rag_gates.types.Generation`
  (:func:`cut_at_stop` applies the stop strings).

Example:
    >>> class EchoLM(FrameworkTextLM[str]):  # a "framework" whose model echoes the prompt
    ...     model_id = "echo"
    ...     def prepare(self, prompt, args, options):
    ...         return str(prompt)
    ...     def invoke(self, call):
    ...         return call
    ...     async def ainvoke(self, call):
    ...         return call
    ...     def open_stream(self, call):
    ...         return iter(call.split(" "))
    ...     async def aopen_stream(self, call):  # pragma: no cover - the example's
    ...         raise NotImplementedError
    ...     def piece(self, chunk, so_far):
    ...         return chunk + " ", so_far + chunk + " "
    ...     def read(self, reply, args, start):
    ...         text, finish, _ = cut_at_stop(reply, args.stop, "eos")
    ...         return Generation(text=text, finish_reason=finish)
    >>> EchoLM().generate("a b. c", stop=["."]).text
    'a b'
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Generic, Literal, TypeVar

from rag_gates.lm.base import BaseTextLM, GenerationArgs, Prompt, validate_prompt
from rag_gates.lm.stops import StopCutter, find_stop
from rag_gates.types import Generation

__all__ = ["FrameworkTextLM", "GenerationArgs", "cut_at_stop"]

FinishReason = Literal["stop", "length", "eos"]
Call = TypeVar("Call")


def cut_at_stop(text: str, stops: Sequence[str], finish: FinishReason
                ) -> tuple[str, FinishReason, tuple[int, int] | None]:
    """``text`` cut before the first stop string (``finish`` then ``"stop"``), and where
    the stop string was found (its start and end in ``text``), or ``text`` unchanged."""
    found = find_stop(text, stops)
    if found is None:
        return text, finish, None
    return text[: found[0]], "stop", found


class FrameworkTextLM(BaseTextLM, Generic[Call]):
    """A framework's model behind the ``TextLM`` protocol; subclasses write the hooks (see
    the module). ``options``: keyword arguments a caller gave that are not ``TextLM``
    arguments (a framework may pass them on as call options, or refuse them)."""

    # ------------------------------------------------------------------ hooks
    @abstractmethod
    def prepare(self, prompt: Prompt, args: GenerationArgs, options: dict[str, Any]) -> Call:
        """The framework call for a checked prompt and arguments."""

    @abstractmethod
    def invoke(self, call: Call) -> Any:
        """Run ``call``; the reply as the framework gives it."""

    @abstractmethod
    async def ainvoke(self, call: Call) -> Any:
        """Run ``call`` through the framework's own async method."""

    @abstractmethod
    def open_stream(self, call: Call) -> Iterator[Any]:
        """Start streaming ``call``: the framework's chunks."""

    @abstractmethod
    async def aopen_stream(self, call: Call) -> AsyncIterator[Any]:
        """Start streaming ``call`` through the framework's own async method."""

    @abstractmethod
    def piece(self, chunk: Any, so_far: str) -> tuple[str, str]:
        """The new text of a streamed ``chunk`` and the whole text so far with it
        (``so_far``: the text before it)."""

    @abstractmethod
    def read(self, reply: Any, args: GenerationArgs, start: float) -> Generation:
        """The reply as a Generation (``start``: ``time.perf_counter()`` at the call)."""

    # ------------------------------------------------------------------ the run
    def _call(self, prompt: Prompt, max_new_tokens: int, stop: Sequence[str] | None,
              temperature: float, logprobs: int | None, options: dict[str, Any]
              ) -> tuple[Call, GenerationArgs]:
        args = GenerationArgs.checked(max_new_tokens, stop, temperature, logprobs)
        return self.prepare(validate_prompt(prompt), args, options), args

    def generate(self, prompt: Prompt, *, max_new_tokens: int = 128,
                 stop: Sequence[str] | None = None, temperature: float = 0.0,
                 logprobs: int | None = None, **options: Any) -> Generation:
        """Generate through the framework's model (see the adapter for ``options``)."""
        start = time.perf_counter()
        call, args = self._call(prompt, max_new_tokens, stop, temperature, logprobs, options)
        return self.read(self.invoke(call), args, start)

    async def agenerate(self, prompt: Prompt, *, max_new_tokens: int = 128,
                        stop: Sequence[str] | None = None, temperature: float = 0.0,
                        logprobs: int | None = None, **options: Any) -> Generation:
        """Async :meth:`generate` through the framework's own async method."""
        start = time.perf_counter()
        call, args = self._call(prompt, max_new_tokens, stop, temperature, logprobs, options)
        return self.read(await self.ainvoke(call), args, start)

    def stream(self, prompt: Prompt, *, max_new_tokens: int = 128,
               stop: Sequence[str] | None = None, temperature: float = 0.0,
               **options: Any) -> Iterator[str]:
        """Text pieces as the model streams them; joined, they equal ``generate().text``.
        Text that could start a stop string is held back; the framework's stream is closed
        when a stop string ends the text, or the caller stops reading."""
        call, args = self._call(prompt, max_new_tokens, stop, temperature, None, options)
        chunks = self.open_stream(call)
        cutter, text = StopCutter(args.stop), ""
        try:
            for chunk in chunks:
                delta, text = self.piece(chunk, text)
                if out := cutter.feed(delta):
                    yield out
                if cutter.stopped:
                    return
            if rest := cutter.flush():
                yield rest
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    async def astream(self, prompt: Prompt, *, max_new_tokens: int = 128,
                      stop: Sequence[str] | None = None, temperature: float = 0.0,
                      **options: Any) -> AsyncIterator[str]:
        """Async :meth:`stream` through the framework's own async streaming."""
        call, args = self._call(prompt, max_new_tokens, stop, temperature, None, options)
        chunks = await self.aopen_stream(call)
        cutter, text = StopCutter(args.stop), ""
        try:
            async for chunk in chunks:
                delta, text = self.piece(chunk, text)
                if out := cutter.feed(delta):
                    yield out
                if cutter.stopped:
                    return
            if rest := cutter.flush():
                yield rest
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
