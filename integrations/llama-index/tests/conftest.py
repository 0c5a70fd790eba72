"""Fixtures for the LlamaIndex adapter: a tiny random-weight Llama (offline, sub-second)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.bridge.pydantic import Field
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent

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
    from rag_gates_lab.corpus import load_corpus_stats

    # The embedded model's tokenizer, resolved from the user's cache before HOME moves.
    tokenizer = CorpusTokenizer.resolve(None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAG_GATES_HOME", str(tmp_path_factory.mktemp("rag-gates-home")))
        stats = load_corpus_stats(path=SLICES, tokenizer=tokenizer)
    yield stats
    stats.close()


class Collector(BaseEventHandler):
    """Keeps every LlamaIndex instrumentation event it sees (the ``collector`` fixture)."""

    events: list[BaseEvent] = Field(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "Collector"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        self.events.append(event)

    def of(self, kind: type[BaseEvent]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


@pytest.fixture
def collector() -> Iterator[Collector]:
    root = get_dispatcher()
    handler = Collector()
    root.add_event_handler(handler)
    try:
        yield handler
    finally:
        root.event_handlers.remove(handler)
