"""``rag-gates cbdr ...``: train a confidence probe, build preference data, fine-tune a reranker.

Added to ``rag-gates`` by the lab (:func:`rag_gates_lab.cli.register`)::

    rag-gates cbdr train-probe --dataset popqa [--dataset hotpotqa] --out DIR
    rag-gates cbdr build-preferences --dataset hotpotqa --out prefs.jsonl
    rag-gates cbdr train-reranker --preferences prefs.jsonl --out DIR

Expected failures (missing data, a probe for another model, one-class labels) print one red
line saying what to do and exit with status 1.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rag_gates.commands._help import clean_errors
from rag_gates.types import QAExample

__all__ = ["cbdr_app", "clean_errors", "load_example_groups", "load_examples"]

cbdr_app = typer.Typer(
    rich_markup_mode="rich",  # help texts escape brackets as \[
    help="CBDR: train a hidden-state confidence probe, build preference data from it, and "
         "fine-tune a cross-encoder reranker on those preferences.",
    no_args_is_help=True, add_completion=False)
console = Console()


def load_example_groups(dataset: list[str], n: list[int], offset: int, data: Path | None
                        ) -> list[tuple[str, list[QAExample]]]:
    """The questions of each ``--dataset`` (repeatable), under the name it was given, with
    ``--n`` given once for all or once per dataset, after ``--offset`` valid rows; a dataset
    with none left is an error. The names matter: ``testbed-probe:DIR`` questions all say
    ``dataset="testbed"``, but only the given name finds their retrieval corpus."""
    from rag_gates_lab.datasets import load_dataset

    counts = list(n)
    if len(counts) == 1:
        counts *= len(dataset)
    if len(counts) != len(dataset):
        raise ValueError(f"give --n once, or once per --dataset ({len(dataset)} times); "
                         f"got {len(counts)}")
    groups: list[tuple[str, list[QAExample]]] = []
    for name, count in zip(dataset, counts, strict=True):
        load = load_dataset(name, data, n=count, offset=offset)
        if not load.examples:
            raise ValueError(f"no {name} questions after offset {offset}; lower --offset")
        groups.append((name, list(load.examples)))
    return groups


def load_examples(dataset: list[str], n: list[int], offset: int, data: Path | None
                  ) -> list[QAExample]:
    """:func:`load_example_groups`, flattened in order."""
    return [e for _, group in load_example_groups(dataset, n, offset, data) for e in group]


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
    from rag_gates.lm.defaults import load_lm

    with clean_errors():
        prompts = ProbePrompts.model_validate({"style": prompt_style})
        counts = list(n or [800])
        examples = load_examples(dataset, counts, offset, data)
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


@cbdr_app.command("build-preferences")
def build_preferences_command(
    out: Annotated[Path, typer.Option(
        help="JSONL file to write (resumed if it exists; skips go to FILE.state).")],
    dataset: Annotated[str, typer.Option(
        help="Dataset whose rows carry candidate paragraphs: hotpotqa or 2wiki.")] = "hotpotqa",
    n: Annotated[int, typer.Option(min=1, help="Questions.")] = 300,
    offset: Annotated[int, typer.Option(
        min=0, help="Questions skipped first (keep the ones you evaluate on apart).")] = 500,
    data: Annotated[Path | None, typer.Option(help="Dataset file or directory.")] = None,
    model: Annotated[str, typer.Option(help="'default' or an HF path/id.")] = "default",
    probe: Annotated[Path | None, typer.Option(
        help="Probe directory (train-probe --out); default $RAG_GATES_CBDR_PROBE or the "
             "shipped SmolLM2 probe.")] = None,
    max_pos: Annotated[int, typer.Option(min=1, help="Positives (Inc > 0) per question.")] = 5,
    max_neg: Annotated[int, typer.Option(min=1, help="Negatives (Inc < 0) per question.")] = 5,
    batch_size: Annotated[int, typer.Option(min=1, help="Prompts per forward pass.")] = 4,
    max_passage_tokens: Annotated[int, typer.Option(
        min=1, help="Longer passages are cut to their first this-many tokens.")] = 512,
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads.")] = None,
) -> None:
    """Rank each question's paragraphs by Inc = Conf(q + c) - Conf(q) and write up to
    --max-pos positives and --max-neg negatives per question. Resumes if interrupted."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from rag_gates.cbdr.preferences import build_preferences
    from rag_gates.cbdr.probe import ConfidenceProbe
    from rag_gates.cbdr.rerank import ConfidenceGainReranker
    from rag_gates.cbdr.shipped import load_default_probe
    from rag_gates.lm.defaults import load_lm
    from rag_gates_lab.datasets import load_dataset

    with clean_errors():
        examples = load_dataset(dataset, data, n=n, offset=offset).examples
        if not examples:
            raise ValueError(f"no {dataset} questions after offset {offset}; lower --offset")
        with console.status(f"loading {model}"):
            lm = load_lm(model, num_threads=threads)
        chosen = ConfidenceProbe.load(probe, lm=lm) if probe is not None else \
            load_default_probe(lm)
        reranker = ConfidenceGainReranker(lm, chosen, batch_size=batch_size,
                                          max_passage_tokens=max_passage_tokens)
        with Progress("[progress.description]{task.description}", BarColumn(),
                      MofNCompleteColumn(), TimeRemainingColumn(), console=console) as bar:
            task = bar.add_task("scoring passages", total=len(examples))

            def progress(done: int, total: int, records: int) -> None:
                bar.update(task, completed=done, total=total,
                           description=f"scoring passages ({records} records)")

            stats = build_preferences(reranker, examples, max_pos=max_pos, max_neg=max_neg,
                                      out=out, progress=progress)
    console.print(
        f"[bold]{stats.records} records[/] in {out} ({stats.written} new, "
        f"{stats.already_written} already there) from {stats.questions} questions; skipped "
        f"{stats.skipped_no_pos} with no passage raising the confidence, "
        f"{stats.skipped_no_neg} with none lowering it, {stats.skipped_no_context} without "
        f"passages; {stats.seconds:.0f} s")


@cbdr_app.command("train-reranker")
def train_reranker_command(
    preferences: Annotated[Path, typer.Option(help="JSONL from build-preferences.")],
    out: Annotated[Path, typer.Option(
        help="Directory for the fine-tuned cross-encoder (a previous one is replaced).")],
    base: Annotated[str | None, typer.Option(
        help="Local checkpoint to start from (a cross-encoder such as bge-reranker, or a "
             "BERT-like encoder); default the embedded all-MiniLM-L6-v2.")] = None,
    epochs: Annotated[int, typer.Option(min=1)] = 1,
    lr: Annotated[float, typer.Option(min=0.0, help="AdamW peak learning rate.")] = 6e-5,
    weight_decay: Annotated[float, typer.Option(min=0.0)] = 0.01,
    batch_size: Annotated[int, typer.Option(min=1, help="Rows (query, positive) per step.")
                          ] = 8,
    num_negatives: Annotated[int, typer.Option(
        min=1, help="Hard negatives per positive (repeated when a record has fewer).")] = 4,
    max_length: Annotated[int, typer.Option(min=8, help="Tokens per (query, passage).")] = 256,
    seed: Annotated[int, typer.Option()] = 0,
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads.")] = None,
) -> None:
    """Fine-tune a cross-encoder on the preferences with InfoNCE (one positive against its
    hard negatives); use it with CrossEncoderReranker(DIR) or the cbdr-ce bench method."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from rag_gates.cbdr.finetune import train_reranker

    with clean_errors():
        if not preferences.is_file():
            raise FileNotFoundError(
                f"preference file {preferences} not found; build one with: rag-gates cbdr "
                "build-preferences --dataset hotpotqa --out FILE")
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        with Progress("[progress.description]{task.description}", BarColumn(),
                      MofNCompleteColumn(), TimeRemainingColumn(), console=console) as bar:
            task = bar.add_task("training", total=None)

            def progress(step: int, total: int, loss: float) -> None:
                bar.update(task, completed=step, total=total,
                           description=f"training (loss {loss:.3f})")

            training = train_reranker(
                preferences, out, base=base, epochs=epochs, lr=lr, weight_decay=weight_decay,
                batch_size=batch_size, num_negatives=num_negatives, max_length=max_length,
                seed=seed, progress=progress)
    curve = " -> ".join(f"{x:.4f}" for x in training.epoch_loss)
    console.print(
        f"[bold]final loss {training.final_loss:.4f}[/] (mean per epoch {curve}; "
        f"{training.records} records, {training.rows} rows, {training.steps} steps, "
        f"{training.seconds:.0f} s) -> {out}")
