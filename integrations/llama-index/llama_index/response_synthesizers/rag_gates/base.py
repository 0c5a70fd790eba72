"""``TokRAGLLM`` and ``TokRAGSynthesizer``: rag-gates' two-stream decoders in LlamaIndex."""

from __future__ import annotations

import threading
from collections.abc import AsyncGenerator, Generator, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import llama_index.core.instrumentation as instrument
from llama_index.core.base.llms.types import (
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
)
from llama_index.core.base.response.schema import (
    RESPONSE_TYPE,
    AsyncStreamingResponse,
    Response,
    StreamingResponse,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.callbacks import CallbackManager
from llama_index.core.callbacks.schema import CBEventType, EventPayload
from llama_index.core.instrumentation.events.synthesis import (
    SynthesizeEndEvent,
    SynthesizeStartEvent,
)
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.prompts.mixin import PromptDictType
from llama_index.core.response_synthesizers.base import BaseSynthesizer, QueryTextType
from llama_index.core.schema import BaseNode, NodeWithScore, QueryBundle
from llama_index.llms.rag_gates.base import (
    LOGPROBS_LAYOUT,
    LOGPROBS_LAYOUT_KEY,
    _loads_model_first,
    to_llama_index_logprobs,
    top_logprobs_to_ask,
)
from llama_index.retrievers.rag_gates.convert import node_to_passage

from rag_gates.lm.base import WhiteBoxLM
from rag_gates.types import Passage

__all__ = ["CHOICES_KEY", "TokRAGLLM", "TokRAGSynthesizer", "to_passages"]

dispatcher = instrument.get_dispatcher(__name__)

CHOICES_KEY = "tokrag"
"""Key of the decoder's record (choices, counts, trace) in response metadata and in
``CompletionResponse.additional_kwargs``."""

_LOAD_LOCK = threading.Lock()
_CALL_KWARGS = frozenset({"max_new_tokens", "stop", "top_logprobs"})


def to_passages(items: Iterable[NodeWithScore | BaseNode | Passage | str] | None
                ) -> list[Passage]:
    """Nodes (with or without scores), passages or strings as rag-gates passages; the
    caller's nodes are read, never changed."""
    if items is None:
        return []
    if isinstance(items, str):
        raise TypeError("passages must be a list (of nodes, Passage or str), not one string")
    out: list[Passage] = []
    for item in items:
        if isinstance(item, Passage):
            out.append(item)
        elif isinstance(item, str):
            out.append(Passage(text=item))
        else:
            out.append(node_to_passage(item))
    return out


class TokRAGLLM(CustomLLM):
    """Tok-RAG (or CAD / AdaCAD) as a LlamaIndex LLM whose ``complete`` takes the retrieved
    passages separately from the question.

    ``complete(question, passages=nodes)`` decodes with and without the passages in lockstep
    and returns ``CompletionResponse`` with ``logprobs`` (with ``top_logprobs`` set; row
    ``[0]`` the kept token, as :class:`~llama_index.llms.rag_gates.RagGatesLLM`) and
    ``additional_kwargs["tokrag"]``: one choice per token (both streams' candidates, the side
    kept, Tok-RAG's score and fusion layer), counts and the trace. Streaming yields a
    response per chosen token; the last one carries ``additional_kwargs["tokrag"]`` and the
    ``logprobs``. Without
    passages it generates plainly and says so in ``warnings``.

    Setup:
        ``pip install -c constraints.txt -e ".[hf,qdrant]" -e integrations/llama-index`` (from
        the clone's root)

    Example:
        >>> from llama_index.response_synthesizers.rag_gates import TokRAGLLM
        >>> llm = TokRAGLLM(max_new_tokens=48)          # embedded SmolLM2, loaded lazily
        >>> r = llm.complete("Who directed Ed Wood?", passages=nodes, top_logprobs=2)
        >>> r.text, r.additional_kwargs["tokrag"]["disagreements"]
        >>> for r in llm.stream_complete("Who directed Ed Wood?", passages=nodes): ...
        >>> r = await llm.acomplete("Who directed Ed Wood?", passages=nodes)
        >>> TokRAGLLM(lm=lm, method="cad", cad_alpha=1.0)   # context-aware decoding
    """

    model: str = Field(default="default", description="'default' (embedded SmolLM2), a hub "
                       "id or a path; loaded lazily with rag_gates.lm.load_lm unless `lm` "
                       "is given.")
    method: Literal["tokrag", "cad", "adacad"] = Field(
        default="tokrag", description="Decoder: Tok-RAG, CAD (fixed alpha) or AdaCAD.")
    fusion_layer: int | None = Field(default=None, ge=1, description="Tok-RAG: a fixed "
                                     "fusion layer (skip the l* search).")
    cad_alpha: float = Field(default=0.5, ge=0.0, description="CAD's weight (method='cad').")
    max_new_tokens: int = Field(default=128, gt=0, description="Most tokens per call.")
    top_logprobs: int | None = Field(default=None, ge=0, le=20, description="Per-token "
                                     "log-probabilities with this many alternatives.")
    dataset: str | None = Field(default=None, description="Prompt instruction variant "
                                "(rag_gates.prompts.qa_prompt), e.g. 'pubmedqa'.")

    _lm: Any = PrivateAttr(default=None)
    _decoder: Any = PrivateAttr(default=None)

    def __init__(self, *, lm: Any = None, callback_manager: CallbackManager | None = None,
                 **kwargs: Any) -> None:
        if lm is not None:
            if not isinstance(lm, WhiteBoxLM):
                from rag_gates.errors import WhiteBoxRequiredError

                raise WhiteBoxRequiredError(
                    f"TokRAGLLM reads logits, hidden states and attention; {type(lm).__name__} "
                    "is text-only. Pass rag_gates.lm.load_lm('default') or an HFWhiteBoxLM."
                )
            kwargs.setdefault("model", lm.model_id)
        super().__init__(callback_manager=callback_manager, **kwargs)
        self._lm = lm
        if lm is not None:  # a text-only or unsupported model fails here, not at first call
            _ = self.decoder

    @classmethod
    def class_name(cls) -> str:
        return "TokRAGLLM"

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> TokRAGLLM:
        memo = {} if memo is None else memo
        for shared in (self._lm, self._decoder):  # the model is shared, never copied
            if shared is not None:
                memo[id(shared)] = shared
        return super().__deepcopy__(memo)

    @property
    def decoder(self) -> Any:
        """The rag-gates decoder (``TokRAGDecoder``, ``CADDecoder`` or ``AdaCADDecoder``)."""
        if self._decoder is None:
            with _LOAD_LOCK:
                if self._decoder is None:
                    if self._lm is None:
                        from rag_gates.lm import load_lm

                        self._lm = load_lm(self.model)
                    self._decoder = self._build(self._lm)
        return self._decoder

    async def adecoder(self) -> Any:
        """:attr:`decoder` for async calls: a first load runs in a worker thread."""
        from rag_gates.lm import load_off_event_loop

        return await load_off_event_loop(self._decoder, lambda: self.decoder)

    def _build(self, lm: Any) -> Any:
        from rag_gates.tokrag import AdaCADDecoder, CADDecoder, TokRAGConfig, TokRAGDecoder

        if self.method == "cad":
            return CADDecoder(lm, self.cad_alpha, dataset=self.dataset)
        if self.method == "adacad":
            return AdaCADDecoder(lm, dataset=self.dataset)
        return TokRAGDecoder(lm, TokRAGConfig(fusion_layer=self.fusion_layer),
                             dataset=self.dataset)

    @property
    def metadata(self) -> LLMMetadata:
        lm = self.decoder.lm
        return LLMMetadata(context_window=int(lm.max_context), num_output=self.max_new_tokens,
                           is_chat_model=False, model_name=f"{self.method}:{lm.model_id}")

    def _call(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
        """The decoder's arguments for a call (passages, log-probabilities, budget, stop) and
        the alternatives per token asked for (``top_logprobs``)."""
        top = kwargs.pop("top_logprobs", self.top_logprobs)
        passages = to_passages(kwargs.pop("passages", None))
        unknown = set(kwargs) - _CALL_KWARGS
        if unknown:
            raise TypeError(f"TokRAGLLM got unexpected keyword argument(s) {sorted(unknown)}; "
                            f"accepted: passages, {', '.join(sorted(_CALL_KWARGS))}")
        out: dict[str, Any] = {
            "passages": passages, "logprobs": top_logprobs_to_ask(top),
            "max_new_tokens": kwargs.get("max_new_tokens", self.max_new_tokens)}
        if kwargs.get("stop") is not None:
            out["stop"] = kwargs["stop"]
        return out, top

    def _response(self, generation: Any, top: int | None, delta: str | None = None
                  ) -> CompletionResponse:
        extra: dict[str, Any] = {CHOICES_KEY: generation.summary(),
                                 "finish_reason": generation.finish_reason}
        if generation.logprobs is not None:
            extra[LOGPROBS_LAYOUT_KEY] = LOGPROBS_LAYOUT
        return CompletionResponse(
            text=generation.text, delta=delta, additional_kwargs=extra, raw=generation,
            logprobs=None if generation.logprobs is None
            else to_llama_index_logprobs(generation.logprobs, top))

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any
                 ) -> CompletionResponse:
        call, top = self._call(kwargs)
        return self._response(self.decoder.generate(prompt, **call), top)

    @_loads_model_first(adecoder)
    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any
                        ) -> CompletionResponse:
        call, top = self._call(kwargs)
        decoder = await self.adecoder()
        return self._response(await decoder.agenerate(prompt, **call), top)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any
                        ) -> CompletionResponseGen:
        call, top = self._call(kwargs)
        events = self.decoder.stream_events(prompt, **call)

        def gen() -> CompletionResponseGen:
            text = ""
            for item in events:
                if isinstance(item, str):
                    text += item
                    yield CompletionResponse(text=text, delta=item)
                else:  # the finished generation: choices and logprobs, as complete() gives
                    yield self._response(item, top, delta="")

        return gen()

    @_loads_model_first(adecoder)
    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any
                               ) -> CompletionResponseAsyncGen:
        call, top = self._call(kwargs)
        decoder = await self.adecoder()
        events = decoder.astream_events(prompt, **call)

        async def gen() -> CompletionResponseAsyncGen:
            text = ""
            async for item in events:
                if isinstance(item, str):
                    text += item
                    yield CompletionResponse(text=text, delta=item)
                else:
                    yield self._response(item, top, delta="")

        return gen()


class TokRAGSynthesizer(BaseSynthesizer):
    """A response synthesizer that answers with Tok-RAG (or CAD / AdaCAD): the retrieved
    nodes go to the decoder's RAG stream as passages, the question to both streams.

    ``response.metadata["tokrag"]``: the per-token choices, counts, truncation, warnings and
    trace (for a streaming response, filled in when the stream is exhausted);
    ``response.source_nodes``: the retrieved nodes, unchanged. No nodes: the model answers
    from its own knowledge, with a warning in the metadata.

    Example:
        >>> from llama_index.response_synthesizers.rag_gates import TokRAGSynthesizer
        >>> synth = TokRAGSynthesizer(lm=lm, max_new_tokens=48)
        >>> engine = index.as_query_engine(similarity_top_k=3, response_synthesizer=synth)
        >>> # offline, with no Settings.llm configured, also pass llm=synth.llm (LlamaIndex
        >>> # reads Settings.llm eagerly even when a synthesizer is given)
        >>> response = engine.query("Who directed Ed Wood?")
        >>> str(response), response.metadata["tokrag"]["disagreements"]
        >>> streaming = index.as_query_engine(
        ...     response_synthesizer=TokRAGSynthesizer(lm=lm, streaming=True))
        >>> for piece in streaming.query("Who directed Ed Wood?").response_gen: ...
        >>> response = await engine.aquery("Who directed Ed Wood?")
    """

    def __init__(self, llm: TokRAGLLM | None = None, *, lm: Any = None, streaming: bool = False,
                 callback_manager: CallbackManager | None = None, **llm_kwargs: Any) -> None:
        if llm is None:
            llm = TokRAGLLM(lm=lm, **llm_kwargs)
        elif lm is not None or llm_kwargs:
            raise TypeError("pass either llm=TokRAGLLM(...) or lm=... with its settings")
        if not isinstance(llm, TokRAGLLM):
            raise TypeError(f"llm must be a TokRAGLLM, got {type(llm).__name__}; a model "
                            "goes in as lm= (TokRAGSynthesizer(lm=load_default_lm()))")
        super().__init__(llm=llm, callback_manager=callback_manager, streaming=streaming)
        self.llm: TokRAGLLM = llm

    def _get_prompts(self) -> PromptDictType:
        return {}  # the prompt is rag-gates' QA prompt, shared with the benchmark

    def _update_prompts(self, prompts: PromptDictType) -> None:
        return None

    def get_response(self, query_str: str, text_chunks: Sequence[str], **kwargs: Any) -> Any:
        passages = to_passages(list(text_chunks))
        if self._streaming:
            return self._stream_text(query_str, passages, {})
        return self.llm.complete(query_str, passages=passages).text

    async def aget_response(self, query_str: str, text_chunks: Sequence[str], **kwargs: Any
                            ) -> Any:
        passages = to_passages(list(text_chunks))
        if self._streaming:
            return self._astream_text(query_str, passages, {})
        return (await self.llm.acomplete(query_str, passages=passages)).text

    # Streams go through the LLM's stream_complete, as complete() does for a whole answer,
    # so LlamaIndex's LLM completion events and callbacks fire for a streamed answer too.
    def _stream_text(self, question: str, passages: list[Passage], meta: dict[str, Any]
                     ) -> Generator[str, None, None]:
        for response in self.llm.stream_complete(question, passages=passages):
            if response.delta:
                yield response.delta
            if CHOICES_KEY in response.additional_kwargs:
                meta[CHOICES_KEY] = response.additional_kwargs[CHOICES_KEY]

    async def _astream_text(self, question: str, passages: list[Passage], meta: dict[str, Any]
                            ) -> AsyncGenerator[str, None]:
        async for response in await self.llm.astream_complete(question, passages=passages):
            if response.delta:
                yield response.delta
            if CHOICES_KEY in response.additional_kwargs:
                meta[CHOICES_KEY] = response.additional_kwargs[CHOICES_KEY]

    @staticmethod
    def _inputs(query: QueryTextType, nodes: list[NodeWithScore],
                additional_source_nodes: Sequence[NodeWithScore] | None
                ) -> tuple[str, list[Passage], list[NodeWithScore]]:
        """The question, the nodes as passages, and the response's source nodes."""
        question = query.query_str if isinstance(query, QueryBundle) else str(query)
        return question, to_passages(nodes), list(nodes) + list(additional_source_nodes or [])

    # synthesize/asynthesize are overridden because the base class answers "Empty Response"
    # to no nodes and hands get_response bare text (titles lost); they still fire what
    # LlamaIndex's own fire: the span, the start/end events and the SYNTHESIZE callback event.
    @contextmanager
    def _synthesis_events(self, query: QueryTextType, question: str
                          ) -> Iterator[list[RESPONSE_TYPE]]:
        dispatcher.event(SynthesizeStartEvent(query=query))
        out: list[RESPONSE_TYPE] = []  # the caller appends its response
        with self._callback_manager.event(
                CBEventType.SYNTHESIZE, payload={EventPayload.QUERY_STR: question}) as event:
            yield out
            event.on_end(payload={EventPayload.RESPONSE: out[0]})
        dispatcher.event(SynthesizeEndEvent(query=query, response=out[0]))

    @staticmethod
    def _response(completion: CompletionResponse, sources: list[NodeWithScore]) -> Response:
        return Response(completion.text, source_nodes=sources,
                        metadata={CHOICES_KEY: completion.additional_kwargs[CHOICES_KEY]})

    @dispatcher.span
    def synthesize(self, query: QueryTextType, nodes: list[NodeWithScore],
                   additional_source_nodes: Sequence[NodeWithScore] | None = None,
                   **response_kwargs: Any) -> RESPONSE_TYPE:
        question, passages, sources = self._inputs(query, nodes, additional_source_nodes)
        with self._synthesis_events(query, question) as out:
            if self._streaming:
                meta: dict[str, Any] = {}
                out.append(StreamingResponse(self._stream_text(question, passages, meta),
                                             source_nodes=sources, metadata=meta))
            else:
                out.append(self._response(self.llm.complete(question, passages=passages),
                                          sources))
        return out[0]

    @dispatcher.span
    async def asynthesize(self, query: QueryTextType, nodes: list[NodeWithScore],
                          additional_source_nodes: Sequence[NodeWithScore] | None = None,
                          **response_kwargs: Any) -> RESPONSE_TYPE:
        question, passages, sources = self._inputs(query, nodes, additional_source_nodes)
        with self._synthesis_events(query, question) as out:
            if self._streaming:
                meta: dict[str, Any] = {}
                out.append(AsyncStreamingResponse(self._astream_text(question, passages, meta),
                                                  source_nodes=sources, metadata=meta))
            else:
                out.append(self._response(
                    await self.llm.acomplete(question, passages=passages), sources))
        return out[0]
