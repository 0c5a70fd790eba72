"""Algorithm 1 of the paper: the trajectory with the fewest retrievals that reaches the gold
answer, by uniform-cost search over the model's own trajectories.

A search node is a trajectory prefix and its retrieval count. Popping a node (one
*expansion*): the model writes the next subquery (or the final answer); a subquery gives two
children, answered directly (same count) and answered from passages retrieved with the
subquery (count + 1). Children are answered when they are popped, so a branch that is never
reached costs nothing. The queue is ordered by (retrievals, steps, insertion): since a child
never costs less than its parent, the first final answer that matches the gold belongs to a
trajectory with the fewest retrievals among all the search can reach (ties: fewer steps).

Stops: a final answer is checked when the model writes it, when ``max_steps`` subqueries are
reached (forced, as in the agent loop), or when a step cannot be read (no marker, empty or
repeated subquery: forced and recorded in ``Trajectory.malformed``); a wrong final answer
ends that branch. ``max_expansions`` caps the pops per question (``status="expansion_cap"``).

Answers match by normalised containment in either direction (the authors' check): the gold
in the prediction or the prediction in the gold, as whole words after SQuAD normalisation.

A *given decomposition* (``decomposition=[(subquery, gold answers), ...]``, e.g. the
testbed's two-hop rows) replaces the model's subqueries: for a model that cannot yet
decompose (a testbed model no longer follows the one-shot format), the search still finds,
per subquery, whether the model answers it from memory or needs retrieval. The subqueries
are asked in order, each in both branches; a branch whose intermediate answer misses that
subquery's gold answers ends there (a later subquery names the earlier answer, so a wrong
answer would otherwise be hidden by it). The last subquery is the question's own last hop,
so its answer is the final answer (checked against the question's gold as above) without a
further call: a testbed model asked for the final line copies the one-shot example's answer
or writes nothing, and the trained model learns the line from the trajectories.

Example:
    >>> search = TrajectorySearch(lm, bm25, max_expansions=32)        # doctest: +SKIP
    >>> found = search.run("Who was the father of the director of Jaws?",
    ...                    ["Arnold Spielberg"])                     # doctest: +SKIP
    >>> found.status, found.trajectory.retrievals, found.expansions   # doctest: +SKIP
    ('found', 1, 3)
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rag_gates._text import check_text
from rag_gates.answers import accuracy, exact_match, normalize_answer
from rag_gates.deeprag.agent import DeepRAGConfig
from rag_gates.deeprag.engine import (
    Executor,
    Program,
    direct_answer,
    final_answer,
    next_step,
    retrieved_answer,
)
from rag_gates.deeprag.gates import ConstantGate
from rag_gates.deeprag.trajectory import (
    MalformedStep,
    Step,
    Trajectory,
    render_steps,
    step_problem,
)
from rag_gates.lm.base import TextLM
from rag_gates.retrieval.base import Retriever
from rag_gates.types import TraceRecorder

__all__ = ["Decomposition", "MatchRule", "SearchOutcome", "TrajectorySearch", "answer_matches"]

MatchRule = Literal["containment", "accuracy", "exact"]
Decomposition = Sequence[tuple[str, Sequence[str]]]
"""Given subqueries in order, each with its gold answers."""
Status = Literal["found", "exhausted", "expansion_cap"]


def answer_matches(prediction: str, golds: Sequence[str], rule: MatchRule = "containment"
                   ) -> bool:
    """Whether ``prediction`` reaches a gold answer. ``containment``: a normalised gold in
    the normalised prediction or the reverse, as whole words; ``accuracy``: only the gold in
    the prediction (the benchmark's accuracy); ``exact``: exact match.

    Example:
        >>> answer_matches("Spielberg", ["Steven Spielberg"]), answer_matches("", ["x"])
        (True, False)
    """
    if rule == "exact":
        return exact_match(prediction, golds) > 0
    if accuracy(prediction, golds) > 0:
        return True
    p = normalize_answer(prediction)
    return rule == "containment" and bool(p) and any(
        f" {p} " in f" {normalize_answer(g)} " for g in golds)


class SearchOutcome(BaseModel):
    """One question's search: the trajectory found (or None) and what it cost."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: Status
    trajectory: Trajectory | None = None
    expansions: int = Field(..., ge=0, description="Nodes popped.")
    max_expansions: int = Field(..., ge=1, description="The cap it ran under.")
    llm_calls: int = Field(0, ge=0)
    retrievals: int = Field(0, ge=0, description="Retrievals made by the whole search.")
    seconds: float = Field(0.0, ge=0.0)

    @property
    def found(self) -> bool:
        return self.trajectory is not None


# A queue entry: (retrievals, steps, insertion order, steps so far, pending subquery
# and branch, malformed steps on the path). The order number is unique, so the tuples never
# compare further.
_Node = tuple[int, int, int, tuple[Step, ...], tuple[str, bool] | None,
              tuple[MalformedStep, ...]]


class TrajectorySearch:
    """Uniform-cost search for the fewest-retrieval trajectory reaching the gold answer.

    Args:
        lm: any TextLM (greedy; the same prompts as :class:`~rag_gates.deeprag.DeepRAG`).
        retriever: any rag-gates Retriever.
        config: the loop settings used for prompts, ``k``, ``max_steps`` and token budgets
            (its decision ``mode`` is not used: the search tries both branches).
        max_expansions: nodes popped per question before giving up.
        match: how a final answer is checked against the gold answers.
    """

    def __init__(self, lm: TextLM, retriever: Retriever, config: DeepRAGConfig | None = None,
                 *, max_expansions: int = 64, match: MatchRule = "containment",
                 **overrides: Any) -> None:
        base = config or DeepRAGConfig()
        self.config = DeepRAGConfig(**{**dict(base), **overrides}) if overrides else base
        if isinstance(max_expansions, bool) or not isinstance(max_expansions, int) \
                or max_expansions < 1:
            raise ValueError(f"max_expansions must be an int >= 1, got {max_expansions!r}")
        if match not in ("containment", "accuracy", "exact"):
            raise ValueError(f"match must be containment, accuracy or exact; got {match!r}")
        self.lm = lm
        self.retriever = retriever
        self.max_expansions = max_expansions
        self.match: MatchRule = match
        self._branch = {True: ConstantGate(True, name="deeprag-search"),
                        False: ConstantGate(False, name="deeprag-search")}

    def program(self, question: str, answers: Sequence[str],
                decomposition: Decomposition | None = None
                ) -> Program[tuple[Status, Trajectory | None, int]]:
        """The search as a request generator: (status, trajectory or None, expansions).
        ``decomposition``: the subqueries to ask, with their gold answers (module docs)."""
        c = self.config
        fmt = c.prompt
        queue: list[_Node] = [(0, 0, 0, (), None, ())]
        order = 1
        expansions = 0
        while queue:
            if expansions >= self.max_expansions:
                return "expansion_cap", None, expansions
            retrievals, _, _, steps, pending, malformed = heapq.heappop(queue)
            expansions += 1
            if pending is not None:
                subquery, retrieve = pending
                so_far = render_steps(steps)
                decision = self._branch[retrieve].decide(subquery)
                if retrieve:
                    passages, answer = yield from retrieved_answer(
                        fmt, question, so_far, subquery, c.k, c.max_answer_tokens)
                    step = Step(subquery=subquery, decision=decision, passages=passages,
                                answer=answer)
                else:
                    answer = yield from direct_answer(fmt, question, so_far, subquery,
                                                      c.max_answer_tokens)
                    step = Step(subquery=subquery, decision=decision, answer=answer)
                steps = (*steps, step)
                if decomposition is not None and not answer_matches(
                        answer, decomposition[len(steps) - 1][1], self.match):
                    continue  # a wrong intermediate answer ends the branch
            so_far = render_steps(steps)
            stop: Literal["answered", "step_cap", "malformed"] = "step_cap"
            final: str | None = None
            subquery_next: str | None = None
            if decomposition is not None:
                if len(steps) < len(decomposition):
                    subquery_next = decomposition[len(steps)][0]
                else:
                    # The last given subquery answers the question: its answer is the final
                    # one (a model that cannot yet write the final line still yields a path).
                    stop, final = "answered", steps[-1].answer
            elif len(steps) < c.max_steps:
                st, raw, nudged = yield from next_step(fmt, question, so_far, generate=False,
                                                       max_new_tokens=c.max_step_tokens,
                                                       nudge=c.nudge)
                if nudged:
                    malformed = (*malformed, MalformedStep(kind="no_marker", step=len(steps),
                                                           text=raw, action="nudged"))
                problem = step_problem(st, steps) if st.kind != "final" else None
                if st.kind == "final":
                    stop, final = "answered", st.final or None
                elif problem is not None:
                    stop = "malformed"
                    malformed = (*malformed, MalformedStep(kind=problem, step=len(steps),
                                                           text=raw, action="forced_final"))
                else:
                    subquery_next = st.subquery
            if subquery_next is not None:
                for branch in (False, True):
                    heapq.heappush(queue, (retrievals + branch, len(steps) + 1, order,
                                           steps, (subquery_next, branch), malformed))
                    order += 1
                continue
            if final is None:
                final = yield from final_answer(fmt, question, so_far, c.max_answer_tokens,
                                                forced=stop != "answered")
            if answer_matches(final, answers, self.match):
                return "found", Trajectory(question=question, steps=steps, final_answer=final,
                                           stop_reason=stop, malformed=malformed), expansions
        return "exhausted", None, expansions

    def _outcome(self, result: tuple[Status, Trajectory | None, int], rec: TraceRecorder,
                 start: float) -> SearchOutcome:
        status, trajectory, expansions = result
        trace = rec.trace()
        return SearchOutcome(status=status, trajectory=trajectory,
                             expansions=expansions, max_expansions=self.max_expansions,
                             llm_calls=trace.llm_calls, retrievals=trace.retrievals,
                             seconds=time.perf_counter() - start)

    @staticmethod
    def _check_answers(answers: Sequence[str], what: str) -> None:
        if isinstance(answers, str) or not answers or not all(
                isinstance(a, str) and a.strip() for a in answers):
            raise ValueError(f"{what} must be a non-empty list of gold answer strings, got "
                             f"{answers!r}")

    def _check(self, question: str, answers: Sequence[str],
               decomposition: Decomposition | None) -> None:
        check_text(question, "question")
        self._check_answers(answers, "answers")
        if decomposition is None:
            return
        if isinstance(decomposition, str) or not decomposition:
            raise ValueError("decomposition must be a non-empty list of (subquery, gold "
                             f"answers) pairs, got {decomposition!r}")
        for i, pair in enumerate(decomposition):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise ValueError(f"decomposition[{i}] must be a (subquery, gold answers) "
                                 f"pair, got {pair!r}")
            check_text(pair[0], f"decomposition[{i}] subquery")
            self._check_answers(pair[1], f"decomposition[{i}] answers")

    def run(self, question: str, answers: Sequence[str], *,
            decomposition: Decomposition | None = None) -> SearchOutcome:
        """Search one question; the outcome says what was found and what it cost.
        ``decomposition``: ask these subqueries instead of the model's (module docs)."""
        self._check(question, answers, decomposition)
        rec, start = TraceRecorder(), time.perf_counter()
        result = Executor(self.lm, self.retriever, rec).run(
            self.program(question, answers, decomposition))
        return self._outcome(result, rec, start)

    async def arun(self, question: str, answers: Sequence[str], *,
                   decomposition: Decomposition | None = None) -> SearchOutcome:
        """:meth:`run` with the model's and retriever's async forms."""
        self._check(question, answers, decomposition)
        rec, start = TraceRecorder(), time.perf_counter()
        result = await Executor(self.lm, self.retriever, rec).arun(
            self.program(question, answers, decomposition))
        return self._outcome(result, rec, start)
