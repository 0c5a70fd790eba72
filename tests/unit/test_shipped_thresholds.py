"""One threshold per shipped artifact (issue 31, item 3): a policy or probe carries the
threshold calibrated with it, and every way of building a gate on it (the README's, the
demo's, the benchmark's) uses that threshold unless given another.

The mechanism is checked on the tiny model with artifacts written here; the shipped artifacts
themselves on the embedded SmolLM2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rag_gates.cbdr.gate import CBDRGate
from rag_gates.cbdr.pipeline import CBDRPipeline
from rag_gates.cbdr.probe import DEFAULT_BETA, ConfidenceProbe, ProbeCalibration, ProbeConfig
from rag_gates.retrieval.bm25 import BM25Retriever
from rag_gates.srrag.gate import DEFAULT_TAU, SelfRoutingGate
from rag_gates.srrag.policy import PolicyEntry
from rag_gates.srrag.shipped import (
    DEFAULT_POLICY_LABELS,
    POLICY_ENV,
    load_default_policy,
    read_policy_labels,
    write_policy_labels,
)
from rag_gates.types import Passage

QUESTIONS = [("In what city was Robley Dunglison Evans born?", "retrieval"),
             ("In what city was Ingvild Bryn born?", "parametric"),
             ("In what city was Mick Flynn born?", "retrieval"),
             ("What is the capital of France?", "parametric")]


@pytest.fixture()
def no_policy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(POLICY_ENV, raising=False)


def _labels(tmp_path: Path, model_id: str, tau: float | None) -> Path:
    entries = [PolicyEntry(id=f"q{i}", dataset="popqa", question=q, source=s)  # type: ignore[arg-type]
               for i, (q, s) in enumerate(QUESTIONS)]
    return write_policy_labels(tmp_path / "labels.jsonl", entries, model_id, "test", tau=tau,
                               calibration={"agreement": 0.75} if tau is not None else None,
                               k=2)


# ------------------------------------------------------------------------------- SR-RAG
def test_a_gate_over_a_calibrated_policy_uses_its_tau(tiny: Any, tmp_path: Path) -> None:
    policy = load_default_policy(tiny, labels=_labels(tmp_path, tiny.model_id, tau=0.3))
    assert policy.tau == 0.3
    gate = SelfRoutingGate(tiny, policy)
    assert (gate.tau, gate.tau_source) == (0.3, "calibrated with the policy")
    assert gate.decide("Who wrote Hamlet?").threshold == 0.3
    # Given explicitly, the caller's tau wins.
    assert SelfRoutingGate(tiny, policy, tau=0.05).tau == 0.05
    # The calibration is of p_M * p_D: p_M alone keeps the default.
    assert SelfRoutingGate(tiny, policy, mode="model").tau == DEFAULT_TAU


def test_an_uncalibrated_policy_or_another_k_keeps_the_default(tiny: Any,
                                                                tmp_path: Path) -> None:
    uncalibrated = load_default_policy(tiny, labels=_labels(tmp_path, tiny.model_id, None))
    gate = SelfRoutingGate(tiny, uncalibrated)
    assert gate.tau == DEFAULT_TAU and gate.tau_source.startswith("DEFAULT_TAU")
    other_k = load_default_policy(tiny, k=3, labels=_labels(tmp_path, tiny.model_id, 0.3))
    assert other_k.tau is None and SelfRoutingGate(tiny, other_k).tau == DEFAULT_TAU


# --------------------------------------------------------------------------------- CBDR
def _probe(lm: Any, calibration: ProbeCalibration | None) -> ConfidenceProbe:
    config = ProbeConfig(model_id=lm.model_id, hidden_size=lm.hidden_size,
                         num_layers=lm.num_layers, layer=1, hidden_dims=(8,),
                         calibration=calibration)
    return ConfidenceProbe(config)


def test_a_gate_over_a_calibrated_probe_uses_its_beta(tiny: Any, tmp_path: Path) -> None:
    probe = _probe(tiny, ProbeCalibration(beta=0.42, made_with="test"))
    loaded = ConfidenceProbe.load(probe.save(tmp_path / "probe"), lm=tiny)
    assert loaded.beta == 0.42
    assert CBDRGate(tiny, loaded).beta == 0.42
    assert CBDRGate(tiny, loaded).threshold == pytest.approx(1 - 0.42)
    assert CBDRGate(tiny, loaded, beta=0.9).beta == 0.9
    retriever = BM25Retriever.from_passages([Passage(id="a", text="Paris is in France.")])
    assert CBDRPipeline(tiny, retriever, loaded).gate.beta == 0.42
    assert CBDRGate(tiny, _probe(tiny, None)).beta == DEFAULT_BETA


def test_the_bench_cbdr_option_still_sets_beta() -> None:
    from rag_gates_lab.plugins.cbdr import parse_beta

    assert parse_beta(None) is None  # the probe's own, read when it loads
    assert parse_beta("0.9") == 0.9
    with pytest.raises(ValueError, match="beta"):
        parse_beta("2")


# ---------------------------------------------------------------- the shipped artifacts
@pytest.mark.integration
def test_the_readme_and_the_demo_build_the_shipped_srrag_gate_alike(
        smol: Any, no_policy_env: None) -> None:
    from rag_gates.cli import shipped_srrag_gate

    header, _ = read_policy_labels(DEFAULT_POLICY_LABELS)
    assert header.tau is not None
    readme = SelfRoutingGate(smol, load_default_policy(smol))  # the README's snippet
    demo = shipped_srrag_gate(smol)
    assert readme.tau == demo.tau == header.tau


@pytest.mark.integration
def test_every_entry_point_builds_the_shipped_cbdr_gate_at_the_probes_beta(
        smol: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from rag_gates.cbdr.shipped import DEFAULT_PROBE_DIR, PROBE_ENV, load_default_probe
    from rag_gates.methods import MethodContext
    from rag_gates.registry import make_gate
    from rag_gates_lab.plugins.cbdr import cbdr_method

    monkeypatch.delenv(PROBE_ENV, raising=False)
    beta = json.loads((DEFAULT_PROBE_DIR / "probe.json").read_text())["calibration"]["beta"]
    retriever = BM25Retriever.from_passages([Passage(id="a", text="Paris is in France.")])
    ctx = MethodContext(lm=smol, retriever=retriever, dataset="popqa")
    assert CBDRGate(smol, load_default_probe(smol)).beta == beta  # the README's / demo's
    assert make_gate("cbdr", ctx).beta == beta  # eval-gate --gate cbdr, calibrate, load_gate
    assert cbdr_method(ctx).gate.beta == beta  # bench --methods cbdr
