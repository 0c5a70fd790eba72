"""load_gate(): a spec builds a real gate that decides at the certified threshold, names the
spec in every decision, and is refused for another model."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag_gates.calibration import (
    CalibrationError,
    CalibrationRecord,
    CertifiedGate,
    GateContext,
    GateSpec,
    ModelIdentity,
    SpecModelMismatchError,
    calibrate,
    load_gate,
    register_gate,
)
from rag_gates.confidence import FirstTokenProbGate
from rag_gates.gate import BaseGate, Gate, Weighted
from rag_gates.types import GateDecision

QUESTIONS = [f"Who wrote book number {i} of the {w} series?"
             for i in range(20) for w in ("red", "blue", "green")]


def _records(scores: dict[str, list[float | None]]) -> list[CalibrationRecord]:
    """Labels tied to the first gate's score: a low score means the closed-book answer is
    right (skipping is harmless), a high one that retrieval fixes it."""
    first = next(iter(scores.values()))
    ranked = sorted(s for s in first if s is not None)
    cut = ranked[len(ranked) * 2 // 3]
    out = []
    for i, q in enumerate(QUESTIONS):
        s = first[i]
        right = s is not None and s < cut
        out.append(CalibrationRecord(
            id=f"q{i}", question=q, closed_book_correct=right, retrieved_correct=True,
            scores={g: v[i] for g, v in scores.items()}))
    return out


@pytest.fixture(scope="module")
def first_token_spec(tiny: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    gate = FirstTokenProbGate(tiny)
    scores: list[float | None] = [gate.decide(q).score for q in QUESTIONS]
    report = calibrate(_records({"first-token-prob": scores}), max_loss=0.2, delta=0.1,
                       model=ModelIdentity.of(tiny), retriever="none (test)", composite=False)
    spec = report.spec_for("first-token-prob")
    assert spec.certified, spec.note
    return spec.save(tmp_path_factory.mktemp("spec") / "gate.json")


def test_a_loaded_spec_decides_at_the_certified_threshold(tiny: Any,
                                                          first_token_spec: Path) -> None:
    spec = GateSpec.load(first_token_spec)
    gate = load_gate(first_token_spec, lm=tiny)
    assert isinstance(gate, Gate) and gate.threshold == spec.threshold
    bare = FirstTokenProbGate(tiny)
    skipped = 0
    for q in QUESTIONS:
        d = gate.decide(q)
        score = bare.decide(q).score
        assert d.score == pytest.approx(score)
        assert d.retrieve == (score >= spec.threshold)
        skipped += not d.retrieve
        assert d.evidence["spec"] == {"name": str(first_token_spec), "epsilon": 0.2,
                                      "delta": 0.1, "bound": "exact", "n": len(QUESTIONS),
                                      "threshold": spec.threshold, "certified": True}
        assert "certified threshold" in d.reason
    assert skipped / len(QUESTIONS) == pytest.approx(spec.skip_rate.observed)


def test_batch_and_async_decisions_carry_the_spec(tiny: Any, first_token_spec: Path) -> None:
    gate = load_gate(first_token_spec, lm=tiny)
    batch = gate.decide_batch(QUESTIONS[:3])
    one = asyncio.run(gate.adecide(QUESTIONS[0]))
    assert all(d.evidence["spec"]["epsilon"] == 0.2 for d in [*batch, one])
    assert [d.retrieve for d in batch] == [gate.decide(q).retrieve for q in QUESTIONS[:3]]


def test_a_spec_for_another_model_is_refused(first_token_spec: Path) -> None:
    from rag_gates.testing import tiny_lm

    other = tiny_lm(seed=1)
    with pytest.raises(SpecModelMismatchError, match="calibrated for model 'tiny-llama-seed0'"):
        load_gate(first_token_spec, lm=other)
    gate = load_gate(first_token_spec, lm=other, allow_other_model=True)
    # Served on another model, the spec certifies nothing: every path's decision says so.
    decisions = [gate.decide(QUESTIONS[0]), asyncio.run(gate.adecide(QUESTIONS[1])),
                 *gate.decide_batch(QUESTIONS[2:4])]
    for d in decisions:
        assert d.evidence["spec"]["certified"] is False
        assert "allow_other_model=True" in d.evidence["spec"]["override"]
        assert "tiny-llama-seed1" in d.evidence["spec"]["override"]
        if "undecided" not in d.evidence:
            assert "NOT certified here" in d.reason and "accuracy drop <=" not in d.reason
    # The override is recorded only when it overrode something: the right model is certified.
    same = load_gate(first_token_spec, lm=tiny_lm(seed=0), allow_other_model=True)
    d = same.decide(QUESTIONS[0])
    assert d.evidence["spec"]["certified"] is True and "override" not in d.evidence["spec"]
    assert same.override is None


def test_a_spec_served_without_a_model_check_says_it_is_not_certified() -> None:
    model = ModelIdentity(name="m", fingerprint="1" * 64)
    spec = calibrate(_word_records(), max_loss=0.1, model=model, retriever="-",
                     composite=False).spec_for("long-words")
    assert spec.certified
    gate = load_gate(spec, allow_other_model=True)
    for d in [gate.decide(WORDY[0]), *gate.decide_batch(WORDY[1:4])]:
        assert d.evidence["spec"]["certified"] is False
        assert "no lm to check" in d.evidence["spec"]["override"]
        assert "NOT certified here" in d.reason


def test_an_off_scale_composite_threshold_is_refused(tmp_path: Path) -> None:
    """A resealed cascade (or weighted) spec whose threshold lies off its score's scale
    would never retrieve: refused like a single gate's."""
    model = ModelIdentity(name="m", fingerprint="1" * 64)
    report = calibrate(_word_records(), max_loss=0.1, model=model, retriever="-")
    for name in ("cascade(long-words,vowels)", "weighted(long-words,vowels)"):
        spec = report.spec_for(name)
        assert spec.certified, spec.note
        resealed = spec.model_copy(update={"threshold": 5.0}).sealed()
        with pytest.raises(CalibrationError, match="score scale"):
            load_gate(resealed.save(tmp_path / "x.json"), allow_other_model=True)
        load_gate(spec, allow_other_model=True)  # the certified threshold loads


def test_the_model_must_be_given_to_be_checked(first_token_spec: Path) -> None:
    with pytest.raises(CalibrationError, match="pass lm="):
        load_gate(first_token_spec)


def test_model_identity_is_the_weights_not_the_name(tiny: Any) -> None:
    from rag_gates.lm.hf import HFWhiteBoxLM
    from rag_gates.testing import tiny_lm, tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer(0)
    renamed = HFWhiteBoxLM(model, tok, model_id="moved/elsewhere")
    assert ModelIdentity.of(renamed).matches(ModelIdentity.of(tiny))
    assert ModelIdentity.of(tiny).kind == "weights"
    assert not ModelIdentity.of(tiny_lm(seed=1)).matches(ModelIdentity.of(tiny))
    import torch

    with torch.no_grad():                       # one fine-tuning step's worth of change
        next(renamed.model.parameters()).add_(0.01)
    assert not ModelIdentity.of(renamed).matches(ModelIdentity.of(tiny))


def test_a_served_model_is_identified_by_endpoint_and_name() -> None:
    from rag_gates.lm.openai_compat import OpenAICompatibleLM

    a = OpenAICompatibleLM("http://127.0.0.1:9/v1", model="smollm2", probe=False)
    b = OpenAICompatibleLM("http://127.0.0.1:9/v1", model="llama", probe=False)
    ia, ib = ModelIdentity.of(a), ModelIdentity.of(b)
    assert ia.kind == "endpoint" and not ia.matches(ib)
    assert ia.matches(ModelIdentity.of(OpenAICompatibleLM("http://127.0.0.1:9/v1/",
                                                          model="smollm2", probe=False)))


def test_a_served_models_chat_template_is_part_of_its_identity() -> None:
    """P(True) scores chat prompts the client renders: a spec made with one template does not
    match the same endpoint with another or none; without a template the fingerprint is the
    endpoint and name alone, as before templates were recorded (old specs still load)."""
    import hashlib

    from rag_gates.lm.openai_compat import OpenAICompatibleLM

    url = "http://127.0.0.1:9/v1"
    plain = OpenAICompatibleLM(url, model="smollm2", probe=False)
    one = OpenAICompatibleLM(url, model="smollm2", probe=False,
                             chat_template="{{ messages[0]['content'] }}")
    other = OpenAICompatibleLM(url, model="smollm2", probe=False,
                               chat_template="<s>{{ messages[0]['content'] }}")
    ids = [ModelIdentity.of(lm) for lm in (plain, one, other)]
    assert all(i.kind == "endpoint" for i in ids)
    assert not ids[0].matches(ids[1]) and not ids[1].matches(ids[2])
    assert ids[1].matches(ModelIdentity.of(OpenAICompatibleLM(
        url, model="smollm2", probe=False, chat_template="{{ messages[0]['content'] }}")))
    assert ids[0].fingerprint == hashlib.sha256(f"{url}#smollm2".encode()).hexdigest()


class Counting(BaseGate):
    """A cheap real gate: the share of words longer than six letters; counts its calls."""

    name = "long-words"

    def __init__(self, threshold: float = 0.5) -> None:
        super().__init__(threshold)
        self.calls = 0

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, Any]]:
        self.calls += 1
        words = query.split()
        if query.startswith("NaN"):
            return math.nan, {}
        return sum(len(w) > 6 for w in words) / len(words), {"words": len(words)}


class Vowels(BaseGate):
    name = "vowels"

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, Any]]:
        return sum(c in "aeiou" for c in query) / max(1, len(query)), {}


BUILT: list[Counting] = []


def _counting(ctx: GateContext, threshold: float | None) -> Gate:
    gate = Counting(0.5 if threshold is None else threshold)
    BUILT.append(gate)
    return gate


register_gate("long-words", _counting)
register_gate("vowels", lambda ctx, t: Vowels(0.5 if t is None else t))

WORDY = [f"{'Extraordinary ' * (i % 7)}question {'about ' * (6 - i % 7)}item {i}"
         for i in range(90)]


def _word_records() -> list[CalibrationRecord]:
    out = []
    for i, q in enumerate(WORDY):
        s = Counting().score(q)[0]
        v = Vowels(0.5).score(q)[0]
        out.append(CalibrationRecord(id=str(i), question=q, closed_book_correct=s < 0.4,
                                     retrieved_correct=True,
                                     scores={"long-words": s, "vowels": v}))
    return out


def test_an_always_retrieve_spec_never_consults_the_gate(tmp_path: Path) -> None:
    records = _word_records()[:30]
    model = ModelIdentity(name="m", fingerprint="1" * 64)
    spec = calibrate(records, max_loss=0.01, model=model, retriever="-",
                     composite=False).spec_for("long-words")
    assert spec.threshold is None
    BUILT.clear()
    gate = load_gate(spec.save(tmp_path / "g.json"), allow_other_model=True)
    d = gate.decide("Extraordinary question")
    assert d.retrieve and "no threshold certified" in d.reason and BUILT == []
    assert all(x.retrieve for x in gate.decide_batch(["a b", "c d"]))
    assert d.evidence["spec"]["certified"] is False


def test_an_undecided_score_retrieves_and_names_the_spec(tmp_path: Path) -> None:
    model = ModelIdentity(name="m", fingerprint="1" * 64)
    spec = calibrate(_word_records(), max_loss=0.1, model=model, retriever="-",
                     composite=False).spec_for("long-words")
    assert spec.certified
    gate = load_gate(spec, allow_other_model=True)
    d = gate.decide("NaN question")
    assert d.retrieve and "undecided" in d.evidence and "override" in d.evidence["spec"]


def test_decisions_do_not_share_or_mutate_evidence() -> None:
    model = ModelIdentity(name="m", fingerprint="1" * 64)
    spec = calibrate(_word_records(), max_loss=0.1, model=model, retriever="-",
                     composite=False).spec_for("long-words")
    original = GateDecision(gate="long-words", retrieve=True, score=0.0, threshold=0.5,
                            reason="fixed", evidence={"k": 1})

    class Fixed(BaseGate):
        name = "long-words"

        def decide(self, query: str, **signals: Any) -> GateDecision:
            return original

        def score(self, query: str, **signals: Any) -> tuple[float, dict[str, Any]]:
            raise AssertionError

    gate = CertifiedGate(Fixed(0.5), spec)
    a, b = gate.decide("x"), gate.decide("y")
    assert "spec" not in original.evidence and original.retrieve is True
    assert a.evidence["spec"] == b.evidence["spec"]
    assert a.evidence["spec"] is not b.evidence["spec"]
    a.evidence["spec"]["epsilon"] = 0.9                     # a caller scribbles on one
    assert gate.decide("z").evidence["spec"]["epsilon"] == 0.1


def test_a_composite_spec_loads_as_the_fitted_weighted_gate(tmp_path: Path) -> None:
    model = ModelIdentity(name="m", fingerprint="1" * 64)
    report = calibrate(_word_records(), max_loss=0.1, model=model, retriever="-")
    name = "weighted(long-words,vowels)"
    spec = report.spec_for(name)
    assert spec.composite is not None and spec.composite.gates == ["long-words", "vowels"]
    gate = load_gate(spec.save(tmp_path / "w.json"), allow_other_model=True)
    assert isinstance(gate.inner, Weighted)
    fit = spec.composite
    for q in WORDY[:10]:
        d = gate.decide(q)
        s = [Counting().score(q)[0], Vowels(0.5).score(q)[0]]
        z = fit.bias + sum(w * (x - c) / sc for w, x, c, sc in
                           zip(fit.weights, s, fit.center, fit.scale, strict=True))
        assert d.score == pytest.approx(1 / (1 + math.exp(-z)))
        if spec.threshold is not None:
            assert d.retrieve == (d.score >= spec.threshold)


def test_a_cascade_spec_loads_as_a_working_cascade(tmp_path: Path) -> None:
    """The loaded gate is a Cascade of the two fitted one-gate scales: the cheap gate
    decides outside the band, the expensive one inside (and only there is it called), and
    the score compared with the certified threshold is the one calibrate() certified."""
    from rag_gates.calibration.calibrate import cascade_scores
    from rag_gates.gate import Cascade

    model = ModelIdentity(name="m", fingerprint="1" * 64)
    records = _word_records()
    report = calibrate(records, max_loss=0.1, model=model, retriever="-")
    name = "cascade(long-words,vowels)"
    spec = report.spec_for(name)
    assert spec.cascade is not None and spec.composite is None
    BUILT.clear()
    gate = load_gate(spec.save(tmp_path / "c.json"), allow_other_model=True)
    assert isinstance(gate.inner, Cascade) and gate.name == name
    fit = spec.cascade
    want = cascade_scores(fit, np.array([r.scores[fit.cheap.gates[0]] for r in records]),
                          np.array([r.scores[fit.expensive.gates[0]] for r in records]))
    called = 0
    for q, w in zip(WORDY, want, strict=True):
        d = gate.decide(q)
        assert d.score == pytest.approx(w, abs=1e-12)
        called += bool(d.evidence["expensive_called"])
        if spec.threshold is not None:
            assert d.retrieve == (d.score >= spec.threshold)
    # Some questions fall outside the band: the expensive gate was not asked for them.
    assert 0 < called < len(WORDY) or fit.band[0] == fit.band[1]


def test_an_unknown_gate_or_missing_corpus_is_a_clear_error(tmp_path: Path) -> None:
    model = ModelIdentity(name="m", fingerprint="1" * 64)
    records = [r.model_copy(update={"scores": {"mystery": r.scores["long-words"]}})
               for r in _word_records()]
    spec = calibrate(records, max_loss=0.1, model=model, retriever="-").spec_for("mystery")
    with pytest.raises(CalibrationError, match="cannot build"):
        load_gate(spec, allow_other_model=True)
    records = [r.model_copy(update={"scores": {"quco": r.scores["long-words"]}})
               for r in _word_records()]
    spec = calibrate(records, max_loss=0.1, model=model, retriever="-").spec_for("quco")
    with pytest.raises(CalibrationError, match="needs corpus statistics"):
        load_gate(spec, allow_other_model=True)


def test_a_tampered_spec_object_is_refused() -> None:
    model = ModelIdentity(name="m", fingerprint="1" * 64)
    spec = calibrate(_word_records(), max_loss=0.1, model=model, retriever="-",
                     composite=False).spec_for("long-words")
    forged = spec.model_copy(update={"threshold": 10.0})
    with pytest.raises(CalibrationError, match="checksum mismatch"):
        load_gate(forged, allow_other_model=True)


def test_load_gate_is_reachable_from_the_top_without_a_heavy_import() -> None:
    import subprocess
    import sys

    code = ("import sys, rag_gates; light = 'numpy' not in sys.modules; "
            "from rag_gates.calibration import load_gate; "
            "print(light, rag_gates.load_gate is load_gate, rag_gates.GateSpec.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    assert out == ["True", "True", "GateSpec"]


def test_an_expression_spec_builds_the_composed_gate() -> None:
    """A spec whose gate is an expression of registered gates builds that composition and
    compares its score (the deciding margin) with the certified threshold."""
    from rag_gates.gate import AnyOf

    expression = "long-words:0.1|vowels:0.3"
    composed = AnyOf(Counting(0.1), Vowels(0.3))
    records = [r.model_copy(update={"scores": {expression: composed.decide(r.question).score}})
               for r in _word_records()]
    model = ModelIdentity(name="m", fingerprint="1" * 64)
    spec = calibrate(records, max_loss=0.1, model=model, retriever="-").spec_for(expression)
    assert spec.certified
    gate = load_gate(spec, allow_other_model=True)
    assert isinstance(gate.inner, AnyOf)
    for q in WORDY[:20]:
        d = gate.decide(q)
        assert d.score == pytest.approx(composed.decide(q).score)
        assert d.retrieve == (d.score >= spec.threshold)


def test_a_spec_threshold_off_the_gates_score_scale_is_refused(tiny: Any) -> None:
    """CBDR's factory turns the threshold into beta (clamped to [0, 1]); a spec whose scores
    were not CBDR's (here: the long-words share, tripled) certifies a threshold above 1, at
    which the wrapper would never retrieve. load_gate refuses it instead."""
    from tests.unit.test_gate_fail_closed import probe_for

    model = ModelIdentity(name="m", fingerprint="1" * 64)
    records = [r.model_copy(update={"scores": {"cbdr": 3 * r.scores["long-words"]}})
               for r in _word_records()]
    spec = calibrate(records, max_loss=0.1, model=model, retriever="-",
                     composite=False).spec_for("cbdr")
    assert spec.certified and spec.threshold is not None and spec.threshold > 1.0
    with pytest.raises(CalibrationError, match="score scale"):
        load_gate(spec, lm=tiny, probe=probe_for(tiny), allow_other_model=True)
    # The same records on CBDR's own scale load and decide at the spec's threshold.
    records = [r.model_copy(update={"scores": {"cbdr": r.scores["long-words"]}})
               for r in _word_records()]
    spec = calibrate(records, max_loss=0.1, model=model, retriever="-",
                     composite=False).spec_for("cbdr")
    gate = load_gate(spec, lm=tiny, probe=probe_for(tiny), allow_other_model=True)
    assert gate.inner.beta == pytest.approx(1.0 - spec.threshold)  # type: ignore[union-attr]
