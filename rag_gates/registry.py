"""The one gate registry: every gate a name, an expression or a certified spec can build.

``calibrate``, :func:`rag_gates.calibration.load_gate`, gate expressions, ``selective@GATE``,
the CLI and the lab all build gates here. A name resolves, in order, to a core gate
(``first-token-prob``, ``first-token-logprob``, ``answer-logprob``, ``sample-agreement``,
``p-true``, ``p-true-sampling``: need the model;
``quco``: needs corpus statistics; ``cbdr``: needs the white-box model and a probe, the
shipped one by default), a
gate added with :func:`register_gate`, or a factory registered under the ``rag_gates.gates``
entry-point group by another distribution. A factory is ``factory(ctx, threshold) -> Gate``:
``ctx`` a :class:`GateContext`, ``threshold`` on the gate's own score scale (None: the
gate's default).

Example:
    >>> from rag_gates.registry import GateContext, make_gate
    >>> gate = make_gate("quco&first-token-prob:0.4", GateContext(lm=lm, corpus=stats))
    ...                                                             # doctest: +SKIP
    >>> gate.decide("Who wrote Hamlet?").retrieve                   # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rag_gates.errors import CalibrationError
from rag_gates.gate.base import BaseGate, Gate, check_threshold
from rag_gates.gate.expression import is_gate_expression, parse_gate_expression

__all__ = ["CORE_GATE_RANGES", "ENTRY_POINT_GROUP", "GateContext", "GateFactory", "available_gates",
           "build_named_gate", "check_gate_expression", "check_gate_threshold",
           "core_gate_names", "gate_needs_lm", "make_gate", "register_gate", "unregister_gate",
           "walk_gate_expression"]

ENTRY_POINT_GROUP = "rag_gates.gates"


class GateContext(BaseModel):
    """What a gate factory may need: the model, corpus statistics, a CBDR probe and options.

    ``corpus`` is a :class:`~rag_gates.corpus.CorpusStats`, or None with ``corpus_provider``
    (a zero-argument callable returning one) to open the statistics only when a gate that
    counts entities is built. ``options`` are a spec's options (``dataset``,
    ``max_new_tokens``, ``tau_entity``: QuCo's default when no threshold is given)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    lm: Any = Field(None, description="A TextLM (white-box gates require a WhiteBoxLM).")
    corpus: Any = Field(None, description="CorpusStats for gates that count entities (quco).")
    corpus_provider: Callable[[], Any] | None = Field(
        None, description="Opens the corpus statistics when a gate first needs them.")
    probe: Any = Field(None, description="A CBDR ConfidenceProbe (default: the shipped one).")
    dataset: str | None = Field(None, description="Dataset name, to pick its prompt.")
    max_new_tokens: int = Field(48, ge=1, le=1024, description="Answer length budget.")
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="A spec's options (see the class docstring).")

    def need_lm(self, gate: str) -> Any:
        """The model, or CalibrationError saying that ``gate`` needs one."""
        if self.lm is None:
            raise CalibrationError(f"gate {gate!r} needs the model: pass lm= (to load_gate, "
                                   "or in the GateContext)")
        return self.lm

    def need_corpus(self, gate: str) -> Any:
        """The corpus statistics, or CalibrationError saying that ``gate`` needs them."""
        if self.corpus is not None:
            return self.corpus
        if self.corpus_provider is not None:
            return self.corpus_provider()
        raise CalibrationError(f"gate {gate!r} needs corpus statistics: pass corpus= (a "
                               "LocalInfiniGram / HostedInfiniGram) to load_gate, or in the "
                               "GateContext")


GateFactory = Callable[[GateContext, float | None], Gate]


def _model_gate_kwargs(ctx: GateContext, threshold: float | None, *,
                       answer_budget: bool = True) -> dict[str, Any]:
    """What a gate that reads the model takes from the context: the prompt variant (a
    spec's option over the run's), the run's answer budget (the gate's reply is then the
    no-rag answer, which a skip replies with: rag_gates.answer_once) and the threshold when
    one is given (else the gate's default)."""
    kwargs: dict[str, Any] = {"dataset": ctx.options.get("dataset", ctx.dataset)}
    if answer_budget:
        kwargs["max_new_tokens"] = int(ctx.options.get("max_new_tokens", ctx.max_new_tokens))
    if threshold is not None:
        kwargs["threshold"] = threshold
    return kwargs


def _first_token(ctx: GateContext, threshold: float | None) -> Gate:
    from rag_gates.confidence import FirstTokenProbGate

    return FirstTokenProbGate(ctx.need_lm("first-token-prob"),
                              **_model_gate_kwargs(ctx, threshold, answer_budget=False))


def _first_token_logprob(ctx: GateContext, threshold: float | None) -> Gate:
    from rag_gates.confidence import FirstTokenLogprobGate

    return FirstTokenLogprobGate(ctx.need_lm("first-token-logprob"),
                                 **_model_gate_kwargs(ctx, threshold))


def _answer_logprob(ctx: GateContext, threshold: float | None) -> Gate:
    from rag_gates.confidence import AnswerLogprobGate

    return AnswerLogprobGate(ctx.need_lm("answer-logprob"), **_model_gate_kwargs(ctx, threshold))


def _sample_agreement(ctx: GateContext, threshold: float | None) -> Gate:
    from rag_gates.sample_agreement import SampleAgreementGate

    kwargs = _model_gate_kwargs(ctx, threshold)
    # A spec's options fix the draw (how many, how hot, which seed), so a loaded spec scores
    # as calibrate did.
    for key, option in (("samples", "samples"), ("temperature", "sample_temperature"),
                        ("seed", "sample_seed"), ("agreement", "sample_agreement")):
        if option in ctx.options:
            kwargs[key] = ctx.options[option]
    return SampleAgreementGate(ctx.need_lm("sample-agreement"), **kwargs)


def _p_true(ctx: GateContext, threshold: float | None) -> Gate:
    from rag_gates.p_true import PTrueGate

    return PTrueGate(ctx.need_lm("p-true"), **_model_gate_kwargs(ctx, threshold))


def _p_true_sampling(ctx: GateContext, threshold: float | None) -> Gate:
    from rag_gates.p_true import SAMPLING_DEFAULT_SAMPLES, PTrueGate

    kwargs = _model_gate_kwargs(ctx, threshold)
    kwargs["samples"] = ctx.options.get("p_true_samples", SAMPLING_DEFAULT_SAMPLES)
    # A spec's options fix the draw, so a loaded spec scores as calibrate did (options of
    # their own: sample-agreement's may draw another count at another temperature).
    for key, option in (("temperature", "p_true_temperature"), ("seed", "p_true_seed")):
        if option in ctx.options:
            kwargs[key] = ctx.options[option]
    return PTrueGate(ctx.need_lm("p-true-sampling"), **kwargs)


def _quco(ctx: GateContext, threshold: float | None) -> Gate:
    from rag_gates.quco import QuCoGate

    stats = ctx.need_corpus("quco")
    if threshold is None:
        tau = ctx.options.get("tau_entity")
        return QuCoGate(stats) if tau is None else QuCoGate(stats, tau_entity=float(tau))
    # The rarity score lies in (0, 1]; a threshold at or below 0 retrieves always.
    return QuCoGate.from_threshold(stats, min(1.0, max(threshold, 1e-12)))


def _cbdr(ctx: GateContext, threshold: float | None) -> Gate:
    from rag_gates.cbdr.gate import CBDRGate

    lm = ctx.need_lm("cbdr")
    probe = ctx.probe
    if probe is None:
        from rag_gates.cbdr.shipped import load_default_probe

        probe = load_default_probe(lm)
    # On the score's own scale (1 - the probe's confidence); None: the probe's calibration.
    return CBDRGate(lm, probe, threshold=threshold)


#: The core gates' score scales (their classes' ``threshold_range``; a test holds the two
#: equal), so ``NAME:THRESHOLD`` is checked without importing a gate's module (CBDR's loads
#: torch).
CORE_GATE_RANGES: dict[str, tuple[float, float]] = {
    "first-token-prob": (0.0, 1.0), "first-token-logprob": (0.0, 1.0),
    "answer-logprob": (0.0, 100.0), "quco": (0.0, 1.0), "cbdr": (0.0, 1.0),
    "sample-agreement": (0.0, 1.0), "p-true": (0.0, math.inf),
    "p-true-sampling": (0.0, math.inf)}


_CORE: dict[str, GateFactory] = {"first-token-prob": _first_token,
                                 "first-token-logprob": _first_token_logprob,
                                 "answer-logprob": _answer_logprob, "quco": _quco,
                                 "cbdr": _cbdr, "sample-agreement": _sample_agreement,
                                 "p-true": _p_true, "p-true-sampling": _p_true_sampling}
_CORE_NEEDS_LM = {"first-token-prob": True, "first-token-logprob": True,
                  "answer-logprob": True, "quco": False, "cbdr": True,
                  "sample-agreement": True, "p-true": True, "p-true-sampling": True}
_REGISTERED: dict[str, GateFactory] = {}


def core_gate_names() -> list[str]:
    """The gates every install can build (no entry point, nothing registered)."""
    return sorted(_CORE)


def register_gate(name: str, factory: GateFactory, *, replace: bool = False) -> None:
    """Make ``name`` buildable everywhere gates are built (``factory(ctx, threshold) ->
    Gate``). A name of your own may be registered again (a notebook cell run twice); a core
    gate's name (``answer-logprob``, ``cbdr``, ...) only with ``replace=True``: every
    certified spec naming it would build your gate instead, and still claim its guarantee."""
    if not name or any(c in name for c in "()&|,: "):
        raise ValueError(f"a gate name has no spaces or ()&|,: characters, got {name!r}")
    if name in _CORE and not replace:
        raise ValueError(f"{name!r} is a core gate: registering it again would change what "
                         "every spec naming it builds; give your gate another name (or pass "
                         "replace=True)")
    _REGISTERED[name] = factory


def unregister_gate(name: str) -> None:
    """Forget a gate added with :func:`register_gate` (a core gate replaced with
    ``replace=True`` is restored)."""
    _REGISTERED.pop(name, None)


def available_gates() -> dict[str, GateFactory]:
    """Every buildable name: core gates, registered gates (which win: ``replace=True``),
    then the ``rag_gates.gates`` entry points (which never shadow a core name)."""
    gates = {**_CORE, **_REGISTERED}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        gates.setdefault(ep.name, ep.load())
    return gates


def _threshold_range(name: str, factory: GateFactory | None) -> tuple[float, float]:
    declared = getattr(factory, "threshold_range", None)
    if declared is not None:
        low, high = declared
        return (float(low), float(high))
    if factory is not None and factory is _CORE.get(name):
        return CORE_GATE_RANGES[name]
    return (-math.inf, math.inf)


def check_gate_threshold(name: str, threshold: float | None,
                         gates: Mapping[str, GateFactory] | None = None) -> float | None:
    """``threshold`` if it lies on the score scale the gate ``name`` declares (None stays
    None: the gate's default), else a ValueError naming the gate and its range. Model-free.

    Example:
        >>> check_gate_threshold("first-token-prob", 0.4)
        0.4
    """
    if threshold is None:
        return None
    factory = (gates if gates is not None else available_gates()).get(name)
    return check_threshold(name, threshold, _threshold_range(name, factory))


class _Placeholder(BaseGate):
    """Stands for a checked gate name while an expression is parsed; never decides."""

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, Any]]:
        raise RuntimeError("a gate of a checked expression was asked to decide")


def walk_gate_expression(text: str,
                         check_leaf: Callable[[str, float | None], float | None]) -> None:
    """Parse ``text`` (a gate name, ``NAME:THRESHOLD`` or an expression; grammar and limits:
    :data:`rag_gates.gate.GATE_GRAMMAR`) without building a gate, calling ``check_leaf(name,
    threshold)`` for every named gate, those of ``weighted(FILE)`` files included."""

    def resolve(name: str, threshold: float | None) -> Gate:
        if is_gate_expression(name) or ":" in name:  # a weights file's gate
            if threshold is not None:
                raise ValueError(f"gate {name!r}: give thresholds inside the expression")
            return parse_gate_expression(name, resolve)
        value = check_leaf(name, threshold)
        gate = _Placeholder(0.0 if value is None else value)
        gate.name = name
        return gate

    parse_gate_expression(text, resolve)


def check_gate_expression(expression: str, gates: Mapping[str, GateFactory] | None = None
                          ) -> None:
    """Check a gate expression without building a gate: its syntax and limits, its weights
    files (shape, cycles) and every ``NAME:THRESHOLD`` against the gate's declared range.
    Raises ValueError (:class:`~rag_gates.errors.WeightsFileError` for a weights file) saying
    what is wrong. Names not registered are left to :func:`make_gate`.

    Example:
        >>> check_gate_expression("quco&first-token-prob:0.4")
    """
    known = gates if gates is not None else available_gates()
    walk_gate_expression(expression, lambda name, threshold: check_gate_threshold(
        name, threshold, known))


def gate_needs_lm(expression: str, gates: Mapping[str, GateFactory] | None = None) -> bool:
    """Whether building the gate ``expression`` needs the model: False only when every gate
    in it is known not to (QuCo's pre-check reads the question and the corpus counts, never
    the model; a factory says so with ``factory.needs_lm = False``).

    Example:
        >>> gate_needs_lm("quco"), gate_needs_lm("quco&first-token-prob:0.4")
        (False, True)
    """
    known = gates if gates is not None else available_gates()
    needs = False

    def leaf(name: str, threshold: float | None) -> float | None:
        nonlocal needs
        factory = known.get(name)
        default = _CORE_NEEDS_LM.get(name, True) if factory is _CORE.get(name) else True
        needs = needs or bool(getattr(factory, "needs_lm", default))
        return threshold

    walk_gate_expression(expression, leaf)
    return needs


def make_gate(name: str, ctx: GateContext, threshold: float | None = None) -> Gate:
    """Build a gate by exact name, ``NAME:THRESHOLD``, or a composite expression of them
    (``quco&cbdr``, ``cascade(quco,cbdr,0.2,0.8)``: :data:`rag_gates.gate.GATE_GRAMMAR`);
    an unknown name lists the valid ones. An expression is checked whole first
    (:func:`check_gate_expression`), so nothing is built for one that would be refused."""
    gates = available_gates()  # read once: each lookup of the entry points takes ~50 ms
    if (is_gate_expression(name) or ":" in name) and threshold is None:
        check_gate_expression(name, gates)
    return _build(name, ctx, threshold, gates)


def build_named_gate(name: str, ctx: GateContext, threshold: float | None,
                     gates: Mapping[str, GateFactory] | None = None) -> Gate:
    """One gate by its bare name (no expression) at ``threshold``, checked against its
    scale; an unknown name raises CalibrationError listing the known ones."""
    known = gates if gates is not None else available_gates()
    if name not in known:
        raise CalibrationError(f"unknown gate {name!r}; valid names: "
                               f"{', '.join(sorted(known))} (add one with "
                               "rag_gates.gate.register_gate)")
    return known[name](ctx, check_gate_threshold(name, threshold, known))


def _build(name: str, ctx: GateContext, threshold: float | None,
           gates: Mapping[str, GateFactory]) -> Gate:
    if is_gate_expression(name) or ":" in name:
        if threshold is not None:
            raise ValueError(f"gate {name!r}: give thresholds inside the expression "
                             "(NAME:THRESHOLD), not as a separate threshold")
        return parse_gate_expression(name, lambda n, t: _build(n, ctx, t, gates))
    return build_named_gate(name, ctx, threshold, gates)
