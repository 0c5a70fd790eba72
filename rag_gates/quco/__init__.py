"""QuCo-RAG: retrieval gated by pre-training-corpus statistics (papers/quco-rag.txt).

* :class:`QuCoGate`: before generation, retrieve when the question's entities are rare;
* :class:`ClaimVerifier`: after generation, flag claims whose head and tail never co-occur;
* :class:`QuCoPipeline`: the dynamic generation loop that uses both.

Only text goes through the model, so any TextLM works, API models included (through the
LangChain and LlamaIndex adapters). Corpus counts come from any
:class:`~rag_gates.corpus.CorpusStats`.
"""

from __future__ import annotations

from rag_gates.quco._common import OnError
from rag_gates.quco.gate import QuCoGate
from rag_gates.quco.pipeline import QuCoConfig, QuCoPipeline, QuCoResult
from rag_gates.quco.verifier import ClaimCheck, ClaimVerifier, SentenceCheck, Verification

__all__ = [
    "ClaimCheck",
    "ClaimVerifier",
    "OnError",
    "QuCoConfig",
    "QuCoGate",
    "QuCoPipeline",
    "QuCoResult",
    "SentenceCheck",
    "Verification",
]
