"""``OpenAICompatibleLM``: a :class:`~rag_gates.lm.base.TextLM` over any server that speaks the
OpenAI completions/chat API (vLLM, llama.cpp's servers, TGI, OpenAI itself).

What it gives: generation with stop strings, streaming, async calls with a bounded number in
flight, per-token ``logprobs``/``top_logprobs``, the next-token distribution from
``top_logprobs`` (:meth:`~OpenAICompatibleLM.top_next_tokens`), and teacher-forced
:meth:`~OpenAICompatibleLM.score` from the prompt log-probabilities the completions endpoint
echoes (``echo`` + ``logprobs``), where the server gets them right.

Servers get prompt log-probabilities wrong, so they are probed, never trusted: at
construction the model generates a few tokens after a known prompt, and the same tokens are
then scored by echo. Agreement means *aligned*; agreement once every echoed entry is read one
position earlier means *shifted* (llama-cpp-python reports, for a prompt that does not start
with the BOS token, each token's entry from the distribution after it): the shift is corrected
from the previous position's ``top_logprobs``, and a token missing from them raises a clear
error. No echoed values (llama.cpp's C++ server) or values that match neither reading: score()
is declared unsupported, with the reason, in ``lm.capabilities``. The probe runs once per
prompt kind: *raw* text (sent as is) and *chat* prompts rendered with a ``chat_template`` given
to the client (without one, chat prompts go to the chat endpoint, which echoes nothing).

Text in a served prompt is not literal: the server parses special-token text such as
``<|im_end|>`` in a completions prompt, and chat servers render messages to text before
tokenising them. Unlike :class:`~rag_gates.lm.hf.HFWhiteBoxLM`, a served model cannot keep a
passage from forging a chat turn; keep untrusted text away from control tokens.

Every log-probability a server reports (generated tokens, their alternatives, echoed prompts)
must be finite and <= 0, allowing :data:`LOGPROB_TOLERANCE` (1e-6) above 0 for float rounding
(such a value is read as 0): anything else raises :class:`~rag_gates.errors.ServerLogprobError`
(a gate reading it then retrieves), and a server whose probe replies carry such values is
declared as offering no log-probabilities.

The API key is read from the environment (``api_key_env``, default ``OPENAI_API_KEY``) and
sent only as the ``Authorization`` header; it is never logged, stored in a run directory or
put in an error message. A ``base_url`` carrying credentials or a query string is refused
(without repeating them), and every reply is scrubbed of the key as it is read, so a server
that echoes the header cannot put it into an error or a log line. Every reply body is read in
chunks and refused beyond ``max_response_bytes`` (32 MiB by default).

The model's side lives here (routing prompts, generation, streaming, the probe, scoring);
the HTTP side (options, loop thread, retries, bounded reads) in
:mod:`rag_gates.lm.openai_transport`, and reading the replies in
:mod:`rag_gates.lm.openai_replies`.

Example:
    >>> lm = OpenAICompatibleLM("http://127.0.0.1:8000/v1")               # doctest: +SKIP
    >>> lm.capabilities.offered()                                          # doctest: +SKIP
    ['text', 'logprobs', 'score', 'next_token']
    >>> lm.generate("The capital of France is", max_new_tokens=4, logprobs=3)  # doctest: +SKIP
    >>> lm.score("The capital of France is", [" Paris", " Rome"])          # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from rag_gates._http import redact_url
from rag_gates._json import JSONDepthError, loads_bounded
from rag_gates._optional import require
from rag_gates._text import check_encodable
from rag_gates.errors import (
    LogprobsMissingError,
    ServerError,
    ServerLogprobError,
    ServerReplyError,
    ServerRequestError,
    ServerTimeoutError,
    WhiteBoxRequiredError,
)
from rag_gates.lm.base import (
    BaseTextLM,
    Capabilities,
    ContinuationScore,
    FormattedPrompt,
    GenerationArgs,
    Prompt,
    as_messages,
    validate_prompt,
)
from rag_gates.lm.openai_replies import (
    Alignment,
    Echo,
    chat_logprobs,
    completion_logprobs,
    continuation_span,
    finish_of,
    first_choice,
    read_echo,
    read_span,
    reply_field,
)
from rag_gates.lm.openai_transport import OpenAIConfig, OpenAITransport, StreamStarted
from rag_gates.lm.stops import StopCutter
from rag_gates.types import ChatMessage, Generation, TopLogprob

__all__ = ["OpenAICompatibleLM", "OpenAIConfig", "PromptKind", "load_chat_template"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

PromptKind = Literal["raw", "chat", "messages"]
"""How a prompt reaches the server: ``raw`` text and ``chat`` (messages rendered by the client's
``chat_template``) go to the completions endpoint; ``messages`` to the chat endpoint."""

# The probe: a prompt whose continuation is near-certain for any instruction-tuned model.
PROBE_RAW = "The capital of France is"
PROBE_QUESTION = "What is the capital of France? Answer in one word."
# The probe's generation: greedy, with one alternative per token.
_PROBE = GenerationArgs(max_new_tokens=3, temperature=0.0, logprobs=1)
# The one-token request that asks whether the server answers the API's ``n`` (seeded, so
# every run sends the same request).
_N_PROBE = GenerationArgs(max_new_tokens=1, temperature=1.0, logprobs=None, seed=0)


class OpenAICompatibleLM(BaseTextLM):
    """A model behind an OpenAI-compatible server, as a :class:`~rag_gates.lm.base.TextLM`.

    Args:
        base_url: the API root (``http://HOST:PORT/v1``).
        config: an :class:`OpenAIConfig`; keyword overrides also work (``model=``,
            ``chat_template=``, ``max_concurrency=``, ...).

    Setup:
        ``pip install "rag-gates[api]"`` (httpx, jinja2). A local server for the embedded
        model: ``pip install "llama-cpp-python[server]"`` then ``python -m llama_cpp.server
        --model SmolLM2-135M-Instruct.Q4_1.gguf --logits_all true``.

    Instantiate:
        >>> lm = OpenAICompatibleLM("http://127.0.0.1:8000/v1")            # doctest: +SKIP
        >>> lm = OpenAICompatibleLM.from_spec("openai:http://127.0.0.1:8000/v1#smollm2")
        ...                                                                 # doctest: +SKIP

    Invoke:
        >>> g = lm.generate("Who wrote Hamlet?", max_new_tokens=16, stop=["\\n"], logprobs=3)
        ...                                                                 # doctest: +SKIP
        >>> lm.top_next_tokens("The capital of France is", k=5)            # doctest: +SKIP

    Async:
        >>> gens = await asyncio.gather(*(lm.agenerate(q) for q in questions))  # doctest: +SKIP
        >>> async for piece in lm.astream("Who wrote Hamlet?"): ...         # doctest: +SKIP
    """

    def __init__(self, base_url: str | None = None, *, config: OpenAIConfig | None = None,
                 **overrides: Any) -> None:
        if base_url is not None:
            overrides["base_url"] = base_url
        if config is None:
            self.config = OpenAIConfig.model_validate(overrides)
        else:
            self.config = OpenAIConfig.model_validate({**config.model_dump(), **overrides})
        self._transport = OpenAITransport(self.config)
        self.base_url = self._transport.base_url
        self._template: Any = _compile_template(self.config.chat_template)
        self._model: str | None = self.config.model
        self.alignment: dict[PromptKind, Alignment] = {}
        #: Whether the server answers the API's ``n`` with ``n`` choices (None: not asked yet).
        self.batched_samples: bool | None = None
        self._n_lock: asyncio.Lock | None = None
        if self.config.probe:
            self._capabilities = self._transport.call(self._probe())
        else:
            self._capabilities = Capabilities(
                logprobs=True, top_logprobs=self.config.max_top_logprobs, next_token="top-k",
                notes={"score": "not probed (probe=False): prompt log-probabilities are "
                                "untrusted until probed"})

    @classmethod
    def from_spec(cls, spec: str, **overrides: Any) -> OpenAICompatibleLM:
        """Build from ``openai:URL[#model-name]`` (the form ``--model`` takes)."""
        if not spec.startswith("openai:"):
            raise ValueError(f"expected 'openai:URL[#model-name]', got {redact_url(spec)!r}")
        url, _, model = spec.removeprefix("openai:").partition("#")
        if model:
            overrides.setdefault("model", model)
        return cls(url, **overrides)

    # ------------------------------------------------------------------------------ identity
    @property
    def model_id(self) -> str:
        return self.config.model_id or f"openai:{self.base_url}#{self._model or '?'}"

    @property
    def model_name(self) -> str | None:
        """The model name sent to the server (resolved from GET /models when not given)."""
        return self._model

    @property
    def capabilities(self) -> Capabilities:
        """What this served model offers, as probed at construction."""
        return self._capabilities

    @property
    def supports_logprobs(self) -> bool:
        return self._capabilities.logprobs

    def __repr__(self) -> str:  # the key is never part of it
        return f"OpenAICompatibleLM({self.base_url!r}, model={self._model!r})"

    async def _resolve_model(self) -> str:
        if self._model is None:
            data = await self._transport.request("/models")
            try:
                self._model = str(data["data"][0]["id"])
            except (KeyError, IndexError, TypeError) as exc:
                raise ServerReplyError(
                    f"{self.base_url}/models lists no model ({str(data)[:200]}); pass "
                    "model='<name>'") from exc
        return self._model

    # ------------------------------------------------------------------------------ prompts
    def route(self, prompt: Prompt) -> tuple[PromptKind, str | list[dict[str, str]]]:
        """Where ``prompt`` goes and in what form (see :data:`PromptKind`)."""
        prompt = validate_prompt(prompt)
        if isinstance(prompt, FormattedPrompt):
            # Formatted text is chat-formatted in practice: it shares the chat probe.
            return ("chat" if self._template is not None else "raw"), str(prompt)
        if isinstance(prompt, str) and not self.config.chat:
            return "raw", prompt
        messages = ([ChatMessage(role="user", content=prompt)] if isinstance(prompt, str)
                    else as_messages(prompt))
        if self._template is not None:
            return "chat", self.render(messages)
        if messages and messages[-1].role == "assistant":
            # The chat endpoint would close that message and start a new one: the model would
            # not continue the text it was given, and nothing would say so.
            raise ValueError(
                f"this prompt ends with an assistant message to continue (prefill), which the "
                f"chat endpoint of {self.base_url} cannot do: pass chat_template= (the model's "
                "Jinja template; `rag-gates bench --chat-template`), so the prompt is rendered "
                "here and continued through the completions endpoint")
        return "messages", [{"role": m.role, "content": m.content} for m in messages]

    def render(self, messages: Sequence[ChatMessage | dict[str, str]]) -> str:
        """Render chat messages with the client's ``chat_template``. A final assistant message
        is continued (no end of turn after it), as HFWhiteBoxLM does."""
        if self._template is None:
            raise ValueError("render() needs chat_template= (the model's Jinja template)")
        msgs = as_messages(messages)
        prefill = msgs[-1].role == "assistant"
        text = str(self._template.render(
            messages=[{"role": m.role, "content": m.content} for m in msgs],
            add_generation_prompt=not prefill, bos_token="", eos_token=""))
        if prefill:
            content = msgs[-1].content
            end = text.rfind(content) if content else -1
            if end < 0:
                raise ValueError("the chat template dropped the final assistant message; "
                                 "cannot continue it")
            text = text[: end + len(content)]
        return text

    # ------------------------------------------------------------------------------ generation
    def _payload(self, kind: PromptKind, body: str | list[dict[str, str]],
                 args: GenerationArgs, *, stream: bool) -> tuple[str, dict[str, Any]]:
        payload: dict[str, Any] = {"model": self._model, "max_tokens": args.max_new_tokens,
                                   "temperature": float(args.temperature), "stream": stream}
        if args.stop and self.config.max_stop_strings:
            payload["stop"] = list(args.stop[: self.config.max_stop_strings])
        if args.seed is not None:
            payload["seed"] = args.seed
        if kind == "messages":
            payload["messages"] = body
            if args.logprobs is not None:
                payload["logprobs"] = True
                payload["top_logprobs"] = args.logprobs
            return "/chat/completions", payload
        payload["prompt"] = body
        if args.logprobs is not None:
            payload["logprobs"] = args.logprobs
        return "/completions", payload

    def _check_top(self, logprobs: int | None) -> None:
        if logprobs is not None and logprobs > self.config.max_top_logprobs:
            raise ValueError(f"logprobs={logprobs} is more than this server gives "
                             f"(max_top_logprobs={self.config.max_top_logprobs})")

    async def _agenerate(self, prompt: Prompt, args: GenerationArgs) -> Generation:
        self._check_top(args.logprobs)
        kind, body = self.route(prompt)
        return await self._agenerate_routed(kind, body, args)

    async def _agenerate_routed(self, kind: PromptKind, body: str | list[dict[str, str]],
                                args: GenerationArgs) -> Generation:
        start = time.perf_counter()
        await self._resolve_model()
        path, payload = self._payload(kind, body, args, stream=False)
        data = await self._transport.request(path, payload)
        url = f"{self.base_url}{path}"
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        return self._read_choice(kind, first_choice(data, url), url, args.logprobs, args.stop,
                                 usage, start)

    @staticmethod
    def _read_choice(kind: PromptKind, choice: dict[str, Any], url: str, logprobs: int | None,
                     stops: tuple[str, ...], usage: dict[str, Any], start: float
                     ) -> Generation:
        """One choice of a reply as a :class:`Generation` (``usage``: the reply's, whose
        completion tokens count this choice's only when it is the reply's one choice)."""
        if kind == "messages":
            text = reply_field(choice, url, "message", "content", kind=str, nullable=True) or ""
            tokens = chat_logprobs(choice, url, logprobs) if logprobs is not None else None
        else:
            text = reply_field(choice, url, "text", kind=str)
            tokens = (completion_logprobs(choice, url, logprobs)
                      if logprobs is not None else None)
        if logprobs is not None and not tokens and text:
            raise LogprobsMissingError(f"{url} returned no log-probabilities although they were "
                                   "asked for (start the server with logits_all / logprobs "
                                   "enabled)")
        text, tokens, finish = finish_of(text, tokens, stops, choice)
        return Generation(
            text=text, finish_reason=finish, logprobs=tokens,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or len(tokens or ())),
            latency_ms=(time.perf_counter() - start) * 1000.0)

    async def _asample(self, prompt: Prompt, n: int, args: GenerationArgs
                       ) -> list[Generation]:
        kind, body = self.route(prompt)
        await self._resolve_model()
        if n > 1 and await self._takes_n(kind):
            start = time.perf_counter()
            path, payload = self._payload(kind, body, args, stream=False)
            payload["n"] = n
            url = f"{self.base_url}{path}"
            data = await self._transport.request(path, payload)
            first_choice(data, url)  # a reply without choices is malformed, n or not
            choices = data["choices"]
            if len(choices) < n:
                raise ServerReplyError(f"{url} sent {len(choices)} choices for n={n}, after "
                                       "answering n with n choices before")
            usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
            # The reply's completion tokens are all n choices': they say nothing of one.
            shared = {k: v for k, v in usage.items() if k != "completion_tokens"}
            return [self._read_choice(kind, c if isinstance(c, dict) else {}, url, None,
                                      args.stop, shared, start) for c in choices[:n]]
        # A server that ignores n (llama.cpp's answers with one choice): one request each,
        # seeded seed + i, so the same call draws the same samples every time.
        return list(await asyncio.gather(*(
            self._agenerate_routed(kind, body, args.model_copy(update={
                "seed": None if args.seed is None else args.seed + i}))
            for i in range(n))))

    async def _takes_n(self, kind: PromptKind) -> bool:
        """Whether the server answers the API's ``n`` with ``n`` choices: asked once, with a
        fixed one-token request, before any sample is drawn (so which requests a sampling
        call sends never depends on which call came first: concurrent runs send the same)."""
        if self._n_lock is None:  # made on the client's loop, where every call runs
            self._n_lock = asyncio.Lock()
        async with self._n_lock:
            if self.batched_samples is None:
                probe = PROBE_RAW if kind != "messages" else PROBE_QUESTION
                probe_kind, body = self.route(probe) if kind != "raw" else ("raw", probe)
                path, payload = self._payload(probe_kind, body, _N_PROBE, stream=False)
                payload["n"] = 2
                try:
                    data = await self._transport.request(path, payload)
                except ServerRequestError:  # a server that refuses n
                    self.batched_samples = False
                else:
                    choices = data.get("choices") if isinstance(data, dict) else None
                    self.batched_samples = isinstance(choices, list) and len(choices) >= 2
            return self.batched_samples

    def sample(self, prompt: Prompt, n: int, *, max_new_tokens: int = 128,
               stop: Sequence[str] | None = None, temperature: float = 1.0,
               seed: int | None = None) -> list[Generation]:
        """``n`` sampled replies to ``prompt`` (``temperature > 0``): one request with the API's
        ``n`` where the server honours it (vLLM, OpenAI), else ``n`` requests in flight at
        once, the i-th seeded ``seed + i`` (llama.cpp's servers answer ``n`` with one choice).
        Which one the server does is asked once, by a one-token request, before the first
        sample (:attr:`batched_samples`).

        Example:
            >>> [g.text for g in lm.sample("Who wrote Hamlet?", 3, max_new_tokens=8,
            ...                            seed=0)]                          # doctest: +SKIP
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n is a count of samples >= 1, got {n!r}")
        args = GenerationArgs.checked(max_new_tokens, stop, temperature, None, seed)
        if args.temperature <= 0:
            raise ValueError(f"sampling needs temperature > 0 (0 is greedy: {n} equal "
                             f"replies), got {temperature}")
        return self._transport.call(self._asample(prompt, n, args))

    def generate(self, prompt: Prompt, *, max_new_tokens: int = 128,
                 stop: Sequence[str] | None = None, temperature: float = 0.0,
                 logprobs: int | None = None, seed: int | None = None) -> Generation:
        """Generate greedily (``temperature=0``) or by sampling (``seed`` where the server
        takes one). ``logprobs=k`` returns per-token log-probabilities with the ``k`` most
        likely alternatives. ``finish_reason`` is ``"stop"`` when a stop string ended the text
        (servers that do not say whether they stopped at end-of-sequence or at a stop string
        are read as ``"stop"`` whenever stop strings were given)."""
        args = GenerationArgs.checked(max_new_tokens, stop, temperature, logprobs, seed)
        return self._transport.call(self._agenerate(prompt, args))

    async def agenerate(self, prompt: Prompt, *, max_new_tokens: int = 128,
                        stop: Sequence[str] | None = None, temperature: float = 0.0,
                        logprobs: int | None = None, seed: int | None = None,
                        **kwargs: Any) -> Generation:
        """:meth:`generate` without a thread: at most ``max_concurrency`` requests of this
        client are in flight at once, the rest wait for a slot."""
        if kwargs:
            raise TypeError(f"unexpected arguments: {sorted(kwargs)}")
        args = GenerationArgs.checked(max_new_tokens, stop, temperature, logprobs, seed)
        return await self._transport.on_loop(self._agenerate(prompt, args))

    async def _stream_into(self, emit: Callable[[tuple[str, object]], None],
                           cancelled: threading.Event, prompt: Prompt, args: GenerationArgs
                           ) -> None:
        try:
            start = time.perf_counter()
            kind, body = self.route(prompt)
            await self._resolve_model()
            path, payload = self._payload(kind, body, args, stream=True)
            url = f"{self.base_url}{path}"
            cutter = StopCutter(args.stop)
            state: dict[str, Any] = {"finish": None, "pieces": 0}

            async def read(response: Any) -> None:
                started = False
                try:
                    async for line in self._transport.lines(response, url):
                        if cancelled.is_set():
                            return
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            return
                        try:
                            chunk = loads_bounded(data, what=f"an event streamed by {url}")
                        except JSONDepthError as exc:
                            raise ServerReplyError(str(exc)) from None
                        except ValueError as exc:
                            raise ServerReplyError(
                                f"{url} streamed an event that is not JSON: {data[:200]!r}"
                            ) from exc
                        choice = first_choice(chunk, url)
                        piece = (reply_field(choice, url, "delta", "content", kind=str,
                                        nullable=True, optional=True)
                                 if kind == "messages" else
                                 reply_field(choice, url, "text", kind=str, nullable=True))
                        state["finish"] = choice.get("finish_reason") or state["finish"]
                        if piece:
                            state["pieces"] += 1
                            out = cutter.feed(piece)
                            if out:
                                started = True
                                emit(("piece", out))
                            if cutter.stopped:
                                return  # leaving closes the connection: the server stops
                except Exception as exc:
                    if started and not isinstance(exc, ServerError):
                        raise StreamStarted() from exc
                    raise

            await self._transport.request(path, payload, on_open=read)
            rest = cutter.flush()
            if rest:
                emit(("piece", rest))
            finish = ("stop" if cutter.stopped else
                      "length" if state["finish"] == "length" else
                      "stop" if args.stop and state["finish"] == "stop" else "eos")
            emit(("done", Generation(text=cutter.text, finish_reason=finish,
                                     completion_tokens=state["pieces"],
                                     latency_ms=(time.perf_counter() - start) * 1000.0)))
        except Exception as exc:  # handed to the consumer, raised there
            emit(("error", exc))

    def stream(self, prompt: Prompt, *, max_new_tokens: int = 128,
               stop: Sequence[str] | None = None, temperature: float = 0.0,
               seed: int | None = None) -> Generator[str, None, Generation | None]:
        """Yield text as the server streams it (stop strings cut as in :meth:`generate`);
        the generator's return value is the finished :class:`Generation`. Closing it early
        closes the connection, so the server stops generating."""
        args = GenerationArgs.checked(max_new_tokens, stop, temperature, None, seed)
        pieces: queue.Queue[tuple[str, object]] = queue.Queue()
        cancelled = threading.Event()
        future = self._transport.submit(self._stream_into(pieces.put, cancelled, prompt, args))
        try:
            while True:
                try:
                    what, value = pieces.get(timeout=self.config.timeout * 2 + 5.0)
                except queue.Empty as exc:
                    raise ServerTimeoutError(f"{self.base_url} streamed nothing for "
                                             f"{self.config.timeout * 2 + 5.0:.0f} s") from exc
                if what == "piece":
                    yield str(value)
                elif what == "error":
                    raise value  # type: ignore[misc]
                else:
                    return value if isinstance(value, Generation) else None
        finally:
            cancelled.set()
            future.cancel()

    async def astream(self, prompt: Prompt, *, max_new_tokens: int = 128,
                      stop: Sequence[str] | None = None, temperature: float = 0.0,
                      seed: int | None = None, **kwargs: Any) -> AsyncIterator[str]:
        """:meth:`stream` for an event loop (no worker thread); cancelling or closing it
        closes the connection."""
        if kwargs:
            raise TypeError(f"unexpected arguments: {sorted(kwargs)}")
        args = GenerationArgs.checked(max_new_tokens, stop, temperature, None, seed)
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue[tuple[str, object]] = asyncio.Queue()
        cancelled = threading.Event()

        def emit(item: tuple[str, object]) -> None:
            with contextlib.suppress(RuntimeError):  # the consumer's loop has closed
                loop.call_soon_threadsafe(pieces.put_nowait, item)

        future = self._transport.submit(self._stream_into(emit, cancelled, prompt, args))
        try:
            while True:
                what, value = await pieces.get()
                if what == "piece":
                    yield str(value)
                elif what == "error":
                    raise value  # type: ignore[misc]
                else:
                    return
        finally:
            cancelled.set()
            future.cancel()

    # ------------------------------------------------------------------------------ next token
    def top_next_tokens(self, prompt: Prompt, k: int = 5) -> list[TopLogprob]:
        """The ``k`` most likely next tokens with their log-probabilities (the server's
        ``top_logprobs`` of one generated token): the next-token distribution a served model
        can give."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        g = self.generate(prompt, max_new_tokens=1, logprobs=k)
        if not g.logprobs:
            raise ServerReplyError(f"{self.base_url} generated no token after the prompt "
                                   "(it ended at once), so there is no distribution to read")
        return list(g.logprobs[0].top_logprobs)

    # ------------------------------------------------------------------------------ scoring
    async def _echo(self, text: str, top: int) -> Echo:
        """Echo ``text`` through the completions endpoint with its prompt log-probabilities
        (one generated token rides along: some servers read max_tokens=0 as 'no limit')."""
        path = "/completions"
        data = await self._transport.request(path, {
            "model": self._model, "prompt": text, "echo": True, "logprobs": top,
            "max_tokens": 1, "temperature": 0.0})
        return read_echo(data, f"{self.base_url}{path}")

    async def _ascore_one(self, kind: PromptKind, prompt: str, continuation: str
                          ) -> ContinuationScore:
        alignment = self.alignment.get(kind, "unprobed")
        top = 1 if alignment == "aligned" else self.config.max_top_logprobs
        echo = await self._echo(prompt + continuation, top)
        span = continuation_span(echo, prompt, continuation)
        values = read_span(echo, span, alignment)
        tokens = echo.tokens[span[0]: span[1]]
        if any(v is None for v in values):
            missing = [t for t, v in zip(tokens, values, strict=True) if v is None]
            raise ServerError(
                f"{self.base_url} reports prompt log-probabilities shifted by one position "
                f"(found by the probe at construction); the corrected value of token(s) "
                f"{missing!r} is not among the previous position's top "
                f"{self.config.max_top_logprobs}, so it cannot be recovered. Use chat prompts "
                "with chat_template= if they probed aligned, or a server with correct prompt "
                "log-probabilities")
        return ContinuationScore(text=continuation, token_ids=[], tokens=tokens,
                                 logprobs=[float(v) for v in values if v is not None])

    def check_prompt_form(self, prompt: Prompt) -> None:
        """Raise ValueError, saying what to pass, if prompts of this form cannot be sent (an
        assistant message to continue without a ``chat_template``). Components whose prompts
        have one form check a sample at construction."""
        self.route(prompt)

    def score_unavailable(self, prompt: Prompt) -> str | None:
        """Why :meth:`score` cannot score continuations of a prompt of this form (None: it
        can). Components that score prompts of one form check a sample at construction, so
        a server that cannot is refused before any question is asked."""
        return self._score_route(prompt)[1]

    def _score_route(self, prompt: Prompt) -> tuple[tuple[PromptKind, str] | None, str | None]:
        """``((kind, text), None)`` for a prompt score() can read, else ``(None, why)``."""
        try:
            kind, body = self.route(prompt)
        except ValueError as exc:  # a form this server cannot take at all
            return None, str(exc)
        if kind == "messages":
            return None, (f"score() on chat prompts is not available from {self.base_url}: "
                          "the chat endpoint echoes no prompt; pass chat_template= (the "
                          "model's Jinja template; `rag-gates bench --chat-template`) so chat "
                          "prompts are rendered here and scored by echo")
        if self.alignment.get(kind) not in ("aligned", "shifted"):
            return None, (f"score() on {kind} prompts is not available from {self.base_url}: "
                          + self._capabilities.notes.get("score", "the probe did not pass"))
        assert isinstance(body, str)
        return (kind, body), None

    async def _ascore(self, prompt: Prompt, continuations: Sequence[str]
                      ) -> list[ContinuationScore]:
        if isinstance(continuations, str) or not isinstance(continuations, Sequence):
            raise TypeError("continuations must be a list of strings")
        for i, c in enumerate(continuations):
            if not isinstance(c, str):
                raise TypeError(f"continuation {i} must be a str, got {type(c).__name__}")
            if not c:
                raise ValueError(f"continuation {i} is empty; nothing to score")
            check_encodable(c, f"continuation {i}")
        routed, reason = self._score_route(prompt)  # the prompt is rendered once
        if routed is None:
            raise WhiteBoxRequiredError(
                f"{reason}. Use an HFWhiteBoxLM with the same weights for teacher-forced "
                "scores")
        kind, body = routed
        await self._resolve_model()
        return list(await asyncio.gather(*(self._ascore_one(kind, body, c)
                                           for c in continuations)))

    def score(self, prompt: Prompt, continuations: Sequence[str], **kwargs: Any
              ) -> list[ContinuationScore]:
        """Teacher-forced log-probabilities of each continuation after ``prompt``, from the
        server's echoed prompt log-probabilities (only where the probe found them aligned or
        correctably shifted: see ``capabilities.notes['score']``).

        The server tokenises prompt + continuation together; the continuation must begin at
        a token boundary (write its leading space: ``" Paris"``). ``token_ids`` are empty:
        the completions API returns token strings only.
        """
        if kwargs:
            raise TypeError(f"unexpected arguments: {sorted(kwargs)}")
        return self._transport.call(self._ascore(prompt, continuations))

    async def ascore(self, prompt: Prompt, continuations: Sequence[str]
                     ) -> list[ContinuationScore]:
        """:meth:`score` for an event loop."""
        return await self._transport.on_loop(self._ascore(prompt, continuations))

    # ------------------------------------------------------------------------------ the probe
    async def _probe_kind(self, kind: PromptKind) -> tuple[Alignment, str, bool]:
        """Alignment of prompt log-probabilities for one prompt kind, the evidence, and
        whether generated tokens came with log-probabilities."""
        text = PROBE_RAW if kind == "raw" else self.render(
            [ChatMessage(role="user", content=PROBE_QUESTION)])
        gen = await self._agenerate_routed(kind, text, _PROBE)
        if not gen.logprobs:
            return "missing", "generated tokens came without log-probabilities", False
        tokens = [t.token for t in gen.logprobs]
        continuation = "".join(tokens)
        if not continuation:
            return "mismatch", "the probe generated no text", True
        echo = await self._echo(text + continuation, self.config.max_top_logprobs)
        if not any(v is not None for v in echo.token_logprobs):
            return "missing", "the echo carries no prompt log-probabilities", True
        try:
            span = continuation_span(echo, text, continuation)
        except (ValueError, ServerReplyError) as exc:
            return "mismatch", f"the echo could not be read: {exc}", True
        echoed = echo.tokens[span[0]: span[1]]
        n = 0  # compare the tokens both tokenisations share
        while n < min(len(echoed), len(tokens)) and echoed[n] == tokens[n]:
            n += 1
        if n == 0:
            return "mismatch", "the echo tokenised the generated text differently", True
        generated = [t.logprob for t in gen.logprobs[:n]]
        evidence = []
        for alignment in ("aligned", "shifted"):
            values = read_span(echo, (span[0], span[0] + n), alignment)
            shown = ", ".join("?" if v is None else f"{v:.3f}" for v in values)
            evidence.append(f"{alignment} reading [{shown}]")
            if all(v is not None and abs(v - g) <= self.config.probe_tolerance
                   for v, g in zip(values, generated, strict=True)):
                return alignment, (f"{echoed[:n]!r} after {text[-40:]!r}: generated "
                                   f"[{', '.join(f'{g:.3f}' for g in generated)}], "
                                   + evidence[-1]), True
        return "mismatch", (f"{echoed[:n]!r}: generated "
                            f"[{', '.join(f'{g:.3f}' for g in generated)}] vs "
                            + "; ".join(evidence)), True

    async def _probe(self) -> Capabilities:
        await self._resolve_model()
        kinds: list[PromptKind] = ["raw", "chat"] if self._template is not None else ["raw"]
        found = {}
        invalid: str | None = None
        for kind in kinds:
            try:
                found[kind] = await self._probe_kind(kind)
            except ServerRequestError as exc:  # e.g. a chat-only server refusing completions
                found[kind] = ("missing", f"the completions endpoint refused: {exc}", False)
            except LogprobsMissingError:  # none at all: say how to start the server, as ever
                raise
            except ServerLogprobError as exc:  # values that are not log-probabilities
                invalid = str(exc)
                found[kind] = ("mismatch", f"invalid log-probabilities: {exc}", False)
        self.alignment = {kind: result[0] for kind, result in found.items()}
        logprobs = any(result[2] for result in found.values())
        words = {"aligned": "aligned", "shifted": "shifted by one position (corrected from "
                 "the previous position's top_logprobs)", "missing": "not available",
                 "mismatch": "wrong (matches neither reading; disabled)"}
        summary = "; ".join(f"{kind} prompts: {words[a]} ({detail})"
                            for kind, (a, detail, _) in found.items())
        if self._template is None:
            summary += "; chat prompts: not scorable (no chat_template given)"
        scorable = any(a in ("aligned", "shifted") for a in self.alignment.values())
        for kind, (a, detail, _) in found.items():
            if a not in ("aligned", "shifted"):
                logger.warning("%s: score() on %s prompts disabled: prompt log-probabilities "
                               "%s (%s)", self.base_url, kind, words[a], detail)
        notes = {"score": summary}
        if not logprobs:
            notes["logprobs"] = invalid or ("the server returned no log-probabilities for "
                                            "generated tokens")
        return Capabilities(logprobs=logprobs,
                            top_logprobs=self.config.max_top_logprobs if logprobs else 0,
                            next_token="top-k" if logprobs else "none", score=scorable,
                            notes=notes)

    def close(self) -> None:
        """Close the connection pool (a later call opens a new one)."""
        self._transport.close()

    @property
    def requests_sent(self) -> int:
        """HTTP attempts sent to the server so far (retries count)."""
        return self._transport.requests_sent

    def __enter__(self) -> OpenAICompatibleLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _compile_template(source: str | None) -> Any:
    if source is None:
        return None
    jinja2 = require("jinja2", "api")
    sandbox = require("jinja2.sandbox", "api")

    def raise_exception(message: str) -> None:
        raise ValueError(f"the chat template refused the messages: {message}")

    env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                undefined=jinja2.Undefined)
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent)
    return env.from_string(source)


def load_chat_template(source: str) -> str:
    """The Jinja chat template named by ``source``, for ``OpenAICompatibleLM(chat_template=)``:
    ``"default"`` (the embedded SmolLM2's), a template file, or a model directory holding
    ``chat_template.jinja`` or a ``tokenizer_config.json`` with one.

    Example:
        >>> template = load_chat_template("default")                  # doctest: +SKIP
        >>> lm = OpenAICompatibleLM(url, chat_template=template)      # doctest: +SKIP
    """
    if source == "default":
        from rag_gates.lm.defaults import load_default_tokenizer

        template = load_default_tokenizer().chat_template
        if not isinstance(template, str):
            raise ValueError("the embedded model's tokenizer carries no chat template")
        return template
    from rag_gates._files import read_json, read_text

    path = Path(source).expanduser()
    if path.is_file():
        return read_text(path)
    if path.is_dir():
        if (path / "chat_template.jinja").is_file():
            return read_text(path / "chat_template.jinja")
        config = path / "tokenizer_config.json"
        if config.is_file():
            template = read_json(config, finite=False, expect=dict,
                                 fix="it is not a tokenizer config").get("chat_template")
            if isinstance(template, str):
                return template
        raise ValueError(f"{path} holds no chat template (neither chat_template.jinja nor a "
                         "chat_template in tokenizer_config.json)")
    raise ValueError(f"chat template {source!r}: expected 'default' (the embedded model's), a "
                     "template file, or a model directory; no such file or directory")
