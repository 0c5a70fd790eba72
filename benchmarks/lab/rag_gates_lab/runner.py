"""The benchmark runner: methods x questions, one JSON line per answer, resumable.

A run directory holds ``config.json`` (what was asked: dataset and its fingerprint, methods,
model, retriever, settings), ``results.jsonl`` (one line per question and method, written and
flushed as each finishes), and at the end ``summary.json`` and ``summary.md``. Running the
same configuration again resumes: finished (question, method) pairs are skipped, and a line
cut short by an interruption is dropped and redone. A directory made by a different
configuration is refused rather than mixed.

A served model (``model="openai:URL[#model-name]"``, an :class:`OpenAICompatibleLM`) can answer
``concurrency`` questions at once (a thread pool; the client bounds the requests in flight),
so the server can batch them; lines are written in question order whatever order they finish
in, so a run at any concurrency has the same lines as a sequential one. ``config.json`` then
also records the endpoint and the model name the server reported (never an API key: it is read
from the environment, and a URL carrying credentials is refused). An in-process model answers
one question at a time: its forward passes are serialised, so ``concurrency > 1`` is refused
with one that is not served.

Example:
    >>> from rag_gates_lab.runner import BenchConfig, run_bench
    >>> cfg = BenchConfig(dataset="hotpotqa", methods=["no-rag", "single"], n=200)
    >>> summary = run_bench(cfg, "runs/hotpot-baselines")
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from rag_gates._http import SERVED_PREFIX, check_served_spec
from rag_gates._io import (
    append_locked,
    drop_torn_tail,
    parse_lines_but_a_torn_tail,
    write_text_atomic,
)
from rag_gates.methods import (
    Method,
    MethodContext,
    make_method,
)
from rag_gates_lab.datasets import DatasetLoad, QAExample, load_dataset
from rag_gates_lab.metrics import score_answer
from rag_gates_lab.names import check_dataset, check_methods, check_retriever
from rag_gates_lab.plugins.quco import bench_gate_settings

__all__ = [
    "BenchConfig",
    "ConfigMismatchError",
    "RunDirectoryError",
    "RunRecord",
    "data_matches",
    "read_records",
    "run_bench",
    "summarize",
    "summary_markdown",
]

logger = logging.getLogger(__name__)

CONFIG, RESULTS, SUMMARY_JSON, SUMMARY_MD = ("config.json", "results.jsonl", "summary.json",
                                             "summary.md")


def _model_spec(value: str) -> str:
    if value.startswith(SERVED_PREFIX):
        check_served_spec(value)
    return value


#: A ``--model`` value: a served model's URL carries no credentials or query string (checked;
#: configs holding one never echo their input in errors).
ModelSpec = Annotated[str, AfterValidator(_model_spec)]


class ConfigMismatchError(ValueError):
    """The run directory was made by a different configuration."""


class RunDirectoryError(ValueError):
    """The run directory's ``config.json`` is damaged or not a rag-gates run's."""


class BenchConfig(BaseModel):
    """Everything that defines a run. A run directory accepts the same configuration again
    (resume) or with more methods (extend); anything else is refused."""

    # A refused value is never echoed: a model URL may carry a key (refused below).
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    dataset: str = Field(..., description="hotpotqa, 2wiki, popqa or pubmedqa.")
    methods: list[str] = Field(..., min_length=1, description="Method names, run in order.")
    n: int = Field(200, ge=1, description="Questions (the first n valid rows).")
    offset: int = Field(0, ge=0, description="Valid rows skipped before the first question.")
    model: ModelSpec = Field("default", description="'default', an HF path/id, or "
                                                    "'openai:URL[#model-name]'.")
    retriever: str = Field("bm25", description="bm25 or dense.")
    k: int = Field(3, ge=1, le=50)
    max_new_tokens: int = Field(48, ge=1, le=1024)
    data_path: str | None = Field(None, description="Dataset file; default search path.")
    threads: int | None = Field(
        None, ge=1, exclude=True,
        description="torch threads for the model (not part of the run's identity).")
    prefix_cache_mb: float = Field(
        0, ge=0, le=65536, exclude=True,
        description="In-process models: keep recent prompts' keys and values (MB) so a "
                    "prompt extending one prefills only its new tokens (DeepRAG's steps). "
                    "Not part of the run's identity.")
    concurrency: int = Field(
        1, ge=1, le=64, exclude=True,
        description="Questions answered at once; above 1 only with a served model "
                    "('openai:URL[#model-name]'). Not part of the run's identity.")

    request_timeout: float = Field(
        600.0, gt=0, le=3600, exclude=True,
        description="Seconds a served model may take for one request, retries included. "
                    "Generous: a server that answers one request at a time makes the others "
                    "queue, and echoed prompt log-probabilities cost llama-cpp-python about "
                    "0.3 s per prompt token.")
    chat_template: str | None = Field(
        None, exclude=True,
        description="A served model's chat template ('default': the embedded model's, a "
                    "template file or a model directory): chat prompts are rendered here and "
                    "sent to the completions endpoint, so score() and assistant prefill work "
                    "on them. Recorded with the served model in config.json.")

    @model_validator(mode="after")
    def _served_options_need_a_server(self) -> BenchConfig:
        if self.chat_template is not None and not self.model.startswith(SERVED_PREFIX):
            raise ValueError(
                "chat_template is for a served model (--model openai:URL[#model-name]); an "
                "in-process model uses its tokenizer's own template")
        if self.concurrency > 1 and not self.model.startswith(SERVED_PREFIX):
            raise ValueError(
                f"concurrency {self.concurrency} needs a served model (--model "
                "openai:URL[#model-name]): an in-process model runs one forward pass at a time, "
                "so questions would only wait for each other. Use --concurrency 1, or serve the "
                "model (e.g. llama.cpp's or vLLM's OpenAI-compatible server)")
        return self


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
    """Every complete record of a run (a last line cut short by an interruption is ignored;
    any other unreadable line raises :class:`~rag_gates.errors.ArtifactError`)."""
    path = Path(run_dir) / RESULTS
    if not path.is_file():
        return []
    return parse_lines_but_a_torn_tail(
        path.read_text(encoding="utf-8").splitlines(), RunRecord.model_validate_json,
        file=path, what="a run record",
        fix="delete that line (a resumed run answers that question again)")


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


def data_matches(recorded: object, data: DatasetLoad, run_dir: str | Path) -> bool:
    """Whether a run directory whose ``config.json`` records the data fingerprint
    ``recorded`` holds answers to ``data``: the same fingerprint (questions and gold answers),
    or, for a directory written before the fingerprint covered the answers (it recorded
    :attr:`DatasetLoad.question_fingerprint`), every record it holds for these questions
    carries their current gold answers (each record stores the answers it was scored on)."""
    if recorded == data.fingerprint:
        return True
    if recorded != data.question_fingerprint:
        return False
    answers = {e.id: e.answers for e in data.examples}
    return all(r.answers == answers[r.id] for r in read_records(run_dir) if r.id in answers)


def _prepare_dir(run_dir: Path, config: BenchConfig, data: DatasetLoad,
                 served: dict[str, Any] | None = None, write: bool = True) -> None:
    """Check that the run directory holds this configuration (or nothing); with ``write``,
    store it (methods joined with earlier ones; ``served``: the served model's endpoint and
    name, which must match an earlier run's)."""
    path = run_dir / CONFIG
    existing = _read_run_config(path) if path.is_file() else None
    methods = list(config.methods)
    if existing is not None:
        before = {k: v for k, v in existing["config"].items() if k != "methods"}
        now = _identity(config)
        diff: dict[str, Any] = {k: (before.get(k), v) for k, v in now.items()
                                if before.get(k) != v}
        if not data_matches(existing.get("data_fingerprint"), data, run_dir):
            diff["data_fingerprint (questions and gold answers)"] = (
                existing.get("data_fingerprint"), data.fingerprint)
        if diff:
            raise ConfigMismatchError(
                f"{run_dir} holds a run with a different configuration (was, now): {diff}. "
                "Use a new --out directory."
            )
        before_served = existing.get("served")
        if served is not None and before_served is not None and any(
                before_served.get(k) != served.get(k)
                for k in ("endpoint", "model_name", "chat_template")):
            raise ConfigMismatchError(
                f"{run_dir} was answered by model {before_served.get('model_name')!r} at "
                f"{before_served.get('endpoint')!r} (chat template rendered here: "
                f"{before_served.get('chat_template')}); now {served.get('model_name')!r} at "
                f"{served.get('endpoint')!r} (chat template: {served.get('chat_template')}). "
                "Use a new --out directory (or name the model: openai:URL#model-name)")
        methods = list(dict.fromkeys(existing["config"].get("methods", []) + methods))
    if not write:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    stored: dict[str, Any] = {"config": {**config.model_dump(), "methods": methods},
                              "data_fingerprint": data.fingerprint}
    if served is not None:
        stored["served"] = served
    write_text_atomic(path, json.dumps(stored, indent=2))


def _answered(run_dir: Path, data: DatasetLoad, methods: list[str]) -> bool:
    """Whether ``run_dir`` holds an answer by every method to every question (a line cut
    short by an interruption does not count: that answer is still to be written)."""
    done = {(r.id, r.method) for r in read_records(run_dir)}
    return all((e.id, m) in done for e in data.examples for m in methods)


def _record(example: QAExample, method: Method, dataset: str) -> RunRecord:
    start = time.perf_counter()
    result = method.answer(example.question)
    trace = result.trace
    # As if the method ran alone: work it reused from another method's identical call on
    # this question (a shared greedy verbalization) counts at that call's cost.
    wall = time.perf_counter() - start + trace.reused_ms / 1000.0
    metrics = score_answer(result.answer, example.answers, dataset)
    return RunRecord(
        id=example.id, method=method.name, question=example.question, answers=example.answers,
        prediction=result.answer, em=metrics["em"], f1=metrics["f1"],
        accuracy=metrics["accuracy"], retrievals=trace.retrievals, llm_calls=trace.llm_calls,
        generated_tokens=trace.generated_tokens, wall_s=wall,
        trace=trace.model_dump(mode="json"), meta=dict(example.meta),
    )


def _answers(pool: concurrent.futures.ThreadPoolExecutor,
             todo: list[tuple[QAExample, Method]], config: BenchConfig) -> Iterator[RunRecord]:
    """Records of ``todo`` in order, computed ``config.concurrency`` at a time."""
    if config.concurrency == 1:
        for example, method in todo:
            yield _record(example, method, config.dataset)
        return
    window: deque[concurrent.futures.Future[RunRecord]] = deque()
    pending = iter(todo)
    try:
        for example, method in pending:
            window.append(pool.submit(_record, example, method, config.dataset))
            if len(window) >= 2 * config.concurrency:  # a bounded read-ahead
                yield window.popleft().result()
        while window:
            yield window.popleft().result()
    finally:  # an error or an interruption: start nothing new
        for future in window:
            future.cancel()


def load_bench_lm(config: BenchConfig) -> Any:
    """The run's model: ``openai:URL[#model-name]`` (an OpenAICompatibleLM allowing
    ``concurrency`` requests at once) or ``default`` / an HF path or id (in process)."""
    if config.model.startswith(SERVED_PREFIX):
        from rag_gates.lm.openai_compat import OpenAICompatibleLM, load_chat_template

        template = (load_chat_template(config.chat_template)
                    if config.chat_template is not None else None)
        return OpenAICompatibleLM.from_spec(config.model, chat_template=template,
                                            max_concurrency=max(4, config.concurrency),
                                            timeout=config.request_timeout,
                                            attempt_timeout=config.request_timeout)
    from rag_gates.lm.defaults import load_lm

    return load_lm(config.model, num_threads=config.threads,
                   prefix_cache_mb=config.prefix_cache_mb)


def served_info(lm: Any) -> dict[str, Any] | None:
    """Endpoint, model name and capabilities of a served model (None for an in-process one):
    what ``config.json`` records. No header, and so no API key, is part of it."""
    from rag_gates.lm.openai_compat import OpenAICompatibleLM

    if not isinstance(lm, OpenAICompatibleLM):
        return None
    return {"endpoint": lm.base_url, "model_name": lm.model_name,
            "api_key_env": lm.config.api_key_env,
            "chat_template": lm.config.chat_template is not None,
            "capabilities": lm.capabilities.offered(),
            "prompt_logprob_alignment": dict(lm.alignment)}


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
    lock_wait_s: float = 0.0,
    on_lock_wait: Callable[[], None] | None = None,
) -> dict[str, dict[str, float]]:
    """Run (or resume) a benchmark; return the per-method summary.

    ``lm`` and ``retriever`` default to loading ``config.model`` and the dataset's cached
    ``config.retriever`` index (neither is loaded when the run already holds every answer:
    it is only summarised). ``progress(done, total, running_summary)`` is called after
    every record. A run directory another process is writing raises
    :class:`~rag_gates.errors.FileInUseError`, or with ``lock_wait_s`` is waited for (up to
    that many seconds; ``on_lock_wait()`` is called when the wait starts) and then resumed.
    """
    # Every name before any data, plugin or model loads: a typo fails at once, with the
    # valid names.
    check_dataset(config.dataset)
    check_retriever(config.retriever)
    check_methods(config.methods)
    data = data or load_dataset(config.dataset, config.data_path, n=config.n,
                                offset=config.offset)
    if data.skipped:
        logger.warning("%d malformed lines skipped in %s: %s", len(data.skipped), data.path,
                       data.skipped[:5])
    if not data.examples:
        after = f" after skipping {config.offset} valid ones (--offset)" if config.offset else ""
        if not data.skipped and not after:
            raise ValueError(f"{data.path} holds no question (an empty file?); give a "
                             f"{config.dataset} file with one question per line")
        raise ValueError(
            f"no valid question in {data.path}{after}: {len(data.skipped)} lines skipped as "
            f"malformed (first: {data.skipped[:3]}); check that it is a {config.dataset} file")
    run_path = Path(run_dir)
    # A mismatched directory is refused before any model loads; it is written once the
    # methods are built (a method refusing this model leaves no trace in it).
    _prepare_dir(run_path, config, data, write=False)
    # A run that already holds every answer asked for is only summarised: no model or
    # index is loaded (eval-gate re-scoring a text-only gate against finished labels).
    methods: list[Method] = []
    if lm is not None or not _answered(run_path, data, config.methods):
        if lm is None:
            lm = load_bench_lm(config)
        served = served_info(lm)
        if config.concurrency > 1 and served is None:
            raise ValueError(
                f"concurrency {config.concurrency} needs a served model (OpenAICompatibleLM); "
                f"{type(lm).__name__} runs one forward pass at a time: use concurrency 1")
        needs_retrieval = any(m != "no-rag" for m in config.methods)
        if retriever is None and needs_retrieval:
            from rag_gates_lab.corpus import load_retriever

            retriever = load_retriever(config.dataset, config.retriever, config.data_path)
        ctx = MethodContext(lm=lm, retriever=retriever, dataset=config.dataset, k=config.k,
                            max_new_tokens=config.max_new_tokens,
                            **bench_gate_settings(config.dataset))
        methods = [make_method(name, ctx) for name in config.methods]
        _prepare_dir(run_path, config, data, served=served)
    results = run_path / RESULTS
    # Locked before the rows are read: a second bench on the same --out stops here.
    with append_locked(results, wait_s=lock_wait_s, on_wait=on_lock_wait) as out, \
            concurrent.futures.ThreadPoolExecutor(
            config.concurrency, thread_name_prefix="rag-gates-bench") as pool:
        drop_torn_tail(results)
        records = read_records(run_path)
        done = {(r.id, r.method) for r in records}
        total = len(data.examples) * len(methods)
        todo = [(example, method) for example in data.examples for method in methods
                if (example.id, method.name) not in done]
        # At most `concurrency` questions are answered at once; lines are written in
        # question order (a finished answer waits for the ones before it).
        for record in _answers(pool, todo, config):
            out.write(record.model_dump_json() + "\n")
            out.flush()
            os.fsync(out.fileno())
            records.append(record)
            done.add((record.id, record.method))
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
