"""The QA prompt's instruction is chosen by dataset name: only PubMedQA's differs, so a
misspelt "pubmedqa" is refused rather than silently given the short-answer instruction."""

from __future__ import annotations

import pytest

from rag_gates.confidence import AnswerLogprobGate
from rag_gates.prompts import qa_prompt
from rag_gates.types import Passage


def test_pubmedqa_asks_for_yes_no_or_maybe_and_other_names_take_the_default() -> None:
    assert qa_prompt("Is aspirin an NSAID?", dataset="pubmedqa").startswith(
        "Answer the question with yes, no or maybe.")
    for name in (None, "popqa", "hotpotqa", "testbed", "my-support-tickets"):
        assert qa_prompt("Who wrote Hamlet?", dataset=name).startswith(
            "Answer the question in a few words.")
    ctx = qa_prompt("Is aspirin an NSAID?", [Passage(id="1", text="Aspirin is an NSAID.")],
                    dataset="pubmedqa")
    assert ctx.startswith("Answer the question with yes, no or maybe, using the context.")


@pytest.mark.parametrize("name", ["PubMedQA", "pubmed_qa", "pubmed-qa", "PubMed", "pubmed"])
def test_a_misspelt_pubmedqa_is_refused_with_the_name_to_use(name: str) -> None:
    with pytest.raises(ValueError, match="did you mean 'pubmedqa'"):
        qa_prompt("Is aspirin an NSAID?", dataset=name)


def test_a_gate_with_a_misspelt_dataset_is_refused_when_made() -> None:
    from rag_gates.confidence import FirstTokenProbGate
    from rag_gates.testing import tiny_lm

    lm = tiny_lm(seed=0)
    for gate in (AnswerLogprobGate, FirstTokenProbGate):
        with pytest.raises(ValueError, match="did you mean 'pubmedqa'"):
            gate(lm, dataset="PubMedQA")
        assert gate(lm, dataset="pubmedqa").dataset == "pubmedqa"
