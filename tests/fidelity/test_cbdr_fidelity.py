"""CBDR as the paper computes it (docs/fidelity.md, CBDR section; no public code).

References are re-derived from the paper (Eq. 2, Eq. 5, section 3.4) on real tensors of the
embedded SmolLM2 with the shipped probe: one plain transformers forward pass per prompt
(``output_hidden_states``), the hidden state at index ``Layer / 2`` (embeddings at 0) at the
last prompt position, the probe's MLP, ``softmax(z)[1]``. Tolerance: 1e-4 absolute on
confidences (batched, padded passes in ours against unpadded single ones here).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rag_gates.types import Passage

pytestmark = pytest.mark.integration

Q = "Who directed the film Ed Wood?"
PASSAGE = Passage(title="Ed Wood (film)", text="Ed Wood is a 1994 American biographical "
                  "comedy-drama film directed and produced by Tim Burton.")
TOL = 1e-4


@pytest.fixture(scope="module")
def probe(smol: Any) -> Any:
    from rag_gates.cbdr.shipped import load_default_probe

    return load_default_probe(smol)


def _conf(smol: Any, probe: Any, prompt: str) -> float:
    """Eq. 2 on the Mid_Layer state before the first answer token."""
    layer = (smol.num_layers + 1) // 2  # len(hidden_states) // 2, embeddings at index 0
    assert probe.layer == layer
    with torch.inference_mode():
        out = smol.model(torch.tensor([smol.encode(prompt)]), output_hidden_states=True)
        h = out.hidden_states[layer][0, -1].float()
        z = probe.module((h - probe.mean) / probe.std)
        return float(torch.softmax(z, dim=-1)[1])


def test_confidence_reads_the_middle_layer(smol: Any, probe: Any) -> None:
    ours = probe.confidence(smol, [Q])[0]
    assert abs(ours - _conf(smol, probe, probe.prompts.qa(Q))) < TOL


def test_confidence_gain_is_the_difference(smol: Any, probe: Any) -> None:
    """Eq. 5: Inc(Q, C) = Conf(H_{Q+C}) - Conf(H_Q), the RAG prompt against the QA one."""
    from rag_gates.cbdr import ConfidenceGainReranker

    scores = ConfidenceGainReranker(smol, probe).score_passages(Q, [PASSAGE]).scores
    reference = (_conf(smol, probe, probe.prompts.rag(Q, [PASSAGE]))
                 - _conf(smol, probe, probe.prompts.qa(Q)))
    assert abs(scores[0] - reference) < 2 * TOL


def test_gate_skips_above_beta(smol: Any, probe: Any) -> None:
    """Section 3.4: skip retrieval iff Conf > beta, retrieve otherwise."""
    from rag_gates.cbdr import CBDRGate

    conf = _conf(smol, probe, probe.prompts.qa(Q))
    assert not CBDRGate(smol, probe, beta=max(0.0, conf - 1e-3)).decide(Q).retrieve
    assert CBDRGate(smol, probe, beta=min(1.0, conf + 1e-3)).decide(Q).retrieve


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
