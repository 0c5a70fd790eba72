"""CBDR as the paper computes it (docs/fidelity.md, CBDR section; no public code).

The references are written out by hand from the paper, on real tensors of the embedded
SmolLM2 with the shipped probe, and use none of ``rag_gates.cbdr``'s reading code:

- the prompt: the shipped probe's "rag-gates" QA prompt typed out here, through the
  tokenizer's own chat template (``apply_chat_template``), not our ``render``/``encode``;
- ``H``: one plain transformers forward pass (``output_hidden_states``), the state at
  Mid_Layer = ``Layer / 2`` (section 3.1: ``num_hidden_layers // 2`` = 15 of SmolLM2's 30;
  ``hidden_states[0]`` is the embeddings) at the last prompt token ("before generating the
  first answer token");
- ``E``: the MLP evaluated from the raw tensors of ``probe.safetensors`` (section 3.1 and the
  card: linear + ReLU layers, then 2 logits; the saved feature mean/std first, row C4);
- ``Conf = e^{z_1} / (e^{z_0} + e^{z_1})`` (Eq. 2), written as that ratio.

Each test also shows it can tell a wrong reading apart: the neighbouring layers and
Algorithm 1's last layer give confidences further than the tolerance from ours.
Tolerance: 1e-4 absolute on confidences (batched, padded passes in ours against unpadded
single ones here).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from rag_gates.types import Passage

pytestmark = pytest.mark.integration

Q = "Who directed the film Ed Wood?"
#: Real PopQA development questions, plus Q.
QUESTIONS = [Q, "In what city was Mukhtar Mukhtarov born?",
             "In what city was Leonard Shure born?", "What is Henry Feilden's occupation?"]
PASSAGE = Passage(title="Ed Wood (film)", text="Ed Wood is a 1994 American biographical "
                  "comedy-drama film directed and produced by Tim Burton.")
TOL = 1e-4
#: The "rag-gates" prompt style (rag_gates.prompts.qa_prompt), typed out.
QA = "Answer the question in a few words.\nQuestion: {q}"
RAG = "Answer the question in a few words, using the context.\nContext:\n- {c}\nQuestion: {q}"


@pytest.fixture(scope="module")
def probe(smol: Any) -> Any:
    from rag_gates.cbdr.shipped import load_default_probe

    probe = load_default_probe(smol)
    # The prompt typed out above is the one the shipped probe reads.
    assert (probe.prompts.style, probe.prompts.dataset, probe.config.position) == \
        ("rag-gates", None, -1)
    return probe


@pytest.fixture(scope="module")
def weights() -> dict[str, torch.Tensor]:
    from rag_gates.cbdr.shipped import DEFAULT_PROBE_DIR

    return load_file(str(DEFAULT_PROBE_DIR / "probe.safetensors"))


def _hidden(smol: Any, text: str) -> tuple[torch.Tensor, ...]:
    """All hidden states at the last prompt token, from the tokenizer's chat template."""
    rendered = smol.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                  tokenize=False, add_generation_prompt=True)
    ids = smol.tokenizer(rendered, add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        out = smol.model(torch.tensor([ids]), output_hidden_states=True)
    return tuple(h[0, -1].float() for h in out.hidden_states)


def _eq2(weights: dict[str, torch.Tensor], h: torch.Tensor) -> float:
    """``E(H)`` from the raw weights, then Eq. 2 as the ratio of exponentials."""
    x = (h - weights["feature_mean"].float()) / weights["feature_std"].float()
    linear = sorted({int(k.split(".")[1]) for k in weights if k.startswith("mlp.")})
    for i, index in enumerate(linear):
        x = x @ weights[f"mlp.{index}.weight"].float().T + weights[f"mlp.{index}.bias"].float()
        if i < len(linear) - 1:
            x = torch.clamp(x, min=0.0)  # ReLU between the linear layers
    z0, z1 = float(x[0]), float(x[1])
    return math.exp(z1) / (math.exp(z0) + math.exp(z1))


def _mid(smol: Any) -> int:
    """Section 3.1's Mid_Layer, ``Layer / 2``, as a ``hidden_states`` index."""
    return int(smol.model.config.num_hidden_layers) // 2


def test_confidence_reads_the_middle_layer(smol: Any, probe: Any,
                                           weights: dict[str, torch.Tensor]) -> None:
    """Section 3.1 + Eq. 2: Conf(H) at Mid_Layer, last prompt token; not the last layer
    (Algorithm 1, line 5) nor a neighbouring layer."""
    ours = probe.confidence(smol, QUESTIONS)
    states = [_hidden(smol, QA.format(q=q)) for q in QUESTIONS]
    mid = _mid(smol)
    assert mid == 15
    reference = [_eq2(weights, s[mid]) for s in states]
    for q, a, b in zip(QUESTIONS, ours, reference, strict=True):
        assert abs(a - b) < TOL, (q, a, b)
    # The test can catch a wrong layer: each other reading misses ours by far more than TOL.
    for wrong in (mid - 1, mid + 1, len(states[0]) - 1):
        miss = max(abs(a - _eq2(weights, s[wrong])) for a, s in zip(ours, states, strict=True))
        assert miss > 10 * TOL, (wrong, miss)


def test_confidence_gain_is_the_difference(smol: Any, probe: Any,
                                           weights: dict[str, torch.Tensor]) -> None:
    """Eq. 5: Inc(Q, C) = Conf(H_{Q+C}) - Conf(H_Q), the RAG prompt against the QA one."""
    from rag_gates.cbdr import ConfidenceGainReranker

    scores = ConfidenceGainReranker(smol, probe).score_passages(Q, [PASSAGE]).scores
    mid = _mid(smol)
    context = f"{PASSAGE.title}: {PASSAGE.text}"
    reference = (_eq2(weights, _hidden(smol, RAG.format(c=context, q=Q))[mid])
                 - _eq2(weights, _hidden(smol, QA.format(q=Q))[mid]))
    assert abs(scores[0] - reference) < 2 * TOL


def test_gate_skips_above_beta(smol: Any, probe: Any) -> None:
    """Section 3.4: skip retrieval iff Conf > beta, retrieve when Conf < beta; at exact
    equality (which the text leaves open and Algorithm 1 line 7, ``S >= beta``, skips) we
    retrieve: fail closed, row C7. Tested at beta = Conf exactly and one float step either
    side, with the confidence each path read itself, on the decide and prefill paths."""
    from rag_gates.cbdr import CBDRGate

    for question in QUESTIONS:
        conf = CBDRGate(smol, probe, beta=0.5).decide(question).evidence["confidence"]
        assert isinstance(conf, float) and 0.0 < conf < 1.0
        below, above = math.nextafter(conf, 0.0), math.nextafter(conf, 1.0)
        assert not CBDRGate(smol, probe, beta=below).decide(question).retrieve  # Conf > beta
        assert CBDRGate(smol, probe, beta=conf).decide(question).retrieve       # tie
        assert CBDRGate(smol, probe, beta=above).decide(question).retrieve      # Conf < beta
        held = CBDRGate(smol, probe, beta=0.5).prefill(question, max_new_tokens=4).confidence
        for beta, retrieve in ((math.nextafter(held, 0.0), False), (held, True),
                               (math.nextafter(held, 1.0), True)):
            probed = CBDRGate(smol, probe, beta=beta).prefill(question, max_new_tokens=4)
            assert probed.confidence == held
            assert probed.decision.retrieve is retrieve, (question, beta, held)


def test_paper_prompts_are_the_papers() -> None:
    """Appendix table (QA and RAG prompts), the paragraphs joined by newlines."""
    from rag_gates.cbdr.prompts import ProbePrompts

    prompts = ProbePrompts(style="paper")
    assert prompts.qa("Q?") == ("You need to read the question carefully and answer it "
                                "based on your own knowledge.\nQuestion: Q?")
    rag = prompts.rag("Q?", [Passage(text="C.")])
    assert rag.startswith("You are a rigorous language model. Please answer the question "
                          "based on the provided context. If the context does not support "
                          "reasoning about the answer, please answer the question based on "
                          "your own knowledge.\nContexts:\n")
    assert rag.endswith("C.\nQuestion: Q?")
