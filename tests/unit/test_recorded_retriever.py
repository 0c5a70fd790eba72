"""RecordedRetriever records every retrieval; its async form awaits the wrapped retriever's
own ``aretrieve`` (before, it ran the blocking search on the event loop)."""

from __future__ import annotations

import asyncio
import threading

from rag_gates.retrieval.bm25 import BM25Retriever
from rag_gates.retrieval.recorded import RecordedRetriever
from rag_gates.types import Passage, TraceRecorder

PASSAGES = [Passage(id="hamlet", title="Hamlet", text="Hamlet is a tragedy by Shakespeare."),
            Passage(id="paris", title="Paris", text="Paris is the capital of France.")]


class ThreadNotingBM25(BM25Retriever):
    """BM25 that notes the thread each search runs in."""

    threads: list[threading.Thread]

    def retrieve(self, query: str, k: int = 3) -> list[Passage]:
        self.threads.append(threading.current_thread())
        return super().retrieve(query, k)


def test_both_forms_record_and_the_async_one_searches_off_the_loop() -> None:
    bm25 = ThreadNotingBM25.from_passages(PASSAGES)
    bm25.threads = []
    rec = TraceRecorder()
    recorded = RecordedRetriever(bm25, rec)
    sync = recorded.retrieve("Who wrote Hamlet?", k=1)
    asynchronous = asyncio.run(recorded.aretrieve("Who wrote Hamlet?", k=1))
    assert [p.id for p in sync] == [p.id for p in asynchronous] == ["hamlet"]
    assert bm25.threads[0] is threading.current_thread()
    assert bm25.threads[1] is not threading.current_thread()
    events = [e for e in rec.trace().events if e.kind == "retrieval"]
    assert [(e.data["query"], e.data["ids"]) for e in events] == \
        [("Who wrote Hamlet?", ["hamlet"])] * 2
    assert rec.trace().retrievals == 2
