"""``GatedQueryEngine``: any LlamaIndex query engine behind any rag-gates gate, with the LLM
answering directly when the gate says retrieval is not worth it.

Why not ``RetrieverQueryEngine(GatedRetriever(...))``: when the gate says no, that retriever
returns no nodes, and LlamaIndex's response synthesizers never call the LLM without nodes:
the engine answers "Empty Response". This engine asks the gate first and, on a no, has the
LLM answer the question itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Generator
from typing import Any

from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.response.schema import (
    RESPONSE_TYPE,
    AsyncStreamingResponse,
    Response,
    StreamingResponse,
)
from llama_index.core.callbacks import CallbackManager
from llama_index.core.llms import LLM, ChatMessage
from llama_index.core.prompts import BasePromptTemplate, PromptTemplate
from llama_index.core.prompts.mixin import PromptDictType, PromptMixinType
from llama_index.core.schema import NodeWithScore, QueryBundle
from llama_index.core.settings import Settings
from llama_index.llms.rag_gates.base import RagGatesLLM
from llama_index.retrievers.rag_gates.convert import (
    ANNOTATION_KEY,
    annotate_node,
    nodes_to_passages,
)
from llama_index.retrievers.rag_gates.gated import emit_decision
from pydantic import JsonValue

from rag_gates.answer_once import Reuse, find_closed_book_answer, reusable_answer
from rag_gates.gate import Gate
from rag_gates.gated import GateErrorPolicy, adecide, check_gate, check_gate_error_policy, decide
from rag_gates.types import GateDecision

__all__ = ["DEFAULT_ABSTAIN_MESSAGE", "DEFAULT_DIRECT_PROMPT", "GatedQueryEngine"]

DEFAULT_ABSTAIN_MESSAGE = (
    "I don't know: the retrieved passages do not support an answer I can give reliably.")
"""The reply of a three-way spec's abstention (``rag-gates calibrate --abstain``)."""


DEFAULT_DIRECT_PROMPT = PromptTemplate(
    "Answer the question from your own knowledge, briefly.\n"
    "Question: {query_str}\n"
    "Answer: "
)
"""The prompt of the direct (no-retrieval) answer; it has one variable, ``query_str``."""

# The gate's own closed-book prompt, passed whole as the one variable (braces in it stay text).
_VERBATIM = PromptTemplate("{query_str}")


def _settings_llm() -> LLM:
    """LlamaIndex's ``Settings.llm``, or an error saying what to pass: offline, its default
    (OpenAI) fails with a message about an API key the user never meant to use."""
    try:
        return Settings.llm
    except (ValueError, ImportError) as exc:
        raise ValueError(
            "GatedQueryEngine answers a question the gate skips with an LLM: pass llm= (the "
            "LLM of your query engine, or RagGatesLLM(lm=load_default_lm()) offline) or set "
            f"Settings.llm; LlamaIndex's default LLM did not load ({str(exc).strip()[:200]})"
        ) from exc


class GatedQueryEngine(BaseQueryEngine):
    """Ask a rag-gates gate first; retrieve through ``query_engine`` only when it says so.

    For each query the gate decides on ``query_str`` (``gate.decide``; ``gate.adecide`` on
    the async path):

    * retrieval: the wrapped ``query_engine`` answers (from its retrieved nodes); its
      source nodes come back as annotated copies carrying the decision in
      ``metadata[annotation_key]`` (excluded from prompts and embeddings);
    * no retrieval: ``llm`` answers the question directly with ``direct_prompt`` (default
      :data:`DEFAULT_DIRECT_PROMPT`); the wrapped engine, its retriever and its synthesizer
      are not called and ``response.source_nodes`` is ``[]``.

    Answer once: a gate that generated the closed-book answer to decide (``AnswerLogprobGate``,
    or a composite or loaded spec holding one) has written the direct reply already. Without
    a ``direct_prompt`` the direct answer then uses the gate's own prompt, and when ``llm`` is
    a :class:`~llama_index.llms.rag_gates.RagGatesLLM` over the gate's model, greedy, with
    no system prompt and a budget that cannot change the text, the gate's answer is the reply
    (no second generation). ``response.metadata[annotation_key]["answer_once"]`` says whether
    it was reused and why not when it was not; a given ``direct_prompt`` is reused only when
    it renders to the gate's prompt.

    Three-way specs (``rag-gates calibrate --abstain``, loaded with ``load_gate``): after
    retrieval, the reply is the answer the spec's error bound covers: the spec's model
    answers from the engine's retrieved nodes (``query_engine.retrieve`` when the engine has
    it, else the nodes of its response) with the calibration prompt, and the engine abstains
    when that answer's with-passages score is at or above the certified threshold:
    ``response.response`` is then ``abstain_message``, the nodes stay in
    ``source_nodes``, and ``response.metadata[annotation_key]["abstain"]`` holds the
    :class:`~rag_gates.types.AbstainDecision` (its score, threshold and reason) either way.

    Either way the decision (``GateDecision.model_dump(mode="json")``) is in
    ``response.metadata[annotation_key]``, dispatched as a
    :class:`~llama_index.retrievers.rag_gates.GateDecisionEvent` inside the query's
    instrumentation span, and kept in :attr:`last_decision`.

    Setup:
        ```bash
        pip install -c constraints.txt -e ".[hf,qdrant]" -e integrations/llama-index
        ```

    Args:
        query_engine (BaseQueryEngine): the engine that answers with retrieval (a
            ``VectorStoreIndex.as_query_engine()``, a ``RetrieverQueryEngine``, a router, ...).
        gate (Gate): any rag-gates gate (``QuCoGate``, a confidence gate, your own).
        llm (LLM | None): the LLM for direct answers; default ``Settings.llm``. Usually the
            LLM the wrapped engine's synthesizer uses.
        direct_prompt (BasePromptTemplate | None): prompt of the direct answer, with a
            ``{query_str}`` variable.
        annotation_key (str): metadata key of the decision. Defaults to ``"rag_gates"``.
        callback_manager (CallbackManager | None): LlamaIndex callback manager.
        on_gate_error (str): when the gate raises (a prompt too long for the gate's model, a
            served model's timeout): ``"raise"`` (default: the query fails with the gate's
            error) or ``"retrieve"`` (fail closed: the wrapped engine answers, the decision's
            reason and ``evidence["error"]`` name the error, and a warning is logged). Use
            ``"retrieve"`` for an engine an agent calls as a tool (``QueryEngineTool``): an
            agent turns a tool's exception into a message and answers without documents.
        streaming (bool | None): answer a skip as a ``StreamingResponse``
            (``AsyncStreamingResponse`` from ``aquery``) streamed from ``llm``; ``None``
            (default) follows the inner engine's response synthesizer, so
            ``index.as_query_engine(streaming=True)`` streams whichever way the gate decides.
        abstain_message (str): the reply when a three-way spec abstains.

    Instantiate:
        ```python
        from llama_index.core import VectorStoreIndex
        from llama_index.llms.rag_gates import RagGatesLLM
        from llama_index.query_engine.rag_gates import GatedQueryEngine
        from rag_gates.corpus import LocalInfiniGram
        from rag_gates.quco import QuCoGate

        llm = RagGatesLLM(max_new_tokens=48)  # the embedded SmolLM2; any LlamaIndex LLM works
        index = VectorStoreIndex.from_documents(documents, embed_model=embed_model)
        engine = GatedQueryEngine(
            index.as_query_engine(llm=llm, similarity_top_k=3),
            gate=QuCoGate(LocalInfiniGram("indexes/docs"), tau_entity=82),  # see QuCoGate
            llm=llm,
        )
        ```

    Invoke:
        ```python
        response = engine.query("Were Scott Derrickson and Ed Wood of the same nationality?")
        response.metadata["rag_gates"]["retrieve"]   # True: rare entities, retrieved
        response.metadata["rag_gates"]["evidence"]   # {'entities': [...], 'counts': {...}}
        engine.query("What is the capital of the United States?").source_nodes  # []
        ```

    Async:
        ```python
        response = await engine.aquery(question)
        ```
    """

    def __init__(
        self,
        query_engine: BaseQueryEngine,
        gate: Gate,
        llm: LLM | None = None,
        direct_prompt: BasePromptTemplate | None = None,
        annotation_key: str = ANNOTATION_KEY,
        callback_manager: CallbackManager | None = None,
        streaming: bool | None = None,
        on_gate_error: GateErrorPolicy = "raise",
        abstain_message: str = DEFAULT_ABSTAIN_MESSAGE,
    ) -> None:
        if not isinstance(query_engine, BaseQueryEngine):
            raise TypeError(
                f"query_engine must be a LlamaIndex BaseQueryEngine (e.g. "
                f"index.as_query_engine()), got {type(query_engine).__name__}"
            )
        check_gate(gate)
        if llm is not None and not isinstance(llm, LLM):
            raise TypeError(f"llm must be a LlamaIndex LLM, got {type(llm).__name__}")
        if direct_prompt is not None and not isinstance(direct_prompt, BasePromptTemplate):
            raise TypeError(
                f"direct_prompt must be a LlamaIndex prompt template (PromptTemplate), got "
                f"{type(direct_prompt).__name__}"
            )
        if not isinstance(annotation_key, str) or not annotation_key:
            raise ValueError(f"annotation_key must be a non-empty string, got {annotation_key!r}")
        if not isinstance(abstain_message, str) or not abstain_message.strip():
            raise ValueError("abstain_message must be a non-empty string (the reply when a "
                             "three-way spec abstains)")
        policy = check_gate_error_policy(on_gate_error)
        super().__init__(callback_manager=callback_manager)
        self.on_gate_error: GateErrorPolicy = policy
        self.query_engine = query_engine
        self.gate = gate
        self.llm: LLM = llm or _settings_llm()
        self.direct_prompt: BasePromptTemplate = direct_prompt or DEFAULT_DIRECT_PROMPT
        self._direct_prompt_given = direct_prompt is not None
        self.annotation_key = annotation_key
        self.abstain_message = abstain_message
        # A skip answers in the inner engine's shape: a streaming engine's caller reads
        # response_gen whichever way the gate decides.
        self.streaming: bool = bool(getattr(getattr(
            query_engine, "_response_synthesizer", None), "_streaming", False)) \
            if streaming is None else streaming
        self.last_decision: GateDecision | None = None
        """The most recent decision (per instance; read events when queries run concurrently)."""

    # ------------------------------------------------------------------ prompts
    def _get_prompts(self) -> dict[str, Any]:
        return {"direct_prompt": self.direct_prompt}

    def _update_prompts(self, prompts: PromptDictType) -> None:
        if "direct_prompt" in prompts:
            self.direct_prompt = prompts["direct_prompt"]
            self._direct_prompt_given = True

    def _get_prompt_modules(self) -> PromptMixinType:
        return {"query_engine": self.query_engine}

    # ------------------------------------------------------------------ helpers
    def _record(self, query_bundle: QueryBundle, decision: Any) -> dict[str, JsonValue]:
        data = emit_decision(self.gate, query_bundle.query_str, decision)
        self.last_decision = decision
        return data

    def _annotated(self, response: RESPONSE_TYPE, data: dict[str, JsonValue]) -> RESPONSE_TYPE:
        response.source_nodes = [
            annotate_node(n, key=self.annotation_key, value=data) for n in response.source_nodes
        ]
        response.metadata = {**(response.metadata or {}), self.annotation_key: data}
        return response

    def _direct(self, text: str, data: dict[str, JsonValue]) -> Response:
        return Response(response=text, source_nodes=[], metadata={self.annotation_key: data})

    def _streamed(self, pieces: Generator[str, None, None], data: dict[str, JsonValue]
                  ) -> StreamingResponse:
        return StreamingResponse(response_gen=pieces, source_nodes=[],
                                 metadata={self.annotation_key: data})

    def _astreamed(self, pieces: AsyncGenerator[str, None], data: dict[str, JsonValue]
                   ) -> AsyncStreamingResponse:
        return AsyncStreamingResponse(response_gen=pieces, source_nodes=[],
                                      metadata={self.annotation_key: data})

    # ------------------------------------------------------------------ answer once
    def _direct_call(self, decision: GateDecision, query_str: str
                     ) -> tuple[BasePromptTemplate, str, Reuse | None]:
        """The direct answer's template and its one variable's value, and the gate's own
        answer when it is exactly what that call would return (None: no gate generated)."""
        found = find_closed_book_answer(decision)
        if self._direct_prompt_given or found is None or not isinstance(found.prompt, str):
            template, value = self.direct_prompt, query_str
        else:  # the direct answer is the gate's own closed-book prompt
            template, value = _VERBATIM, found.prompt
        if found is None:
            return template, value, None
        return template, value, self._reuse(decision, template.format(query_str=value))

    def _reuse(self, decision: GateDecision, text: str) -> Reuse:
        llm = self.llm
        gate = find_closed_book_answer(decision)
        name = gate.gate if gate else None
        if not isinstance(llm, RagGatesLLM):
            return Reuse(None, f"llm is a {type(llm).__name__}, not a RagGatesLLM: cannot "
                               "check it would write the gate's answer", name)
        if llm.system_prompt:
            return Reuse(None, "llm has a system prompt the gate's answer was written "
                               "without", name)
        prompt, template = llm._chat_input([ChatMessage(role="user", content=text)])
        if template is not None:
            return Reuse(None, "llm formats messages itself (messages_to_prompt)", name)
        return reusable_answer(decision, lm=llm.lm, prompt=prompt,
                               max_new_tokens=llm.max_new_tokens, temperature=llm.temperature)

    @staticmethod
    def _noted(data: dict[str, JsonValue], reuse: Reuse | None) -> dict[str, JsonValue]:
        return data if reuse is None else {**data, "answer_once": reuse.as_json()}

    def _answered(self, text: str, data: dict[str, JsonValue], reuse: Reuse | None
                  ) -> Response:
        return self._direct(text, self._noted(data, reuse))

    # ------------------------------------------------------------------ three-way
    def _three_way(self) -> bool:
        return bool(getattr(self.gate, "abstains", False))

    def _answer_or_abstain(self, query_bundle: QueryBundle, nodes: list[NodeWithScore],
                           data: dict[str, JsonValue]) -> RESPONSE_TYPE:
        """The three-way spec's reply from ``nodes``: its certified answer, or
        ``abstain_message`` (the core step: ``CertifiedGate.answer_or_abstain``)."""
        answer, verdict = self.gate.answer_or_abstain(
            query_bundle.query_str, nodes_to_passages(nodes))
        data = {**data, "abstain": verdict.model_dump(mode="json")}
        text = self.abstain_message if verdict.abstain else answer.answer
        response: RESPONSE_TYPE = (
            StreamingResponse(response_gen=_once(text), source_nodes=nodes)
            if self.streaming else Response(response=text, source_nodes=nodes))
        return self._annotated(response, data)

    def _retrieved(self, query_bundle: QueryBundle, data: dict[str, JsonValue]
                   ) -> RESPONSE_TYPE:
        if not self._three_way():
            return self._annotated(self.query_engine.query(query_bundle), data)
        retrieve = getattr(self.query_engine, "retrieve", None)
        nodes = list(retrieve(query_bundle) if callable(retrieve) else
                     self.query_engine.query(query_bundle).source_nodes)
        return self._answer_or_abstain(query_bundle, nodes, data)

    async def _aretrieved(self, query_bundle: QueryBundle, data: dict[str, JsonValue]
                          ) -> RESPONSE_TYPE:
        if not self._three_way():
            return self._annotated(await self.query_engine.aquery(query_bundle), data)
        retrieve = getattr(self.query_engine, "aretrieve", None)
        nodes = list(await retrieve(query_bundle) if callable(retrieve) else
                     (await self.query_engine.aquery(query_bundle)).source_nodes)
        # The answer is a model call: off the event loop.
        return await asyncio.to_thread(self._answer_or_abstain, query_bundle, nodes, data)

    # ------------------------------------------------------------------ query
    def _query(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        decision = decide(self.gate, query_bundle.query_str, self.on_gate_error)
        data = self._record(query_bundle, decision)
        if data["retrieve"]:
            return self._retrieved(query_bundle, data)
        template, value, reuse = self._direct_call(decision, query_bundle.query_str)
        if self.streaming:
            noted = self._noted(data, reuse)
            if reuse is not None and reuse.answer is not None:
                return self._streamed(_once(reuse.answer), noted)
            return self._streamed(self.llm.stream(template, query_str=value), noted)
        if reuse is not None and reuse.answer is not None:
            return self._answered(reuse.answer, data, reuse)
        return self._answered(self.llm.predict(template, query_str=value), data, reuse)

    async def _aquery(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        decision = await adecide(self.gate, query_bundle.query_str, self.on_gate_error)
        data = self._record(query_bundle, decision)
        if data["retrieve"]:
            return await self._aretrieved(query_bundle, data)
        if isinstance(self.llm, RagGatesLLM):
            await self.llm.alm()  # a first load in a worker thread: the reuse check reads it
        template, value, reuse = self._direct_call(decision, query_bundle.query_str)
        if self.streaming:
            noted = self._noted(data, reuse)
            if reuse is not None and reuse.answer is not None:
                return self._astreamed(_aonce(reuse.answer), noted)
            return self._astreamed(await self.llm.astream(template, query_str=value), noted)
        if reuse is not None and reuse.answer is not None:
            return self._answered(reuse.answer, data, reuse)
        return self._answered(await self.llm.apredict(template, query_str=value), data, reuse)


def _once(text: str) -> Generator[str, None, None]:
    yield text


async def _aonce(text: str) -> AsyncGenerator[str, None]:
    yield text
