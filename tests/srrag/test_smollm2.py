"""SR-RAG's routing pass on the embedded SmolLM2: one forward pass gives the key and p_M."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.integration


def test_routing_pass_on_the_embedded_model(smol: Any) -> None:
    from rag_gates.srrag.routing import RoutingPrompt, default_layer, route_features

    prompt = RoutingPrompt()
    assert default_layer(smol) == 15  # the middle of 30 layers, as the paper's 7B models
    q = "What is Henry Feilden's occupation?"
    f = route_features(smol, q, prompt, 15)
    assert f.one_pass and f.key.shape == (576,)
    ids = smol.encode(prompt.text(q))
    assert smol.tokenizer.decode(ids[: f.key_position + 1]).endswith("occupation?")
    direct = smol.hidden_states([prompt.text(q)], [15], position=f.key_position)[0, 0]
    assert (direct - f.key).abs().max().item() < 1e-4
    assert 0.0 < f.p_model < 1.0 and 0.0 < f.option_mass < 1.0
