"""A certificate that watches itself: shadow-check a served gate and raise an alarm, with
a stated confidence, when skipping retrieval has come to cost more than epsilon.

A certified threshold (:func:`~rag_gates.calibration.load_gate`) holds for questions drawn
like the calibration ones. :class:`WatchedGate` checks that in production without labels:
each question draws a seeded coin with probability ``shadow_share``; when the coin is up and
the gate *skips* retrieval, it retrieves anyway and answers both ways (closed book and with
the passages, with the prompts ``rag-gates calibrate`` uses,
:func:`rag_gates.prompts.qa_prompt`; the closed-book answer a gate already generated is
reused, :mod:`rag_gates.answer_once`) and compares the two replies with the same-answer
judge calibrate uses (:mod:`rag_gates.calibration.judges`). Where the two replies are the same
answer skipping cannot have cost a right answer, so a disagreement is a label-free,
conservative stand-in for "skipping cost a right answer".

The coin-up questions are a uniform subsample of the traffic; on each, ``x = 1`` when the
gate skipped and the two replies differ, else 0 (a question the gate retrieved costs nothing
to check: ``x = 0``). The mean of ``x`` is the skip share times the disagreement rate among
skipped questions, which bounds the accuracy drop of serving the gate (with the ``exact``
judge, whatever the gold answers). The watch keeps an anytime-valid test of
``H0: mean(x) <= epsilon``: the betting capital of Waudby-Smith and Ramdas ("Estimating means
of bounded random variables by betting", arXiv 2010.09686), the process
:func:`rag_gates.calibration.bounds.wsr_log_capital` computes for calibration, betting the
other way (``1 - x`` against ``1 - epsilon``) with the paper's horizon-free predictable
plug-in bet (:func:`capital_path`). Under H0 the capital is a non-negative supermartingale,
so by Ville's inequality it ever reaches ``1 / alarm_delta`` with probability at most
``alarm_delta``: checking after every question, and stopping whenever, is fine. When it
does, the alarm fires (and stays on): one ``logging`` warning and the ``on_alarm`` callback.

The decisions are the inner gate's, unchanged; every one carries ``evidence["watch"]``
(sampled, shadowed, the two replies when shadowed, the running e-value, the alarm). A shadow
check that fails is logged and counted (``errors``) and never changes the decision. The
counts and the capital live in a small JSON state file, updated under a file lock with an
atomic write, so several worker processes share one test (:meth:`WatchedGate.status`).

Setup:
    ``pip install rag-gates``; a spec written by ``rag-gates calibrate``; the model and the
    retriever it was calibrated with.

Instantiate:
    ``WatchedGate(load_gate("gate.json", lm=lm), lm=lm, retriever=bm25, shadow_share=0.05,
    state="gate.watch.json")``

Invoke:
    ``decide`` / ``adecide`` / ``decide_batch`` as any gate; ``status()`` for the test;
    ``rag-gates audit LOG`` replays a log of the decisions through the same test.

Example:
    >>> from rag_gates.calibration import load_gate
    >>> from rag_gates.calibration.watch import WatchedGate
    >>> gate = WatchedGate(load_gate("gate.json", lm=lm), lm=lm, retriever=bm25,
    ...                    shadow_share=0.05, state="gate.watch.json")   # doctest: +SKIP
    >>> d = gate.decide("Who wrote Hamlet?")                             # doctest: +SKIP
    >>> d.evidence["watch"]["e_value"], gate.status().alarm               # doctest: +SKIP
    (1.0, False)
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from rag_gates.calibration.bounds import WSR_TRUNCATION
from rag_gates.calibration.judges import JUDGE_SYNTAX, SameAnswer, parse_same_answer
from rag_gates.calibration.load import CertifiedGate
from rag_gates.calibration.spec import utc_now
from rag_gates.types import GateDecision, Passage

__all__ = ["WATCH_STATE_FORMAT", "WatchState", "WatchStatus", "WatchTest", "WatchedGate",
           "capital_path", "disagreement_baseline", "replay", "status_of", "watch_bet"]

logger = logging.getLogger(__name__)

WATCH_STATE_FORMAT = "rag-gates/watch-state/1"
MAX_STATE_BYTES = 64 * 1024
"""A state file is a few hundred bytes; anything past this is not one."""
FLUSH_EVERY = 100
"""Questions a process counts before it writes its counts to the state file (a shadow
check writes them at once)."""
_MAX_LOG = 700.0
"""``exp`` of more overflows a float: an e-value above ``e^700`` is reported as that."""


# --- The test -----------------------------------------------------------------------------

def watch_bet(t: int | NDArray[np.float64], prev_var: float | NDArray[np.float64],
              epsilon: float, alpha: float, horizon: int | None = None
              ) -> NDArray[np.float64]:
    """The bet on the ``t``-th observation (t = 1, 2, ...): the predictable plug-in of
    Waudby-Smith and Ramdas, ``sqrt(2 log(1/alpha) / (sigma_{t-1}^2 * h_t))``, truncated at
    ``WSR_TRUNCATION / epsilon`` so the capital loses at most that share of itself on one
    observation. ``h_t = t log(1 + t)`` is the paper's horizon-free choice (an e-process for
    an open-ended stream); ``horizon=n`` gives ``h_t = n``, the fixed-sample choice
    :func:`~rag_gates.calibration.bounds.wsr_log_capital` makes."""
    t_arr = np.asarray(t, dtype=np.float64)
    scale = t_arr * np.log1p(t_arr) if horizon is None else np.full_like(t_arr, horizon)
    bet = np.sqrt(2.0 * math.log(1.0 / alpha) / (np.asarray(prev_var) * scale))
    out: NDArray[np.float64] = np.minimum(bet, WSR_TRUNCATION / epsilon)
    return out


def capital_path(x: NDArray[np.float64] | Sequence[float], epsilon: float, alpha: float,
                 horizon: int | None = None) -> NDArray[np.float64]:
    """``log K_t`` after each observation (last axis, in the order observed) of the capital
    ``K_t = prod_{i <= t} (1 + lambda_i (x_i - epsilon))`` betting that the mean of ``x``
    (values in [0, 1]) is above ``epsilon``; vectorised over leading axes.

    It is :func:`~rag_gates.calibration.bounds.wsr_log_capital` on ``1 - x`` against
    ``m = 1 - epsilon`` (the same running mean ``(1/2 + sum x) / (t + 1)``, running variance
    ``(1/4 + sum (x_i - mu_i)^2) / (t + 1)``, bet and truncation), with the bet of
    :func:`watch_bet`: with ``horizon=len(x)`` its maximum (floored at 0) is exactly
    ``wsr_log_capital(1 - x, 1 - epsilon, alpha)``. Each bet uses only earlier
    observations, so under ``H0: E[x_t | past] <= epsilon`` the capital is a non-negative
    supermartingale and ``P(max_t K_t >= 1/alpha) <= alpha`` (Ville).

    Example:
        >>> import numpy as np
        >>> path = capital_path(np.r_[np.zeros(30), np.ones(10)], 0.05, 0.1)
        >>> bool(path[29] < 0), bool(path[-1] > np.log(10))   # 10 in a row cross 1/alpha
        (True, True)
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[-1]
    t = np.arange(1, n + 1, dtype=np.float64)
    mu = (0.5 + np.cumsum(x, axis=-1)) / (t + 1.0)
    var = (0.25 + np.cumsum((x - mu) ** 2, axis=-1)) / (t + 1.0)
    prev = np.concatenate([np.full((*x.shape[:-1], 1), 0.25), var[..., :-1]], axis=-1)
    bet = watch_bet(t, prev, epsilon, alpha, horizon)
    out: NDArray[np.float64] = np.cumsum(np.log1p(bet * (x - epsilon)), axis=-1)
    return out


class WatchTest(BaseModel):
    """The running test, one observation at a time (:meth:`update` is :func:`capital_path`
    one step on): what the state file keeps so any process can continue it."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    epsilon: float = Field(..., gt=0.0, lt=1.0, description="H0: mean of x <= epsilon.")
    alpha: float = Field(..., gt=0.0, lt=1.0, description="Alarm when K >= 1/alpha.")
    n: int = Field(0, ge=0, description="Observations so far.")
    ones: float = Field(0.0, ge=0.0, description="Their sum (disagreements on skips).")
    sq: float = Field(0.0, ge=0.0, description="Sum of (x_i - mu_i)^2 (running variance).")
    log_capital: float = 0.0
    max_log_capital: float = 0.0

    @property
    def variance(self) -> float:
        return (0.25 + self.sq) / (self.n + 1.0)

    @property
    def crossed(self) -> bool:
        """The capital has reached ``1/alpha`` at some observation (the alarm)."""
        return self.max_log_capital >= math.log(1.0 / self.alpha)

    @property
    def e_value(self) -> float:
        return math.exp(min(self.log_capital, _MAX_LOG))

    def update(self, x: float) -> None:
        if not 0.0 <= x <= 1.0:
            raise ValueError(f"an observation lies in [0, 1], got {x}")
        t = self.n + 1
        bet = float(watch_bet(t, self.variance, self.epsilon, self.alpha))
        self.log_capital += math.log1p(bet * (x - self.epsilon))
        self.max_log_capital = max(self.max_log_capital, self.log_capital)
        self.ones += x
        mu = (0.5 + self.ones) / (t + 1.0)
        self.sq += (x - mu) ** 2
        self.n = t


# --- State and status ---------------------------------------------------------------------

class WatchState(BaseModel):
    """The JSON state file: what the test is about, the counts, the running test."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    format: Literal["rag-gates/watch-state/1"] = "rag-gates/watch-state/1"
    spec: str = Field(..., description="The spec's name or path.")
    spec_checksum: str = Field(..., description="The spec's checksum: one state per spec.")
    judge: str
    shadow_share: float = Field(..., gt=0.0, le=1.0)
    since: str = Field(..., description="When the watch started (UTC, ISO 8601).")
    questions: int = Field(0, ge=0, description="Decisions made.")
    skipped: int = Field(0, ge=0, description="Decisions that skipped retrieval.")
    sampled: int = Field(0, ge=0, description="Decisions whose coin came up (observations).")
    shadowed: int = Field(0, ge=0, description="Sampled skips shadow-checked.")
    disagreements: int = Field(0, ge=0, description="Shadowed skips whose replies differ.")
    errors: int = Field(0, ge=0, description="Shadow checks that failed (not observed).")
    retrievals: int = Field(0, ge=0, description="Retrievals the shadow checks made.")
    generations: int = Field(0, ge=0, description="Generations the shadow checks made.")
    test: WatchTest
    alarm_at: str | None = Field(None, description="When the alarm fired (UTC).")
    alarm_after: int | None = Field(None, description="Questions counted when it fired.")

    def identity(self) -> dict[str, Any]:
        return {"spec_checksum": self.spec_checksum, "judge": self.judge,
                "shadow_share": self.shadow_share, "epsilon": self.test.epsilon,
                "alarm_delta": self.test.alpha}


class WatchStatus(BaseModel):
    """What :meth:`WatchedGate.status` (and ``rag-gates audit``) report."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spec: str
    hypothesis: str = Field(..., description="H0, in words.")
    epsilon: float
    alarm_delta: float
    judge: str
    shadow_share: float
    questions: int = Field(..., description="Decisions made.")
    skipped: int
    sampled: int = Field(..., description="Observations of the test (coin up).")
    shadowed: int
    disagreements: int
    errors: int
    retrievals: int = Field(..., description="Extra retrievals made by shadow checks.")
    generations: int = Field(..., description="Extra generations made by shadow checks.")
    observed_rate: float | None = Field(..., description="Disagreements on skips per "
                                        "observation: the estimate of mean(x).")
    e_value: float = Field(..., description="The capital now (1 at the start).")
    max_e_value: float = Field(..., description="The largest capital so far.")
    alarm: bool = Field(..., description="The capital reached 1/alarm_delta: with "
                        "confidence 1 - alarm_delta, mean(x) > epsilon.")
    alarm_at: str | None
    alarm_after: int | None
    since: str
    state_file: str | None = None


def status_of(state: WatchState, state_file: str | None = None) -> WatchStatus:
    """The status a state stands for."""
    test = state.test
    return WatchStatus(
        spec=state.spec,
        hypothesis=(f"skipped questions whose two replies differ ({state.judge}) are at most "
                    f"{test.epsilon:g} of the questions"),
        epsilon=test.epsilon, alarm_delta=test.alpha, judge=state.judge,
        shadow_share=state.shadow_share, questions=state.questions, skipped=state.skipped,
        sampled=state.sampled, shadowed=state.shadowed, disagreements=state.disagreements,
        errors=state.errors, retrievals=state.retrievals, generations=state.generations,
        observed_rate=(test.ones / test.n) if test.n else None, e_value=test.e_value,
        max_e_value=math.exp(min(test.max_log_capital, _MAX_LOG)), alarm=test.crossed,
        alarm_at=state.alarm_at, alarm_after=state.alarm_after, since=state.since,
        state_file=state_file)


@dataclass
class _Pending:
    """Counts this process has not written to the state file yet."""

    questions: int = 0
    skipped: int = 0


@dataclass(frozen=True)
class _Check:
    """One sampled question's outcome, to add to the state."""

    x: float | None            # None: the shadow check failed (not an observation)
    shadowed: bool
    retrievals: int = 0
    generations: int = 0


def observe(state: WatchState, check: _Check) -> None:
    """Add one sampled question's outcome to ``state`` (the alarm is latched on)."""
    state.sampled += check.x is not None
    state.shadowed += check.shadowed
    state.retrievals += check.retrievals
    state.generations += check.generations
    if check.x is None:
        state.errors += 1
        return
    state.disagreements += int(check.shadowed and check.x > 0)
    was = state.test.crossed
    state.test.update(check.x)
    if state.test.crossed and not was:
        state.alarm_at = utc_now()
        state.alarm_after = state.questions


# --- The gate -----------------------------------------------------------------------------

Retrieve = Callable[[str], Sequence[Passage | str]]


class WatchedGate:
    """A certified gate that shadow-checks a share of the questions it skips and keeps an
    anytime-valid test of the accuracy its skips cost (module docstring: what it tests).

    Args:
        gate: the :class:`~rag_gates.calibration.CertifiedGate` ``load_gate`` returned.
        lm: the model that answers (the one the spec was calibrated for).
        retriever: a rag-gates retriever (``.retrieve(question, k)``) or a callable
            ``question -> passages`` (:class:`~rag_gates.types.Passage` or strings).
        shadow_share: the probability that a question is sampled, in (0, 1]; a sampled
            question that skips retrieval is shadow-checked (one retrieval and one or two
            generations), so the extra work is ``shadow_share * skip share`` of the traffic.
        state: a JSON file for the counts and the test, shared by every process given the
            same path (created if missing; one spec per file); None keeps it in memory.
        judge: the same-answer judge (``exact``, ``f1:CUT`` or a
            :class:`~rag_gates.calibration.SameAnswer`); default: the spec's judge when it
            was certified without labels, else ``exact``.
        seed: the coin's seed (None: fresh entropy). Give each worker process its own.
        alarm_delta: the test's level: the alarm fires wrongly with probability at most this
            (default: the spec's delta).
        epsilon: the rate of skipped-and-disagreeing questions H0 allows (default: the spec's
            epsilon).
        k: passages per retrieval (calibrate's ``--k``, default 3).
        max_new_tokens: answer length budget (default: the spec's, else 32).
        dataset: the prompt's dataset (:func:`~rag_gates.prompts.qa_prompt`), as calibrate
            answered with (default None).
        on_alarm: called once with the :class:`WatchStatus` when this process first sees the
            alarm on (an exception in it is logged, never raised).
    """

    def __init__(self, gate: CertifiedGate, *, lm: Any, retriever: Any,
                 shadow_share: float, state: str | Path | None = None,
                 judge: str | SameAnswer | None = None, seed: int | None = None,
                 alarm_delta: float | None = None, epsilon: float | None = None, k: int = 3,
                 max_new_tokens: int | None = None, dataset: str | None = None,
                 on_alarm: Callable[[WatchStatus], None] | None = None) -> None:
        if not isinstance(gate, CertifiedGate):
            raise TypeError(f"gate must be the CertifiedGate load_gate returns, got "
                            f"{type(gate).__name__}: wrap load_gate('gate.json', lm=lm)")
        spec = gate.spec
        if not spec.certified or gate.inner is None:
            raise ValueError(f"{gate.source} certifies no threshold: it always retrieves, so "
                             "no skip is there to watch; serve it unwatched, or recalibrate")
        if lm is None or not callable(getattr(lm, "generate", None)):
            raise ValueError("lm= must be the model that answers (with .generate): the shadow "
                             "check answers the skipped question both ways with it")
        self._retrieve = _retrieve_function(retriever, k)
        self.shadow_share = _share(shadow_share)
        self.alarm_delta = _unit("alarm_delta", spec.delta if alarm_delta is None
                                 else alarm_delta, "the probability of a false alarm, e.g. 0.1")
        self.epsilon = _unit("epsilon", spec.epsilon if epsilon is None else epsilon,
                             "the rate of skipped questions whose replies differ that H0 "
                             "allows, e.g. the spec's 0.05")
        self.judge = _judge(judge, spec)
        if isinstance(seed, bool) or not (seed is None or (isinstance(seed, int) and seed >= 0)):
            raise ValueError(f"seed must be an int >= 0 or None (fresh entropy), got {seed!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k (passages per retrieval) must be an int >= 1, got {k!r}; "
                             "use calibrate's --k (3 by default)")
        budget = spec.options.get("max_new_tokens", 32) if max_new_tokens is None \
            else max_new_tokens
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {budget!r}; use "
                             "calibrate's --max-new-tokens (32 by default)")
        if on_alarm is not None and not callable(on_alarm):
            raise TypeError("on_alarm must be callable (it is given the WatchStatus)")
        if spec.labels == "gold" and epsilon is None:
            logger.info("watch of %s: the spec was certified with gold labels; the watch sees "
                        "only whether the two replies differ, a looser quantity, so at the "
                        "spec's epsilon it can alarm without a drift. To test for drift, pass "
                        "epsilon=disagreement_baseline(records, spec)", gate.source)
        self.gate = gate
        self.lm = lm
        self.k = k
        self.max_new_tokens = budget
        self.dataset = dataset
        self.on_alarm = on_alarm
        self._rng = random.Random(seed)
        self._mutex = threading.Lock()          # the coin and the pending counts
        self._state_mutex = threading.Lock()    # one state update at a time in this process
        self._pending = _Pending()
        self._warned = False
        self.state_path = None if state is None else _state_path(state)
        fresh = WatchState(
            spec=gate.source, spec_checksum=spec.checksum or spec.payload_checksum(),
            judge=self.judge.name, shadow_share=self.shadow_share, since=utc_now(),
            test=WatchTest(epsilon=self.epsilon, alpha=self.alarm_delta))
        self._memory = fresh
        self._last = status_of(fresh, self._where)
        if self.state_path is not None:
            with self._locked() as current:  # create it, or check it is this watch's
                self._last = status_of(current, self._where)

    # --- gate protocol ---

    @property
    def name(self) -> str:
        return self.gate.name

    @property
    def spec(self) -> Any:
        return self.gate.spec

    @property
    def threshold(self) -> float:
        return self.gate.threshold

    def decide(self, query: str, **signals: Any) -> GateDecision:
        decision = self.gate.decide(query, **signals)
        return self._watch(query, decision, self._draw())

    async def adecide(self, query: str, **signals: Any) -> GateDecision:
        decision = await self.gate.adecide(query, **signals)
        sampled = self._draw()
        if (sampled and not decision.retrieve) or self.state_path is not None:
            # A shadow check generates, a state update takes a file lock: off the loop.
            return await asyncio.to_thread(self._watch, query, decision, sampled)
        return self._watch(query, decision, sampled)

    def decide_batch(self, queries: Sequence[str], **signals: Any) -> list[GateDecision]:
        decisions = self.gate.decide_batch(queries, **signals)
        return [self._watch(q, d, self._draw()) for q, d in zip(queries, decisions,
                                                                strict=True)]

    def status(self) -> WatchStatus:
        """The test as the state file holds it now (this process's counts written first)."""
        self._flush()
        return self._last

    def flush(self) -> None:
        """Write this process's pending counts to the state file (they are written with
        every shadow check and every :data:`FLUSH_EVERY` questions anyway)."""
        self._flush()

    def __repr__(self) -> str:
        return (f"WatchedGate({self.gate!r}, shadow_share={self.shadow_share:g}, "
                f"judge={self.judge.name!r}, state={self._where!r})")

    # --- the watch ---

    @property
    def _where(self) -> str | None:
        return None if self.state_path is None else str(self.state_path)

    def _draw(self) -> bool:
        with self._mutex:
            return self._rng.random() < self.shadow_share

    def _watch(self, query: str, decision: GateDecision, sampled: bool) -> GateDecision:
        """The decision with ``evidence["watch"]``; never changes anything else."""
        watch: dict[str, JsonValue] = {"sampled": sampled, "shadowed": False}
        check: _Check | None = None
        if sampled and decision.retrieve:
            check = _Check(x=0.0, shadowed=False)
        elif sampled:
            check = self._shadow(query, decision, watch)
        try:
            self._record(decision, check)
        except Exception as exc:  # fail closed: the decision stands
            logger.warning("watch of %s: could not update the state (%s: %s); the decision "
                           "is unchanged", self.gate.source, type(exc).__name__, exc)
            watch["error"] = f"state: {type(exc).__name__}: {exc}"[:500]
        last = self._last
        watch.update(e_value=last.e_value, alarm=last.alarm, epsilon=self.epsilon,
                     alarm_delta=self.alarm_delta, judge=self.judge.name,
                     shadow_share=self.shadow_share)
        self._maybe_alarm(last)
        return decision.model_copy(update={"evidence": {**decision.evidence, "watch": watch}})

    def _shadow(self, query: str, decision: GateDecision, watch: dict[str, JsonValue]
                ) -> _Check:
        """Retrieve and answer both ways; fill ``watch``; a failure is logged, not raised."""
        from rag_gates.answer_once import reusable_answer
        from rag_gates.prompts import qa_prompt

        retrievals = generations = 0
        try:
            prompt = qa_prompt(query, dataset=self.dataset)
            reuse = reusable_answer(decision, lm=self.lm, prompt=prompt,
                                    max_new_tokens=self.max_new_tokens)
            closed = reuse.answer
            if closed is None:
                generations += 1
                closed = self.lm.generate(prompt, max_new_tokens=self.max_new_tokens).text
            retrievals += 1
            passages = self._retrieve(query)
            generations += 1
            retrieved = self.lm.generate(qa_prompt(query, passages or None,
                                                   dataset=self.dataset),
                                         max_new_tokens=self.max_new_tokens).text
            same = bool(self.judge(closed, retrieved))
        except Exception as exc:  # fail closed: logged, counted, never raised
            logger.warning("watch of %s: the shadow check failed (%s: %s); the decision is "
                           "unchanged", self.gate.source, type(exc).__name__, exc)
            watch["error"] = f"{type(exc).__name__}: {exc}"[:500]
            return _Check(x=None, shadowed=False, retrievals=retrievals,
                          generations=generations)
        watch.update(shadowed=True, closed_book_answer=closed, retrieved_answer=retrieved,
                     same=same, reused=reuse.answer is not None,
                     passages=[p.id for p in passages])
        return _Check(x=0.0 if same else 1.0, shadowed=True, retrievals=retrievals,
                      generations=generations)

    def _record(self, decision: GateDecision, check: _Check | None) -> None:
        with self._mutex:
            self._pending.questions += 1
            self._pending.skipped += not decision.retrieve
            due = check is not None or self._pending.questions >= FLUSH_EVERY
        if due:
            self._flush(check)

    def _flush(self, check: _Check | None = None) -> None:
        with self._mutex:
            pending, self._pending = self._pending, _Pending()
        try:
            with self._locked() as state:
                state.questions += pending.questions
                state.skipped += pending.skipped
                if check is not None:
                    observe(state, check)
                status = status_of(state, self._where)
        except BaseException:
            with self._mutex:  # not written: count them with the next update
                self._pending.questions += pending.questions
                self._pending.skipped += pending.skipped
            raise
        self._last = status

    @contextmanager
    def _locked(self) -> Iterator[WatchState]:
        """The state, to update in place: in memory, or read from the state file under its
        lock and written back atomically (only if the block raised nothing)."""
        if self.state_path is None:
            with self._state_mutex:
                work = self._memory.model_copy(deep=True)
                yield work
                self._memory = work
            return
        from rag_gates._io import append_locked, write_text_atomic

        path = self.state_path
        lock = path.with_name(path.name + ".lock")
        with self._state_mutex, append_locked(
                lock, wait_s=60.0,
                advice=f"{lock} is held by another process for over a minute"):
            state = _read_state(path) if path.is_file() else self._memory.model_copy(deep=True)
            mine = self._memory.identity()
            if state.identity() != mine:
                theirs = state.identity()
                what = ", ".join(f"{k} {theirs[k]!r} (here {mine[k]!r})" for k in mine
                                 if theirs[k] != mine[k])
                raise ValueError(f"{path} holds the watch of another setting: {what}; give "
                                 "another state file, or delete it to start the test over")
            yield state
            write_text_atomic(path, json.dumps(state.model_dump(mode="json"), indent=1) + "\n")

    def _maybe_alarm(self, status: WatchStatus) -> None:
        if not status.alarm:
            return
        with self._mutex:
            if self._warned:
                return
            self._warned = True
        logger.warning(
            "watch of %s: ALARM: the certificate has expired with confidence %g: skipped "
            "questions whose replies differ are above epsilon %g of the traffic (e-value "
            "%.4g >= %g after %s questions, %d observations, %d disagreements); recalibrate "
            "on current traffic, or retrieve always until then", status.spec,
            1 - status.alarm_delta, status.epsilon, status.max_e_value,
            1 / status.alarm_delta, status.alarm_after, status.sampled, status.disagreements)
        if self.on_alarm is not None:
            try:
                self.on_alarm(status)
            except Exception:
                logger.exception("watch of %s: the on_alarm callback raised", status.spec)


def disagreement_baseline(records: Sequence[Any], spec: Any, *,
                          judge: str | SameAnswer | None = None,
                          delta: float | None = None) -> float:
    """An ``epsilon`` for :class:`WatchedGate` that makes its alarm mean "more skipped
    questions disagree than at calibration": an upper confidence bound, at ``1 - delta``
    (default: the spec's delta), on the share of questions that ``spec`` skips and whose two
    replies differ, from the calibration ``records`` (each keeping both replies, as
    ``rag-gates calibrate`` writes them). A per-group spec skips by each record's group's
    threshold (a record of a group without one is retrieved).

    For a spec certified with gold labels. Its epsilon bounds the accuracy drop; the watch
    sees only disagreement, which bounds the drop from above and, with a model whose replies
    are long, is near the skip share itself, so watched at the spec's epsilon such a spec
    alarms on undrifted traffic (docs/calibration.md measures it). Watched at this baseline
    instead, the alarm tests for drift: with the threshold chosen on the same records, the
    bound holds for every threshold at once (the one-sided Dvoretzky-Kiefer-Wolfowitz
    inequality with Massart's constant: empirical share plus ``sqrt(log(1/delta) / 2n)``),
    so on undrifted traffic the alarm fires with probability at most ``delta`` plus the
    watch's ``alarm_delta``.

    Example:
        >>> eps = disagreement_baseline(read_records("gate-work/records.jsonl"),
        ...                             GateSpec.load("gate.json"))        # doctest: +SKIP
        >>> WatchedGate(gate, lm=lm, retriever=bm25, shadow_share=0.05,
        ...             epsilon=eps)                                      # doctest: +SKIP
    """
    from rag_gates.calibration.spec import GateSpec

    spec = spec.spec if isinstance(spec, CertifiedGate) else spec
    if not isinstance(spec, GateSpec):
        raise TypeError(f"spec must be a GateSpec or a CertifiedGate, got {type(spec).__name__}")
    groups = getattr(spec, "groups", None)
    if spec.threshold is None and groups is None:
        raise ValueError(f"spec {spec.gate!r} certifies no threshold: nothing is skipped")
    if not records:
        raise ValueError("no records: pass the calibration records the spec was certified on")
    same = _judge(judge, spec)
    level = _unit("delta", spec.delta if delta is None else delta,
                  "the probability the baseline is too low, e.g. the spec's 0.1")
    if level > 0.5:
        raise ValueError(f"delta must be at most 0.5 (Massart's DKW constant), got {level}")
    hits = 0
    for r in records:
        if spec.gate not in r.scores:
            raise ValueError(f"record {r.id!r} has no {spec.gate!r} score: pass the records "
                             "the spec was certified on (a composite's own score is not "
                             "in them)")
        if r.closed_book_answer is None or r.retrieved_answer is None:
            raise ValueError(f"record {r.id!r} keeps no replies: calibrate again into a new "
                             "--work-dir (records keep both replies since issue 60)")
        score = r.scores[spec.gate]
        threshold = spec.threshold
        if groups is not None:  # a per-group spec: the record's group's threshold, if any
            certificate = None if r.group is None else spec.group(r.group)
            threshold = None if certificate is None else certificate.threshold
        skipped = score is not None and threshold is not None and math.isfinite(score) \
            and score < threshold
        hits += skipped and not same(r.closed_book_answer, r.retrieved_answer)
    n = len(records)
    bound = hits / n + math.sqrt(math.log(1.0 / level) / (2.0 * n))
    if bound >= 1.0:
        raise ValueError(f"the baseline's upper bound is {bound:.3f} >= 1 on {n} records: "
                         "nothing to watch against; use more calibration records")
    return bound


# --- helpers ------------------------------------------------------------------------------

def _share(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or not 0.0 < value <= 1.0:
        raise ValueError(f"shadow_share must be a number in (0, 1], got {value!r}: the share of "
                         "questions sampled (a sampled skip is checked), e.g. 0.05 for 5%")
    return float(value)


def _unit(name: str, value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be a number in (0, 1), got {value!r}: {what}")
    return float(value)


def _judge(judge: str | SameAnswer | None, spec: Any) -> SameAnswer:
    if judge is None:
        judge = spec.judge if spec.labels != "gold" and spec.judge else "exact"
    if isinstance(judge, SameAnswer):
        return judge
    if not isinstance(judge, str):
        raise TypeError(f"judge must be {JUDGE_SYNTAX} or a SameAnswer, got "
                        f"{type(judge).__name__}")
    try:
        return parse_same_answer(judge)
    except ValueError:
        raise ValueError(f"judge {judge!r}: give {JUDGE_SYNTAX}") from None


def _retrieve_function(retriever: Any, k: int) -> Callable[[str], list[Passage]]:
    from rag_gates.retrieval.base import Retriever

    if isinstance(retriever, Retriever):
        def by_protocol(query: str) -> list[Passage]:
            return list(retriever.retrieve(query, k))
        return by_protocol
    if callable(retriever):
        def by_callable(query: str) -> list[Passage]:
            got = retriever(query)
            if isinstance(got, str | bytes) or not isinstance(got, Sequence | Iterator):
                raise TypeError(f"the retriever callable returned {type(got).__name__}; it "
                                "must return a list of passages (Passage or str)")
            return [p if isinstance(p, Passage) else Passage(text=_text(p)) for p in got]
        return by_callable
    raise TypeError(f"retriever must be a rag-gates Retriever (.retrieve(query, k)) or a "
                    f"callable question -> passages, got {type(retriever).__name__}")


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"a passage must be a Passage or a str, got {type(value).__name__}")
    return value


def _state_path(state: str | Path) -> Path:
    if not isinstance(state, str | Path):
        raise TypeError(f"state must be a file path or None, got {type(state).__name__}")
    path = Path(state).expanduser()
    if path.is_dir():
        raise ValueError(f"state {path} is a directory; give a file path, e.g. "
                         f"{path / 'gate.watch.json'}")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _read_state(path: Path) -> WatchState:
    from pydantic import ValidationError

    from rag_gates._files import read_json

    fix = "delete it to start the test over"
    data = read_json(path, max_bytes=MAX_STATE_BYTES, expect=dict, fix=fix)
    if data.get("format") != WATCH_STATE_FORMAT:
        raise ValueError(f"{path} is not a rag-gates watch state (format "
                         f"{WATCH_STATE_FORMAT!r}); give another state file, or {fix}")
    try:
        return WatchState.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"{path} is not a complete watch state ({exc.errors()[0]['msg']}); "
                         f"{fix}") from None


def replay(decisions: Sequence[Mapping[str, Any]], *, judge: SameAnswer | None = None,
           epsilon: float | None = None, alarm_delta: float | None = None,
           spec: str = "log") -> WatchState:
    """The test over logged decisions (each a :class:`~rag_gates.types.GateDecision` as JSON
    with ``evidence["watch"]``), in the order given: a sampled decision that retrieved is
    ``x = 0``; a shadowed one is ``x = 1`` when ``judge`` (default: the logged judge) calls
    its two replies different; a sampled skip without its replies (the check failed) is an
    error, not an observation. ``epsilon`` / ``alarm_delta`` default to the logged ones.
    Decisions without ``evidence["watch"]`` count as questions only. What
    ``rag-gates audit`` runs."""
    first = next((d["evidence"]["watch"] for d in decisions
                  if isinstance(d.get("evidence"), Mapping)
                  and isinstance(d["evidence"].get("watch"), Mapping)), None)
    if first is None:
        raise ValueError("no decision carries evidence['watch']: log the decisions of a "
                         "WatchedGate (each decision's JSON, one per line)")
    judge = judge or parse_same_answer(str(first.get("judge", "exact")))
    epsilon = _unit("epsilon", first.get("epsilon") if epsilon is None else epsilon,
                    "the logged watch's, or give one")
    alpha = _unit("alarm_delta", first.get("alarm_delta") if alarm_delta is None
                  else alarm_delta, "the logged watch's, or give one")
    share = first.get("shadow_share", 1.0)
    state = WatchState(spec=spec, spec_checksum="", judge=judge.name,
                       shadow_share=float(share) if isinstance(share, int | float)
                       and 0 < share <= 1 else 1.0,
                       since="", test=WatchTest(epsilon=epsilon, alpha=alpha))
    for d in decisions:
        state.questions += 1
        state.skipped += not d.get("retrieve", True)
        evidence = d.get("evidence")
        watch = evidence.get("watch") if isinstance(evidence, Mapping) else None
        if not isinstance(watch, Mapping) or not watch.get("sampled"):
            continue
        if d.get("retrieve", True):
            observe(state, _Check(x=0.0, shadowed=False))
            continue
        closed, retrieved = watch.get("closed_book_answer"), watch.get("retrieved_answer")
        if not (watch.get("shadowed") and isinstance(closed, str)
                and isinstance(retrieved, str)):
            observe(state, _Check(x=None, shadowed=False))
            continue
        observe(state, _Check(x=0.0 if judge(closed, retrieved) else 1.0, shadowed=True,
                              retrievals=1, generations=1 + (not watch.get("reused"))))
    return state
