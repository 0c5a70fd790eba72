"""``rag-gates srrag ...``: label training questions by their better knowledge source, build
the kNN policy datastore from the labels, and export them as SFT / DPO records for TRL.

Added to ``rag-gates`` by the lab (:func:`rag_gates_lab.cli.register`)::

    rag-gates srrag label --dataset popqa --n 300 --dataset pubmedqa --n 150 --out labels.jsonl
    rag-gates srrag build-policy --labels labels.jsonl --path ~/.cache/rag-gates/srrag/policy
    rag-gates srrag export --labels labels.jsonl --stage1 stage1.jsonl --dpo dpo.jsonl

Expected failures (missing data, a label file written with other settings, a datastore of
another model) print one red line saying what to do and exit with status 1.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from rag_gates.commands._help import clean_errors
from rag_gates_lab.commands.cbdr import load_example_groups

__all__ = ["srrag_app"]

srrag_app = typer.Typer(
    rich_markup_mode="rich",  # help texts escape brackets as \[
    help="SR-RAG: label questions by the knowledge source that helps the model more "
         "(retrieval or its own verbalized knowledge), build the kNN source policy, and "
         "export the labels as TRL training data.",
    no_args_is_help=True, add_completion=False)
console = Console()
#: ``--labels``, repeatable (build-policy, export).
_LabelFiles = Annotated[list[Path], typer.Option(help="Label file(s) from 'srrag label'.")]


@srrag_app.callback()
def _group() -> None:
    """SR-RAG commands (always a command group, whatever the number of commands)."""


def _read_label_files(files: list[Path], rule: str | None
                      ) -> tuple[list[tuple[Path, dict[str, Any]]], list[Any]]:
    """Each file's settings line, and all their labels (``rule``: recomputed under it)."""
    from rag_gates.srrag.labels import read_labels

    if rule is not None and rule not in ("sum", "top-n"):
        raise ValueError(f"--rule must be 'sum' or 'top-n', got {rule!r}")
    headers, rows = [], []
    for file in files:
        header, read = read_labels(file, rule)  # type: ignore[arg-type]
        headers.append((file, header))
        rows.extend(read)
    return headers, rows


def _check_labeller(headers: list[tuple[Path, dict[str, Any]]], lm: Any, advice: str) -> None:
    """Refuse labels another model wrote (its preferences, its verbalizations)."""
    for file, header in headers:
        if header.get("model_id") != lm.model_id:
            raise ValueError(
                f"{file} holds the preferences of {header.get('model_id')!r}, not of "
                f"{lm.model_id!r}: {advice}, or pass --model {header.get('model_id')}")


@srrag_app.command("label")
def label_command(
    out: Annotated[Path, typer.Option(
        help="JSONL label file (resumed if it exists; refused if written with other "
             "settings).")],
    dataset: Annotated[list[str], typer.Option(
        help="Dataset(s) to label (repeat to mix): popqa, pubmedqa, hotpotqa, 2wiki.")],
    n: Annotated[list[int] | None, typer.Option(
        min=1, help="Questions per dataset: once for all, or once per --dataset in order "
                    "(default 300).")] = None,
    offset: Annotated[int, typer.Option(
        min=0, help="Questions skipped first (keep the ones you evaluate on apart).")] = 500,
    data: Annotated[Path | None, typer.Option(help="Dataset file or directory.")] = None,
    model: Annotated[str, typer.Option(help="'default' or an HF path/id.")] = "default",
    retriever: Annotated[str, typer.Option(
        help="bm25 or dense, over each dataset's union corpus (as rag-gates bench).")] = "bm25",
    n_retrieved: Annotated[int, typer.Option(min=1, help="Retrieved passages per question."
                                             )] = 5,
    n_verbalized: Annotated[int, typer.Option(
        min=1, help="Verbalizations per question (the first greedy, the others sampled)."
    )] = 2,
    temperature: Annotated[float, typer.Option(
        min=0.01, help="Temperature of the sampled verbalizations.")] = 0.7,
    seed: Annotated[int, typer.Option(help="Seed of the first sampled verbalization.")] = 0,
    max_verbalize_tokens: Annotated[int, typer.Option(
        min=1, help="Token cap of a verbalization (the paper's 150).")] = 150,
    rule: Annotated[str, typer.Option(
        help="'sum' (summed likelihood, Algorithm 1) or 'top-n' (majority of the top n).")
    ] = "sum",
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads.")] = None,
) -> None:
    """Label each question by the source (retrieved passages or the model's own verbalized
    knowledge) under which the model finds the gold answer more likely. Resumable."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from rag_gates.lm.defaults import load_lm
    from rag_gates.srrag.labels import RETRIEVAL, LabelConfig, collect_labels
    from rag_gates.srrag.verbalizer import VerbalizerConfig
    from rag_gates_lab.corpus import load_retriever

    with clean_errors():
        config = LabelConfig.model_validate({
            "n_retrieved": n_retrieved, "n_verbalized": n_verbalized,
            "temperature": temperature, "seed": seed, "rule": rule,
            "verbalizer": VerbalizerConfig(max_new_tokens=max_verbalize_tokens)})
        groups = load_example_groups(dataset, n or [300], offset, data)
        with console.status(f"loading {model}"):
            lm = load_lm(model, num_threads=threads)
        labels = []
        start = time.perf_counter()
        with Progress("[progress.description]{task.description}", BarColumn(),
                      MofNCompleteColumn(), TimeRemainingColumn(), console=console) as bar:
            task = bar.add_task("labelling", total=sum(len(g) for _, g in groups))
            done_before = 0
            for name, part in groups:  # by the name given: it finds the corpus
                source = load_retriever(name, retriever, data)

                def progress(done: int, total: int, retrieval: int,
                             base: int = done_before, name: str = name) -> None:
                    bar.update(task, completed=base + done,
                               description=f"labelling {name} (retrieval preferred "
                                           f"{retrieval}/{done})")

                labels.extend(collect_labels(lm, source, part, config, out,
                                             progress=progress))
                done_before += len(part)
    wall = time.perf_counter() - start
    for name in dict.fromkeys(lb.dataset for lb in labels):
        rows = [lb for lb in labels if lb.dataset == name]
        share = 100 * sum(lb.source == RETRIEVAL for lb in rows) / len(rows)
        seconds = statistics.median(lb.seconds for lb in rows)
        capped = sum(c.hit_token_cap for lb in rows for c in lb.contexts)
        console.print(f"[bold]{name}[/]: {len(rows)} questions, retrieval preferred "
                      f"{share:.1f}%, verbalization {100 - share:.1f}% (rule {rule}); "
                      f"{seconds:.1f} s per question (median); {capped} verbalizations hit "
                      "the token cap")
    console.print(f"{len(labels)} labels in {out} ({wall:.0f} s this run)")


@srrag_app.command("build-policy")
def build_policy_command(
    labels: _LabelFiles,
    path: Annotated[Path | None, typer.Option(
        help="Local Qdrant directory (default $RAG_GATES_HOME/srrag/policy, or "
             ".../skr-policy for --keys minilm).")] = None,
    url: Annotated[str | None, typer.Option(
        help="A Qdrant server instead of --path (API key from QDRANT_API_KEY).")] = None,
    collection: Annotated[str, typer.Option(help="Collection name.")] = "srrag-policy",
    keys: Annotated[str, typer.Option(
        help="'hidden' (the model's hidden state of the last question token: SR-RAG) or "
             "'minilm' (MiniLM question embeddings: the SKR baseline).")] = "hidden",
    model: Annotated[str, typer.Option(help="'default' or an HF path/id (hidden keys).")
                     ] = "default",
    layer: Annotated[int | None, typer.Option(
        help="Hidden-state index of the key (default: the middle layer).")] = None,
    rule: Annotated[str | None, typer.Option(
        help="Recompute the preferred source under 'sum' or 'top-n' (default: as labelled)."
    )] = None,
    replace: Annotated[bool, typer.Option(
        help="Drop the collection first (needed to change model, layer or keys).")] = False,
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads.")] = None,
) -> None:
    """Build (or grow) the kNN source policy from labelled questions: one point per
    question, keyed by the chosen key, valued by its preferred source."""
    from rag_gates.srrag.labels import RETRIEVAL
    from rag_gates.srrag.policy import (
        EmbeddingKeys,
        HiddenStateKeys,
        KeyFunction,
        SourcePolicy,
        default_policy_path,
    )

    with clean_errors():
        if keys not in ("hidden", "minilm"):
            raise ValueError(f"--keys must be 'hidden' or 'minilm', got {keys!r}")
        if url is not None:  # before the model loads; never shown with its secrets
            from rag_gates._http import check_api_key, check_server_url

            check_server_url(url, "--url", "Put the API key in the environment variable "
                             "QDRANT_API_KEY.")
            if os.environ.get("QDRANT_API_KEY") is not None:  # refused now, not after load
                check_api_key(os.environ["QDRANT_API_KEY"], "QDRANT_API_KEY")
        headers, rows = _read_label_files(labels, rule)
        if not rows:
            raise ValueError(f"no labelled questions in {', '.join(map(str, labels))}")
        start = time.perf_counter()
        key_function: KeyFunction
        if keys == "hidden":
            from rag_gates.lm.defaults import load_lm

            with console.status(f"loading {model}"):
                lm = load_lm(model, num_threads=threads)
            _check_labeller(headers, lm, "label with this model")
            key_function = HiddenStateKeys(lm, layer)
        else:
            key_function = EmbeddingKeys()
        where = url or str(path or default_policy_path("hidden" if keys == "hidden"
                                                       else "embedding"))
        client = SourcePolicy.connect(None if url else where, url,
                                      api_key=os.environ.get("QDRANT_API_KEY"))
        try:
            if replace and client.collection_exists(collection):
                client.delete_collection(collection)
            policy = SourcePolicy.open(key_function, collection=collection, client=client)
            policy.location = where
            with console.status(f"keying {len(rows)} questions"):
                policy.add_labels(rows)
            size = len(policy)
        finally:
            client.close()  # a local path stays locked while a client holds it
    retrieval = sum(lb.source == RETRIEVAL for lb in rows)
    console.print(
        f"[bold]{size} questions[/] in {collection!r} at {where} ({len(rows)} added: "
        f"{retrieval} retrieval, {len(rows) - retrieval} parametric; keys "
        f"{key_function.identity}; {time.perf_counter() - start:.0f} s)")


@srrag_app.command("routing-auroc")
def routing_auroc_command(
    labels: Annotated[Path, typer.Option(
        help="Labels of the EVALUATION questions ('srrag label' on them): the truth is "
             "'retrieval beats verbalization'. Keep them out of the datastore.")],
    out: Annotated[Path, typer.Option(help="JSON file for the results.")],
    gate: Annotated[list[str] | None, typer.Option(
        help="Gate(s) to score (repeat; any registered gate or NAME:THRESHOLD); default "
             "srrag, srrag-no-knn, srrag-knn-only, skr.")] = None,
    model: Annotated[str, typer.Option(help="'default' or an HF path/id.")] = "default",
    rule: Annotated[str | None, typer.Option(help="Recompute labels under 'sum' or 'top-n'.")
                    ] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads.")] = None,
) -> None:
    """Source-selection AUROC: does each gate's score predict that retrieval beats the
    model's verbalized knowledge (the paper: 0.497 selective RAG, 0.570 SR-RAG)?"""
    import json
    import math

    from rag_gates._io import write_text_atomic
    from rag_gates.gate import UNDECIDED_SCORE
    from rag_gates.lm.defaults import load_lm
    from rag_gates.methods import MethodContext
    from rag_gates.registry import make_gate
    from rag_gates.srrag.labels import RETRIEVAL, read_labels
    from rag_gates_lab.metrics import auroc
    from rag_gates_lab.plugins.quco import bench_gate_settings

    with clean_errors():
        if rule is not None and rule not in ("sum", "top-n"):
            raise ValueError(f"--rule must be 'sum' or 'top-n', got {rule!r}")
        header, rows = read_labels(labels, rule)  # type: ignore[arg-type]
        if not rows:
            raise ValueError(f"{labels} holds no labelled questions")
        with console.status(f"loading {model}"):
            lm = load_lm(model, num_threads=threads)
        truth = [int(r.source == RETRIEVAL) for r in rows]
        results: dict[str, object] = {
            "labels": str(labels), "label_settings": header, "rule": rule or "as labelled",
            "questions": len(rows), "retrieval_better_share": sum(truth) / len(truth),
            "ids": [[r.dataset, r.id] for r in rows], "gates": {}}
        for name in gate or ["srrag", "srrag-no-knn", "srrag-knn-only", "skr"]:
            start = time.perf_counter()
            scores, retrieved, undecided = [], 0, 0
            scorers: dict[str, Any] = {}  # one gate per dataset (some read its prompt)
            for row in rows:
                if row.dataset not in scorers:
                    scorers[row.dataset] = make_gate(name, MethodContext(
                        lm=lm, dataset=row.dataset, **bench_gate_settings(row.dataset)))
                decision = scorers[row.dataset].decide(row.question)
                undecided += decision.score >= UNDECIDED_SCORE
                scores.append(math.inf if decision.score >= UNDECIDED_SCORE
                              else decision.score)
                retrieved += decision.retrieve
            value = auroc(scores, truth)
            # Per dataset too: datasets differ in which source wins (a key that only tells
            # them apart already scores well on the mix).
            by_dataset = {}
            for dataset in sorted({r.dataset for r in rows}):
                picked = [i for i, r in enumerate(rows) if r.dataset == dataset]
                by_dataset[dataset] = {
                    "questions": len(picked),
                    "retrieval_better_share": sum(truth[i] for i in picked) / len(picked),
                    "auroc": auroc([scores[i] for i in picked], [truth[i] for i in picked])}
            results["gates"][name] = {  # type: ignore[index]
                "auroc": value, "retrieval_rate": retrieved / len(rows),
                "undecided": undecided, "by_dataset": by_dataset,
                "ms_per_question": 1000 * (time.perf_counter() - start) / len(rows),
                "scores": [None if math.isinf(v) else v for v in scores]}
            per = ", ".join(f"{d} {v['auroc']:.3f}" for d, v in by_dataset.items())
            console.print(f"[bold]{name}[/]: AUROC {value:.3f} ({per}), retrieval rate "
                          f"{100 * retrieved / len(rows):.1f}% ({undecided} undecided)")
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, json.dumps(results, indent=2))
    console.print(f"{len(rows)} questions, retrieval better for "
                  f"{100 * sum(truth) / len(truth):.1f}% -> {out}")


@srrag_app.command("export")
def export_command(
    labels: _LabelFiles,
    stage1: Annotated[Path | None, typer.Option(
        help="Write stage-1 SFT records here ({input_ids, labels}: source word, the "
             "verbalization when parametric, the answer trained; passages masked).")] = None,
    dpo: Annotated[Path | None, typer.Option(
        help="Write stage-2 DPO pairs here ({prompt, chosen, rejected}: best over worst "
             "verbalization of the parametric-preferred questions).")] = None,
    model: Annotated[str, typer.Option(
        help="The model that wrote the labels and is to be trained ('default' or an HF "
             "path/id): its tokenizer and chat template shape the records.")] = "default",
    rule: Annotated[str | None, typer.Option(
        help="Recompute the preferred source under 'sum' or 'top-n' (default: as labelled)."
    )] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads.")] = None,
) -> None:
    """Turn source labels into SR-RAG's two-stage training data for TRL's SFTTrainer and
    DPOTrainer."""
    from rag_gates.lm.defaults import load_lm
    from rag_gates.srrag.export import export_stage1, export_stage2_dpo

    with clean_errors():
        if stage1 is None and dpo is None:
            raise ValueError("nothing to write: give --stage1 FILE and/or --dpo FILE")
        headers, rows = _read_label_files(labels, rule)
        with console.status(f"loading {model}"):
            lm = load_lm(model, num_threads=threads)
        _check_labeller(headers, lm, "SR-RAG trains a model on its own labels")
        for kind, path, export in (("stage 1", stage1, export_stage1),
                                   ("DPO", dpo, export_stage2_dpo)):
            if path is not None:
                counts = export(rows, lm, path)
                skipped = ", ".join(f"{n} {why.replace('_', ' ')}"
                                    for why, n in sorted(counts.skipped.items()))
                console.print(f"[bold]{kind}: {counts.records} records[/] from "
                              f"{counts.labels} labels (skipped: {skipped or 'none'}) "
                              f"-> {path}")
