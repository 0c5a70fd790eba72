"""The benchmark runner: methods x questions, one JSON line per answer, resumable.

A run directory holds ``config.json`` (what was asked: dataset and its fingerprint, methods,
model, retriever, settings), ``results.jsonl`` (one line per question and method, written and
flushed as each finishes), and at the end ``summary.json`` and ``summary.md``. Running the
same configuration again resumes: finished (question, method) pairs are skipped, and a line
cut short by an interruption is dropped and redone. A directory made by a different
configuration is refused rather than mixed.

Example:
    >>> from rag_gates.eval.runner import BenchConfig, run_bench
    >>> cfg = BenchConfig(dataset="hotpotqa", methods=["no-rag", "single"], n=200)
    >>> summary = run_bench(cfg, "runs/hotpot-baselines")
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rag_gates._io import write_text_atomic
from rag_gates.eval.datasets import DatasetLoad, QAExample, load_dataset
from rag_gates.eval.methods import (
    Method,
    MethodContext,
    available_methods,
    check_method_name,
    make_method,
)
from rag_gates.eval.metrics import score_answer

__all__ = [
    "BenchConfig",
    "ConfigMismatchError",
    "RunDirectoryError",
    "RunRecord",
    "read_records",
    "run_bench",
    "summarize",
    "summary_markdown",
]

logger = logging.getLogger(__name__)

CONFIG, RESULTS, SUMMARY_JSON, SUMMARY_MD = ("config.json", "results.jsonl", "summary.json",
                                             "summary.md")


class ConfigMismatchError(ValueError):
    """The run directory was made by a different configuration."""


class RunDirectoryError(ValueError):
    """The run directory's ``config.json`` is damaged or not a rag-gates run's."""


class BenchConfig(BaseModel):
    """Everything that defines a run. A run directory accepts the same configuration again
    (resume) or with more methods (extend); anything else is refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dataset: str = Field(..., description="hotpotqa, 2wiki, popqa or pubmedqa.")
    methods: list[str] = Field(..., min_length=1, description="Method names, run in order.")
    n: int = Field(200, ge=1, description="Questions (the first n valid rows).")
    offset: int = Field(0, ge=0, description="Valid rows skipped before the first question.")
    model: str = Field("default", description="'default' or an HF path/id.")
    retriever: str = Field("bm25", description="bm25 or dense.")
    k: int = Field(3, ge=1, le=50)
    max_new_tokens: int = Field(48, ge=1, le=1024)
    data_path: str | None = Field(None, description="Dataset file; default search path.")
    threads: int | None = Field(
        None, ge=1, exclude=True,
        description="torch threads for the model (not part of the run's identity).")


class RunRecord(BaseModel):
    """One answered question by one method."""

    model_config = ConfigDict(frozen=True)

    id: str
    method: str
    question: str
    answers: list[str]
    prediction: str
    em: float
    f1: float
    accuracy: float
    retrievals: int
    llm_calls: int
    generated_tokens: int
    wall_s: float
    trace: dict[str, Any]
    meta: dict[str, Any] = Field(default_factory=dict)


def read_records(run_dir: str | Path) -> list[RunRecord]:
    """Every complete record of a run (a line cut short by an interruption is ignored)."""
    path = Path(run_dir) / RESULTS
    if not path.is_file():
        return []
    records = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            try:
                records.append(RunRecord.model_validate_json(line))
            except ValueError:
                logger.warning("ignoring an incomplete line in %s", path)
    return records


def _repair_tail(path: Path) -> None:
    """Cut a final line without its newline (an interrupted write) so appends stay valid."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with path.open("rb+") as handle:
        data = handle.read()
        if data.endswith(b"\n"):
            return
        keep = data.rfind(b"\n") + 1
        handle.truncate(keep)
        logger.warning("dropped an interrupted last line of %s", path)


def _identity(config: BenchConfig) -> dict[str, Any]:
    # Methods are not part of a run's identity: adding a method to a run extends it.
    return config.model_dump(exclude={"methods"})


def _read_run_config(path: Path) -> dict[str, Any]:
    """The stored ``config.json`` of a run, or a RunDirectoryError naming the file."""
    try:
        existing = json.loads(path.read_bytes().decode("utf-8"))
        if not isinstance(existing, dict) or not isinstance(existing.get("config"), dict):
            raise ValueError("not an object with a 'config' object")
        methods = existing["config"].get("methods", [])
        if not isinstance(methods, list) or not all(isinstance(m, str) for m in methods):
            raise ValueError("'config.methods' is not a list of names")
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError included
        raise RunDirectoryError(
            f"{path} is not a rag-gates run configuration ({type(exc).__name__}: {exc}); the "
            "directory holds something else or a damaged run: use a new --out directory (the "
            "file is left as it is)") from None
    return existing


def _prepare_dir(run_dir: Path, config: BenchConfig, fingerprint: str) -> None:
    path = run_dir / CONFIG
    existing = _read_run_config(path) if path.is_file() else None
    run_dir.mkdir(parents=True, exist_ok=True)
    methods = list(config.methods)
    if existing is not None:
        before = {k: v for k, v in existing["config"].items() if k != "methods"}
        now = _identity(config)
        diff: dict[str, Any] = {k: (before.get(k), v) for k, v in now.items()
                                if before.get(k) != v}
        if existing.get("data_fingerprint") != fingerprint:
            diff["data_fingerprint"] = (existing.get("data_fingerprint"), fingerprint)
        if diff:
            raise ConfigMismatchError(
                f"{run_dir} holds a run with a different configuration (was, now): {diff}. "
                "Use a new --out directory."
            )
        methods = list(dict.fromkeys(existing["config"].get("methods", []) + methods))
    stored = {"config": {**config.model_dump(), "methods": methods},
              "data_fingerprint": fingerprint}
    write_text_atomic(path, json.dumps(stored, indent=2))


def _record(example: QAExample, method: Method, dataset: str) -> RunRecord:
    start = time.perf_counter()
    result = method.answer(example.question)
    wall = time.perf_counter() - start
    metrics = score_answer(result.answer, example.answers, dataset)
    trace = result.trace
    return RunRecord(
        id=example.id, method=method.name, question=example.question, answers=example.answers,
        prediction=result.answer, em=metrics["em"], f1=metrics["f1"],
        accuracy=metrics["accuracy"], retrievals=trace.retrievals, llm_calls=trace.llm_calls,
        generated_tokens=trace.generated_tokens, wall_s=wall,
        trace=trace.model_dump(mode="json"), meta=dict(example.meta),
    )


def summarize(records: Sequence[RunRecord], methods: Sequence[str] | None = None
              ) -> dict[str, dict[str, float]]:
    """Per method: questions, EM, F1, accuracy (means, in %), retrievals and LLM calls per
    question (means), seconds per question (median)."""
    names = list(methods) if methods else list(dict.fromkeys(r.method for r in records))
    out: dict[str, dict[str, float]] = {}
    for name in names:
        rows = [r for r in records if r.method == name]
        if not rows:
            continue
        out[name] = {
            "questions": len(rows),
            "em": 100 * statistics.fmean(r.em for r in rows),
            "f1": 100 * statistics.fmean(r.f1 for r in rows),
            "accuracy": 100 * statistics.fmean(r.accuracy for r in rows),
            "retrievals_per_question": statistics.fmean(r.retrievals for r in rows),
            "llm_calls_per_question": statistics.fmean(r.llm_calls for r in rows),
            "tokens_per_question": statistics.fmean(r.generated_tokens for r in rows),
            "seconds_per_question": statistics.median(r.wall_s for r in rows),
        }
    return out


def summary_markdown(summary: dict[str, dict[str, float]], title: str) -> str:
    """The summary as a markdown table."""
    lines = [f"### {title}", "",
             "| method | n | EM | F1 | acc | retrievals/q | LLM calls/q | s/q (median) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, s in summary.items():
        lines.append(
            f"| {name} | {int(s['questions'])} | {s['em']:.1f} | {s['f1']:.1f} | "
            f"{s['accuracy']:.1f} | {s['retrievals_per_question']:.2f} | "
            f"{s['llm_calls_per_question']:.2f} | {s['seconds_per_question']:.2f} |")
    return "\n".join(lines) + "\n"


ProgressCallback = Callable[[int, int, dict[str, dict[str, float]]], None]


def run_bench(
    config: BenchConfig,
    run_dir: str | Path,
    *,
    lm: Any = None,
    retriever: Any = None,
    data: DatasetLoad | None = None,
    progress: ProgressCallback | None = None,
) -> dict[str, dict[str, float]]:
    """Run (or resume) a benchmark; return the per-method summary.

    ``lm`` and ``retriever`` default to loading ``config.model`` and the dataset's cached
    ``config.retriever`` index. ``progress(done, total, running_summary)`` is called after
    every record.
    """
    known = available_methods()
    for name in config.methods:
        check_method_name(name, known)
    data = data or load_dataset(config.dataset, config.data_path, n=config.n,
                                offset=config.offset)
    if data.skipped:
        logger.warning("%d malformed lines skipped in %s: %s", len(data.skipped), data.path,
                       data.skipped[:5])
    if not data.examples:
        after = f" after skipping {config.offset} valid ones (--offset)" if config.offset else ""
        raise ValueError(
            f"no valid question in {data.path}{after}: {len(data.skipped)} lines skipped as "
            f"malformed (first: {data.skipped[:3]}); check that it is a {config.dataset} file")
    run_path = Path(run_dir)
    _prepare_dir(run_path, config, data.fingerprint)
    results = run_path / RESULTS
    _repair_tail(results)
    records = read_records(run_path)
    done = {(r.id, r.method) for r in records}
    if lm is None:
        from rag_gates.lm.defaults import load_lm

        lm = load_lm(config.model, num_threads=config.threads)
    needs_retrieval = any(m != "no-rag" for m in config.methods)
    if retriever is None and needs_retrieval:
        from rag_gates.eval.corpus import load_retriever

        retriever = load_retriever(config.dataset, config.retriever, config.data_path)
    ctx = MethodContext(lm=lm, retriever=retriever, dataset=config.dataset, k=config.k,
                        max_new_tokens=config.max_new_tokens)
    methods = [make_method(name, ctx) for name in config.methods]
    total = len(data.examples) * len(methods)
    with results.open("a", encoding="utf-8") as out:
        for example in data.examples:
            for method in methods:
                if (example.id, method.name) in done:
                    continue
                record = _record(example, method, config.dataset)
                out.write(record.model_dump_json() + "\n")
                out.flush()
                os.fsync(out.fileno())
                records.append(record)
                done.add((example.id, method.name))
                if progress is not None:
                    progress(len(done), total, summarize(records, config.methods))
    summary = summarize(records)  # every method of the run, including earlier extensions
    run_config = config.model_copy(
        update={"methods": list(dict.fromkeys(r.method for r in records))})
    for name, text in ((SUMMARY_JSON, json.dumps({"config": run_config.model_dump(),
                                                   "summary": summary}, indent=2)),
                       (SUMMARY_MD, summary_markdown(summary, f"{config.dataset}, "
                                                     f"{len(data.examples)} questions, "
                                                     f"{config.retriever}, {config.model}"))):
        write_text_atomic(run_path / name, text)
    return summary
