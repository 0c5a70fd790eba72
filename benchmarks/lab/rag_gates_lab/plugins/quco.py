"""QuCo-RAG in ``rag-gates bench`` and ``rag-gates eval-gate`` (entry points).

Methods: ``quco`` (the full loop), ``quco-no-precheck`` and ``quco-no-runtime`` (the paper's
ablations), each also as ``NAME@TAU_ENTITY`` (``quco@20``: retrieve when an entity is seen at
most 20 times), for a corpus whose counts differ from the default index's, such as a
testbed's: calibrate with ``eval-gate --gate quco`` on calibration rows, then
``tau_entity = 1 / threshold - 1`` (:meth:`QuCoGate.tau_from_threshold`). Gate: ``quco`` (the
pre-generation gate alone, for ``eval-gate``).

Counts come from the local infini-gram index over the Wikipedia paragraphs of HotpotQA and
2WikiMultihopQA (:func:`rag_gates_lab.corpus.load_corpus_stats`, built on first use and
cached), whatever the dataset under test: that index plays the role of the paper's
pre-training corpus. ``tau_entity`` is :data:`BENCH_TAU_ENTITY`, calibrated for that index
with ``rag-gates eval-gate --gate quco --dataset popqa --n 500`` (best accuracy; PopQA is held
apart from the HotpotQA and 2Wiki questions the end-to-end benchmark runs): the calibrated
rarity threshold 0.01205 is ``tau_entity = 1 / 0.01205 - 1 = 82``.
"""

from __future__ import annotations

from typing import Any

from rag_gates.methods import MethodContext, need_retriever
from rag_gates.quco.pipeline import QuCoPipeline
from rag_gates_lab.plugins.options import BENCH_TAU_ENTITY, METHOD_OPTIONS, parse_tau_entity

__all__ = ["BENCH_TAU_ENTITY", "bench_corpus_stats", "bench_gate_settings", "parse_tau_entity",
           "quco_method",
           "quco_no_precheck", "quco_no_runtime"]



def bench_corpus_stats(dataset: str | None) -> Any:
    """The corpus statistics QuCo counts in on the benchmark: the datasets' paragraphs, or a
    testbed's training corpus for ``testbed:DIR``."""
    from rag_gates_lab.corpus import load_corpus_stats
    from rag_gates_lab.testbed.dataset import is_testbed, testbed_dir

    if dataset and is_testbed(dataset):  # count in what the testbed model saw
        return load_corpus_stats(testbed=testbed_dir(dataset))
    return load_corpus_stats()


def bench_gate_settings(dataset: str | None) -> dict[str, Any]:
    """What the benchmark's contexts add for the core ``quco`` gate (its corpus, opened when
    the gate is built, and the benchmark's ``tau_entity``): ``MethodContext(**these, ...)``."""
    return {"corpus_provider": lambda: bench_corpus_stats(dataset),
            "options": {"tau_entity": BENCH_TAU_ENTITY}}


def _stats(ctx: MethodContext) -> Any:
    return ctx.need_corpus("quco") if ctx.corpus is not None or ctx.corpus_provider \
        else bench_corpus_stats(ctx.dataset)


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
