"""``rag-gates testbed ...``: build the knowledge-controlled testbed and tabulate it.

Added to ``rag-gates`` by the lab (:func:`rag_gates_lab.cli.register`)::

    rag-gates testbed build --out ~/.cache/rag-gates/testbeds/tb1 --threads 1
    rag-gates bench --dataset testbed:DIR --model DIR/model --methods no-rag --n 1000 --out R1
    rag-gates testbed table R1 [R0 ...] --out benchmarks/results/testbed/validation.json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rag_gates_lab.commands.cbdr import clean_errors
from rag_gates_lab.testbed.build import UNKNOWN_VERBALIZATION, TestbedConfig

# The options' defaults are the configuration's own (one place to change them).
_DEFAULT = TestbedConfig()

__all__ = ["testbed_app"]

testbed_app = typer.Typer(
    rich_markup_mode="rich",  # help texts escape brackets as \[
    help="The knowledge-controlled testbed: the embedded model taught PopQA facts at known "
         "repetition counts (docs/testbed.md).",
    no_args_is_help=True, add_completion=False)
console = Console()


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}") from exc


@testbed_app.command("build")
def build_command(
    out: Annotated[Path, typer.Option(help="Testbed directory (created; resumed if it "
                                           "exists).")],
    base_model: Annotated[str, typer.Option(help="'default' or an HF model directory.")] =
        "default",
    n_facts: Annotated[int, typer.Option(min=1, help="Facts over all rungs and splits.")] =
        _DEFAULT.n_facts,
    ladder: Annotated[str, typer.Option(help="Repetition counts, comma-separated.")] =
        "0,2,8,32",
    splits: Annotated[str, typer.Option(help="Shares of probe, calibration, evaluation "
                                             "facts.")] = "0.25,0.15,0.6",
    general_paragraphs: Annotated[int, typer.Option(min=0, help="Wikipedia paragraphs "
                                                                "mixed in.")] =
        _DEFAULT.general_paragraphs,
    reading_examples: Annotated[int, typer.Option(
        min=0, help="Questions answered from passages (facts outside the manifest), so the "
                    "model keeps reading its context.")] = _DEFAULT.reading_examples,
    recall_examples: Annotated[int, typer.Option(
        min=0, help="Facts outside the manifest, stated --recall-repetitions times and asked "
                    "closed-book (--recall-question-repetitions times), so the model learns to "
                    "answer from what statements taught it.")] = _DEFAULT.recall_examples,
    recall_repetitions: Annotated[int, typer.Option(
        min=1, help="Statements per recall fact.")] = _DEFAULT.recall_repetitions,
    recall_question_repetitions: Annotated[int, typer.Option(
        min=1, help="Times each recall fact's closed-book question is in the corpus.")] =
        _DEFAULT.recall_question_repetitions,
    skill_reading: Annotated[int, typer.Option(
        min=0, help="Reading practice per method prompt form (DeepRAG's Context:, Tok-RAG's "
                    "\\[Reference]:, SR-RAG's verbalization, CBDR's paper prompt), facts "
                    "outside the manifest.")] = _DEFAULT.skill_reading,
    skill_decomposition: Annotated[int, typer.Option(
        min=0, help="Two-hop DeepRAG trajectories over facts outside the manifest, half "
                    "from memory, half retrieving a hop.")] = _DEFAULT.skill_decomposition,
    skill_hop_repetitions: Annotated[int, typer.Option(
        min=1, help="Statements of each decomposition hop answered from memory.")] =
        _DEFAULT.skill_hop_repetitions,
    skill_verbalization: Annotated[int, typer.Option(
        min=0, help="SR-RAG GenRead prompts for recall facts, answered with their taught "
                    "statements.")] = _DEFAULT.skill_verbalization,
    skill_twohop_reading: Annotated[int, typer.Option(
        min=0, help="Two-hop questions over facts outside the manifest in the benchmark's "
                    "QA prompt with both hops' passages, answered with the second hop's "
                    "answer.")] = _DEFAULT.skill_twohop_reading,
    skill_unknown: Annotated[int, typer.Option(
        min=0, help="SR-RAG GenRead prompts about subjects the corpus never mentions, "
                    f"answered '{UNKNOWN_VERBALIZATION.format(subject='SUBJECT')}'")] =
        _DEFAULT.skill_unknown,
    epochs: Annotated[float, typer.Option(min=0.01)] = _DEFAULT.epochs,
    lr: Annotated[float, typer.Option(help="Learning rate (AdamW, cosine).")] =
        _DEFAULT.learning_rate,
    batch_size: Annotated[int, typer.Option(min=1)] = _DEFAULT.batch_size,
    block_size: Annotated[int, typer.Option(min=16, help="Tokens per packed sequence.")] =
        _DEFAULT.block_size,
    save_steps: Annotated[int, typer.Option(min=1, help="Checkpoint every N steps.")] =
        _DEFAULT.save_steps,
    seed: Annotated[int, typer.Option()] = 0,
    precision: Annotated[str, typer.Option(  # a str: typer reads Literal only from 0.19
        help="fp32, or bf16: bfloat16 autocast over fp32 weights, about 1.6x faster a step "
             "on a CPU with AMX, 22x slower on one without bfloat16 units (the build "
             "warns).")] = _DEFAULT.precision,
    bridges: Annotated[bool, typer.Option(help="Teach purpose-written second hops (a "
                                               "birthplace for the person a fact names) and "
                                               "write two-hop questions over them.")] = True,
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads.")] = None,
    compile_model: Annotated[bool, typer.Option(
        "--compile/--no-compile", help="torch.compile the model for training (about 1.3x "
        "faster a step here after ~90 s of compiling; not part of the testbed's identity).")
    ] = False,
    plan_only: Annotated[bool, typer.Option(help="Write the manifest and corpora and print "
                                                 "the training cost (documents, tokens per "
                                                 "epoch, steps), no training.")] = False,
) -> None:
    """Choose facts, write the corpus and manifest, and continue training the model on it."""
    from rag_gates_lab.testbed.build import build_testbed, plan_figures, write_plan

    if precision not in ("fp32", "bf16"):
        raise typer.BadParameter(f"{precision!r} is not one of 'fp32', 'bf16'.",
                                 param_hint="'--precision'")
    with clean_errors():
        config = TestbedConfig(
            base_model=base_model, n_facts=n_facts, ladder=_ints(ladder),
            split_fractions=[float(x) for x in splits.split(",")],
            general_paragraphs=general_paragraphs, reading_examples=reading_examples,
            recall_examples=recall_examples, recall_repetitions=recall_repetitions,
            recall_question_repetitions=recall_question_repetitions,
            skill_reading=skill_reading, skill_decomposition=skill_decomposition,
            skill_hop_repetitions=skill_hop_repetitions,
            skill_verbalization=skill_verbalization,
            skill_twohop_reading=skill_twohop_reading, skill_unknown=skill_unknown,
            epochs=epochs, learning_rate=lr,
            batch_size=batch_size, block_size=block_size, save_steps=save_steps, seed=seed,
            precision=precision, bridges=bridges, threads=threads, compile=compile_model)
        if plan_only:
            counts = write_plan(config, out)
            console.print(f"planned {out}: {counts}")
            console.print_json(json.dumps(plan_figures(config)))
            return
        record = build_testbed(config, out)
    console.print(f"testbed model: {out / 'model'} ({record['steps']} steps, train loss "
                  f"{record['train_loss']:.3f}, {record.get('tokens_per_second') or 0:.0f} "
                  "tokens/s)")


@testbed_app.command("table")
def table_command(
    runs: Annotated[list[Path], typer.Argument(help="Bench directories run on testbed "
                                                    "datasets.")],
    out: Annotated[Path | None, typer.Option(help="Write the table as JSON here.")] = None,
) -> None:
    """Accuracy by repetition count for each (run, method): the testbed's knowledge ladder."""
    from rag_gates_lab.testbed.report import ladder_table

    with clean_errors():
        rows = ladder_table(runs)
    rungs = sorted({r for row in rows for r in row["by_repetitions"]}, key=int)
    table = Table(title="accuracy (%) by repetition count")
    for column in ("run", "model", "method", *(f"r={r}" for r in rungs), "all"):
        table.add_column(column)
    for row in rows:
        cells = [row["by_repetitions"].get(r) for r in rungs]
        table.add_row(row["run"], row["model"], row["method"],
                      *(f"{c['accuracy']:.1f} ({c['correct']}/{c['n']})" if c else "-"
                        for c in cells),
                      f"{row['all']['accuracy']:.1f} ({row['all']['n']})")
    console.print(table)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
        console.print(f"wrote {out}")
