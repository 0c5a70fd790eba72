"""``TokRAGRunnable``: Tok-RAG (or CAD / AdaCAD) as a LangChain runnable that takes the
question and the retrieved documents separately."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, Literal, cast

from langchain_core.documents import Document
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.messages.ai import UsageMetadata
from langchain_core.runnables import RunnableConfig, RunnableSerializable
from pydantic import ConfigDict, Field, PrivateAttr

from langchain_rag_gates.documents import document_to_passage
from rag_gates.types import Passage

__all__ = ["CHOICES_KEY", "TokRAGRunnable"]

CHOICES_KEY = "tokrag"
"""``response_metadata`` key of the decoder's record (choices, counts, trace)."""

_LOAD_LOCK = threading.Lock()


class TokRAGRunnable(RunnableSerializable[Any, AIMessage]):
    """Answer with Tok-RAG: the model with the retrieved documents and without them decode in
    lockstep; where they disagree, the token the documents support is kept.

    Input: a dict ``{"question": str, "documents": [Document | (Document, score) | str]}``
    (keys configurable), so it drops into an LCEL chain after a retriever. An empty list:
    plain generation, with a warning in the metadata; a missing documents key is a
    ``KeyError`` naming the keys given (a chain that calls them ``"context"``, say).

    Output: an ``AIMessage`` (``| StrOutputParser()`` gives the text) with
    ``response_metadata["tokrag"]``: one choice per token (both streams' candidates, the side
    kept, Tok-RAG's score and fusion layer), counts, truncation, warnings and the trace;
    ``response_metadata["logprobs"]`` (OpenAI shape) with ``top_logprobs`` set;
    ``usage_metadata`` token counts. ``stream``/``astream`` yield one ``AIMessageChunk`` per
    chosen piece of text; the last chunk carries the metadata (with the logprobs).
    ``ainvoke`` and ``astream`` run the model in a worker thread.

    Setup:
        ``pip install -c constraints.txt -e ".[hf,qdrant]" -e integrations/langchain`` (from
        the clone's root)

    Instantiate:
        ```python
        from langchain_core.runnables import RunnablePassthrough
        from langchain_rag_gates import TokRAGRunnable
        from rag_gates.lm import load_lm

        tokrag = TokRAGRunnable(lm=load_lm("default"), max_new_tokens=48)
        chain = {"question": RunnablePassthrough(), "documents": retriever} | tokrag
        ```

    Invoke:
        ```python
        msg = chain.invoke("Who directed Ed Wood?")
        msg.content, msg.response_metadata["tokrag"]["disagreements"]
        for chunk in chain.stream("Who directed Ed Wood?"): print(chunk.content, end="")
        msg = await chain.ainvoke("Who directed Ed Wood?")
        TokRAGRunnable(lm=lm, method="cad", cad_alpha=1.0)      # context-aware decoding
        ```
    """

    model: str = Field("default", description="'default' (embedded SmolLM2), a hub id or a "
                       "path, loaded lazily with rag_gates.lm.load_lm unless `lm` is given.")
    lm: Any = Field(None, exclude=True, description="A rag-gates white-box model (optional).")
    method: Literal["tokrag", "cad", "adacad"] = Field("tokrag", description="Decoder.")
    fusion_layer: int | None = Field(None, ge=1, description="Tok-RAG: fixed fusion layer.")
    cad_alpha: float = Field(0.5, ge=0.0, description="CAD's weight (method='cad').")
    max_new_tokens: int = Field(128, gt=0)
    top_logprobs: int | None = Field(None, ge=0, le=20, description="Per-token logprobs "
                                     "with this many alternatives (None: none).")
    stop: list[str] | None = Field(None, description="Stop strings (excluded from the text).")
    dataset: str | None = Field(None, description="Prompt variant, e.g. 'pubmedqa'.")
    question_key: str = Field("question", min_length=1)
    documents_key: str = Field("documents", min_length=1)

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    _decoder: Any = PrivateAttr(default=None)

    def model_post_init(self, context: Any, /) -> None:
        if self.lm is not None:  # a text-only model fails here, not at the first call
            _ = self.decoder

    @property
    def decoder(self) -> Any:
        """The rag-gates decoder (``TokRAGDecoder``, ``CADDecoder`` or ``AdaCADDecoder``)."""
        if self._decoder is None:
            with _LOAD_LOCK:
                if self._decoder is None:
                    from rag_gates.tokrag import (
                        AdaCADDecoder,
                        CADDecoder,
                        TokRAGConfig,
                        TokRAGDecoder,
                    )

                    if self.lm is None:
                        from rag_gates.lm import load_lm

                        self.lm = load_lm(self.model)
                    if self.method == "cad":
                        self._decoder = CADDecoder(self.lm, self.cad_alpha, dataset=self.dataset)
                    elif self.method == "adacad":
                        self._decoder = AdaCADDecoder(self.lm, dataset=self.dataset)
                    else:
                        self._decoder = TokRAGDecoder(
                            self.lm, TokRAGConfig(fusion_layer=self.fusion_layer),
                            dataset=self.dataset)
        return self._decoder

    async def _adecoder(self) -> Any:
        """:attr:`decoder` for async calls: a first load runs in a worker thread."""
        from rag_gates.lm import load_off_event_loop

        return await load_off_event_loop(self._decoder, lambda: self.decoder)

    # ------------------------------------------------------------------ input / output
    def _split(self, input: Any) -> tuple[str, list[Passage]]:
        if not isinstance(input, Mapping):
            raise TypeError(f"TokRAGRunnable takes a dict {{'{self.question_key}': ..., "
                            f"'{self.documents_key}': [...]}}, got {type(input).__name__}")
        if self.question_key not in input:
            raise KeyError(f"input has no {self.question_key!r} key (the question)")
        if self.documents_key not in input:
            # Most often the chain names the retriever's output otherwise ("context"): read
            # as "no documents", every answer would be closed book without a word.
            raise KeyError(
                f"input has no {self.documents_key!r} key (the retrieved documents); it has "
                f"{sorted(map(str, input))}: name the retriever's output "
                f"{self.documents_key!r}, set documents_key=, or pass "
                f"{{{self.documents_key!r}: []}} for plain generation")
        docs = input[self.documents_key] or []
        if isinstance(docs, str | Document):
            raise TypeError(f"{self.documents_key!r} must be a list of documents")
        passages: list[Passage] = []
        for i, d in enumerate(docs):
            if isinstance(d, str):
                passages.append(Passage(text=d))
            elif isinstance(d, Document):
                passages.append(document_to_passage(d))
            elif isinstance(d, tuple) and len(d) == 2 and isinstance(d[0], Document):
                passages.append(document_to_passage(d[0], score=float(d[1])))
            else:
                raise TypeError(f"document {i} must be a Document, (Document, score) or str, "
                                f"got {type(d).__name__}")
        return input[self.question_key], passages

    def _metadata(self, generation: Any) -> dict[str, Any]:
        meta: dict[str, Any] = {CHOICES_KEY: generation.summary(),
                                "finish_reason": generation.finish_reason,
                                "model_name": self.decoder.model_id}
        if generation.logprobs is not None:
            meta["logprobs"] = {"content": [t.model_dump() for t in generation.logprobs]}
        return meta

    @staticmethod
    def _usage(generation: Any) -> UsageMetadata:
        return {"input_tokens": generation.prompt_tokens,
                "output_tokens": generation.completion_tokens,
                "total_tokens": generation.prompt_tokens + generation.completion_tokens}

    def _message(self, generation: Any) -> AIMessage:
        return AIMessage(content=generation.text, response_metadata=self._metadata(generation),
                         usage_metadata=self._usage(generation))

    def _kwargs(self) -> dict[str, Any]:
        return {"max_new_tokens": self.max_new_tokens, "stop": self.stop}

    # ------------------------------------------------------------------ runnable
    def _invoke(self, input: Any) -> AIMessage:
        question, passages = self._split(input)
        return self._message(self.decoder.generate(question, passages=passages,
                                                   logprobs=self.top_logprobs,
                                                   **self._kwargs()))

    async def _ainvoke(self, input: Any) -> AIMessage:
        question, passages = self._split(input)
        decoder = await self._adecoder()
        return self._message(await decoder.agenerate(question, passages=passages,
                                                     logprobs=self.top_logprobs,
                                                     **self._kwargs()))

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
               ) -> AIMessage:
        return self._call_with_config(self._invoke, input, config)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
                      ) -> AIMessage:
        return await self._acall_with_config(self._ainvoke, input, config)

    def _chunk(self, item: Any) -> AIMessageChunk:
        if isinstance(item, str):
            return AIMessageChunk(content=item)
        return AIMessageChunk(content="", response_metadata=self._metadata(item),
                              usage_metadata=self._usage(item), chunk_position="last")

    def _stream_chunks(self, inputs: Iterator[Any]) -> Iterator[AIMessageChunk]:
        for input in inputs:
            question, passages = self._split(input)
            for item in self.decoder.stream_events(question, passages=passages,
                                                   logprobs=self.top_logprobs,
                                                   **self._kwargs()):
                yield self._chunk(item)

    async def _astream_chunks(self, inputs: AsyncIterator[Any]
                              ) -> AsyncIterator[AIMessageChunk]:
        async for input in inputs:
            question, passages = self._split(input)
            decoder = await self._adecoder()
            async for item in decoder.astream_events(question, passages=passages,
                                                     logprobs=self.top_logprobs,
                                                     **self._kwargs()):
                yield self._chunk(item)

    def stream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
               ) -> Iterator[AIMessageChunk]:
        # Through the callback manager, so tracing and callbacks see a streamed run.
        for chunk in self._transform_stream_with_config(iter([input]), self._stream_chunks,
                                                        config):
            yield cast(AIMessageChunk, chunk)  # Output is AIMessage; the stream's are chunks

    async def astream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
                      ) -> AsyncIterator[AIMessageChunk]:
        async for chunk in self._atransform_stream_with_config(_once(input),
                                                                self._astream_chunks, config):
            yield cast(AIMessageChunk, chunk)


async def _once(value: Any) -> AsyncIterator[Any]:
    yield value
