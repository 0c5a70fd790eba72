"""The fail-closed rule of the Gate protocol: a gate that cannot decide retrieves, says why,
and its decision stays valid JSON. Every gate in the tree is checked, on real faults: a model
or probe with NaN weights, a probe with zero feature spread, an answer with no tokens, a
corpus backend answering a non-finite count, an empty kNN datastore, a subquery with no
decision marker."""

from __future__ import annotations

import asyncio
import importlib
import math
from collections.abc import Callable
from typing import Any

import pytest

from rag_gates.corpus.base import CorpusStats
from rag_gates.corpus.types import CooccurrenceResult, CountResult, Scope
from rag_gates.gate import UNDECIDED_SCORE, BaseGate
from rag_gates.types import GateDecision, Generation, TraceRecorder

QUESTION = "Who wrote the play Hamlet?"


def nan_weights_lm() -> Any:
    """The tiny model with its final norm set to NaN: every logit is NaN."""
    import torch

    from rag_gates.testing import tiny_lm

    lm = tiny_lm(seed=0)
    with torch.no_grad():
        lm.model.model.norm.weight.fill_(float("nan"))
    return lm


def probe_for(lm: Any, *, nan_weights: bool = False, zero_std: bool = False) -> Any:
    import torch

    from rag_gates.cbdr import ConfidenceProbe, ProbeConfig, ProbePrompts

    torch.manual_seed(0)
    config = ProbeConfig(model_id=lm.model_id, hidden_size=lm.hidden_size,
                         num_layers=lm.num_layers, layer=2,
                         prompts=ProbePrompts(style="rag-gates"))
    probe = ConfidenceProbe(config, std=torch.zeros(lm.hidden_size) if zero_std else None)
    if nan_weights:
        with torch.no_grad():
            probe.module[0].weight.fill_(float("nan"))
    return probe


class SilentModel:
    """A text-only model (as an API can be) whose answer is empty: no tokens to judge by."""

    model_id = "silent-api"
    supports_logprobs = True

    def generate(self, prompt: Any, **kwargs: Any) -> Generation:
        return Generation(text="", finish_reason="eos", logprobs=[])


class NonFiniteCounts(CorpusStats):
    """A corpus backend (as a third-party one can be) that answers NaN for every count."""

    @property
    def index_name(self) -> str:
        return "broken"

    @property
    def index_key(self) -> str:
        return "broken"

    def count(self, phrase: str) -> CountResult:
        # model_construct: the backend skips validation, as a careless implementation does.
        return CountResult.model_construct(value=float("nan"), phrase=phrase, backend="broken",
                                           index="broken", approximate=False)

    def cooccurrence(self, a: str, b: str, scope: Scope = "document") -> CooccurrenceResult:
        raise NotImplementedError


def _cbdr(**probe_kwargs: Any) -> Callable[[Any], BaseGate]:
    def build(tiny: Any) -> BaseGate:
        from rag_gates.cbdr import CBDRGate

        return CBDRGate(tiny, probe_for(tiny, **probe_kwargs), beta=0.5)
    return build


def _first_token(tiny: Any) -> BaseGate:
    from rag_gates.confidence import FirstTokenProbGate

    return FirstTokenProbGate(nan_weights_lm(), threshold=0.5)


def _answer_logprob_nan(tiny: Any) -> BaseGate:
    from rag_gates.confidence import AnswerLogprobGate

    return AnswerLogprobGate(nan_weights_lm(), threshold=1.0, max_new_tokens=3)


def _first_token_logprob_nan(tiny: Any) -> BaseGate:
    from rag_gates.confidence import FirstTokenLogprobGate

    return FirstTokenLogprobGate(nan_weights_lm(), threshold=0.5, max_new_tokens=3)


def _first_token_logprob_empty(tiny: Any) -> BaseGate:
    from rag_gates.confidence import FirstTokenLogprobGate

    return FirstTokenLogprobGate(SilentModel(), threshold=0.5)


class UnreadableServer:
    """A served model (as a proxy in front of a server can be) whose every reply is
    malformed: the client raises ServerReplyError, as OpenAICompatibleLM does."""

    model_id = "unreadable-api"
    supports_logprobs = True

    def generate(self, prompt: Any, **kwargs: Any) -> Generation:
        from rag_gates.errors import ServerReplyError

        raise ServerReplyError("the reply has no 'choices' (got {'detail': 'bad gateway'})")


def _sample_agreement_unreadable(tiny: Any) -> BaseGate:
    from rag_gates.sample_agreement import SampleAgreementGate

    return SampleAgreementGate(UnreadableServer(), threshold=0.5, samples=2)


def _p_true_nan(tiny: Any) -> BaseGate:
    import torch

    from rag_gates.p_true import PTrueGate
    from rag_gates.testing import tiny_lm

    lm = tiny_lm(seed=0, extra_tokens=("True",))  # P(True) reads the one token 'True'
    with torch.no_grad():
        lm.model.model.norm.weight.fill_(float("nan"))
    return PTrueGate(lm, max_new_tokens=3)


def _answer_logprob_unreadable(tiny: Any) -> BaseGate:
    from rag_gates.confidence import AnswerLogprobGate

    return AnswerLogprobGate(UnreadableServer(), threshold=1.0)


def _first_token_logprob_unreadable(tiny: Any) -> BaseGate:
    from rag_gates.confidence import FirstTokenLogprobGate

    return FirstTokenLogprobGate(UnreadableServer(), threshold=0.5)


def _answer_logprob_empty(tiny: Any) -> BaseGate:
    from rag_gates.confidence import AnswerLogprobGate

    return AnswerLogprobGate(SilentModel(), threshold=1.0)


def _quco(tiny: Any) -> BaseGate:
    from rag_gates.quco import QuCoGate

    return QuCoGate(NonFiniteCounts(), tau_entity=10)


def _composite(kind: str, lm: Any) -> BaseGate:
    from rag_gates.gate import AllOf, AnyOf, Cascade, Weighted

    broken, other = _quco(lm), _quco(lm)
    if kind == "all":
        return AllOf(broken, other)
    if kind == "any":
        return AnyOf(broken, other)
    if kind == "cascade":
        return Cascade(broken, other, band=(0.0, 1.0))
    return Weighted([other, broken], weights=[1.0, 1.0])


def _empty_policy(tiny: Any) -> Any:
    from rag_gates.srrag import HiddenStateKeys, SourcePolicy

    return SourcePolicy.open(HiddenStateKeys(tiny, layer=2), path=":memory:")


def _skr(tiny: Any) -> BaseGate:
    from rag_gates.srrag import SKRGate

    return SKRGate(_empty_policy(tiny), prior=(1, 1))


def _self_routing(tiny: Any) -> BaseGate:
    from rag_gates.srrag import SelfRoutingGate

    return SelfRoutingGate(tiny, _empty_policy(tiny), tau=0.5)


def _marker(tiny: Any) -> BaseGate:
    from rag_gates.deeprag.gates import MarkerGate

    return MarkerGate()


def _marker_likelihood(tiny: Any) -> BaseGate:
    from rag_gates.deeprag.gates import MarkerLikelihoodGate

    return MarkerLikelihoodGate(nan_weights_lm(), threshold=0.0)


def _unreadable_step(tiny: Any) -> BaseGate:
    from rag_gates.deeprag.gates import UnreadableStepGate

    return UnreadableStepGate()


#: The prompt DeepRAG hands its likelihood gate: it ends right after the subquery's line.
SUBQUERY_PROMPT = f"Question: {QUESTION}\nFollow up: Who wrote Hamlet?\n"

# (case id, gate class name, builder, the raw score the fault produces, the signals the
# gate's caller passes with the query)
CASES: list[tuple[str, str, Callable[[Any], BaseGate], str, dict[str, Any]]] = [
    ("cbdr-probe-nan-weights", "CBDRGate", _cbdr(nan_weights=True), "nan", {}),
    ("cbdr-probe-zero-std", "CBDRGate", _cbdr(zero_std=True), "nan", {}),
    ("first-token-prob-nan-model", "FirstTokenProbGate", _first_token, "nan", {}),
    ("answer-logprob-nan-model", "AnswerLogprobGate", _answer_logprob_nan, "nan", {}),
    ("answer-logprob-empty-answer", "AnswerLogprobGate", _answer_logprob_empty, "inf", {}),
    ("first-token-logprob-nan-model", "FirstTokenLogprobGate", _first_token_logprob_nan, "nan",
     {}),
    ("first-token-logprob-empty-answer", "FirstTokenLogprobGate", _first_token_logprob_empty,
     "nan", {}),
    # A served reply that cannot be read (malformed): as sample-agreement, no number.
    ("answer-logprob-unreadable-reply", "AnswerLogprobGate", _answer_logprob_unreadable,
     "nan", {}),
    ("first-token-logprob-unreadable-reply", "FirstTokenLogprobGate",
     _first_token_logprob_unreadable, "nan", {}),
    ("quco-nan-count", "QuCoGate", _quco, "nan", {}),
    ("sample-agreement-unreadable-reply", "SampleAgreementGate", _sample_agreement_unreadable,
     "nan", {}),
    ("p-true-nan-model", "PTrueGate", _p_true_nan, "nan", {}),
    # Composites: a sub-gate that cannot decide makes the whole decision retrieve.
    ("all-of-nan-sub-gate", "AllOf", lambda lm: _composite("all", lm), "nan", {}),
    ("any-of-nan-sub-gate", "AnyOf", lambda lm: _composite("any", lm), "nan", {}),
    ("cascade-nan-cheap-gate", "Cascade", lambda lm: _composite("cascade", lm), "nan", {}),
    ("weighted-nan-sub-gate", "Weighted", lambda lm: _composite("weighted", lm), "nan", {}),
    # SR-RAG: an empty kNN datastore gives no vote.
    ("skr-empty-datastore", "SKRGate", _skr, "nan", {}),
    ("srrag-empty-datastore", "SelfRoutingGate", _self_routing, "nan", {}),
    # DeepRAG: no marker written; a model whose marker log-probabilities are NaN.
    ("deeprag-no-marker", "MarkerGate", _marker, "nan", {"written": None}),
    ("deeprag-likelihood-nan-model", "MarkerLikelihoodGate", _marker_likelihood, "nan",
     {"prompt": SUBQUERY_PROMPT}),
    # DeepRAG: the model's step cannot be read before anything was retrieved.
    ("deeprag-unreadable-step", "UnreadableStepGate", _unreadable_step, "nan",
     {"problem": "empty_subquery", "written": "Follow up:"}),
]

#: ConstantGate (DeepRAG's always / never) scores a constant: it cannot be undecided. Listed
#: so that a new gate class still fails the coverage test below until it is added here.
COVERED_ELSEWHERE = {"ConstantGate"}


def assert_fails_closed(d: GateDecision, raw: str) -> None:
    assert d.retrieve is True
    assert d.score == UNDECIDED_SCORE and math.isfinite(d.score)
    assert "could not decide" in d.reason and d.reason.endswith(": retrieve")
    assert d.evidence["raw_score"] == raw
    assert isinstance(d.evidence["undecided"], str) and d.evidence["undecided"] in d.reason
    # Valid JSON, with no value lost: it reloads equal, also from a trace.
    assert GateDecision.model_validate_json(d.model_dump_json()) == d
    recorder = TraceRecorder()
    recorder.add_decision(d)
    assert recorder.trace().decisions() == [d]


@pytest.mark.parametrize(("case", "cls", "build", "raw", "signals"), CASES,
                         ids=[c[0] for c in CASES])
def test_a_gate_that_cannot_decide_retrieves_and_says_why(
        tiny: Any, case: str, cls: str, build: Callable[[Any], BaseGate], raw: str,
        signals: dict[str, Any]) -> None:
    gate = build(tiny)
    assert type(gate).__name__ == cls
    assert_fails_closed(gate.decide(QUESTION, **signals), raw)
    assert_fails_closed(asyncio.run(gate.adecide(QUESTION, **signals)), raw)
    for d in gate.decide_batch([QUESTION, "What is the capital of Peru?"], **signals):
        assert_fails_closed(d, raw)


def test_cbdr_prefill_fails_closed_too(tiny: Any) -> None:
    from rag_gates.cbdr import CBDRGate

    probed = CBDRGate(tiny, probe_for(tiny, nan_weights=True), beta=0.5).prefill(QUESTION)
    assert_fails_closed(probed.decision, "nan")
    assert "probe" in probed.decision.reason


def test_every_gate_in_the_tree_is_covered() -> None:
    # Import every module that defines gates, then walk BaseGate's subclasses.
    for module in ("rag_gates.cbdr.gate", "rag_gates.registry", "rag_gates.confidence",
                   "rag_gates.sample_agreement", "rag_gates.p_true",
                   "rag_gates.quco.gate", "rag_gates.srrag.gate", "rag_gates.srrag.skr",
                   "rag_gates.deeprag.gates",
                   "langchain_rag_gates", "llama_index.retrievers.rag_gates",
                   "llama_index.query_engine.rag_gates"):
        importlib.import_module(module)

    def walk(cls: type) -> list[type]:
        return [s for sub in cls.__subclasses__() for s in (sub, *walk(sub))]

    shipped = {c.__name__ for c in walk(BaseGate)
               if c.__module__.startswith(("rag_gates", "langchain_rag_gates", "llama_index"))
               and not c.__name__.startswith("_")}  # private bases of the composites
    assert shipped - COVERED_ELSEWHERE == {cls for _, cls, _, _, _ in CASES}


def test_non_finite_evidence_is_made_json_safe_and_finite_scores_decide_as_before() -> None:
    class Fixed(BaseGate):
        name = "fixed"

        def __init__(self, value: float) -> None:
            super().__init__(threshold=0.5)
            self.value = value

        def score(self, query: str, **signals: Any) -> tuple[float, dict[str, Any]]:
            return self.value, {"spread": float("-inf"), "nested": {"x": [float("nan"), 1.0]}}

    low = Fixed(0.2).decide(QUESTION)
    assert (low.retrieve, low.score) == (False, 0.2)
    assert low.evidence == {"spread": "-inf", "nested": {"x": ["nan", 1.0]}}
    assert GateDecision.model_validate_json(low.model_dump_json()) == low
    assert Fixed(0.5).decide(QUESTION).retrieve is True
    undecided = Fixed(float("-inf")).decide(QUESTION)  # -inf would have meant "never retrieve"
    assert undecided.retrieve is True and undecided.evidence["raw_score"] == "-inf"


def test_fail_closed_overturns_only_a_skip_it_cannot_read() -> None:
    """What the framework wrappers apply to decisions from gates outside BaseGate."""
    from rag_gates.gate import fail_closed

    def decision(score: float, retrieve: bool, **evidence: Any) -> GateDecision:
        return GateDecision(gate="remote", retrieve=retrieve, score=score, threshold=0.5,
                            reason="its own reason", evidence=evidence)

    for kept in (decision(0.2, False), decision(0.2, False, undecided=False),
                 decision(0.9, True), decision(float("nan"), True)):
        assert fail_closed(kept) is kept
    nan = fail_closed(decision(float("nan"), False, spread=float("inf")))
    assert nan.retrieve and nan.score == UNDECIDED_SCORE
    assert nan.reason == "remote could not decide (its score nan is not a finite number): retrieve"
    assert nan.evidence["gate_said"] == "its own reason" and nan.evidence["spread"] == "inf"
    GateDecision.model_validate_json(nan.model_dump_json())  # valid JSON
    marked = fail_closed(decision(0.2, False, undecided="the service timed out"))
    assert marked.retrieve and "(the service timed out)" in marked.reason
