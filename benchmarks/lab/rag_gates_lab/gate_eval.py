"""Gate quality on real questions: does the gate's score find the questions the model gets
wrong without retrieval, and what accuracy does each threshold buy at what retrieval rate?

Labels come from cached runs of the same model on the same questions: ``no-rag`` (closed
book; label 1 = wrong) and ``single`` (top-k retrieval). A gate at threshold t answers a
question with retrieval when its score >= t, so its accuracy at t is the ``single`` accuracy
on retrieved questions and the ``no-rag`` accuracy on the rest; both runs are resumable and
shared by every gate evaluated on that model and those questions: the cache is keyed by the
questions, their gold answers and the retrieval corpus (the data file's content), never by the
file's path, so a copy of the file elsewhere shares the labels and a file edited in place gets
new ones.

Several eval-gate runs at once (one per gate, in parallel) share the labels: each decides
its own gate first, then the labels are written by one run at a time (a lock on the cache's
``results.jsonl``); a run that finds them being written waits for the other and reads them
(and finishes them, if the other stopped), so no question is labelled twice.

Example:
    >>> from rag_gates_lab.gate_eval import GateEvalConfig, evaluate_gate
    >>> report = evaluate_gate(GateEvalConfig(gate="first-token-prob", dataset="popqa", n=500),
    ...                        "runs/gate-popqa")
    >>> report.auroc, report.calibrated_threshold
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rag_gates._io import append_locked, drop_torn_tail, write_text_atomic
from rag_gates.calibration.fit import ThresholdPoint, threshold_curve
from rag_gates.calibration.fit import best_accuracy_point as calibrate
from rag_gates.lm.defaults import rag_gates_home
from rag_gates.methods import MethodContext
from rag_gates.registry import check_gate_expression, gate_needs_lm, make_gate
from rag_gates.types import GateDecision
from rag_gates_lab.datasets import DatasetLoad, load_dataset
from rag_gates_lab.metrics import auroc, roc_curve, spearman
from rag_gates_lab.names import check_dataset, check_gate_names, check_retriever
from rag_gates_lab.plugins.quco import bench_gate_settings
from rag_gates_lab.runner import (
    BenchConfig,
    ConfigMismatchError,
    ModelSpec,
    data_matches,
    read_records,
    run_bench,
)

__all__ = ["GateEvalConfig", "GateEvalReport", "ThresholdPoint", "calibrate", "evaluate_gate",
           "threshold_curve"]

logger = logging.getLogger(__name__)


class GateEvalConfig(BaseModel):
    # A refused value is never echoed: a model URL may carry a key (refused, see ModelSpec).
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    gate: str = Field(..., description="Gate name (see available_gates()).")
    dataset: str
    n: int = Field(200, ge=2)
    offset: int = Field(0, ge=0)
    model: ModelSpec = "default"
    retriever: str = "bm25"
    k: int = Field(3, ge=1, le=50)
    max_new_tokens: int = Field(32, ge=1, le=1024)
    data_path: str | None = None
    labels_dir: str | None = Field(
        None, exclude=True,
        description="A bench directory holding (or to hold) the no-rag and single runs; its "
                    "configuration must match. Default: a cache under RAG_GATES_HOME.")
    create_labels: bool = Field(
        False, exclude=True,
        description="Create labels_dir when it does not exist (otherwise refused, so a typo "
                    "never starts a fresh, hours-long labelling run in a stray directory).")
    target_retrieval_rate: float | None = Field(
        None, ge=0.0, le=1.0,
        description="Calibrate for this retrieval rate; None = the best-accuracy threshold.")
    threads: int | None = Field(
        None, ge=1, exclude=True,
        description="torch threads for the model (not part of the evaluation's identity).")


class GateEvalReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    config: GateEvalConfig
    questions: int
    closed_book_accuracy: float
    single_retrieval_accuracy: float
    wrong_without_retrieval: float = Field(..., description="Share of positive labels.")
    auroc: float
    roc: list[tuple[float, float]]
    curve: list[ThresholdPoint]
    calibrated_threshold: float
    calibrated: ThresholdPoint
    calibration: Literal["best-accuracy", "target-rate"]
    popularity_spearman: float | None = Field(
        None, description="PopQA: Spearman correlation of the gate score with s_pop.")
    mean_gate_latency_ms: float


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:80]


def label_run_dir(config: GateEvalConfig, fingerprint: str, corpus: str | None = None
                  ) -> Path:
    """Where the shared no-rag/single runs of this model and these questions are cached:
    keyed by the loaded questions' and gold answers' ``fingerprint``
    (:attr:`DatasetLoad.fingerprint`) and by the retrieval corpus they were answered from
    (``corpus``, default :func:`~rag_gates_lab.corpus.corpus_key` of the data file), so two
    data files, or one whose answers were edited, never share labels, and a copy of the same
    file at another path does."""
    from rag_gates_lab.corpus import corpus_key

    corpus = corpus or corpus_key(config.dataset, config.data_path)
    return _label_root(config) / _label_name(config, f"-{fingerprint}-c{corpus}")


def _label_root(config: GateEvalConfig) -> Path:
    return rag_gates_home() / "eval-cache" / _slug(config.model)


def _label_name(config: GateEvalConfig, key: str) -> str:
    return (f"{_slug(config.dataset)}{key}-n{config.n}-o{config.offset}-{config.retriever}-"
            f"k{config.k}-t{config.max_new_tokens}")


def _adopt_older_labels(config: GateEvalConfig, labels_dir: Path, data: DatasetLoad,
                        corpus: str) -> None:
    """Move a label cache of an earlier layout (named without a key, or by the questions'
    fingerprint alone) to ``labels_dir`` when it holds these very labels: its records carry
    these questions' current gold answers (:func:`~rag_gates_lab.runner.data_matches`) and
    its data file has this retrieval corpus. It then records this data's fingerprint and no
    data path (the name says which data; the path does not matter)."""
    from rag_gates_lab.corpus import corpus_key

    if labels_dir.exists():
        return
    for key in (f"-{data.question_fingerprint}", ""):
        old = _label_root(config) / _label_name(config, key)
        try:
            recorded = json.loads((old / "config.json").read_text(encoding="utf-8"))
            recorded_path = recorded["config"].get("data_path")
            same_corpus = corpus_key(config.dataset, recorded_path) == corpus
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # absent, damaged or its data file gone: not provably the same labels
        if same_corpus and data_matches(recorded.get("data_fingerprint"), data, old):
            recorded["config"]["data_path"] = None
            recorded["data_fingerprint"] = data.fingerprint
            write_text_atomic(old / "config.json", json.dumps(recorded, indent=2))
            old.rename(labels_dir)
            logger.info("label cache %s renamed to %s (keyed by the data's questions, gold "
                        "answers and corpus)", old, labels_dir)
            return


def evaluate_gate(config: GateEvalConfig, out_dir: str | Path, *, lm: Any = None,
                  retriever: Any = None,
                  progress: Callable[[str, int, int], None] | None = None,
                  labels_wait_s: float = math.inf) -> GateEvalReport:
    """Score a gate against closed-book correctness; write ``gate_eval.json``,
    ``decisions.jsonl`` and the calibrated ``gate.json`` to ``out_dir``.

    The gate decides first; then the labels (the shared ``no-rag``/``single`` runs). Labels
    another process is writing are waited for, up to ``labels_wait_s`` seconds (default: as
    long as it takes; then :class:`~rag_gates.errors.FileInUseError`), and read, not redone.
    """
    # Every name before anything loads (the names alone import no plugin), then the
    # expression (syntax, limits, thresholds, weights files) before a model loads.
    check_gate_names(config.gate)
    check_dataset(config.dataset)
    check_retriever(config.retriever)
    check_gate_expression(config.gate)
    if config.labels_dir and not config.create_labels and not Path(config.labels_dir).is_dir():
        raise FileNotFoundError(
            f"the labels directory {config.labels_dir} does not exist; pass an existing bench "
            "directory, or add --create-labels (create_labels=True) to label into a new one")
    data = load_dataset(config.dataset, config.data_path, n=config.n, offset=config.offset)
    if len(data.examples) < 2:
        raise ValueError(f"need at least 2 questions, {data.path} gave {len(data.examples)}")
    if lm is None and gate_needs_lm(config.gate):
        from rag_gates.lm.defaults import load_lm

        lm = load_lm(config.model, num_threads=config.threads)
    # Otherwise (a text-only gate such as quco) lm stays None: run_bench loads the model
    # only if the labels still need answers, so finished labels are re-scored without it.
    data_path = config.data_path
    if config.labels_dir:  # the user's own bench directory: its data path must match
        labels_dir = Path(config.labels_dir)
    else:  # the shared cache: its name says which data; any path to that data shares it
        from rag_gates_lab.corpus import corpus_key, load_retriever

        corpus = corpus_key(config.dataset, config.data_path)
        labels_dir = label_run_dir(config, data.fingerprint, corpus)
        _adopt_older_labels(config, labels_dir, data, corpus)
        if retriever is None:
            retriever = load_retriever(config.dataset, config.retriever, config.data_path)
        data_path = None
    bench = BenchConfig(dataset=config.dataset, methods=["no-rag", "single"], n=config.n,
                        offset=config.offset, model=config.model, retriever=config.retriever,
                        k=config.k, max_new_tokens=config.max_new_tokens,
                        data_path=data_path, threads=config.threads)

    def bench_progress(done: int, total: int, _: Any) -> None:
        if progress is not None:
            progress("labels (no-rag, single)", done, total)

    def waiting() -> None:
        logger.info("waiting for the labels another process is writing in %s", labels_dir)
        if progress is not None:
            progress("waiting for the labels another eval-gate is writing", 0, 1)

    # The gate first: its errors come before hours of labelling, and a run started beside
    # another decides while the other labels.
    ctx = MethodContext(lm=lm, dataset=config.dataset, max_new_tokens=config.max_new_tokens,
                        **bench_gate_settings(config.dataset))
    gate = make_gate(config.gate, ctx)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    decisions = _decide_resumably(gate, config, data.examples, out, progress)
    run_bench(bench, labels_dir, lm=lm, retriever=retriever, data=data,
              progress=bench_progress, lock_wait_s=labels_wait_s, on_lock_wait=waiting)
    by_key = {(r.id, r.method): r for r in read_records(labels_dir)}
    closed = [by_key[(e.id, "no-rag")].accuracy for e in data.examples]
    retrieved = [by_key[(e.id, "single")].accuracy for e in data.examples]
    # An infinite score (e.g. an empty answer) ranks above every finite one.
    scores = [d.score if math.isfinite(d.score) else 1e300 for d in decisions]
    labels = [int(c == 0.0) for c in closed]
    curve = threshold_curve(scores, closed, retrieved)
    chosen = calibrate(curve, config.target_retrieval_rate)
    popularity = None
    if config.dataset == "popqa":
        pops = [e.meta.get("s_pop") for e in data.examples]
        pairs = [(s, float(p)) for s, p in zip(scores, pops, strict=True)
                 if isinstance(p, int | float)]
        popularity = spearman([s for s, _ in pairs], [p for _, p in pairs])
    report = GateEvalReport(
        config=config, questions=len(data.examples),
        closed_book_accuracy=sum(closed) / len(closed),
        single_retrieval_accuracy=sum(retrieved) / len(retrieved),
        wrong_without_retrieval=sum(labels) / len(labels),
        auroc=auroc(scores, labels), roc=roc_curve(scores, labels), curve=curve,
        calibrated_threshold=chosen.threshold, calibrated=chosen,
        calibration="best-accuracy" if config.target_retrieval_rate is None else "target-rate",
        popularity_spearman=popularity,
        mean_gate_latency_ms=sum(d.latency_ms for d in decisions) / len(decisions),
    )
    _write_json(out / "gate_eval.json", report.model_dump(mode="json"))
    _write_json(out / "gate.json", {
        "gate": config.gate, "threshold": chosen.threshold, "model": config.model,
        "calibrated_on": {"dataset": config.dataset, "n": config.n, "offset": config.offset,
                          "calibration": report.calibration,
                          "target_retrieval_rate": config.target_retrieval_rate},
        "expected": {"retrieval_rate": chosen.retrieval_rate, "accuracy": chosen.accuracy},
    })
    return report


def _decide_resumably(gate: Any, config: GateEvalConfig, examples: list[Any], out: Path,
                      progress: Callable[[str, int, int], None] | None
                      ) -> list[GateDecision]:
    """The gate's decision on every question, one line each in ``decisions.jsonl``, written
    as it is made; a rerun after an interruption keeps the finished ones (a line cut short is
    dropped) and decides the rest. A directory holding another evaluation's decisions is
    refused rather than mixed."""
    identity = {"config": config.model_dump(mode="json", exclude={"labels_dir"}),
                "questions": [e.id for e in examples]}
    marker, path = out / "decisions.config.json", out / "decisions.jsonl"
    # Locked before anything is read or cut: a second eval-gate on the same --out stops here.
    with append_locked(path) as handle:
        if marker.is_file():
            before = json.loads(marker.read_text())
            if before != identity:
                raise ConfigMismatchError(
                    f"{out} holds the decisions of another gate evaluation "
                    f"({before['config']}); use a new --out directory")
        else:
            handle.truncate(0)  # decisions of an older layout: not resumable
            write_text_atomic(marker, json.dumps(identity, indent=2))
        drop_torn_tail(path)
        done: dict[str, GateDecision] = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            key = row.pop("id")
            done[key] = GateDecision.model_validate(row)
        for i, example in enumerate(examples, start=1):
            if example.id not in done:
                d = gate.decide(example.question)
                handle.write(json.dumps({"id": example.id, **d.model_dump(mode="json")}) + "\n")
                handle.flush()
                done[example.id] = d
            if progress is not None:
                progress(f"gate {config.gate}", i, len(examples))
    return [done[e.id] for e in examples]


def _json_safe(value: Any) -> Any:
    """NaN/inf (an AUROC with one class, a constant score) become null: valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(_json_safe(payload), indent=2, allow_nan=False))
