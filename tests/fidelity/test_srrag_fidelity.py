"""SR-RAG as the paper computes it (docs/fidelity.md, SR-RAG section; no public code).

Routing references are re-derived on real SmolLM2 tensors from one plain transformers
forward pass of the routing prompt (``output_hidden_states``): the key = the hidden state of
the question's last token (located through the tokenizer's character offsets) at layer
``L // 2``; ``p_M`` = the probability of the retrieval word's first tokens over both words'.
Tolerances: 1e-4 absolute on the key (cosine > 0.9999) and on ``p_M``. The rest is
arithmetic, exact.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from rag_gates.srrag.labels import ContextScore, LabelConfig, preferred_source
from rag_gates.srrag.policy import PolicyVote
from rag_gates.srrag.verbalizer import GENREAD_PROMPT, VerbalizerConfig

Q = "Who directed the film Ed Wood?"


def test_genread_prompt_is_the_papers() -> None:
    """Fig. 5, verbatim; 150-token cap; n = 5 contexts per source (section 3.3)."""
    paper = ("Generate a background document from Wikipedia to help answer the following "
             "question. Directly start with document content and do not generate URL.\n"
             "Question: {question}\nBackground document:")
    assert paper == GENREAD_PROMPT
    assert VerbalizerConfig().max_new_tokens == 150
    assert (LabelConfig().n_retrieved, LabelConfig().n_verbalized) == (5, 5)


def _ctx(source: str, likelihood: float) -> ContextScore:
    return ContextScore(source=source, text="t", answer="a", mean_logprob=math.log(likelihood),
                        tokens=1)  # type: ignore[arg-type]


def test_label_rule() -> None:
    """Algorithm 1: s = argmax over sources of the summed likelihoods. Retrieved 0.5 + 0.1
    + 0.1 = 0.7 against verbalized 0.3 x 3 = 0.9: parametric, although the single most
    helpful context is retrieved (the top-n majority rule, n = 3, says retrieval only if
    two of the three best are retrieved: here 0.5 R, 0.3 P, 0.3 P -> parametric too)."""
    contexts = [_ctx("retrieval", 0.5), _ctx("retrieval", 0.1), _ctx("retrieval", 0.1),
                _ctx("parametric", 0.3), _ctx("parametric", 0.3), _ctx("parametric", 0.3)]
    assert preferred_source(contexts, "sum") == "parametric"
    assert preferred_source(contexts, "top-n") == "parametric"
    contexts[1] = _ctx("retrieval", 0.45)  # 1.05 > 0.9
    assert preferred_source(contexts, "sum") == "retrieval"


def test_p_datastore_is_votes_over_k() -> None:
    """Section 3.4: p_D(<Wiki>) = votes / k, k = 30."""
    from rag_gates.srrag.policy import DEFAULT_K

    assert DEFAULT_K == 30
    assert PolicyVote(k=30, found=30, retrieval=12, parametric=18).p_retrieve == 12 / 30


@pytest.fixture(scope="module")
def routed(smol: Any) -> dict[str, Any]:
    from rag_gates.srrag.routing import RoutingPrompt, default_layer, route_features

    prompt = RoutingPrompt()
    layer = smol.num_layers // 2
    assert default_layer(smol) == layer
    features = route_features(smol, Q, prompt, layer)
    text = prompt.text(Q)
    rendered = smol.render(text)
    end = rendered.rindex(Q.strip()) + len(Q.strip())  # the question ends the user message
    enc = smol.tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=True)
    assert list(enc["input_ids"]) == smol.encode(text)
    position = max(i for i, (s, e) in enumerate(enc["offset_mapping"]) if s < end)
    with torch.inference_mode():
        out = smol.model(torch.tensor([smol.encode(text)]), output_hidden_states=True)
    probs = torch.softmax(out.logits[0, -1].float(), -1)

    def first_ids(word: str) -> set[int]:
        return {smol.tokenizer(v, add_special_tokens=False)["input_ids"][0]
                for v in (word, f" {word}", word.lower(), f" {word.lower()}")}

    search, memory = first_ids("Search"), first_ids("Memory")
    p_search = float(probs[sorted(search - memory)].sum())
    p_memory = float(probs[sorted(memory - search)].sum())
    return {"features": features, "position": position, "prompt": prompt, "layer": layer,
            "key": out.hidden_states[layer][0, position].float(),
            "p_model": p_search / (p_search + p_memory)}


@pytest.mark.integration
def test_key_is_the_last_question_token(routed: dict[str, Any]) -> None:
    f = routed["features"]
    assert f.key_position == routed["position"]
    assert torch.allclose(f.key, routed["key"], atol=1e-4)


@pytest.mark.integration
def test_p_model_is_the_routing_share(routed: dict[str, Any]) -> None:
    assert abs(routed["features"].p_model - routed["p_model"]) < 1e-4


@pytest.mark.integration
def test_gate_rule(smol: Any, routed: dict[str, Any]) -> None:
    """Retrieve iff the score reaches tau (ties retrieve); tau 0.1 by default (Llama-2)."""
    from rag_gates.srrag.gate import DEFAULT_TAU, SelfRoutingGate

    assert DEFAULT_TAU == 0.1
    p = routed["p_model"]
    at = SelfRoutingGate(smol, None, tau=max(0.0, p - 1e-3), mode="model",
                         layer=routed["layer"])
    above = SelfRoutingGate(smol, None, tau=min(1.0, p + 1e-3), mode="model",
                            layer=routed["layer"])
    assert at.decide(Q).retrieve and not above.decide(Q).retrieve
