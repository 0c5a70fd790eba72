"""``DeepRAGRunnable``: DeepRAG's step-by-step loop as a LangChain runnable, on any LangChain
chat model or LLM and any LangChain retriever, streaming its steps."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar

from langchain_core.callbacks import AsyncCallbackManagerForChainRun, CallbackManagerForChainRun
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.utils import AddableDict
from pydantic import Field, PrivateAttr

from langchain_rag_gates._inputs import MethodRunnable, rag_gates_retriever, rag_gates_text_lm
from langchain_rag_gates.documents import passages_to_documents
from langchain_rag_gates.retrievers import _adispatch_in_run, _dispatch_in_run
from rag_gates.deeprag import DeepRAG, DeepRAGConfig, DeepRAGResult, Step
from rag_gates.gate import Gate

__all__ = ["STEP_EVENT", "DeepRAGRunnable"]

#: The custom callback event sent as each step is taken (its data: the step's dict).
STEP_EVENT = "rag_gates_deeprag_step"


def _step_dict(index: int, step: Step) -> dict[str, Any]:
    return {
        "index": index,
        "subquery": step.subquery,
        "decision": step.decision.model_dump(mode="json"),
        "documents": None if step.passages is None else passages_to_documents(step.passages),
        "answer": step.answer,
        "text": step.render(),
    }


class DeepRAGRunnable(MethodRunnable):
    """DeepRAG (:class:`rag_gates.deeprag.DeepRAG`) as a runnable: the model splits the
    question into subqueries one at a time, decides per subquery whether to retrieve (with
    the subquery) or answer from its own knowledge, and writes the final answer.

    The model goes through :func:`~langchain_rag_gates.as_text_lm` (chat models and LLMs;
    the loop continues an assistant message, so use a model that continues a final AI
    message, such as :class:`~langchain_rag_gates.ChatRagGates`, or ``style="completion"``
    with an LLM), the retriever through :class:`~langchain_rag_gates.LangChainRetrieverAdapter`.

    Input: the question as a ``str``, or a dict with the question under ``query_key``
    (default ``"question"``).

    Output (an ``AddableDict``):

    - ``"answer"``: the final answer;
    - ``"steps"``: one dict per step: ``index``, ``subquery``, ``decision``
      (``GateDecision.model_dump(mode="json")``), ``documents`` (LangChain ``Document``
      objects retrieved with the subquery; None when answered directly), ``answer``, ``text``
      (the step in DeepRAG's text format);
    - ``"trajectory"``: the whole trajectory in the text format;
    - ``"documents"``: every retrieved passage, as ``Document`` objects;
    - ``"stop_reason"``: ``answered``, ``step_cap`` or ``malformed``; ``"malformed"``: the
      steps the loop could not read and what it did;
    - ``"trace"``: every decision, retrieval and model call (``Trace.model_dump``).

    ``stream`` / ``astream`` yield one chunk ``{"steps": [step]}`` per step as it is taken,
    then the rest of the output; added together (``AddableDict``) the chunks equal the
    ``invoke`` output. Every form (``invoke``, ``ainvoke``, ``stream``, ``astream``) sends each
    step to callback handlers as the custom event ``"rag_gates_deeprag_step"``.

    Setup:
        ```bash
        pip install -c constraints.txt -e ".[hf,qdrant]" -e integrations/langchain
        ```

    Key init args:
        llm: BaseLanguageModel | TextLM
            Any LangChain chat model or LLM (or a rag-gates ``TextLM``).
        retriever: BaseRetriever | Retriever | None
            Any LangChain retriever (or a rag-gates ``Retriever``); None only with
            ``mode="never"``.
        gate: rag_gates Gate | None
            With a gate (QuCo, CBDR, a composite), it decides per subquery.
        deeprag_config: DeepRAGConfig
            Loop settings; its fields may also be given directly (``mode="likelihood"``,
            ``threshold=0.0``, ``k=3``, ``max_steps=6``); they are validated.

    Instantiate:
        ```python
        from langchain_rag_gates import ChatRagGates, DeepRAGRunnable

        deeprag = DeepRAGRunnable(llm=ChatRagGates(model="default"),
                                  retriever=store.as_retriever(), k=3, max_steps=6)
        ```

    Invoke:
        ```python
        out = deeprag.invoke("Who was the father of the director of Jaws?")
        out["answer"], [s["decision"]["retrieve"] for s in out["steps"]]
        print(out["trajectory"])
        for chunk in deeprag.stream(question):
            print(chunk["steps"][0]["text"] if "steps" in chunk else chunk["answer"])
        ```

    Async:
        ```python
        out = await deeprag.ainvoke(question)
        async for chunk in deeprag.astream(question): ...
        ```
    """

    retriever: Any = Field(
        None, exclude=True, description="A LangChain retriever, or a rag-gates Retriever."
    )
    gate: Any = Field(None, exclude=True, description="A rag-gates Gate deciding per subquery.")
    deeprag_config: DeepRAGConfig = Field(
        default_factory=DeepRAGConfig, description="DeepRAG settings (mode, k, max_steps, ...)."
    )
    _agent: DeepRAG = PrivateAttr()
    config_type: ClassVar[type[DeepRAGConfig]] = DeepRAGConfig
    config_field: ClassVar[str] = "deeprag_config"

    def model_post_init(self, context: Any, /) -> None:
        lm = rag_gates_text_lm(self.llm)
        passages = rag_gates_retriever(self.retriever, optional=True)
        if self.gate is not None and not isinstance(self.gate, Gate):
            raise TypeError(f"gate must be a rag-gates Gate, got {type(self.gate).__name__}")
        config = self.deeprag_config
        if self.gate is not None and config.mode != "gate":
            config = config.model_copy(update={"mode": "gate"})
        self._agent = DeepRAG(lm, passages, config, gate=self.gate)

    @property
    def agent(self) -> DeepRAG:
        """The rag-gates loop this runnable drives."""
        return self._agent

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _rest(result: DeepRAGResult) -> AddableDict:
        t = result.trajectory
        return AddableDict(
            answer=result.answer,
            trajectory=t.render(),
            documents=passages_to_documents(result.passages),
            stop_reason=t.stop_reason,
            malformed=[m.model_dump(mode="json") for m in t.malformed],
            trace=result.trace.model_dump(mode="json"),
        )

    def _chunks(self, item: Step | DeepRAGResult, index: int) -> AddableDict:
        if isinstance(item, Step):
            return AddableDict(steps=[_step_dict(index, item)])
        return self._rest(item)

    @staticmethod
    def _merge(chunks: list[AddableDict]) -> dict[str, Any]:
        out = AddableDict(steps=[])
        for chunk in chunks:
            out = out + chunk
        return out

    # ------------------------------------------------------------------ Runnable
    def _stream_steps(self, inputs: Iterator[Any], run_manager: CallbackManagerForChainRun
                      ) -> Iterator[AddableDict]:
        # One code path for invoke and stream: each step is yielded and dispatched as an event.
        for input in inputs:
            for i, item in enumerate(self._agent.stream(self.question_of(input))):
                chunk = self._chunks(item, i)
                if isinstance(item, Step):
                    _dispatch_in_run(STEP_EVENT, chunk["steps"][0], run_manager)
                yield chunk

    async def _astream_steps(self, inputs: AsyncIterator[Any],
                             run_manager: AsyncCallbackManagerForChainRun
                             ) -> AsyncIterator[AddableDict]:
        async for input in inputs:
            i = 0
            async for item in self._agent.astream(self.question_of(input)):
                chunk = self._chunks(item, i)
                i += 1
                if isinstance(item, Step):
                    await _adispatch_in_run(STEP_EVENT, chunk["steps"][0], run_manager)
                yield chunk

    def _run(
        self, input: Any, run_manager: CallbackManagerForChainRun, config: RunnableConfig
    ) -> dict[str, Any]:
        return self._merge(list(self._stream_steps(iter([input]), run_manager)))

    async def _arun(
        self, input: Any, run_manager: AsyncCallbackManagerForChainRun, config: RunnableConfig
    ) -> dict[str, Any]:
        return self._merge([c async for c in self._astream_steps(_once(input), run_manager)])


    def stream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
               ) -> Iterator[dict[str, Any]]:
        # Through the callback manager, so tracing and the step events see a streamed run.
        yield from self._transform_stream_with_config(iter([input]), self._stream_steps, config)

    async def astream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
                      ) -> AsyncIterator[dict[str, Any]]:
        async for chunk in self._atransform_stream_with_config(_once(input),
                                                                self._astream_steps, config):
            yield chunk


async def _once(value: Any) -> AsyncIterator[Any]:
    yield value
