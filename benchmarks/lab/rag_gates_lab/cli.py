"""The lab's commands on ``rag-gates``: ``bench``, ``eval-gate``, ``fit-weighted``,
``report``, ``testbed``, and the research commands of ``cbdr``, ``deeprag`` and ``srrag``,
plus ``index from-datasets``. Registered through the ``rag_gates.cli`` entry point
(:func:`register`), so every documented command keeps its name when the lab is installed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rag_gates._console import error_line, quiet_transformers
from rag_gates.commands._help import ThreadsOption
from rag_gates_lab.names import (
    check_dataset,
    check_gate_names,
    check_methods,
    check_retriever,
    names_help,
)

console = Console()


def register(root: typer.Typer) -> None:
    """Add the lab's commands to the ``rag-gates`` app ``root`` (typer + rich only: no heavy
    import, so ``rag-gates --help`` stays fast)."""
    from rag_gates.corpus.cli import index_app
    from rag_gates_lab.commands.cbdr import cbdr_app
    from rag_gates_lab.commands.deeprag import deeprag_app
    from rag_gates_lab.commands.srrag import srrag_app
    from rag_gates_lab.corpus_cli import from_datasets
    from rag_gates_lab.testbed.cli import testbed_app

    root.command()(bench)
    root.command("eval-gate")(eval_gate)
    root.command("fit-weighted")(fit_weighted_command)
    root.command()(report)
    root.add_typer(cbdr_app, name="cbdr")
    root.add_typer(deeprag_app, name="deeprag")
    root.add_typer(testbed_app, name="testbed")
    root.add_typer(srrag_app, name="srrag")
    index_app.command("from-datasets")(from_datasets)


def bench(
    dataset: Annotated[str, typer.Option(help=names_help("dataset"))],
    out: Annotated[Path, typer.Option(help="Run directory (created; resumed if it exists).")],
    methods: Annotated[str, typer.Option(help=names_help("method"))] = "no-rag,single",
    n: Annotated[int, typer.Option(min=1, help="Number of questions.")] = 200,
    offset: Annotated[int, typer.Option(min=0, help="Questions skipped first.")] = 0,
    model: Annotated[str, typer.Option(
        help="'default', an HF path/id (in process), or openai:URL\\[#model-name] (a model "
             "behind an OpenAI-compatible server; API key from $OPENAI_API_KEY).")
    ] = "default",
    retriever: Annotated[str, typer.Option(help="bm25 or dense.")] = "bm25",
    k: Annotated[int, typer.Option(min=1, max=50, help="Passages per retrieval.")] = 3,
    max_new_tokens: Annotated[int, typer.Option(min=1, max=1024)] = 48,
    data: Annotated[Path | None, typer.Option(help="Dataset file or directory.")] = None,
    threads: ThreadsOption = None,
    prefix_cache_mb: Annotated[float, typer.Option(
        min=0, help="In-process models: MB of recent prompts' keys and values kept, so a "
                    "prompt that extends one prefills only its new tokens (DeepRAG, FLARE); "
                    "0: off. Log-probabilities equal an uncached run's up to float rounding "
                    "(about 1e-5), so a greedy near-tie may differ.")] = 0,
    concurrency: Annotated[int, typer.Option(
        min=1, max=64, help="Questions answered at once (a served model only; the server "
                            "batches them). In-process models answer one at a time.")] = 1,
    request_timeout: Annotated[float, typer.Option(
        min=1, max=3600, help="Seconds a served model may take for one request, retries "
                              "included (questions queue at a server that answers one at a "
                              "time).")] = 600.0,
    chat_template: Annotated[str | None, typer.Option(
        help="A served model's chat template: 'default' (the embedded SmolLM2's), a template "
             "file or a model directory. Chat prompts are then rendered here, so score() "
             "(deeprag-likelihood) and assistant prefill (deeprag) work through the server's "
             "completions endpoint.")] = None,
) -> None:
    """Run methods over a dataset: one JSON line per answer, resumable, summary at the end."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from rag_gates.errors import ServerError, WhiteBoxRequiredError
    from rag_gates.methods import split_method_list
    from rag_gates_lab.runner import BenchConfig, ConfigMismatchError, run_bench

    try:
        config = BenchConfig(dataset=dataset, methods=split_method_list(methods),
                             n=n, offset=offset, model=model, retriever=retriever, k=k,
                             max_new_tokens=max_new_tokens,
                             data_path=str(data) if data else None, threads=threads,
                             prefix_cache_mb=prefix_cache_mb,
                             concurrency=concurrency, chat_template=chat_template,
                             request_timeout=request_timeout)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    _check_names(lambda: check_dataset(dataset), lambda: check_retriever(retriever),
                 lambda: check_methods(config.methods))
    _check_output_dir(out)
    quiet_transformers()  # after the checks: importing transformers takes a second or two
    # Transient: an error (or the summary) is printed where the bar was, not under it.
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeRemainingColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task("starting", total=None)

        def progress(done: int, total: int, running: dict[str, dict[str, float]]) -> None:
            accs = "  ".join(f"{m} {s['accuracy']:.0f}%" for m, s in running.items())
            bar.update(task, completed=done, total=total, description=f"acc: {accs}")

        try:
            summary = run_bench(config, out, progress=progress)
        except (ValueError, FileNotFoundError, ConfigMismatchError, WhiteBoxRequiredError,
                ServerError) as exc:
            console.print(error_line(exc), highlight=False, soft_wrap=True)
            raise typer.Exit(2) from exc
    console.print((out / "summary.md").read_text())
    console.print(f"results: {out / 'results.jsonl'}; summary: {out / 'summary.json'}")
    _ = summary


def eval_gate(
    gate: Annotated[str, typer.Option(help=names_help("gate"))],
    dataset: Annotated[str, typer.Option(help=names_help("dataset"))],
    out: Annotated[Path, typer.Option(help="Output directory.")],
    n: Annotated[int, typer.Option(min=2)] = 200,
    offset: Annotated[int, typer.Option(min=0)] = 0,
    model: Annotated[str, typer.Option()] = "default",
    retriever: Annotated[str, typer.Option(help="bm25 or dense (for the single-retrieval "
                                                "labels).")] = "bm25",
    k: Annotated[int, typer.Option(min=1, max=50)] = 3,
    max_new_tokens: Annotated[int, typer.Option(min=1, max=1024)] = 32,
    target_rate: Annotated[float | None, typer.Option(
        min=0.0, max=1.0, help="Calibrate for this retrieval rate (default: best accuracy)."
    )] = None,
    data: Annotated[Path | None, typer.Option()] = None,
    labels: Annotated[Path | None, typer.Option(
        help="Bench directory with (or to hold) the no-rag and single runs of these questions; "
             "it must exist unless --create-labels is given."
    )] = None,
    create_labels: Annotated[bool, typer.Option(
        "--create-labels", help="Create the --labels directory if it does not exist.")] = False,
    threads: ThreadsOption = None,
) -> None:
    """Score a gate against 'the model answers wrong without retrieval': AUROC, accuracy and
    retrieval rate at every threshold, a calibrated threshold saved in OUT/gate.json. A gate
    that reads text only (quco) scored against finished --labels loads no model."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from rag_gates_lab.gate_eval import GateEvalConfig, evaluate_gate

    try:
        config = GateEvalConfig(gate=gate, dataset=dataset, n=n, offset=offset, model=model,
                                retriever=retriever, k=k, max_new_tokens=max_new_tokens,
                                target_retrieval_rate=target_rate,
                                data_path=str(data) if data else None,
                                labels_dir=str(labels) if labels else None,
                                create_labels=create_labels, threads=threads)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    _check_names(lambda: check_gate_names(gate), lambda: check_dataset(dataset),
                 lambda: check_retriever(retriever))
    _check_output_dir(out)
    quiet_transformers()
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeRemainingColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task("starting", total=None)

        def progress(stage: str, done: int, total: int) -> None:
            bar.update(task, description=stage, completed=done, total=total)

        try:
            report = evaluate_gate(config, out, progress=progress)
        except (ValueError, FileNotFoundError, TypeError) as exc:  # incl. ConfigMismatchError
            console.print(error_line(exc))
            raise typer.Exit(2) from exc
    c = report.calibrated
    console.print(f"[bold]{gate}[/] on {dataset} ({report.questions} questions): "
                  f"AUROC {report.auroc:.3f}; closed book {100 * report.closed_book_accuracy:.1f}%"
                  f", single retrieval {100 * report.single_retrieval_accuracy:.1f}%")
    console.print(f"calibrated threshold {c.threshold:.4g}: accuracy {100 * c.accuracy:.1f}% at "
                  f"retrieval rate {100 * c.retrieval_rate:.1f}% -> {out / 'gate.json'}")
    if report.popularity_spearman is not None:
        console.print(f"Spearman(score, s_pop) = {report.popularity_spearman:.3f}")


def fit_weighted_command(
    run: Annotated[list[Path], typer.Option(help="An eval-gate output directory, one per "
                                                 "gate (repeat; calibration rows).")],
    labels: Annotated[Path, typer.Option(help="Bench directory with the no-rag and single "
                                              "runs of the same questions.")],
    out: Annotated[Path, typer.Option(help="JSON to write: use it as weighted(OUT).")],
    target_rate: Annotated[float | None, typer.Option(
        min=0.0, max=1.0, help="Calibrate for this retrieval rate (default: best accuracy)."
    )] = None,
) -> None:
    """Fit a Weighted gate (logistic regression of 'closed-book answer wrong' on the gates'
    scores) from eval-gate decisions on calibration rows; use it as weighted(OUT)."""
    from rag_gates._io import write_text_atomic
    from rag_gates_lab.compose import fit_weighted_from_runs

    try:
        fitted = fit_weighted_from_runs(run, labels, target_rate=target_rate)
    except (ValueError, FileNotFoundError) as exc:
        console.print(error_line(exc))
        raise typer.Exit(2) from exc
    write_text_atomic(out, json.dumps(fitted, indent=2))
    weights = ", ".join(f"{g} {w:+.3f}" for g, w in zip(fitted["gates"], fitted["weights"],
                                                         strict=True))
    console.print(f"weights {weights}, bias {fitted['bias']:+.3f}, threshold "
                  f"{fitted['threshold']:.3f} on {fitted['fitted_on']['rows']} rows -> {out}")
    console.print(f'use it as --gate "weighted({out})" or selective@weighted({out})')


def report(
    runs: Annotated[list[Path], typer.Argument(help="Bench and/or eval-gate directories.")],
    out: Annotated[Path, typer.Option(help="Report directory.")] = Path("report"),
    title: Annotated[str, typer.Option()] = "rag-gates report",
    doc: Annotated[Path | None, typer.Option(
        help="Also put the report into this markdown page, between its "
             "'<!-- BEGIN rag-gates report' and '<!-- END rag-gates report -->' lines "
             "(the rest of the page is kept).")] = None,
    paired: Annotated[bool, typer.Option(
        help="Report each dataset's bench runs on the questions that every method of every "
             "run on it answered: a run stopped part-way compares with the others on the "
             "same questions.")] = False,
) -> None:
    """Write a markdown report with a table and PNG plots for bench/eval-gate directories."""
    from rag_gates_lab.report import update_document, write_report

    try:
        path = write_report(runs, out, title=title, paired=paired)
        if doc is not None:
            console.print(f"updated {update_document(doc, path)}")
    except (FileNotFoundError, ValueError) as exc:
        console.print(error_line(exc))
        raise typer.Exit(2) from exc
    console.print(f"wrote {path}")


def _check_output_dir(out: Path) -> None:
    """--out must be a directory that can be made: said before any model loads."""
    from rag_gates._io import output_path_problem

    problem = output_path_problem(out, directory=True)
    if problem is not None:
        raise typer.BadParameter(problem, param_hint="'--out'")


def _check_names(*checks: Callable[[], None]) -> None:
    """Run the name checks before anything loads: an unknown name ends the command with the
    valid ones (exit 2), in seconds rather than after the model has answered."""
    try:
        for check in checks:
            check()
    except (ValueError, OSError) as exc:  # OSError: weighted(FILE) without its file
        console.print(error_line(exc), highlight=False, soft_wrap=True)
        raise typer.Exit(2) from exc
