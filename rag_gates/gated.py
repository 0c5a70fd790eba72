"""The gated-retrieval step, written once for every framework shell: ask the gate, fail
closed by the error policy, check what it returned, and retrieve only when the decision
says so, annotating what comes back with the decision.

The integrations' ``GatedRetriever`` (LangChain and LlamaIndex), ``SelfRoutingRetriever``,
``GatedQueryEngine`` and ``GateRouter`` are shells over these functions: each binds them to
its own types (how a decision is reported: a LangChain custom event, a LlamaIndex
instrumentation event; how documents or nodes are retrieved and copied).

Example:
    >>> from rag_gates.gated import annotation, decide, gated_retrieve
    >>> decision = decide(gate, query, on_error="retrieve")   # doctest: +SKIP
    >>> passages = gated_retrieve(                             # doctest: +SKIP
    ...     decision, record=annotation, skipped=lambda decision, data: [],
    ...     retrieve=lambda: retriever.retrieve(query, k=3),
    ...     annotate=lambda passages, data: passages)
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Literal, TypeVar

from pydantic import JsonValue

from rag_gates.gate import Gate, fail_closed, gate_error_decision
from rag_gates.types import GateDecision

__all__ = [
    "GateErrorPolicy",
    "adecide",
    "agated_retrieve",
    "annotation",
    "check_decision",
    "check_gate",
    "check_gate_error_policy",
    "decide",
    "gate_error_policy",
    "gated_retrieve",
]

logger = logging.getLogger(__name__)

GateErrorPolicy = Literal["raise", "retrieve"]
"""What a shell does when ``gate.decide`` raises: ``"raise"`` the gate's error, or
``"retrieve"`` (fail closed: retrieve, the decision names the error)."""

_POLICY_OVERRIDE: ContextVar[GateErrorPolicy | None] = ContextVar(
    "rag_gates_gate_error_policy", default=None)
"""Set by :func:`gate_error_policy` for one call (an agent's tool must not raise)."""

Item = TypeVar("Item")
Annotation = dict[str, JsonValue]


def check_gate(value: Any) -> Gate:
    """``value`` if it follows rag-gates' ``Gate`` protocol, else a TypeError saying how."""
    if not isinstance(value, Gate):
        raise TypeError(
            f"gate must follow rag_gates' Gate protocol (name, threshold, decide, adecide, "
            f"decide_batch), got {type(value).__name__}; subclass rag_gates.gate.BaseGate"
        )
    return value


def check_gate_error_policy(value: object) -> GateErrorPolicy:
    """``value`` if it is an ``on_gate_error`` policy, else a ValueError naming both."""
    if value == "raise" or value == "retrieve":
        return value
    raise ValueError(f"on_gate_error must be 'raise' or 'retrieve', got {value!r}")


@contextmanager
def gate_error_policy(policy: GateErrorPolicy) -> Iterator[None]:
    """Within this context every :func:`decide` / :func:`adecide` uses ``policy``, whatever
    its caller's own: an agent's tool sets ``"retrieve"`` for its call, since an agent turns
    a tool's exception into a message and answers without the documents."""
    token = _POLICY_OVERRIDE.set(check_gate_error_policy(policy))
    try:
        yield
    finally:
        _POLICY_OVERRIDE.reset(token)


def check_decision(gate: Any, decision: Any) -> GateDecision:
    """``decision`` if it is a ``GateDecision``, else a TypeError naming the gate."""
    if not isinstance(decision, GateDecision):
        raise TypeError(
            f"gate {getattr(gate, 'name', type(gate).__name__)!r} returned "
            f"{type(decision).__name__}, expected a rag_gates GateDecision"
        )
    return decision


def annotation(decision: GateDecision) -> Annotation:
    """The decision as the JSON the shells attach to what they return and report."""
    return decision.model_dump(mode="json")


def _failed(gate: Any, query: str, error: Exception, policy: GateErrorPolicy) -> GateDecision:
    if (_POLICY_OVERRIDE.get() or policy) == "raise":
        raise error
    logger.warning("gate %r raised on %r (%s: %s); on_gate_error='retrieve': retrieve",
                   getattr(gate, "name", "?"), query[:80], type(error).__name__, error)
    return gate_error_decision(gate, error)


def decide(gate: Gate, query: str, on_error: GateErrorPolicy = "raise", *,
           call: Callable[[Callable[[str], Any], str], Any] | None = None) -> GateDecision:
    """The gate's decision on ``query``, checked (a TypeError if it is no ``GateDecision``)
    and failed closed (one that skips on a score that is no number retrieves instead:
    :func:`rag_gates.gate.fail_closed`). If the gate raises: the error (``on_error="raise"``)
    or the decision that retrieves and names it (``"retrieve"``, logged as a warning); a
    :func:`gate_error_policy` context overrides ``on_error``. ``call(gate.decide, query)``
    runs the gate where a framework wants it (LangChain: inside the caller's run context)."""
    try:
        decision = gate.decide(query) if call is None else call(gate.decide, query)
    except Exception as error:  # any failure to decide is "undecided"
        return _failed(gate, query, error, on_error)
    return fail_closed(check_decision(gate, decision))


async def adecide(gate: Gate, query: str, on_error: GateErrorPolicy = "raise", *,
                  call: Callable[[Coroutine[Any, Any, Any]], Awaitable[Any]] | None = None
                  ) -> GateDecision:
    """:func:`decide` with ``gate.adecide``; ``call`` awaits its coroutine where a
    framework wants it."""
    try:
        coroutine = gate.adecide(query)
        decision = await (coroutine if call is None else call(coroutine))
    except Exception as error:  # any failure to decide is "undecided"
        return _failed(gate, query, error, on_error)
    return fail_closed(check_decision(gate, decision))


def gated_retrieve(
    decision: GateDecision,
    *,
    record: Callable[[GateDecision], Annotation],
    skipped: Callable[[GateDecision, Annotation], list[Item] | GateDecision],
    retrieve: Callable[[], list[Item]],
    annotate: Callable[[list[Item], Annotation], list[Item]],
) -> list[Item]:
    """The gated-retrieval step after the decision: ``record`` it (keep it, report it;
    returns its annotation); on a skip, ``skipped`` answers instead (``[]``, or the
    model's own document), or overturns the decision with one that retrieves (recorded
    too: SR-RAG on an empty verbalization); on a retrieve, ``retrieve`` runs and
    ``annotate`` copies its items with the (last) decision's annotation."""
    data = record(decision)
    if not decision.retrieve:
        instead = skipped(decision, data)
        if isinstance(instead, list):
            return instead
        data = record(instead)  # overturned: retrieve after all
    return annotate(retrieve(), data)


async def agated_retrieve(
    decision: GateDecision,
    *,
    record: Callable[[GateDecision], Awaitable[Annotation]],
    skipped: Callable[[GateDecision, Annotation], Awaitable[list[Item] | GateDecision]],
    retrieve: Callable[[], Awaitable[list[Item]]],
    annotate: Callable[[list[Item], Annotation], list[Item]],
) -> list[Item]:
    """:func:`gated_retrieve` with awaitable ``record``, ``skipped`` and ``retrieve``."""
    data = await record(decision)
    if not decision.retrieve:
        instead = await skipped(decision, data)
        if isinstance(instead, list):
            return instead
        data = await record(instead)  # overturned: retrieve after all
    return annotate(await retrieve(), data)
