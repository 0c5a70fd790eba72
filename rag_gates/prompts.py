"""Prompts shared by the demo, the baselines and the benchmarks."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from rag_gates.types import Passage

__all__ = ["check_prompt_dataset", "continue_prompt", "format_passages", "qa_prompt"]

_INSTRUCTION = {
    None: "Answer the question in a few words.",
    "pubmedqa": "Answer the question with yes, no or maybe.",
}


def format_passages(passages: Sequence[Passage]) -> str:
    """One passage per line: ``- Title: text``."""
    return "\n".join(f"- {p.title}: {p.text}" if p.title else f"- {p.text}" for p in passages)


def qa_prompt(question: str, passages: Sequence[Passage] | None = None,
              dataset: str | None = None, *, block: str | None = None) -> str:
    """A short-answer prompt, with the passages as context when given (``block``: the
    passages already rendered, in place of :func:`format_passages`)."""
    check_prompt_dataset(dataset)
    instruction = _INSTRUCTION.get(dataset, _INSTRUCTION[None])
    if not passages:
        return f"{instruction}\nQuestion: {question}"
    return (f"{instruction.rstrip('.')}, using the context.\nContext:\n"
            f"{format_passages(passages) if block is None else block}\nQuestion: {question}")


@lru_cache(maxsize=256)  # called for every prompt; the names in use are few
def check_prompt_dataset(dataset: str | None) -> None:
    """Refuse a misspelt "pubmedqa" ("PubMedQA", "pubmed_qa"): every other dataset takes the
    default instruction, so a typo would silently ask for "a few words" instead of
    yes/no/maybe. Any other name (or None) passes."""
    if dataset is None or dataset in _INSTRUCTION:
        return
    for name in _INSTRUCTION:
        if name is not None and re.sub(r"[^a-z]", "", dataset.lower()) in (name, name[:-2]):
            raise ValueError(f"dataset {dataset!r}: did you mean {name!r}? (the name selects "
                             "the answer instruction; any other name takes the default)")


def continue_prompt(question: str, passages: Sequence[Passage] | None, so_far: str,
                    dataset: str | None = None) -> str:
    """The QA prompt plus the answer written so far, asking for its next sentence only.

    Used by the methods that write an answer sentence by sentence (FS-RAG, QuCo-RAG).
    """
    base = qa_prompt(question, passages, dataset=dataset)
    if not so_far:
        return base
    return (f"{base}\nAnswer so far: {so_far}\n"
            "Continue the answer with its next sentence only; reply with nothing if the "
            "answer is complete.")
