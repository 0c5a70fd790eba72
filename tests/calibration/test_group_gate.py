"""A per-group spec through a framework's gated retriever: ``CertifiedGate.for_group(g)`` is
a gate like any other, so LangChain's GatedRetriever (which calls ``decide(query)``) serves
group g's certified threshold, and an unseen group retrieves."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever

from langchain_rag_gates import GatedRetriever
from tests.calibration.test_by_group import _served


class Fixed(BaseRetriever):
    def _get_relevant_documents(self, query: str, *,
                                run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return [Document(page_content=f"about {query}")]


def test_a_group_bound_gate_serves_its_groups_threshold_in_langchain() -> None:
    gate, spec, records = _served("cbdr")
    for certificate in spec.groups or []:
        bound = gate.for_group(certificate.group)
        assert bound.threshold == certificate.threshold
        retriever = GatedRetriever(retriever=Fixed(), gate=bound)
        members = [r for r in records if r.group == certificate.group][:40]
        for r in members:
            docs = retriever.invoke(r.question)
            direct = gate.decide(r.question, group=certificate.group)
            assert bool(docs) == direct.retrieve
            if docs:
                assert docs[0].metadata["rag_gates"]["evidence"]["spec"]["group"] == \
                    certificate.group
        assert any(not gate.decide(r.question, group=certificate.group).retrieve
                   for r in members)  # the check can fail: some questions skip


def test_an_unseen_group_always_retrieves_and_a_missing_group_is_refused() -> None:
    gate, _, records = _served("cbdr")
    unseen = gate.for_group("a relation never calibrated")
    retriever = GatedRetriever(retriever=Fixed(), gate=unseen)
    assert all(retriever.invoke(r.question) for r in records[:20])
    assert unseen.threshold < -1e300
    bad: Any = None
    with pytest.raises(ValueError, match="for_group needs a group"):
        gate.for_group(bad)
