"""Fixtures: a tiny random-weight Llama (sub-second, offline, deterministic), in memory and on
disk, and a ChatRagGates over it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from langchain_rag_gates import ChatRagGates

SLICES = Path(__file__).resolve().parents[3] / "examples" / "data"
"""The shipped HotpotQA / 2Wiki / PopQA slices."""


@pytest.fixture(scope="session")
def tiny() -> Any:
    from rag_gates.testing import tiny_lm

    return tiny_lm(seed=0)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rag_gates.testing import save_tiny_lm

    return save_tiny_lm(tmp_path_factory.mktemp("tiny-llama"), seed=0)


@pytest.fixture
def chat(tiny: Any) -> ChatRagGates:
    return ChatRagGates(lm=tiny, max_tokens=12)


@pytest.fixture(scope="session")
def corpus_stats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The real dataset corpus-statistics index, built from examples/data in a private
    RAG_GATES_HOME (about 2-7 s, one cpu)."""
    pytest.importorskip("infini_gram",
                        reason='needs the corpus extra: pip install "rag-gates[corpus]"')
    from rag_gates.corpus.tokenizer import CorpusTokenizer
    from rag_gates_lab.corpus import load_corpus_stats

    # The embedded model's tokenizer, resolved from the user's cache before HOME moves.
    tokenizer = CorpusTokenizer.resolve(None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAG_GATES_HOME", str(tmp_path_factory.mktemp("rag-gates-home")))
        stats = load_corpus_stats(path=SLICES, tokenizer=tokenizer)
    yield stats
    stats.close()
