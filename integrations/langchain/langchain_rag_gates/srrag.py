"""``SelfRoutingRetriever``: SR-RAG's routing as a LangChain retriever.

Per query, a gate (SR-RAG's :class:`~rag_gates.srrag.SelfRoutingGate`: ``p_M * p_D >= tau``)
routes either to the wrapped retriever or to the model's own knowledge: then the model writes
a background document (GenRead) and that one document comes back, marked
``metadata["source"] = "parametric"``. Any chain that formats retrieved documents into a
prompt gains SR-RAG's routing with one swap of its retriever.
"""

from __future__ import annotations

from typing import Any

from langchain_core.documents import Document
from pydantic import Field, JsonValue, model_validator

from langchain_rag_gates.documents import annotate_document, passage_to_document
from langchain_rag_gates.retrievers import GatedRetriever
from rag_gates.srrag.verbalizer import retrieve_instead, says_nothing, verbalizer_for
from rag_gates.types import GateDecision, Passage

__all__ = ["SelfRoutingRetriever"]


class SelfRoutingRetriever(GatedRetriever):
    """Retrieved documents, or one document of the model's own verbalized knowledge.

    For each query the gate decides (``gate.decide``; ``gate.adecide`` on the async path):

    - retrieval: the wrapped retriever's documents, as annotated copies (as
      :class:`GatedRetriever`);
    - no retrieval: the verbalizer writes the model's background document for the query and
      it comes back as one ``Document`` with ``metadata["source"] = "parametric"``,
      ``metadata["hit_token_cap"]`` (the verbalization stopped at its token cap) and the
      decision under ``metadata["rag_gates"]``; an empty verbalization is nothing to answer
      from, so the wrapped retriever's documents come back instead, under the overturned
      decision (``retrieve`` true, ``evidence["verbalization"] == "empty"``), which is
      reported as a second decision event.

    Every decision (with ``p_M``, ``p_D`` and the neighbours that voted in its evidence) is
    reported to the callback handlers as the custom event ``"rag_gates_decision"`` and kept
    in :attr:`last_decision`. The caller's documents are never modified.

    Setup:
        ```bash
        pip install -c constraints.txt -e ".[hf,qdrant]" -e integrations/langchain
        rag-gates srrag label --dataset popqa --out labels.jsonl
        rag-gates srrag build-policy --labels labels.jsonl
        ```

    Key init args:
        retriever: BaseRetriever
            The retriever to route to (a vector store's ``as_retriever()``, BM25, ...).
        gate: rag_gates.gate.Gate
            Usually a ``SelfRoutingGate``; any rag-gates gate routes the same way.
        verbalizer: rag_gates.srrag.Verbalizer | None
            Writes the parametric document; default a ``Verbalizer`` on ``gate.lm``.
        k: int | None
            Documents from the wrapped retriever (the parametric path returns one).

    Instantiate:
        ```python
        from langchain_rag_gates import SelfRoutingRetriever
        from rag_gates.lm import load_lm
        from rag_gates.srrag import HiddenStateKeys, SelfRoutingGate, SourcePolicy

        lm = load_lm("default")
        # read-only (the default): a private copy, so every worker process opens the folder
        policy = SourcePolicy.open_existing(lm, path="~/.cache/rag-gates/srrag/policy")
        retriever = SelfRoutingRetriever(retriever=store.as_retriever(),
                                         gate=SelfRoutingGate(lm, policy, tau=0.1), k=3)
        ```

    Invoke:
        ```python
        docs = retriever.invoke("Who wrote Hamlet?")
        docs[0].metadata["source"]             # 'parametric' when routed to the model
        retriever.last_decision.evidence["p_datastore"]
        ```

    Async:
        ```python
        docs = await retriever.ainvoke("Who wrote Hamlet?")
        ```

    Use within a chain:
        ```python
        chain = ({"context": retriever | format_docs, "question": RunnablePassthrough()}
                 | prompt | llm | StrOutputParser())
        ```
    """

    verbalizer: Any = Field(
        None, exclude=True,
        description="A rag_gates.srrag.Verbalizer; default one on the gate's model.")

    @model_validator(mode="after")
    def _default_verbalizer(self) -> SelfRoutingRetriever:
        self.verbalizer = verbalizer_for(self.gate, self.verbalizer)
        return self

    def _verbalized(self, passage: Passage, decision: GateDecision,
                    data: dict[str, JsonValue]) -> list[Document] | GateDecision:
        # An empty verbalization is nothing to answer from: retrieve instead (fail closed).
        if says_nothing(passage):
            return retrieve_instead(decision)
        return [annotate_document(passage_to_document(passage), data)]

    def _skipped(self, query: str, decision: GateDecision, data: dict[str, JsonValue]
                 ) -> list[Document] | GateDecision:
        return self._verbalized(self.verbalizer.verbalize(query), decision, data)

    async def _askipped(self, query: str, decision: GateDecision, data: dict[str, JsonValue]
                        ) -> list[Document] | GateDecision:
        return self._verbalized(await self.verbalizer.averbalize(query), decision, data)
