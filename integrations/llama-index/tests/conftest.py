"""Fixtures for the LlamaIndex adapter: a tiny random-weight Llama (offline, sub-second)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SLICES = Path(__file__).resolve().parents[3] / "examples" / "data"
"""The shipped HotpotQA / 2Wiki / PopQA slices."""


@pytest.fixture(scope="session")
def tiny_li() -> Any:
    """One shared HFWhiteBoxLM; tests only read from it."""
    from rag_gates.testing import tiny_lm

    return tiny_lm(seed=0)


@pytest.fixture(scope="session")
def corpus_stats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The real dataset corpus-statistics index, built from examples/data in a private
    RAG_GATES_HOME (about 2-7 s, one cpu)."""
    pytest.importorskip("infini_gram",
                        reason='needs the corpus extra: pip install "rag-gates[corpus]"')
    from rag_gates.corpus.tokenizer import CorpusTokenizer
    from rag_gates.eval.corpus import load_corpus_stats

    # The embedded model's tokenizer, resolved from the user's cache before HOME moves.
    tokenizer = CorpusTokenizer.resolve(None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAG_GATES_HOME", str(tmp_path_factory.mktemp("rag-gates-home")))
        stats = load_corpus_stats(path=SLICES, tokenizer=tokenizer)
    yield stats
    stats.close()
