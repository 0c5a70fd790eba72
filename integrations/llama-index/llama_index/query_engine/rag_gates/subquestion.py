"""LlamaIndex's own ``SubQuestionQueryEngine`` as a ``rag-gates bench`` method (a peer baseline
for DeepRAG: decompose the question, retrieve for every sub-question, then answer).

The engine runs with the run's model (through :class:`RagGatesLLM`) and the run's retriever
(through :class:`PassageRetriever` inside a ``RetrieverQueryEngine``, offered to the engine as
its one ``QueryEngineTool``), so it is compared with the other methods on equal terms. Every
model call and retrieval it makes is recorded in the method's trace: the sub-question planning
call as ``llm_call`` ``subquestion-gen``, the sub-answers and the final answer as ``llm``, one
``retrieval`` per sub-question that reached the tool, and a ``note`` ``subquestion`` with the
sub-questions generated and what became of each.

Sub-questions come from LlamaIndex's default ``LLMQuestionGenerator``: its few-shot prompt asks
the model for JSON, parsed by ``SubQuestionOutputParser``. A small model often writes JSON the
parser refuses; that question then gets an empty answer (scored as wrong) and a ``note``
``subquestion-error`` with the parser's error and the model's output, so the failure is counted,
not hidden.

Registered under the ``rag_gates.methods`` entry point as ``subquestion``:

    rag-gates bench --dataset hotpotqa --methods no-rag,single,flare,subquestion --n 100 \\
        --out runs/x

In Python:

    >>> from rag_gates.methods import MethodContext, make_method
    >>> method = make_method("subquestion", MethodContext(lm=lm, retriever=bm25))
    >>> result = method.answer("Were Scott Derrickson and Ed Wood of the same nationality?")
    >>> result.answer, result.trace.retrievals, result.trace.llm_calls
"""

from __future__ import annotations

import inspect
from typing import Any

from llama_index.core.callbacks import CallbackManager, CBEventType, EventPayload
from llama_index.core.callbacks.llama_debug import LlamaDebugHandler
from llama_index.core.output_parsers.base import OutputParserException
from llama_index.core.query_engine import RetrieverQueryEngine, SubQuestionQueryEngine
from llama_index.core.question_gen import LLMQuestionGenerator
from llama_index.core.question_gen.output_parser import SubQuestionOutputParser
from llama_index.core.schema import NodeWithScore
from llama_index.core.tools import QueryEngineTool
from llama_index.query_engine.rag_gates._recorded import recorded_llm, recorded_retriever
from llama_index.retrievers.rag_gates import nodes_to_passages
from pydantic import JsonValue

from rag_gates.errors import RagGatesError
from rag_gates.methods import MethodContext, MethodResult, need_retriever
from rag_gates.types import TraceRecorder

__all__ = ["SubQuestionMethod", "SubQuestionParseError"]

TOOL_NAME = "documents"
"""The one tool's name, which the model must copy into every sub-question's ``tool_name``."""

TOOL_DESCRIPTION = "Retrieves passages from a document collection to answer one factual question."


class SubQuestionParseError(Exception):
    """The model's sub-question output was refused by LlamaIndex's parser.

    Raised (chained from the parser's own error) by :class:`_SignallingParser`, so that a
    parse failure is told apart from every other error of the run; ``output`` is the model's
    text."""

    def __init__(self, output: str, error: Exception) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.output = output
        self.error = error


class _SignallingParser(SubQuestionOutputParser):
    """LlamaIndex's ``SubQuestionOutputParser``, unchanged, except that its failures surface
    as :class:`SubQuestionParseError`.

    The parser fails in three ways (question_gen/output_parser.py, output_parsers/utils.py):
    ``OutputParserException`` when the text is neither JSON nor YAML, ``ValueError`` when it
    holds no JSON at all or an empty one (``[]``, ``{}``; pydantic's ``ValidationError``, a
    ``ValueError``, when an item is not ``{"sub_question", "tool_name"}``), and ``TypeError``
    when ``"items"`` is not a list (``{"items": null}``). Catching those around the whole
    engine instead would also swallow the model's own ``ContextLengthError`` (a
    ``ValueError``), which must stay an error.
    """

    def parse(self, output: str) -> Any:
        try:
            return super().parse(output)
        except (OutputParserException, ValueError, TypeError) as error:
            raise SubQuestionParseError(output, error) from error


class _ErrorWatch:
    """Passes every call through to ``target`` and remembers rag-gates' own errors (a server
    down, a prompt over the context): LlamaIndex's engine catches every exception of a
    sub-question and only logs it (``_query_subq``), which would score a broken run as
    wrong answers. The method raises the first remembered error after the query."""

    def __init__(self, target: Any, errors: list[RagGatesError]) -> None:
        self._target = target
        self._errors = errors

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._target, attr)
        if not callable(value):
            return value
        errors = self._errors
        if inspect.iscoroutinefunction(value):
            async def watched_async(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await value(*args, **kwargs)
                except RagGatesError as error:
                    errors.append(error)
                    raise
            return watched_async

        def watched(*args: Any, **kwargs: Any) -> Any:
            try:
                return value(*args, **kwargs)
            except RagGatesError as error:
                errors.append(error)
                raise
        return watched


class SubQuestionMethod:
    """LlamaIndex's ``SubQuestionQueryEngine`` on the run's model and retriever, with one tool
    (the retriever's query engine) and LlamaIndex's default ``LLMQuestionGenerator``.

    ``question_gen_tokens`` is the generation budget of the sub-question call only: the
    default prompt asks for indented JSON (about 36 SmolLM2 tokens per sub-question, 72 for
    two), which the run's answer budget (``max_new_tokens``, 48 by default) would cut into
    unparseable JSON. Sub-answers and the final answer use ``max_new_tokens``.
    """

    name = "subquestion"

    def __init__(self, ctx: MethodContext, question_gen_tokens: int = 256) -> None:
        if question_gen_tokens < 1:
            raise ValueError(f"question_gen_tokens must be >= 1, got {question_gen_tokens}")
        self.ctx = ctx
        self.retriever = need_retriever(ctx, self.name)
        self.question_gen_tokens = question_gen_tokens

    def answer(self, question: str) -> MethodResult:
        rec = TraceRecorder()
        errors: list[RagGatesError] = []
        ctx = self.ctx.model_copy(update={"lm": _ErrorWatch(self.ctx.lm, errors)})
        llm = recorded_llm(ctx, rec)
        # The LlamaIndex callbacks report each sub-question and its outcome (the engine drops
        # a failed sub-question with only a logged warning: sub_question_query_engine.py).
        events = LlamaDebugHandler(print_trace_on_end=False)
        tool = QueryEngineTool.from_defaults(
            query_engine=RetrieverQueryEngine.from_args(
                recorded_retriever(ctx, _ErrorWatch(self.retriever, errors), rec), llm=llm,
                callback_manager=CallbackManager([events]),
            ),
            name=TOOL_NAME, description=TOOL_DESCRIPTION,
        )
        # The default generator, given explicitly: from_defaults() without one tries the
        # OpenAI function-calling generator and raises ImportError when its package is absent.
        question_gen = LLMQuestionGenerator.from_defaults(
            llm=recorded_llm(ctx, rec, max_new_tokens=self.question_gen_tokens,
                             name="subquestion-gen"),
            output_parser=_SignallingParser(),
        )
        # verbose=False: the engine prints every sub-question and answer otherwise;
        # use_async=False: the bench runs one question per thread, synchronously.
        engine = SubQuestionQueryEngine.from_defaults(
            query_engine_tools=[tool], llm=llm, question_gen=question_gen,
            verbose=False, use_async=False,
        )
        try:
            response = engine.query(question)
        except SubQuestionParseError as error:
            # No sub-questions, so no answer: recorded, scored as an empty answer, counted.
            with rec.timed("note", "subquestion-error") as data:
                # The parser's message may repeat the whole output, which is kept once below.
                data["error"] = str(error)[:300]
                data["output"] = error.output
                data["question_gen_tokens"] = self.question_gen_tokens
            return MethodResult(answer="", trace=rec.trace())
        if errors:  # swallowed inside a sub-question: a failure of the run, not an answer
            raise errors[0]
        answered, nodes = _record_sub_questions(rec, events, self.question_gen_tokens)
        if not answered:
            # Zero sub-questions (or none that reached the tool): the synthesizer makes no model
            # call and answers LlamaIndex's placeholder "Empty Response", not the model's words.
            return MethodResult(answer="", trace=rec.trace())
        return MethodResult(answer=str(response).strip(), trace=rec.trace(),
                            passages=nodes_to_passages(nodes))


def _record_sub_questions(rec: TraceRecorder, events: LlamaDebugHandler,
                          question_gen_tokens: int) -> tuple[int, list[NodeWithScore]]:
    """Record a ``subquestion`` note from the engine's SUB_QUESTION callback events (one
    start/end pair per generated sub-question); return the answered count and the retrieved
    nodes (the response's own source nodes also hold the synthesized "Sub question: ...
    Response: ..." texts)."""
    asked: list[JsonValue] = []
    failed: list[JsonValue] = []
    nodes: list[NodeWithScore] = []
    answered = 0
    for start, end in events.get_event_pairs(CBEventType.SUB_QUESTION):
        sub_q = (start.payload or {})[EventPayload.SUB_QUESTION].sub_q
        asked.append(sub_q.sub_question)
        outcome = end.payload or {}
        if EventPayload.SUB_QUESTION not in outcome:
            # An exception: in the event itself (e.g. a KeyError when the model named a tool
            # other than TOOL_NAME) or deeper, where the engine ends the event empty.
            error = outcome.get(EventPayload.EXCEPTION)
            failed.append({"sub_question": sub_q.sub_question, "tool_name": sub_q.tool_name,
                           "error": f"{type(error).__name__}: {error}" if error is not None
                           else "failed inside the tool (LlamaIndex logged it, no outcome)"})
        else:
            answered += 1
            nodes.extend(outcome[EventPayload.SUB_QUESTION].sources)
    with rec.timed("note", "subquestion") as data:
        data["sub_questions"] = asked
        data["generated"] = len(asked)
        data["answered"] = answered
        data["failed"] = failed
        data["question_gen_tokens"] = question_gen_tokens
    return answered, nodes
