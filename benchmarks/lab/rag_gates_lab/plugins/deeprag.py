"""DeepRAG in ``rag-gates bench`` (entry points).

Methods (the agent loop of :class:`~rag_gates.deeprag.DeepRAG`, retrieving top-k with each
subquery; the final answer is the method's answer):

- ``deeprag``: the model's own text decides per subquery (``generate`` mode); a subquery
  followed by no decision marker retrieves (fail closed, the library default);
- ``deeprag@authors``: the same, read as the authors' inference loop reads it
  (``marker_rule="authors"``: only a follow-up ending in "Let" retrieves, anything else is
  answered directly; gxy-gxy/DeepRAG ``src/algorithms/sragsftv2.py:94``): the reproduction
  setting of the paper-comparison tables (``deeprag@fail-closed`` is ``deeprag``);
- ``deeprag-likelihood`` / ``deeprag-likelihood@T``: retrieve when ``log p(retrieve marker) -
  log p(direct marker) >= T`` (default 0);
- ``deeprag-always`` / ``deeprag-never``;
- ``deeprag-gate@GATE``: any registered gate decides per subquery (``NAME``,
  ``NAME:THRESHOLD`` or a composite expression, as ``selective@GATE``).

The step cap is 6 subqueries on HotpotQA and 10 elsewhere (the authors' settings). The
prompt: a model directory holding ``deeprag.json`` (``{"prompt": {...}}``, a
:class:`~rag_gates.deeprag.DeepRAGPrompt`, as a DeepRAG-trained model carries) is run with
that prompt; any other model gets the paper's instruction plus the one-shot
:data:`~rag_gates.deeprag.DEMONSTRATION` (an untrained small model rarely writes the markers
from the instruction alone).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rag_gates.deeprag import DEMONSTRATION, DeepRAG, DeepRAGConfig, DeepRAGPrompt
from rag_gates.deeprag.train import PROMPT_FILE
from rag_gates.gate import Gate
from rag_gates.methods import MethodContext, need_retriever
from rag_gates_lab.plugins.options import (
    METHOD_OPTIONS,
    parse_deeprag_rule,
    parse_threshold,
    validate_gate,
)

__all__ = ["PROMPT_FILE", "bench_prompt", "deeprag_always", "deeprag_gate", "deeprag_likelihood",
           "deeprag_method", "deeprag_never", "parse_deeprag_rule", "parse_threshold",
           "validate_gate"]


def bench_prompt(lm: Any) -> DeepRAGPrompt:
    """The prompt for ``lm``: its directory's ``deeprag.json``, else instruction + example."""
    source = Path(str(getattr(lm, "model_id", "")))
    file = source / PROMPT_FILE
    if file.is_file():
        try:
            return DeepRAGPrompt.model_validate(json.loads(file.read_text())["prompt"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{file}: not a DeepRAG prompt file ({exc}); it must hold "
                             '{"prompt": {"style": ..., "demonstration": ...}}') from exc
    return DeepRAGPrompt(demonstration=DEMONSTRATION)


def _agent(ctx: MethodContext, name: str, *, gate: Gate | None = None, **settings: Any
           ) -> DeepRAG:
    config = DeepRAGConfig(k=ctx.k, max_answer_tokens=ctx.max_new_tokens,
                           max_steps=6 if ctx.dataset == "hotpotqa" else 10,
                           prompt=bench_prompt(ctx.lm), **settings)
    retriever = None if config.mode == "never" else need_retriever(ctx, name)
    return DeepRAG(ctx.lm, retriever, config, gate=gate, name=name)


def deeprag_method(ctx: MethodContext) -> DeepRAG:
    """The model's own text decides per subquery (``@authors``: the authors' marker rule)."""
    name = "deeprag" if ctx.option is None else f"deeprag@{ctx.option}"
    return _agent(ctx, name, mode="generate", marker_rule=parse_deeprag_rule(ctx.option))


def deeprag_always(ctx: MethodContext) -> DeepRAG:
    """Retrieve for every subquery."""
    return _agent(ctx, "deeprag-always", mode="always")


def deeprag_never(ctx: MethodContext) -> DeepRAG:
    """Never retrieve: decomposition on the model's own knowledge."""
    return _agent(ctx, "deeprag-never", mode="never")


def deeprag_likelihood(ctx: MethodContext) -> DeepRAG:
    """Retrieve when the retrieve marker is likelier than the direct one by ``T``."""
    name = "deeprag-likelihood" if ctx.option is None else f"deeprag-likelihood@{ctx.option}"
    return _agent(ctx, name, mode="likelihood", threshold=parse_threshold(ctx.option))


def deeprag_gate(ctx: MethodContext) -> DeepRAG:
    """A rag-gates gate decides per subquery (asked with the subquery)."""
    from rag_gates.registry import make_gate

    validate_gate(ctx.option)
    assert ctx.option is not None
    return _agent(ctx, f"deeprag-gate@{ctx.option}", gate=make_gate(ctx.option, ctx),
                  mode="gate")


deeprag_method.accepts_option = True  # type: ignore[attr-defined]
deeprag_method.validate_option = METHOD_OPTIONS["deeprag"]  # type: ignore[attr-defined]
deeprag_likelihood.accepts_option = True  # type: ignore[attr-defined]
deeprag_likelihood.validate_option = METHOD_OPTIONS["deeprag-likelihood"]  # type: ignore[attr-defined]
deeprag_gate.accepts_option = True  # type: ignore[attr-defined]
deeprag_gate.validate_option = METHOD_OPTIONS["deeprag-gate"]  # type: ignore[attr-defined]
