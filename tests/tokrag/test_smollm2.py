"""Tok-RAG on the embedded SmolLM2: a question whose answer only the passage knows, so the
stream with the passage and the stream without it disagree."""

from __future__ import annotations

import math
from typing import Any

import pytest

from rag_gates.prompts import qa_prompt
from rag_gates.types import Passage

pytestmark = pytest.mark.integration

Q = "Who directed the 2019 film Grublings?"
PASSAGES = [Passage(title="Grublings", text="Grublings is a 2019 Norwegian comedy film "
                    "directed by Marta Kellerud.")]


def test_streams_disagree_and_each_choice_is_recorded(smol: Any) -> None:
    from rag_gates.tokrag import CADDecoder, TokRAGConfig, TokRAGDecoder

    single = smol.generate(qa_prompt(Q, PASSAGES), max_new_tokens=24)
    plain = smol.generate(qa_prompt(Q), max_new_tokens=24)
    assert single.text != plain.text  # the passage changes the answer
    g = TokRAGDecoder(smol).generate(Q, passages=PASSAGES, max_new_tokens=24)
    assert g.disagreements, "the two streams never disagreed"
    first_rag = smol.tokenizer(single.text, add_special_tokens=False)["input_ids"][0]
    assert g.choices[0].rag_token_id == first_rag  # stream 0 is exactly `single`'s prompt
    for c in g.disagreements:
        assert c.rag_token_id != c.llm_token_id
        assert c.score is not None and math.isfinite(c.score)
        assert c.layer is not None and 1 <= c.layer < smol.num_layers
        assert c.token_id == (c.rag_token_id if c.side == "rag" else c.llm_token_id)
    # CAD at alpha 0 is standard RAG, one code path apart.
    assert CADDecoder(smol, 0.0).generate(Q, passages=PASSAGES,
                                          max_new_tokens=24).text == single.text
    fixed = TokRAGDecoder(smol, TokRAGConfig(judge="paper", fusion_layer=12))
    assert {c.layer for c in fixed.generate(Q, passages=PASSAGES,
                                            max_new_tokens=8).disagreements} <= {12}
    streams = fixed.open(Q, PASSAGES, max_new_tokens=4)
    verdict = fixed.judge(streams)
    assert verdict.score_literal != verdict.score_renormalised
