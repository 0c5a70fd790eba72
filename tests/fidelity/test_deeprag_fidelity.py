"""DeepRAG as the paper and the authors' code write it (docs/fidelity.md, DeepRAG section).
String rules, compared exactly."""

from __future__ import annotations

from rag_gates.deeprag.trajectory import INSTRUCTION, _context_lines
from rag_gates.types import Passage

# Appendix A.1 (the authors' ICL-prompt/instruction.txt carries it after "Instruction: ").
PAPER_INSTRUCTION = (
    'You are a helpful Retrieve-Augmented Generation (RAG) model. Your task is to answer '
    'questions by logically decomposing them into clear sub-questions and iteratively '
    'addressing each one. Use "Follow up:" to introduce each sub-question and "Intermediate '
    'answer:" to provide answers. For each sub-question, decide whether you can provide a '
    'direct answer or if additional information is required. If additional information is '
    'needed, state, "Let\'s search the question in Wikipedia." and then use the retrieved '
    'information to respond comprehensively. If a direct answer is possible, provide it '
    'immediately without searching.')


def test_instruction_is_the_authors() -> None:
    assert INSTRUCTION == PAPER_INSTRUCTION


def test_context_block_format() -> None:
    """The authors' ``_try_retrieval_path``: "Context:" then "[i] doc" lines, 1-based."""
    docs = [Passage(title="Jaws", text="Jaws is a 1975 film."), Passage(text="Second.")]
    assert "\n".join(_context_lines(docs)) == "Context:\n[1] Jaws: Jaws is a 1975 film.\n" \
                                              "[2] Second."
