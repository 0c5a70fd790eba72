"""QuCo-RAG in ``rag-gates bench`` and ``rag-gates eval-gate`` (entry points).

Methods: ``quco`` (the full loop), ``quco-no-precheck`` and ``quco-no-runtime`` (the paper's
ablations), each also as ``NAME@TAU_ENTITY`` (``quco@20``: retrieve when an entity is seen at
most 20 times), for a corpus whose counts differ from the default index's, such as a
testbed's: calibrate with ``eval-gate --gate quco`` on calibration rows, then
``tau_entity = 1 / threshold - 1`` (:meth:`QuCoGate.tau_from_threshold`). Gate: ``quco`` (the
pre-generation gate alone, for ``eval-gate``).

Counts come from the local infini-gram index over the Wikipedia paragraphs of HotpotQA and
2WikiMultihopQA (:func:`rag_gates.eval.corpus.load_corpus_stats`, built on first use and
cached), whatever the dataset under test: that index plays the role of the paper's
pre-training corpus. ``tau_entity`` is :data:`BENCH_TAU_ENTITY`, calibrated for that index
with ``rag-gates eval-gate --gate quco --dataset popqa --n 500`` (best accuracy; PopQA is held
apart from the HotpotQA and 2Wiki questions the end-to-end benchmark runs): the calibrated
rarity threshold 0.01205 is ``tau_entity = 1 / 0.01205 - 1 = 82``.
"""

from __future__ import annotations

from typing import Any

from rag_gates.eval.methods import MethodContext, need_retriever
from rag_gates.eval.plugins.options import BENCH_TAU_ENTITY, METHOD_OPTIONS, parse_tau_entity
from rag_gates.quco.gate import QuCoGate
from rag_gates.quco.pipeline import QuCoPipeline

__all__ = ["BENCH_TAU_ENTITY", "parse_tau_entity", "quco_gate", "quco_method",
           "quco_no_precheck", "quco_no_runtime"]



def _stats(ctx: MethodContext) -> Any:
    from rag_gates.eval.corpus import load_corpus_stats
    from rag_gates.eval.testbed.dataset import is_testbed, testbed_dir

    if ctx.dataset and is_testbed(ctx.dataset):  # count in what the testbed model saw
        return load_corpus_stats(testbed=testbed_dir(ctx.dataset))
    return load_corpus_stats()


def _pipeline(ctx: MethodContext, base: str, **overrides: Any) -> QuCoPipeline:
    name = base if ctx.option is None else f"{base}@{ctx.option}"
    pipeline = QuCoPipeline(
        ctx.lm, need_retriever(ctx, name), _stats(ctx),
        tau_entity=parse_tau_entity(ctx.option, base), k=ctx.k,
        chunk_tokens=ctx.max_new_tokens, max_new_tokens=ctx.max_new_tokens,
        dataset=ctx.dataset, **overrides)
    pipeline.name = name
    return pipeline


def quco_method(ctx: MethodContext) -> QuCoPipeline:
    """The full QuCo-RAG loop: pre-check and runtime claim verification."""
    return _pipeline(ctx, "quco")


def quco_no_precheck(ctx: MethodContext) -> QuCoPipeline:
    """Ablation: runtime verification only."""
    return _pipeline(ctx, "quco-no-precheck", pre_check=False)


def quco_no_runtime(ctx: MethodContext) -> QuCoPipeline:
    """Ablation: the pre-generation gate only (then one generation)."""
    return _pipeline(ctx, "quco-no-runtime", runtime_check=False)


for _name, _factory in (("quco", quco_method), ("quco-no-precheck", quco_no_precheck),
                       ("quco-no-runtime", quco_no_runtime)):
    _factory.accepts_option = True  # type: ignore[attr-defined]
    # Checked before any model is loaded, and before this module is imported (options.py).
    _factory.validate_option = METHOD_OPTIONS[_name]  # type: ignore[attr-defined]


def quco_gate(ctx: MethodContext, threshold: float | None = None) -> QuCoGate:
    """The pre-generation gate at a rarity ``threshold`` (``1 / (1 + tau_entity)``); None
    means :data:`BENCH_TAU_ENTITY`."""
    if threshold is None:
        return QuCoGate(_stats(ctx), tau_entity=BENCH_TAU_ENTITY)
    return QuCoGate.from_threshold(_stats(ctx), threshold)


quco_gate.threshold_range = QuCoGate.threshold_range  # type: ignore[attr-defined]
# Entities from the question text and counts in the corpus: eval-gate loads no model for it
# (rag_gates.eval.gates.gate_needs_lm) unless the labels still need answers.
quco_gate.needs_lm = False  # type: ignore[attr-defined]
