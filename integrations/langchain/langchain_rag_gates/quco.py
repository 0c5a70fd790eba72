"""``QuCoRunnable``: QuCo-RAG's dynamic generation loop as a LangChain runnable, on any
LangChain chat model or LLM and any LangChain retriever."""

from __future__ import annotations

from typing import Any, ClassVar

from langchain_core.callbacks import AsyncCallbackManagerForChainRun, CallbackManagerForChainRun
from langchain_core.runnables import RunnableConfig
from pydantic import Field, PrivateAttr

from langchain_rag_gates._inputs import MethodRunnable, rag_gates_retriever, rag_gates_text_lm
from langchain_rag_gates.documents import passages_to_documents
from langchain_rag_gates.retrievers import DECISION_EVENT, _adispatch_in_run, _dispatch_in_run
from rag_gates.corpus.base import CorpusStats
from rag_gates.quco import QuCoConfig, QuCoPipeline, QuCoResult

__all__ = ["QuCoRunnable"]


class QuCoRunnable(MethodRunnable):
    """QuCo-RAG (:class:`rag_gates.quco.QuCoPipeline`) as a runnable.

    Each input runs QuCo's loop: the pre-generation gate (rare question entities ->
    retrieve), chunked generation, claim verification against corpus co-occurrence, and
    re-retrieval for flagged claims (at most ``max_rounds`` times). The model goes through
    :func:`~langchain_rag_gates.as_text_lm` (chat models and LLMs alike), the retriever
    through :class:`~langchain_rag_gates.LangChainRetrieverAdapter`; their runs nest under
    this runnable's run in callbacks and tracing.

    Input: the question as a ``str``, or a dict with the question under ``query_key``
    (default ``"question"``).

    Output (a dict):

    - ``"answer"``: the answer text;
    - ``"decision"``: the pre-check gate decision, ``GateDecision.model_dump(mode="json")``
      (None with ``pre_check=False``); also sent to callback handlers as the custom event
      ``"rag_gates_decision"`` (when the loop has finished);
    - ``"documents"``: every passage the loop used, as LangChain ``Document`` objects;
    - ``"rounds"``: regeneration rounds triggered by flagged claims;
    - ``"trace"``: every decision, retrieval, model call and verification
      (``Trace.model_dump(mode="json")``);
    - ``"verifications"``: one ``Verification.summary()`` per verified chunk;
    - ``"stop_reason"``: why the loop ended.

    ``invoke``, ``ainvoke`` (the loop runs in a worker thread), ``batch`` and ``abatch``
    work; it composes in LCEL like any runnable. ``stream``/``astream`` are LangChain's
    defaults: one chunk, the whole output dict, when the loop has finished (a verified
    answer is only known then).

    Setup:
        ```bash
        pip install -c constraints.txt -e ".[hf,qdrant,corpus]" -e integrations/langchain
        ```

    Key init args:
        llm: BaseLanguageModel | TextLM
            Any LangChain chat model or LLM (or a rag-gates ``TextLM``).
        retriever: BaseRetriever | Retriever
            Any LangChain retriever (or a rag-gates ``Retriever``).
        stats: CorpusStats
            Corpus statistics for the gate and the verifier: a ``LocalInfiniGram`` over an
            index of your documents (``rag-gates index build docs/ --out indexes/docs``), or
            the hosted infini-gram API.
        extractor: Extractor | None
            Entity/claim extractor; default ``rag_gates.extract.default_extractor()``.
        quco_config: QuCoConfig
            QuCo settings. Its fields may also be given directly (``tau_entity=82``,
            ``k=3``, ``max_new_tokens=48``); they are validated.

    Instantiate:
        ```python
        from langchain_core.vectorstores import InMemoryVectorStore
        from langchain_rag_gates import ChatRagGates, QuCoRunnable
        from rag_gates.corpus import LocalInfiniGram

        quco = QuCoRunnable(
            llm=ChatRagGates(model="default"),            # any chat model or LLM
            retriever=store.as_retriever(),
            stats=LocalInfiniGram("indexes/docs"),  # rag-gates index build docs/ --out indexes/docs
            tau_entity=82,  # calibrate on your own labelled questions: rag-gates eval-gate
            k=3, max_new_tokens=48,
        )
        ```

    Invoke:
        ```python
        out = quco.invoke("Were Scott Derrickson and Ed Wood of the same nationality?")
        out["answer"], out["decision"]["retrieve"], out["decision"]["reason"]
        [d.metadata["title"] for d in out["documents"]]
        quco.invoke({"question": "Who directed Ed Wood?"})
        quco.batch([question_1, question_2])
        ```

    Async:
        ```python
        out = await quco.ainvoke(question)
        outs = await quco.abatch([question_1, question_2])
        ```
    """

    retriever: Any = Field(
        ..., exclude=True, description="A LangChain retriever, or a rag-gates Retriever."
    )
    stats: Any = Field(
        ..., exclude=True, description="rag_gates.corpus.CorpusStats for gate and verifier."
    )
    extractor: Any = Field(
        None, exclude=True, description="Entity/claim extractor (default: the package's)."
    )
    quco_config: QuCoConfig = Field(
        default_factory=QuCoConfig, description="QuCo settings (tau_entity, k, ...)."
    )
    _pipeline: QuCoPipeline = PrivateAttr()
    config_type: ClassVar[type[QuCoConfig]] = QuCoConfig
    config_field: ClassVar[str] = "quco_config"

    def model_post_init(self, context: Any, /) -> None:
        lm = rag_gates_text_lm(self.llm)
        passages = rag_gates_retriever(self.retriever)
        if not isinstance(self.stats, CorpusStats):
            raise TypeError(
                f"stats must be a rag_gates.corpus.CorpusStats (load_corpus_stats(), "
                f"LocalInfiniGram, HostedInfiniGram), got {type(self.stats).__name__}"
            )
        self._pipeline = QuCoPipeline(lm, passages, self.stats, self.extractor,
                                      self.quco_config)

    @property
    def pipeline(self) -> QuCoPipeline:
        """The rag-gates pipeline this runnable drives."""
        return self._pipeline

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def output_of(result: QuCoResult) -> dict[str, Any]:
        """The runnable's output dict for a pipeline result."""
        return {
            "answer": result.answer,
            "decision": None if result.decision is None
            else result.decision.model_dump(mode="json"),
            "documents": passages_to_documents(result.passages),
            "rounds": result.rounds,
            "trace": result.trace.model_dump(mode="json"),
            "verifications": [v.summary() for v in result.verifications],
            "stop_reason": result.stop_reason,
        }

    def _run(
        self, input: Any, run_manager: CallbackManagerForChainRun, config: RunnableConfig
    ) -> dict[str, Any]:
        output = self.output_of(self._pipeline.run(self.question_of(input)))
        if output["decision"] is not None:
            _dispatch_in_run(DECISION_EVENT, output["decision"], run_manager)
        return output

    async def _arun(
        self, input: Any, run_manager: AsyncCallbackManagerForChainRun, config: RunnableConfig
    ) -> dict[str, Any]:
        output = self.output_of(await self._pipeline.arun(self.question_of(input)))
        if output["decision"] is not None:
            await _adispatch_in_run(DECISION_EVENT, output["decision"], run_manager)
        return output
