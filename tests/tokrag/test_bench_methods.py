"""tokrag / tokrag@LAYER / cad@ALPHA / adacad in the bench registry (tiny model, BM25)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("bm25s")

from rag_gates.methods import (
    MethodContext,
    available_methods,
    check_method_name,
    make_method,
)
from rag_gates.prompts import qa_prompt
from rag_gates.retrieval.bm25 import BM25Retriever
from rag_gates.types import Passage

CORPUS = [Passage(id="p1", title="France", text="The capital of France is Paris."),
          Passage(id="p2", text="William Shakespeare wrote Hamlet in London."),
          Passage(id="p3", text="The quick brown fox jumps over the lazy dog.")]


@pytest.mark.parametrize("name", ["tokrag@0", "tokrag@x", "tokrag@1.5", "cad@-1", "cad@abc",
                                  "cad@nan", "adacad@1"])
def test_bad_options_are_refused_before_any_model(name: str) -> None:
    with pytest.raises(ValueError, match=name.split("@")[0]):
        check_method_name(name, available_methods())


def test_good_options_pass() -> None:
    for name in ("tokrag", "tokrag@12", "cad", "cad@0", "cad@1.0", "adacad"):
        check_method_name(name, available_methods())


def test_methods_answer_with_a_trace(tiny: Any) -> None:
    ctx = MethodContext(lm=tiny, retriever=BM25Retriever.from_passages(CORPUS), k=2,
                        max_new_tokens=6)
    q = "What is the capital of France?"
    single = make_method("single", ctx).answer(q)
    cad0 = make_method("cad@0", ctx).answer(q)
    # One code path apart: CAD at alpha 0 is standard RAG on the same passages and prompt.
    assert cad0.answer == single.answer and cad0.passages == single.passages
    assert tiny.generate(qa_prompt(q, single.passages), max_new_tokens=6).text == single.answer
    for name in ("tokrag", "tokrag@2", "adacad"):
        result = make_method(name, ctx).answer(q)
        assert result.trace.retrievals == 1 and result.trace.llm_calls == 1
        call = next(e for e in result.trace.events if e.kind == "llm_call")
        assert call.tokens == 6 or call.data["finish_reason"] != "length"
    with pytest.raises(ValueError, match="fusion_layer=9"):
        make_method("tokrag@9", ctx)
