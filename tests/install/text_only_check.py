"""A text-only application's environment (``make test-install``): the bare core and both
framework integrations, no ``hf`` extra. torch is not installed, both integrations import,
and a gate of the application's own gates a LangChain and a LlamaIndex retriever, failing
closed on a score that is no number.

Run by tests/install/test_install.sh in a fresh venv made from the integrations' READMEs'
text-only install line; prints one line per check."""

from __future__ import annotations

import importlib.util
import math
import sys
from typing import Any


class _Gates:
    """The application's own gate (defined once the core is importable)."""

    @staticmethod
    def make() -> Any:
        from rag_gates.gate import BaseGate

        class LongQuestionGate(BaseGate):
            """Retrieve for questions of at least 6 words; NaN for the word "broken"."""

            name = "long-question"

            def score(self, query: str, **signals: Any) -> tuple[float, dict[str, Any]]:
                if "broken" in query:
                    return math.nan, {}
                words = len(query.split())
                return float(words), {"words": words}

        return LongQuestionGate(threshold=6)


def check_langchain() -> None:
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever

    import langchain_rag_gates

    class Shelf(BaseRetriever):
        def _get_relevant_documents(self, query: str, *, run_manager: Any) -> list[Document]:
            return [Document(page_content="Paris is the capital of France.")]

    lc = langchain_rag_gates.GatedRetriever(retriever=Shelf(), gate=_Gates.make())
    assert lc.invoke("Capital of France?") == []
    docs = lc.invoke("What is the capital city of France today?")
    assert len(docs) == 1 and docs[0].metadata["rag_gates"]["retrieve"] is True
    assert len(lc.invoke("broken?")) == 1  # fail closed: retrieves
    print("LangChain GatedRetriever: skips, retrieves, fails closed")


def check_llama_index() -> None:
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from llama_index.retrievers.rag_gates import GatedRetriever

    class Shelf(BaseRetriever):
        def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
            return [NodeWithScore(node=TextNode(text="Paris is the capital of France."),
                                  score=1.0)]

    li = GatedRetriever(Shelf(), gate=_Gates.make())
    assert li.retrieve("Capital of France?") == []
    assert len(li.retrieve("What is the capital city of France today?")) == 1
    assert len(li.retrieve("broken?")) == 1
    print("LlamaIndex GatedRetriever: skips, retrieves, fails closed")


def main(frameworks: list[str]) -> int:
    """Check the frameworks named (``langchain``, ``llama-index``) in this environment."""
    for heavy in ("torch", "transformers", "sentence_transformers"):
        assert importlib.util.find_spec(heavy) is None, f"{heavy} is installed"
    print("no torch, transformers or sentence-transformers installed")
    checks = {"langchain": check_langchain, "llama-index": check_llama_index}
    for name in frameworks:
        checks[name]()
    assert "torch" not in sys.modules
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:] or ["langchain", "llama-index"]))
