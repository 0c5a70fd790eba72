"""``rag-gates cbdr ...``: train a confidence probe, build preference data, fine-tune a reranker.

Registered by the main CLI as ``app.add_typer(cbdr_app, name="cbdr")``::

    rag-gates cbdr train-probe --dataset popqa [--dataset hotpotqa] --out DIR
    rag-gates cbdr build-preferences --dataset hotpotqa --out prefs.jsonl
    rag-gates cbdr train-reranker --preferences prefs.jsonl --out DIR

Expected failures (missing data, a probe for another model, one-class labels) print one red
line saying what to do and exit with status 1.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rag_gates.errors import RagGatesError

__all__ = ["cbdr_app"]

cbdr_app = typer.Typer(
    help="CBDR: train a hidden-state confidence probe, build preference data from it, and "
         "fine-tune a cross-encoder reranker on those preferences.",
    no_args_is_help=True, add_completion=False)
console = Console()
err_console = Console(stderr=True)


@contextmanager
def clean_errors() -> Iterator[None]:
    """Expected errors become one red line and exit status 1."""
    try:
        yield
    except (RagGatesError, FileNotFoundError, ImportError, ValueError) as exc:
        err_console.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


@cbdr_app.command("train-probe")
def train_probe_command(
    out: Annotated[Path, typer.Option(help="Directory to write probe.safetensors + probe.json.")],
    dataset: Annotated[list[str], typer.Option(
        help="Dataset(s) to label (repeat the option to mix): hotpotqa, 2wiki, popqa, "
             "pubmedqa.")],
    model: Annotated[str, typer.Option(help="'default' or an HF path/id.")] = "default",
    n: Annotated[list[int] | None, typer.Option(
        min=4, help="Questions per dataset: once for all, or once per --dataset in order "
                    "(default 800).")] = None,
    offset: Annotated[int, typer.Option(
        min=0, help="Questions skipped first (keep the ones you evaluate on apart).")] = 500,
    data: Annotated[Path | None, typer.Option(help="Dataset file or directory.")] = None,
    layer: Annotated[int | None, typer.Option(
        help="Hidden-state index (0 = embeddings); default the middle layer.")] = None,
    position: Annotated[int, typer.Option(help="Prompt position (-1 = last token).")] = -1,
    prompt_style: Annotated[str, typer.Option(
        help="'paper' (the CBDR paper's prompts) or 'rag-gates' (the bench's).")] = "paper",
    label_max_new_tokens: Annotated[int, typer.Option(
        min=1, max=512, help="Token budget of the greedy answers that give the labels.")] = 64,
    dev_fraction: Annotated[float, typer.Option(
        min=0.05, max=0.5, help="Share of questions held out for early stopping.")] = 0.25,
    epochs: Annotated[int, typer.Option(min=1)] = 30,
    lr: Annotated[float, typer.Option(min=0.0)] = 5e-5,
    seed: Annotated[int, typer.Option()] = 0,
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads.")] = None,
) -> None:
    """Label questions by the model's own greedy answers, read one hidden state per question,
    and train the MLP probe (best dev AUROC kept). Collection resumes if interrupted."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from rag_gates.cbdr.data import as_tensors, collect_probe_data, default_cache_path
    from rag_gates.cbdr.probe import ProbeConfig, default_layer, train_probe
    from rag_gates.cbdr.prompts import ProbePrompts
    from rag_gates.eval.datasets import load_dataset
    from rag_gates.lm.defaults import load_lm

    with clean_errors():
        prompts = ProbePrompts.model_validate({"style": prompt_style})
        counts = list(n or [800])
        if len(counts) == 1:
            counts *= len(dataset)
        if len(counts) != len(dataset):
            raise ValueError(f"give --n once, or once per --dataset ({len(dataset)} times); "
                             f"got {len(counts)}")
        examples = []
        for name, count in zip(dataset, counts, strict=True):
            load = load_dataset(name, data, n=count, offset=offset)
            examples.extend(load.examples)
        with console.status(f"loading {model}"):
            lm = load_lm(model, num_threads=threads)
        chosen = default_layer(lm) if layer is None else layer
        lm._check_hidden_layers([chosen])
        cache = default_cache_path(lm, prompts, chosen, position=position,
                                   max_new_tokens=label_max_new_tokens)
        start = time.perf_counter()
        with Progress("[progress.description]{task.description}", BarColumn(),
                      MofNCompleteColumn(), TimeRemainingColumn(), console=console) as bar:
            task = bar.add_task("labelling", total=len(examples))

            def progress(done: int, total: int, right: int) -> None:
                bar.update(task, completed=done,
                           description=f"labelling (right so far {right}/{done})")

            collected = collect_probe_data(lm, examples, prompts, chosen, position=position,
                                           max_new_tokens=label_max_new_tokens, cache=cache,
                                           progress=progress)
        collect_s = time.perf_counter() - start
        order = list(range(len(collected)))
        random.Random(seed).shuffle(order)
        cut = max(2, int(len(order) * dev_fraction))
        dev = [collected[i] for i in order[:cut]]
        train = [collected[i] for i in order[cut:]]
        train_x, train_y = as_tensors(train)
        dev_x, dev_y = as_tensors(dev)
        config = ProbeConfig(
            model_id=lm.model_id, hidden_size=lm.hidden_size, num_layers=lm.num_layers,
            layer=chosen, position=position, prompts=prompts,
            label_max_new_tokens=label_max_new_tokens,
            trained_on={"datasets": list(dataset), "n": counts, "offset": offset,
                        "dev_fraction": dev_fraction, "seed": seed,
                        "questions": len(collected)})
        with Progress("[progress.description]{task.description}", BarColumn(),
                      MofNCompleteColumn(), console=console) as bar:
            task = bar.add_task("training", total=epochs)

            def epoch_progress(done: int, total: int, dev_auroc: float) -> None:
                bar.update(task, completed=done,
                           description=f"training (dev AUROC {dev_auroc:.3f})")

            probe, training = train_probe(config, train_x, train_y, dev_x, dev_y,
                                          epochs=epochs, lr=lr, seed=seed,
                                          progress=epoch_progress)
        probe.config = probe.config.model_copy(update={"metrics": {
            **probe.config.metrics, "collect_seconds": round(collect_s, 1),
            "positive_rate": sum(e.correct for e in collected) / len(collected)}})
        probe.save(out)
    console.print(
        f"[bold]dev AUROC {training.best_dev_auroc:.3f}[/] (epoch {training.best_epoch}/"
        f"{epochs}; {training.train_examples} train / {training.dev_examples} dev questions, "
        f"{100 * training.train_positive_rate:.1f}% answered right; labels {collect_s:.0f} s, "
        f"training {training.seconds:.1f} s) -> {out}")
