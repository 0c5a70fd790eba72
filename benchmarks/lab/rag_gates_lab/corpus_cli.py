"""``rag-gates index from-datasets``: the corpus-statistics index of the QA datasets'
paragraphs, the one QuCo-RAG counts in on the benchmark (added to ``rag-gates index`` by
:func:`rag_gates_lab.cli.register`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rag_gates.corpus.cli import _clean_errors, _open, _print_json, _print_stats


def from_datasets(
    datasets: Annotated[str, typer.Option(
        help="Comma-separated dataset names whose context paragraphs are indexed.")
    ] = "hotpotqa,2wiki",
    data: Annotated[Path | None, typer.Option(
        help="Directory holding the data files (default: $RAG_GATES_DATA, ../shared/data, "
             "then the slices in examples/data); a file when one dataset is named.")] = None,
    tokenizer: Annotated[str, typer.Option(
        help="'default' (the embedded model's), a tokenizer.json, or a local model folder.")
    ] = "default",
    case: Annotated[str, typer.Option(
        help="'sensitive' (a cased index, QuCo-RAG's authors' layout and the benchmark's) "
             "or 'insensitive' (a lower-cased one).")
    ] = "sensitive",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print path and stats as JSON.")
                       ] = False,
) -> None:
    """Build (once; then reuse) the corpus-statistics index of the datasets' paragraphs, the
    one QuCo-RAG uses in the benchmark; print its cached path and stats."""
    from rag_gates_lab.corpus import build_corpus_stats

    with _clean_errors():
        if case not in ("sensitive", "insensitive"):
            raise ValueError("--case must be 'sensitive' or 'insensitive'")
        directory = build_corpus_stats(datasets, data, tokenizer=tokenizer,
                                       lowercase=case == "insensitive",
                                       progress=not quiet and not as_json)
        info = _open(directory).stats()
    if as_json:
        _print_json(info.model_dump())
        return
    typer.echo(str(directory))
    _print_stats(info, title=f"corpus statistics of {datasets}")
