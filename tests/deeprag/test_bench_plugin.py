"""The DeepRAG methods of ``rag-gates bench``: registered by entry point, options checked
before any model loads, each mode built and answering."""

from __future__ import annotations

import json
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from rag_gates.deeprag import DEMONSTRATION, DeepRAG
from rag_gates.methods import Method, MethodContext, check_method_name, split_method_name
from rag_gates_lab.plugins.deeprag import bench_prompt
from tests.deeprag.conftest import QUESTION, ScriptedLM, jaws_world


def registered() -> dict[str, Any]:
    """The DeepRAG entry points (loading every plugin would import the frameworks)."""
    return {ep.name: ep.load() for ep in entry_points(group="rag_gates.methods")
            if ep.name.startswith("deeprag")}


def make_method(name: str, ctx: MethodContext) -> Method:
    """As ``rag_gates.methods.make_method``, over the DeepRAG entry points only."""
    methods = registered()
    check_method_name(name, methods)
    base, option = split_method_name(name)
    method: Method = methods[base](ctx.model_copy(update={"option": option}))
    return method


class ScriptedWhiteBox(ScriptedLM):
    """Scripted text; everything white-box from the tiny model."""

    def __init__(self, tiny: Any) -> None:
        super().__init__(jaws_world)
        self._tiny = tiny

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tiny, name)


def test_methods_are_registered_and_options_checked() -> None:
    methods = registered()
    for name in ("deeprag", "deeprag-likelihood", "deeprag-always", "deeprag-never",
                 "deeprag-gate"):
        assert name in methods
    check_method_name("deeprag-likelihood@-1.5", methods)
    check_method_name("deeprag-gate@cascade(quco,cbdr,0.2,0.8)", methods)
    for bad, message in (("deeprag-likelihood@abc", "log-probability margin"),
                         ("deeprag-likelihood@nan", "finite"),
                         ("deeprag-gate", "needs a gate"),
                         ("deeprag@0.5", "the option is the marker rule"),
                         ("deeprag-gate@cascade(quco", "examples: quco&cbdr")):
        with pytest.raises(ValueError, match=message):
            check_method_name(bad, methods)


def test_each_mode_answers(bm25: Any, tiny_long: Any) -> None:
    lm = ScriptedWhiteBox(tiny_long)
    ctx = MethodContext(lm=lm, retriever=bm25, dataset="hotpotqa", k=2, max_new_tokens=16)
    expected = {"deeprag": [False, True], "deeprag-always": [True, True],
                "deeprag-never": [False, False], "deeprag-likelihood@-1000000": [True, True],
                "deeprag-gate@first-token-prob:1": [False, False]}
    for name, decisions in expected.items():
        method = make_method(name, ctx)
        assert isinstance(method, DeepRAG) and method.name == name
        assert method.config.k == 2 and method.config.max_steps == 6
        assert method.config.max_answer_tokens == 16
        result = method.answer(QUESTION)
        assert [d.retrieve for d in result.decisions] == decisions, name
        assert result.trace.retrievals == sum(decisions)
    gated = make_method("deeprag-gate@first-token-prob:1", ctx)
    assert gated.gate.name == "first-token-prob"
    other = make_method("deeprag", ctx.model_copy(update={"dataset": "2wiki"}))
    assert isinstance(other, DeepRAG) and other.config.max_steps == 10
    with pytest.raises(ValueError, match="retriever"):
        make_method("deeprag", ctx.model_copy(update={"retriever": None}))
    assert make_method("deeprag-never", ctx.model_copy(update={"retriever": None})
                       ).answer(QUESTION).answer == "Leah Adler"


def test_authors_marker_rule_is_a_method_option(bm25: Any) -> None:
    """``deeprag@authors``: the authors' reading of a step (a subquery with no marker is
    answered directly); ``deeprag@fail-closed`` is ``deeprag``; anything else is refused
    before a model loads."""
    from rag_gates_lab.names import check_methods

    check_methods(["deeprag@authors", "deeprag@fail-closed"])
    with pytest.raises(ValueError, match="the option is the marker rule"):
        check_methods(["deeprag@author"])
    no_marker = "Follow up: Who was the father of Steven Spielberg?\nHe was"

    def reply(question: str, so_far: str) -> str:
        return no_marker if so_far.count("Follow up:") == 1 and not so_far.endswith(
            ("Intermediate answer:", "So the final answer is:")) else jaws_world(question, so_far)

    ctx = MethodContext(lm=ScriptedLM(reply), retriever=bm25, dataset="hotpotqa", k=2,
                        max_new_tokens=16)
    authors = make_method("deeprag@authors", ctx)
    assert isinstance(authors, DeepRAG) and authors.name == "deeprag@authors"
    assert authors.config.marker_rule == "authors"
    assert [d.retrieve for d in authors.answer(QUESTION).decisions][:2] == [False, False]
    fail_closed = make_method("deeprag@fail-closed", ctx)
    assert isinstance(fail_closed, DeepRAG) and fail_closed.config.marker_rule == "fail_closed"
    assert [d.retrieve for d in fail_closed.answer(QUESTION).decisions][:2] == [False, True]


def test_prompt_of_a_trained_model_directory(tmp_path: Path) -> None:
    class Named:
        model_id = str(tmp_path)

    assert bench_prompt(Named()).demonstration == DEMONSTRATION  # untrained: one-shot
    (tmp_path / "deeprag.json").write_text(json.dumps({"prompt": {"style": "chat"}}))
    assert bench_prompt(Named()).demonstration is None
    (tmp_path / "deeprag.json").write_text(json.dumps({"prompt": {"styl": "chat"}}))
    with pytest.raises(ValueError, match=r"deeprag\.json"):
        bench_prompt(Named())
