"""Serve a certified gate: :func:`load_gate` builds the gate a spec names and wraps it so
every decision uses the certified threshold and names the spec and its guarantee.

Gates are built by name from the one gate registry (:mod:`rag_gates.registry`):
``first-token-prob`` and ``answer-logprob`` (need ``lm``), ``quco`` (needs ``corpus=``, a
:class:`~rag_gates.corpus.CorpusStats`), ``cbdr`` (needs ``lm`` and a probe: ``probe=`` or
the one shipped for the embedded model), any name added with :func:`register_gate` or an
installed distribution's ``rag_gates.gates`` entry point, and expressions of them
(:data:`rag_gates.gate.GATE_GRAMMAR`).

Example:
    >>> from rag_gates.calibration import load_gate
    >>> gate = load_gate("gate.json", lm=lm)                        # doctest: +SKIP
    >>> d = gate.decide("Who wrote Hamlet?")                        # doctest: +SKIP
    >>> d.retrieve, d.evidence["spec"]["epsilon"]                   # doctest: +SKIP
    (False, 0.05)
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import JsonValue

from rag_gates._text import check_text
from rag_gates.calibration.spec import GateSpec, ModelIdentity
from rag_gates.errors import CalibrationError, SpecModelMismatchError
from rag_gates.gate import (
    Cascade,
    Gate,
    Weighted,
    check_threshold,
    is_undecided,
    parse_gate_expression,
)
from rag_gates.registry import (
    GateContext,
    available_gates,
    check_gate_threshold,
    register_gate,
)
from rag_gates.types import AbstainDecision, GateDecision, Passage

if TYPE_CHECKING:
    from rag_gates.confidence import PassageAnswer

__all__ = ["CertifiedGate", "GateContext", "load_gate", "register_gate"]


def _build(name: str, ctx: GateContext, threshold: float | None) -> Gate:
    """One gate of a spec at the spec's threshold, unchecked here: the spec's threshold is
    checked against the built gate's scale by :func:`_check_spec_threshold`, which names the
    spec in its error."""
    gates = available_gates()
    if name not in gates:
        raise CalibrationError(f"the spec names gate {name!r}, which load_gate cannot build; "
                               f"known: {', '.join(sorted(gates))} (add one with "
                               "rag_gates.calibration.register_gate)")
    try:
        check_gate_threshold(name, threshold, gates)
    except ValueError as exc:  # said as the spec's fault, before anything is built
        raise CalibrationError(f"the spec's threshold for gate {name!r} is off the gate's "
                               f"score scale: {exc}") from None
    return gates[name](ctx, threshold)


class CertifiedGate:
    """A gate at its certified threshold: retrieves when the inner gate's score is at or
    above the spec's threshold (or it could not decide), and every decision carries
    ``evidence["spec"]`` (the spec's name or path, epsilon, delta, bound, n, threshold).
    A spec without a certified threshold always retrieves without consulting the gate.

    A per-group spec (``calibrate(by_group=True)``) uses the threshold of the question's
    ``group`` (``decide(query, group="tenant-a")``); for a group the spec has not seen, a
    group with no certified threshold, or no group given, it always retrieves without
    consulting the gate, and says why (fail closed). Its evidence names the group.

    The inner gate's decision is copied, never changed: its evidence (e.g. the closed-book
    answer of ``answer-logprob``) stays, with the ``spec`` entry added.
    """

    def __init__(self, inner: Gate | None, spec: GateSpec, *, source: str | None = None,
                 override: str | None = None, lm: Any = None) -> None:
        self.inner = inner
        self.lm = lm
        """The model the spec serves (``load_gate``'s ``lm``): a three-way spec answers
        after retrieval with it (:meth:`answer_or_abstain`)."""
        self.spec = spec
        self.source = source or spec.gate
        self.override = override
        """Why the spec is served without its guarantee (``load_gate(...,
        allow_other_model=True)`` skipped or failed the model check), or None."""
        summary = spec.summary(self.source)
        if override is not None:
            # An overridden check certifies nothing: every decision says so.
            summary = {**summary, "certified": False, "override": override}
        self._summary = summary
        self.threshold = spec.threshold if spec.threshold is not None else -sys.float_info.max
        self._name = spec.gate if spec.certified else f"always-retrieve({spec.gate})"
        self._guarantee = (
            f"certified: accuracy drop <= {spec.epsilon:g} with probability "
            f">= {1 - spec.delta:g} ({spec.bound}, n={spec.n})" if override is None else
            f"NOT certified here: {override}")

    @property
    def name(self) -> str:
        return self._name

    @property
    def spec_evidence(self) -> dict[str, JsonValue]:
        """What every decision's ``evidence["spec"]`` holds (the spec, its guarantee, and
        ``certified: false`` with the override when one was made): also copied into a
        fail-closed decision made for this gate when it raised
        (:func:`~rag_gates.gate.gate_error_decision`)."""
        return dict(self._summary)

    def _always(self, latency_ms: float = 0.0) -> GateDecision:
        return GateDecision(
            gate=self._name, retrieve=True, score=0.0, threshold=self.threshold,
            reason=f"{self.spec.gate}: no threshold certified ({self.source}): always retrieve",
            evidence={"spec": dict(self._summary)}, latency_ms=latency_ms)

    def _wrap(self, d: GateDecision, group: str | None = None) -> GateDecision:
        summary, threshold, guarantee = self._summary, self.threshold, self._guarantee
        if self.spec.groups is not None:
            certificate = self.spec.group(str(group))
            assert certificate is not None and certificate.threshold is not None
            summary, threshold = self._group_summary(group), certificate.threshold
            guarantee = (f"group {group!r}: {guarantee}" if self.override is not None else
                         f"certified for group {group!r}: accuracy drop within it <= "
                         f"{self.spec.epsilon:g} with probability >= {1 - self.spec.delta:g}, "
                         f"every group at once ({self.spec.bound}, n={certificate.n})")
        elif group is not None:
            summary = {**summary, "group": group}
        evidence: dict[str, JsonValue] = {**d.evidence, "spec": dict(summary)}
        if is_undecided(d):
            return d.model_copy(update={"retrieve": True, "threshold": threshold,
                                        "evidence": evidence})
        retrieve = d.score >= threshold
        relation, verb = (">=", "retrieve") if retrieve else ("<", "answer without retrieval")
        reason = (f"{d.gate} score {d.score:.4g} {relation} certified threshold "
                  f"{threshold:.4g} ({guarantee}): {verb}")
        return d.model_copy(update={"retrieve": retrieve, "threshold": threshold,
                                    "reason": reason, "evidence": evidence})

    def _group_summary(self, group: str | None) -> dict[str, JsonValue]:
        """``evidence["spec"]`` of a per-group spec's decision: the spec, and the group's
        threshold, n, share of delta and whether it is certified (0 and false when the
        spec has not seen the group)."""
        certificate = None if group is None else self.spec.group(group)
        summary: dict[str, JsonValue] = {**self._summary, "group": group}
        if certificate is None:
            summary.update(threshold=None, certified=False, group_n=0, group_delta=0.0)
        else:
            summary.update(threshold=certificate.threshold, group_n=certificate.n,
                           group_delta=certificate.delta,
                           certified=certificate.certified and self.override is None)
        return summary

    def _group_always(self, group: str | None) -> GateDecision | None:
        """The fail-closed decision of a per-group spec for ``group`` (None: the spec is
        not per group, or the group has a certified threshold: the gate decides)."""
        if self.spec.groups is None:
            return None
        certificate = None if group is None else self.spec.group(group)
        if certificate is not None and certificate.certified:
            return None
        if group is None:
            why = "no group given: this spec certifies one threshold per group (pass group=)"
        elif certificate is None:
            known = ", ".join(repr(g.group) for g in self.spec.groups)
            why = f"group {group!r} is not in the spec (its groups: {known})"
        else:
            why = f"group {group!r}: {certificate.note or 'no threshold certified'}"
        return GateDecision(
            gate=f"always-retrieve({self.spec.gate})", retrieve=True, score=0.0,
            threshold=-sys.float_info.max,
            reason=f"{self.spec.gate}: {why} ({self.source}): always retrieve",
            evidence={"spec": self._group_summary(group)})

    def decide(self, query: str, group: str | None = None, **signals: Any) -> GateDecision:
        """Decide for ``query``. ``group``: the question's group, for a per-group spec (a
        spec with one threshold for every question ignores it, and names it in the
        evidence)."""
        _check_group(group)
        always = self._group_always(group)
        if self.inner is None or always is not None:
            check_text(query, "query")
            return always or self._always()
        return self._wrap(self.inner.decide(query, **signals), group)

    async def adecide(self, query: str, group: str | None = None,
                      **signals: Any) -> GateDecision:
        _check_group(group)
        always = self._group_always(group)
        if self.inner is None or always is not None:
            check_text(query, "query")
            return always or self._always()
        return self._wrap(await self.inner.adecide(query, **signals), group)

    def decide_batch(self, queries: Sequence[str],
                     group: str | Sequence[str | None] | None = None,
                     **signals: Any) -> list[GateDecision]:
        """Decide for each of ``queries``. ``group``: one group for all of them, or one per
        query (a per-group spec asks the gate only about the queries of its certified
        groups)."""
        queries = list(queries)
        groups: list[str | None]
        if group is None or isinstance(group, str):
            groups = [group] * len(queries)
        else:
            groups = list(group)
            if len(groups) != len(queries):
                raise ValueError(f"decide_batch: {len(groups)} groups for {len(queries)} "
                                 "queries; give one group per query, or one for all")
        for g in groups:
            _check_group(g)
        if self.inner is None:
            for q in queries:
                check_text(q, "query")
            return [self._group_always(g) or self._always() for g in groups]
        out: list[GateDecision | None] = [self._group_always(g) for g in groups]
        for q, d in zip(queries, out, strict=True):
            if d is not None:
                check_text(q, "query")
        asked = [i for i, d in enumerate(out) if d is None]
        if asked:
            decided = self.inner.decide_batch([queries[i] for i in asked], **signals)
            for i, d in zip(asked, decided, strict=True):
                out[i] = self._wrap(d, groups[i])
        return [d for d in out if d is not None]

    @property
    def abstains(self) -> bool:
        """The spec is three-way (``calibrate --abstain``): after retrieval, ask
        :meth:`after_retrieval` whether to answer."""
        return self.spec.abstain is not None

    def after_retrieval(self, score: float | None, *, answer: str | None = None,
                        error: str | None = None) -> AbstainDecision:
        """The third outcome: answer from the passages when the with-passages ``score``
        (:func:`rag_gates.confidence.answer_with_passages`) is below the spec's abstention
        threshold, else abstain. A score that is missing or not finite abstains (fail
        closed for this outcome), and says why; so does a spec whose test certified no
        answer after retrieval. A spec that is not three-way never abstains.

        Example:
            >>> from rag_gates.confidence import answer_with_passages
            >>> pa = answer_with_passages(lm, q, passages)           # doctest: +SKIP
            >>> gate.after_retrieval(pa.score, answer=pa.answer).abstain  # doctest: +SKIP
        """
        certificate = self.spec.abstain
        summary: dict[str, JsonValue] = dict(self._summary)
        evidence: dict[str, JsonValue] = {"spec": summary}
        if answer is not None:
            evidence["answer"] = answer
        if error is not None:
            evidence["error"] = error
        value = math.nan if score is None else float(score)
        if certificate is None:
            return AbstainDecision(abstain=False, score=value, threshold=None,
                                   reason=f"{self.spec.gate}: the spec ({self.source}) is "
                                          "not three-way: answer from the passages",
                                   evidence=evidence)
        guarantee = (f"wrong answers <= {certificate.max_error:g} of questions with "
                     f"probability >= {1 - self.spec.delta:g}" if self.override is None else
                     f"NOT certified here: {self.override}")
        t = certificate.threshold
        if t is None:
            return AbstainDecision(abstain=True, score=value, threshold=None, evidence=evidence,
                                   reason=f"no answer after retrieval was certified "
                                          f"({self.source}; {guarantee}): abstain")
        if not math.isfinite(value):
            why = f": {error}" if error else ""
            return AbstainDecision(abstain=True, score=value, threshold=t, evidence=evidence,
                                   reason=f"the with-passages {certificate.score} score could "
                                          f"not be computed{why}: abstain (fail closed)")
        abstain = value >= t
        relation, verb = (">=", "abstain") if abstain else ("<", "answer from the passages")
        return AbstainDecision(
            abstain=abstain, score=value, threshold=t, evidence=evidence,
            reason=f"with-passages {certificate.score} score {value:.4g} {relation} certified "
                   f"abstention threshold {t:.4g} ({guarantee}): {verb}")

    def answer_or_abstain(self, query: str, passages: Sequence[Passage]
                          ) -> tuple[PassageAnswer, AbstainDecision]:
        """After retrieval: the answer the spec was certified on (the spec's model, greedy,
        from ``passages`` with the calibration prompt and budget) and whether to give it or
        abstain (:meth:`after_retrieval`). What both frameworks' gated engines call for a
        three-way spec, so the reply they give is the one the error bound covers.

        Example:
            >>> gate = load_gate("gate.json", lm=lm)                       # doctest: +SKIP
            >>> passages = retriever.retrieve(q, 3)                      # doctest: +SKIP
            >>> answer, verdict = gate.answer_or_abstain(q, passages)     # doctest: +SKIP
            >>> "I don't know" if verdict.abstain else answer.answer       # doctest: +SKIP
        """
        from rag_gates.confidence import answer_with_passages

        check_text(query, "query")
        if self.lm is None:
            raise ValueError("answer_or_abstain needs the spec's model: load the spec with "
                             "load_gate(path, lm=lm)")
        budget = self.spec.options.get("max_new_tokens", 32)
        dataset = self.spec.options.get("dataset")
        answer = answer_with_passages(
            self.lm, query, passages, max_new_tokens=budget if isinstance(budget, int) else 32,
            dataset=dataset if isinstance(dataset, str) else None)
        return answer, self.after_retrieval(answer.score, answer=answer.answer,
                                            error=answer.error)

    def for_group(self, group: str) -> GroupGate:
        """This gate with ``group`` given to every decision: what a framework's gated
        retriever or engine takes, since they call ``decide(query)`` (one retriever per
        tenant, say: ``GatedRetriever(retriever=..., gate=spec_gate.for_group("tenant-a"))``).
        """
        _check_group(group)
        if group is None:
            raise ValueError("for_group needs a group (a non-empty string)")
        return GroupGate(self, group)

    def __repr__(self) -> str:
        # A log line naming the gate must not make an overridden spec look certified.
        shown = "" if self.override is None else ", certified=False (overridden)"
        return f"CertifiedGate({self._name!r}, threshold={self.spec.threshold!r}, " \
               f"source={self.source!r}{shown})"


def _check_group(group: object) -> None:
    if group is not None and not isinstance(group, str):
        raise TypeError(f"group must be a string (the question's group) or None, got "
                        f"{type(group).__name__}")


class GroupGate:
    """A :class:`CertifiedGate` bound to one group (:meth:`CertifiedGate.for_group`): a gate
    like any other, whose every decision is the certified gate's for that group."""

    def __init__(self, certified: CertifiedGate, group: str) -> None:
        self.certified = certified
        self.group = group

    @property
    def name(self) -> str:
        return self.certified.name

    @property
    def threshold(self) -> float:
        """The group's certified threshold (the spec's own for a one-threshold spec; the
        lowest float, "always retrieve", for a group with none)."""
        groups = self.certified.spec.groups
        if not groups:
            return float(self.certified.threshold)
        found = next((g for g in groups if g.group == self.group), None)
        if found is None or found.threshold is None:
            return -sys.float_info.max
        return float(found.threshold)

    def decide(self, query: str, **signals: Any) -> GateDecision:
        return self.certified.decide(query, group=self.group, **signals)

    async def adecide(self, query: str, **signals: Any) -> GateDecision:
        return await self.certified.adecide(query, group=self.group, **signals)

    def decide_batch(self, queries: Sequence[str], **signals: Any) -> list[GateDecision]:
        return self.certified.decide_batch(queries, group=self.group, **signals)

    def __repr__(self) -> str:
        return f"{self.certified!r}.for_group({self.group!r})"


def load_gate(path_or_spec: str | Path | GateSpec, *, lm: Any = None, corpus: Any = None,
              probe: Any = None, allow_other_model: bool = False) -> CertifiedGate:
    """Build the certified gate a spec file (or :class:`GateSpec`) describes.

    Args:
        path_or_spec: a ``gate.json`` written by ``rag-gates calibrate`` /
            :meth:`GateSpec.save`, or the spec itself.
        lm: the model that will answer; its identity must match the spec's (the guarantee
            was measured on that model's answers).
        corpus: corpus statistics for ``quco``.
        probe: a CBDR :class:`~rag_gates.cbdr.ConfidenceProbe` (default: the shipped one).
        allow_other_model: serve a spec calibrated for another model (or without ``lm`` to
            check against): its guarantee then does not apply.

    Raises:
        CalibrationError: the file is missing, truncated, edited by hand (checksum) or names
            a gate that cannot be built (or lacks what it needs).
        SpecModelMismatchError: ``lm`` is not the model the spec was calibrated for.
    """
    if isinstance(path_or_spec, GateSpec):
        spec = GateSpec.from_json_dict(path_or_spec.model_dump(mode="json"))
        source = spec.gate
    else:
        spec = GateSpec.load(path_or_spec)
        source = str(path_or_spec)
    override = _model_check(spec, lm, source, allow_other_model)
    if not spec.certified:
        return CertifiedGate(None, spec, source=source, override=override, lm=lm)
    ctx = GateContext(lm=lm, corpus=corpus, probe=probe,
                      options={"max_new_tokens": 32, **spec.options})
    inner: Gate
    if spec.cascade is not None:
        # Each sub-gate on its fitted one-gate probability scale, both at the same inner
        # threshold, so the Cascade's margin is the score calibrate() certified.
        tiers = [Weighted([_build(f.gates[0], ctx, None)], f.weights, f.bias, center=f.center,
                          scale=f.scale, threshold=spec.cascade.inner_threshold)
                 for f in (spec.cascade.cheap, spec.cascade.expensive)]
        inner = Cascade(tiers[0], tiers[1], (spec.cascade.band[0], spec.cascade.band[1]),
                        name=spec.gate)
        # The Cascade's score is the deciding probability minus the inner threshold.
        zero = spec.cascade.inner_threshold
        _check_spec_threshold(spec, inner, source, scale=(-zero, 1.0 - zero))
    elif spec.composite is not None:
        fit = spec.composite
        subs = [_build(g, ctx, None) for g in fit.gates]
        _check_spec_threshold(spec, None, source, scale=Weighted.threshold_range)
        inner = Weighted(subs, fit.weights, fit.bias, center=fit.center, scale=fit.scale,
                         threshold=float(spec.threshold or 0.0), name=spec.gate)
    else:
        def resolve(name: str, threshold: float | None) -> Gate:
            return _build(name, ctx, threshold)

        whole = spec.gate if (":" in spec.gate or any(c in spec.gate for c in "()&|,")) \
            else None
        inner = parse_gate_expression(whole, resolve) if whole is not None \
            else _build(spec.gate, ctx, spec.threshold)
        # An expression too (NAME:THRESHOLD is that gate on its own scale): a threshold off
        # the score's scale never (or always) retrieves; every group's threshold too.
        _check_spec_threshold(spec, inner, source)
        for certificate in spec.groups or ():
            _check_spec_threshold(spec, inner, f"{source} (group {certificate.group!r})",
                                  threshold=certificate.threshold)
    return CertifiedGate(inner, spec, source=source, override=override, lm=lm)


def _model_check(spec: GateSpec, lm: Any, source: str, allow_other_model: bool) -> str | None:
    """Refuse a spec calibrated for another model (or served with no model to check);
    with ``allow_other_model`` return why the guarantee does not apply instead (None when
    the check passed, so nothing was overridden)."""
    if lm is None:
        why = (f"calibrated for model {spec.model.name!r}, served with no lm to check "
               "against (allow_other_model=True)")
        if not allow_other_model:
            raise CalibrationError(
                f"{source} was calibrated for model {spec.model.name!r}: pass lm= (the model "
                "that will answer) so load_gate can check it, or allow_other_model=True to "
                "serve it without the check (the guarantee then does not apply)")
        return why
    here = ModelIdentity.of(lm)
    if spec.model.matches(here):
        return None
    if not allow_other_model:
        raise SpecModelMismatchError(
            f"{source} was calibrated for model {spec.model.name!r} (fingerprint "
            f"{spec.model.fingerprint[:12]}), but lm is {here.name!r} (fingerprint "
            f"{here.fingerprint[:12]}): its guarantee does not transfer. Recalibrate "
            "with rag-gates calibrate for this model, or pass allow_other_model=True")
    return (f"calibrated for model {spec.model.name!r} (fingerprint "
            f"{spec.model.fingerprint[:12]}), served on {here.name!r} (fingerprint "
            f"{here.fingerprint[:12]}) with allow_other_model=True")


def _check_spec_threshold(spec: GateSpec, gate: Gate | None, source: str, *,
                          scale: tuple[float, float] | None = None,
                          threshold: float | None = None) -> None:
    # A factory may clamp the threshold into its gate's own parameter (CBDR's beta, QuCo's
    # tau), and a composite's score has a scale of its own (a probability; a cascade's
    # margin): the wrapper compares against the spec's threshold, and one off the score's
    # scale would never (or always) retrieve. Refuse it, as the gate's constructor would.
    if scale is None:
        scale = getattr(gate, "threshold_range", None)
    if threshold is None:
        threshold = spec.threshold
    if threshold is None or scale is None:
        return
    try:
        check_threshold(spec.gate, threshold, scale)
    except ValueError as exc:
        raise CalibrationError(f"{source}: {exc}; recalibrate with rag-gates calibrate "
                               "(the spec's scores were not this gate's)") from None
