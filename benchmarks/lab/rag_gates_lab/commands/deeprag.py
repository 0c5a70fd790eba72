"""``rag-gates deeprag ...``: synthesize DeepRAG training trajectories and export them.

Added to ``rag-gates`` by the lab (:func:`rag_gates_lab.cli.register`)::

    rag-gates deeprag synthesize --dataset hotpotqa --dataset 2wiki --n 150 --out rows.jsonl
    rag-gates deeprag export --rows rows.jsonl --sft sft.jsonl --dpo dpo.jsonl

Expected failures (missing data, a file written with other settings) print one red line
saying what to do and exit with status 1.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any, Literal, cast

import typer
from rich.console import Console

from rag_gates.commands._help import clean_errors

__all__ = ["deeprag_app"]

deeprag_app = typer.Typer(
    rich_markup_mode="rich",  # help texts escape brackets as \[
    help="DeepRAG: find the fewest-retrieval trajectory that reaches the gold answer for "
         "training questions (Algorithm 1), and export SFT / DPO records for TRL.",
    no_args_is_help=True, add_completion=False)
console = Console()


@deeprag_app.command("synthesize")
def synthesize_command(
    out: Annotated[Path, typer.Option(help="JSONL file of rows (resumed if it exists).")],
    dataset: Annotated[list[str], typer.Option(
        help="Dataset(s) to search (repeat to mix): hotpotqa, 2wiki, ...; each retrieves "
             "from its own corpus.")],
    n: Annotated[int, typer.Option(min=1, help="Questions per dataset.")] = 150,
    offset: Annotated[int, typer.Option(
        min=0, help="Questions skipped first (keep the evaluation rows apart).")] = 500,
    data: Annotated[Path | None, typer.Option(help="Dataset file or directory.")] = None,
    model: Annotated[str, typer.Option(help="'default' or an HF path/id.")] = "default",
    retriever: Annotated[str, typer.Option(help="bm25 or dense.")] = "bm25",
    k: Annotated[int, typer.Option(min=1, max=50, help="Passages per retrieval.")] = 3,
    max_steps: Annotated[int, typer.Option(min=0, max=50, help="Subqueries before the "
                                           "final answer is forced.")] = 6,
    max_expansions: Annotated[int, typer.Option(min=1, help="Search nodes popped per "
                                                "question before giving up.")] = 48,
    demonstration: Annotated[bool, typer.Option(
        help="Show the one-shot example in the prompt (for untrained models).")] = True,
    nudge: Annotated[bool, typer.Option(
        help="Ask a step with no marker again with 'Follow up:' written.")] = True,
    match: Annotated[str, typer.Option(help="containment (either way), accuracy or exact."
                                       )] = "containment",
    decomposition: Annotated[str, typer.Option(
        help="model: the model writes the subqueries (the paper's Algorithm 1); given: each "
             "row's own subqueries with their gold answers (the testbed's two-hop rows; a row "
             "without them is one subquery), for a model that cannot decompose yet.")
    ] = "model",
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads.")] = None,
    prefix_cache_mb: Annotated[float, typer.Option(
        min=0, help="MB of recent prompts' keys and values kept: the search's children share "
                    "their parent's prompt, so each prefills only its new tokens. 0: off. "
                    "Equal to an uncached run up to float rounding (about 1e-5)."
    )] = 256,
) -> None:
    """Search each question's trajectories by retrieval count (uniform-cost) until a final
    answer matches the gold; one row per question with its cost. Resumes if interrupted."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from rag_gates.deeprag.agent import DeepRAGConfig
    from rag_gates.deeprag.search import MatchRule, TrajectorySearch
    from rag_gates.deeprag.synthesis import SynthesisStats, synthesize
    from rag_gates.deeprag.trajectory import DEMONSTRATION, DeepRAGPrompt
    from rag_gates.lm.defaults import load_lm
    from rag_gates_lab.corpus import load_retriever
    from rag_gates_lab.datasets import load_dataset

    with clean_errors():
        if match not in ("containment", "accuracy", "exact"):
            raise ValueError(f"--match must be containment, accuracy or exact; got {match!r}")
        if decomposition not in ("model", "given"):
            raise ValueError(f"--decomposition must be model or given; got {decomposition!r}")
        loads = [(name, load_dataset(name, data, n=n, offset=offset).examples)
                 for name in dataset]
        for name, examples in loads:
            if not examples:
                raise ValueError(f"no {name} questions after offset {offset}; lower --offset")
        with console.status(f"loading {model}"):
            lm = load_lm(model, num_threads=threads, prefix_cache_mb=prefix_cache_mb)
        config = DeepRAGConfig(k=k, max_steps=max_steps, nudge=nudge, prompt=DeepRAGPrompt(
            demonstration=DEMONSTRATION if demonstration else None))
        total = sum(len(examples) for _, examples in loads)
        stats: list[SynthesisStats] = []
        with Progress("[progress.description]{task.description}", BarColumn(),
                      MofNCompleteColumn(), TimeRemainingColumn(), console=console) as bar:
            task = bar.add_task("searching", total=total)
            before = 0
            for name, examples in loads:
                search = TrajectorySearch(lm, load_retriever(name, retriever, data), config,
                                          max_expansions=max_expansions,
                                          match=cast(MatchRule, match))

                def progress(done: int, count: int, found: int, name: str = name,
                             before: int = before) -> None:
                    bar.update(task, completed=before + done,
                               description=f"searching {name} (found {found}/{done})")

                stats.append(synthesize(
                    search, examples, out, progress=progress,
                    decomposition=cast(Literal["model", "given"], decomposition)))
                before += len(examples)
    for name, s in zip(dataset, stats, strict=True):
        mean = "-" if s.mean_retrievals is None else f"{s.mean_retrievals:.2f}"
        console.print(
            f"[bold]{name}: {s.found}/{s.questions} found[/] ({100 * s.found_share:.1f}%; "
            f"{s.written} searched now, {s.already_written} resumed; {s.expansion_cap} hit "
            f"the cap of {max_expansions}); mean retrievals on the paths found {mean}, "
            f"{s.mean_expansions:.1f} expansions and {s.mean_seconds:.1f} s per question "
            f"-> {out}")


@deeprag_app.command("export")
def export_command(
    rows: Annotated[Path, typer.Option(help="JSONL rows from 'deeprag synthesize'.")],
    sft: Annotated[Path | None, typer.Option(
        help="Write pre-tokenised SFT records here ({input_ids, labels}; passages masked).")
    ] = None,
    dpo: Annotated[Path | None, typer.Option(
        help="Write step-wise DPO pairs here ({prompt, chosen, rejected}).")] = None,
    model: Annotated[str, typer.Option(
        help="The model to be trained ('default' or an HF path/id): its tokenizer and chat "
             "template shape the records.")] = "default",
    style: Annotated[str, typer.Option(help="Prompt style the trained model will be run "
                                       "with: chat or completion.")] = "chat",
    demonstration: Annotated[bool, typer.Option(
        help="Keep the one-shot example in the training prompts (default: the paper's "
             "instruction alone, which is what the trained model is then run with).")] = False,
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads.")] = None,
) -> None:
    """Turn synthesized trajectories into TRL SFTTrainer / DPOTrainer records."""
    from rag_gates.deeprag.export import export_dpo, export_sft
    from rag_gates.deeprag.synthesis import read_rows
    from rag_gates.deeprag.trajectory import DEMONSTRATION, DeepRAGPrompt
    from rag_gates.lm.defaults import load_lm

    with clean_errors():
        if sft is None and dpo is None:
            raise ValueError("nothing to write: give --sft FILE and/or --dpo FILE")
        fmt = DeepRAGPrompt.model_validate(
            {"style": style, "demonstration": DEMONSTRATION if demonstration else None})
        found = read_rows(rows)
        with console.status(f"loading {model}"):
            lm = load_lm(model, num_threads=threads)
        for kind, path, export in (("SFT", sft, export_sft), ("DPO", dpo, export_dpo)):
            if path is not None:
                stats = export(found, path, lm, fmt)
                console.print(f"[bold]{kind}: {stats.records} records[/] from "
                              f"{stats.trajectories} trajectories ({stats.rows} rows) -> {path}")


@deeprag_app.command("train")
def train_command(
    stage: Annotated[str, typer.Option(help="sft (trajectories) or dpo (decision pairs).")],
    out: Annotated[Path, typer.Option(help="Model directory to write (replaced if it "
                                      "exists).")],
    data: Annotated[Path | None, typer.Option(
        help="Records from 'deeprag export' (--sft or --dpo file).")] = None,
    rows: Annotated[Path | None, typer.Option(
        help="Instead of --data: rows from 'deeprag synthesize', exported for this stage "
             "with the model being trained (as 'deeprag export' does; the records are kept "
             "in OUT as STAGE-records.jsonl).")] = None,
    model: Annotated[str, typer.Option(
        help="'default' or an HF path/id: the model to train (for dpo, the SFT output).")
    ] = "default",
    lr: Annotated[float | None, typer.Option(
        min=0.0, help="Learning rate (default: SFT 1e-5, DPO 5e-7, the authors').")] = None,
    beta: Annotated[float, typer.Option(min=0.0, help="DPO beta.")] = 0.4,
    epochs: Annotated[float, typer.Option(min=0.0)] = 1.0,
    max_steps: Annotated[int, typer.Option(help="Stop after this many steps (-1: epochs).")
                         ] = -1,
    batch_size: Annotated[int, typer.Option(min=1)] = 1,
    grad_accum: Annotated[int, typer.Option(min=1)] = 1,
    seed: Annotated[int, typer.Option()] = 0,
    style: Annotated[str, typer.Option(help="The prompt style the records were exported "
                                       "with (written to deeprag.json).")] = "chat",
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads.")] = None,
) -> None:
    """Fine-tune with TRL (pip install "rag-gates\\[trl]"): SFT on the trajectories, then
    DPO on the step-wise decision pairs; writes a model directory that bench loads, with
    training.json (loss per step) and loss.png. From synthesis to a trained model is one
    command per stage with --rows:

        rag-gates deeprag train --stage sft --rows synth.jsonl --out models/deeprag-sft
        rag-gates deeprag train --stage dpo --rows synth.jsonl --model models/deeprag-sft \\
            --out models/deeprag-sft-dpo
    """
    from rag_gates.deeprag.export import export_dpo, export_sft
    from rag_gates.deeprag.synthesis import read_rows
    from rag_gates.deeprag.train import read_training_records, train_dpo, train_sft
    from rag_gates.deeprag.trajectory import DeepRAGPrompt
    from rag_gates.lm.defaults import load_lm

    with clean_errors():
        if stage not in ("sft", "dpo"):
            raise ValueError(f"--stage must be sft or dpo, got {stage!r}")
        if (data is None) == (rows is None):
            raise ValueError("give --data (records from 'deeprag export') or --rows (rows "
                             "from 'deeprag synthesize'), one of the two")
        prompt = DeepRAGPrompt.model_validate({"style": style})
        # A bad file fails before the model loads.
        found = read_rows(rows) if rows is not None else None
        if data is not None:
            read_training_records(data, "sft" if stage == "sft" else "dpo")
        with console.status(f"loading {model}"):
            lm = load_lm(model, num_threads=threads)
        with tempfile.TemporaryDirectory() as scratch:
            records = Path(scratch) / f"{stage}-records.jsonl" if data is None else data
            if found is not None:
                stats = (export_sft if stage == "sft" else export_dpo)(found, records, lm,
                                                                       prompt)
                console.print(f"{stage.upper()}: {stats.records} records from "
                              f"{stats.trajectories} trajectories ({stats.rows} rows)")
                if stats.records == 0:
                    raise ValueError(f"{rows} holds no trajectory to train on ({stats.rows} "
                                     "rows searched, none found): synthesize more questions")
            common: dict[str, Any] = {"epochs": epochs, "max_steps": max_steps,
                                      "batch_size": batch_size, "grad_accum": grad_accum,
                                      "seed": seed, "prompt": prompt}
            if stage == "sft":
                done = train_sft(lm, records, out, lr=1e-5 if lr is None else lr, **common)
            else:
                done = train_dpo(lm, records, out, beta=beta,
                                 lr=5e-7 if lr is None else lr, **common)
            if found is not None:  # the directory says what it was trained on
                shutil.copyfile(records, out / records.name)
        _plot_losses(done.losses, out / "loss.png", f"DeepRAG {stage.upper()} ({model})")
    last = f"{done.losses[-1][1]:.4f}" if done.losses else "-"
    console.print(f"[bold]{stage}: {done.steps} steps[/] on {done.records} records, final "
                  f"loss {last}, {done.seconds:.0f} s -> {out}")


def _plot_losses(losses: list[tuple[int, float]], path: Path, title: str) -> None:
    """The loss per step as a PNG (needs matplotlib, the eval extra; skipped without it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([s for s, _ in losses], [v for _, v in losses], marker=".")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
