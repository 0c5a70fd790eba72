"""The DeepRAG agent loop over any :class:`~rag_gates.lm.base.TextLM` and any retriever.

Each step: the model writes ``Follow up: <subquery>`` (or ``So the final answer is: ...``,
which ends the run); a decision is taken on the subquery; on *retrieve* the loop retrieves
with the **subquery** (top-``k``), writes the passages as ``Context:`` and the model answers
from them; otherwise the model answers from its own knowledge. After ``max_steps`` subqueries
the final answer is forced.

Decision modes (``DeepRAGConfig.mode``):

- ``generate``: the model's own text decides (it writes ``Let's search the question in
  Wikipedia.`` or ``Intermediate answer:`` after the subquery, in the same call);
- ``likelihood``: ``log p(retrieve marker) - log p(direct marker) >= threshold`` after the
  subquery (:class:`~rag_gates.deeprag.gates.MarkerLikelihoodGate`; white-box, or API
  log-probabilities);
- ``always`` / ``never``;
- ``gate``: any rag-gates :class:`~rag_gates.gate.Gate` (QuCo, CBDR, a composite) decides per
  subquery, asked with the subquery as its query.

Malformed steps, the documented rule (each is counted in ``Trajectory.malformed``):

- no marker at the start of the step: the step is asked again once with ``Follow up:``
  already written, so the model writes a subquery (``nudge=True``, the default; untrained
  small models often answer in free text at once, which would make every run closed-book);
- still no marker (``nudge=False``), an empty subquery, or a subquery asked before (a loop)
  ends the decomposition: the final answer is forced (``stop_reason="malformed"``); if no
  step had retrieved yet, the run first retrieves with the question itself (a last step,
  decided by :class:`~rag_gates.deeprag.gates.UnreadableStepGate`: undecided, so it
  retrieves and says why), so an unreadable model never answers from memory in silence;
- generate mode, a subquery followed by neither decision marker: the step retrieves (the
  fail-closed rule of every gate) and goes on.

The authors' rule (``marker_rule="authors"``, generate mode; ``rag-gates bench`` method
``deeprag@authors``): the step is written and read as in the authors' inference loop
(gxy-gxy/DeepRAG ``src/algorithms/sragsftv2.py``): generation runs on through blank lines to
their stop words (``:137``), the step retrieves only when the follow-up ends with ``Let``
(``:94``), and a subquery followed by no marker is answered without retrieval
(``:105-107``); an unreadable step ends the decomposition without the fail-closed retrieval
(their loop never retrieves but at ``Let``). Fail closed stays the default: with it a model
that stops writing markers retrieves rather than answering from memory in silence.

Retrieval that finds nothing: the step says ``Context: (nothing found)`` and the model answers
anyway. Every decision, retrieval and model call is in the returned trace.

Example:
    >>> from rag_gates.deeprag import DeepRAG
    >>> agent = DeepRAG(lm, bm25, mode="likelihood", threshold=0.0)       # doctest: +SKIP
    >>> result = agent.run("Who was the father of the director of Jaws?") # doctest: +SKIP
    >>> print(result.trajectory.render())                                 # doctest: +SKIP
    >>> [d.retrieve for d in result.decisions], result.trace.retrievals   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rag_gates._text import check_text
from rag_gates.deeprag.engine import (
    Ask,
    Driving,
    Emit,
    Executor,
    Program,
    direct_answer,
    final_answer,
    next_step,
    retrieved_answer,
    subquery_line,
)
from rag_gates.deeprag.gates import (
    ConstantGate,
    MarkerGate,
    MarkerLikelihoodGate,
    UnreadableStepGate,
)
from rag_gates.deeprag.trajectory import (
    DeepRAGPrompt,
    MalformedStep,
    Step,
    Trajectory,
    render_steps,
    step_problem,
)
from rag_gates.gate import Gate
from rag_gates.lm.base import TextLM
from rag_gates.retrieval.base import Retriever
from rag_gates.types import GateDecision, PipelineResult, TraceRecorder

__all__ = ["DecisionMode", "DeepRAG", "DeepRAGConfig", "DeepRAGResult"]

DecisionMode = Literal["generate", "likelihood", "always", "never", "gate"]


class DeepRAGConfig(BaseModel):
    """Settings of the DeepRAG loop. Unknown keys are an error (no silent typos)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: DecisionMode = Field("generate", description="Who decides per subquery.")
    threshold: float = Field(0.0, allow_inf_nan=False, description="likelihood mode: "
                             "retrieve when log p(retrieve) - log p(direct) >= this.")
    k: int = Field(3, ge=1, le=50, description="Passages per retrieval.")
    max_steps: int = Field(6, ge=0, le=50, description="Subqueries before the final answer "
                           "is forced (the card: 6 for HotpotQA-like data, 10 otherwise).")
    max_step_tokens: int = Field(64, ge=4, le=1024, description="Tokens for a step's text "
                                 "(subquery, and in generate mode marker and answer).")
    max_answer_tokens: int = Field(48, ge=1, le=1024, description="Tokens per answer.")
    nudge: bool = Field(True, description="A step that starts with no marker is asked again "
                        "once with 'Follow up:' written for the model.")
    marker_rule: Literal["fail_closed", "authors"] = Field(
        "fail_closed", description="generate mode: how a step's text is cut and read. "
        "'fail_closed': the step stops at a blank line or where the next step begins, and a "
        "subquery followed by no decision marker retrieves. 'authors': the authors' stops "
        "and reading (src/algorithms/sragsftv2.py:94,105,137): only a follow-up ending in "
        "'Let' retrieves; no marker is answered directly.")

    @model_validator(mode="after")
    def _rule_needs_generate(self) -> DeepRAGConfig:
        if self.marker_rule != "fail_closed" and self.mode != "generate":
            raise ValueError(f"marker_rule={self.marker_rule!r} reads the decision marker the "
                             f"model writes, which only generate mode has (mode is "
                             f"{self.mode!r}); drop marker_rule or use mode='generate'")
        return self
    prompt: DeepRAGPrompt = Field(default_factory=DeepRAGPrompt)


class DeepRAGResult(PipelineResult):
    """The answer, passages and trace (:class:`PipelineResult`), plus the trajectory."""

    trajectory: Trajectory


class DeepRAG:
    """DeepRAG over any TextLM and any rag-gates Retriever.

    Args:
        lm: a TextLM (``likelihood`` mode: a WhiteBoxLM, or a model returning logprobs).
        retriever: a rag-gates Retriever (framework retrievers through the integration
            packages); may be None only in ``never`` mode.
        config: a :class:`DeepRAGConfig`; keyword overrides (``mode="always"``) also work.
        gate: the gate of ``gate`` mode (mode defaults to ``gate`` when one is given).
        name: the method name in benchmarks and logs.
    """

    def __init__(self, lm: TextLM, retriever: Retriever | None,
                 config: DeepRAGConfig | None = None, *, gate: Gate | None = None,
                 name: str = "deeprag", **overrides: Any) -> None:
        if config is not None and not isinstance(config, DeepRAGConfig):
            raise TypeError(f"config must be a DeepRAGConfig, got {type(config).__name__}; "
                            "settings also go in as keywords (DeepRAG(lm, retriever, k=3))")
        if gate is not None and "mode" not in overrides and config is None:
            overrides["mode"] = "gate"
        base = config or DeepRAGConfig()
        self.config = DeepRAGConfig(**{**dict(base), **overrides}) if overrides else base
        if not isinstance(lm, TextLM):
            raise TypeError(
                f"lm must follow rag_gates' TextLM protocol, got {type(lm).__name__}; wrap a "
                "LangChain or LlamaIndex model with the integration's as_text_lm(...), or use "
                "langchain_rag_gates.DeepRAGRunnable / llama_index's DeepRAGQueryEngine")
        if retriever is not None and not isinstance(retriever, Retriever):
            raise TypeError(
                f"retriever must follow rag_gates' Retriever protocol, got "
                f"{type(retriever).__name__}; wrap a framework retriever with "
                "langchain_rag_gates.LangChainRetrieverAdapter or "
                "llama_index.retrievers.rag_gates.LlamaIndexRetrieverAdapter")
        mode = self.config.mode
        if retriever is None and mode != "never":
            raise ValueError(f"mode {mode!r} may retrieve: pass a retriever (or mode='never')")
        if (gate is not None) != (mode == "gate"):
            raise ValueError("pass gate=... exactly when mode='gate' (got mode "
                             f"{mode!r} and gate {gate!r})")
        # Every step continues the trajectory as the assistant: a served model must be able
        # to take that form (see OpenAICompatibleLM.check_prompt_form); refuse now, not at
        # the first question.
        sample = self.config.prompt.build("?", subquery_line("?"))
        check_form = getattr(lm, "check_prompt_form", None)
        if callable(check_form):
            check_form(sample)
        self.lm = lm
        self.retriever = retriever
        self.name = name
        self.gate: Gate
        if mode == "gate":
            assert gate is not None
            self.gate = gate
        elif mode == "likelihood":
            self.gate = MarkerLikelihoodGate(lm, self.config.threshold, sample_prompt=sample)
        elif mode == "generate":
            self.gate = MarkerGate(missing_marker="answer" if self.config.marker_rule == "authors"
                                   else "retrieve")
        else:
            self.gate = ConstantGate(mode == "always", name=f"deeprag-{mode}")

    # ------------------------------------------------------------------ the loop
    def program(self, question: str) -> Program[Trajectory]:
        """The loop as a request generator (see :mod:`rag_gates.deeprag.engine`)."""
        c = self.config
        fmt = c.prompt
        generate = c.mode == "generate"
        authors = c.marker_rule == "authors"
        steps: list[Step] = []
        malformed: list[MalformedStep] = []
        stop_reason: Literal["answered", "step_cap", "malformed"] = "step_cap"
        final: str | None = None
        while len(steps) < c.max_steps:
            so_far = render_steps(steps)
            st, raw, nudged = yield from next_step(fmt, question, so_far, generate=generate,
                                                   max_new_tokens=c.max_step_tokens,
                                                   nudge=c.nudge, authors=authors)
            if nudged:
                malformed.append(MalformedStep(kind="no_marker", step=len(steps), text=raw,
                                               action="nudged"))
            if authors and st.kind == "final" and not st.final:
                # "So the final" without an answer after it: the authors ask for the final
                # answer in a call of its own (sragsftv2.py:86-87).
                stop_reason = "answered"
                break
            problem = step_problem(st, steps)
            if st.kind == "final" and problem is None:
                stop_reason, final = "answered", st.final
                break
            if problem is not None:
                stop_reason = "malformed"
                # Fail closed: the step cannot be read and nothing was retrieved yet, so no
                # decision was made; retrieve with the question before the final answer. Not
                # in never mode: "never retrieve" is the user's decision, made in advance;
                # nor under the authors' rule, whose loop retrieves only at "Let".
                fail_closed = c.mode != "never" and not authors and not any(
                    s.passages is not None for s in steps)
                malformed.append(MalformedStep(kind=problem, step=len(steps), text=raw,
                                               action="retrieved" if fail_closed
                                               else "forced_final"))
                if fail_closed:
                    unread: GateDecision = yield Ask(UnreadableStepGate(), question,
                                                     {"problem": problem, "written": raw})
                    passages, answer = yield from retrieved_answer(
                        fmt, question, so_far, question, c.k, c.max_answer_tokens)
                    steps.append(Step(subquery=question, decision=unread, passages=passages,
                                      answer=answer))
                    yield Emit(steps[-1])
                break
            if generate:
                if st.decision is None:
                    malformed.append(MalformedStep(kind="no_decision", step=len(steps),
                                                   text=raw, action="answered" if authors
                                                   else "retrieved"))
                signals: dict[str, Any] = {"written": st.decision}
            else:
                signals = {"prompt": fmt.build(question, so_far + subquery_line(st.subquery)),
                           "question": question}
            decision: GateDecision = yield Ask(self.gate, st.subquery, signals)
            if decision.retrieve:
                passages, answer = yield from retrieved_answer(
                    fmt, question, so_far, st.subquery, c.k, c.max_answer_tokens)
                steps.append(Step(subquery=st.subquery, decision=decision, passages=passages,
                                  answer=answer))
                yield Emit(steps[-1])
                continue
            if generate and st.answer:
                answer = st.answer
            else:
                answer = yield from direct_answer(fmt, question, so_far, st.subquery,
                                                  c.max_answer_tokens)
            steps.append(Step(subquery=st.subquery, decision=decision, answer=answer))
            yield Emit(steps[-1])
        if final is None:
            final = yield from final_answer(fmt, question, render_steps(steps),
                                            c.max_answer_tokens,
                                            forced=stop_reason != "answered")
        return Trajectory(question=question, steps=tuple(steps), final_answer=final,
                          stop_reason=stop_reason, malformed=tuple(malformed))

    def _result(self, trajectory: Trajectory, rec: TraceRecorder) -> DeepRAGResult:
        # The steps in the trace too, so a logged trace (a bench record) says which subquery
        # each decision was about (per-subquery analyses read this note).
        with rec.timed("note", "trajectory") as data:
            data["steps"] = [{"subquery": st.subquery, "retrieve": st.retrieved,
                              "answer": st.answer} for st in trajectory.steps]
            data["stop_reason"] = trajectory.stop_reason
            data["malformed"] = len(trajectory.malformed)
        return DeepRAGResult(answer=trajectory.final_answer, trace=rec.trace(),
                             passages=trajectory.passages, trajectory=trajectory)

    def run(self, question: str) -> DeepRAGResult:
        """Answer ``question``; the result carries the trajectory and the full trace."""
        check_text(question, "question")
        rec = TraceRecorder()
        trajectory = Executor(self.lm, self.retriever, rec).run(self.program(question))
        return self._result(trajectory, rec)

    async def arun(self, question: str) -> DeepRAGResult:
        """:meth:`run` with the model's, retriever's and gate's async forms."""
        check_text(question, "question")
        rec = TraceRecorder()
        trajectory = await Executor(self.lm, self.retriever, rec).arun(self.program(question))
        return self._result(trajectory, rec)

    def answer(self, question: str) -> DeepRAGResult:
        """Alias of :meth:`run`, the name every pipeline answers to (and the benchmark calls)."""
        return self.run(question)

    async def aanswer(self, question: str) -> DeepRAGResult:
        return await self.arun(question)

    def stream(self, question: str) -> Iterator[Step | DeepRAGResult]:
        """Each :class:`Step` as soon as it is taken, then the :class:`DeepRAGResult`.

        Example:
            >>> for item in agent.stream("Who was the father of the director of Jaws?"):
            ...     print(item.render() if isinstance(item, Step) else item.answer)
        """
        check_text(question, "question")
        rec = TraceRecorder()
        driving = Driving(self.program(question))
        yield from Executor(self.lm, self.retriever, rec).iterate(driving)
        yield self._result(driving.result, rec)

    async def astream(self, question: str) -> AsyncIterator[Step | DeepRAGResult]:
        """:meth:`stream` with the model's, retriever's and gate's async forms."""
        check_text(question, "question")
        rec = TraceRecorder()
        driving = Driving(self.program(question))
        async for step in Executor(self.lm, self.retriever, rec).aiterate(driving):
            yield step
        yield self._result(driving.result, rec)
