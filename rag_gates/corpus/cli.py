"""``rag-gates index ...``: build and query local infini-gram indexes.

Registered by the main CLI as ``app.add_typer(index_app, name="index")``::

    rag-gates index build CORPUS... --out DIR [--tokenizer T] [--force]
    rag-gates index stats DIR [--verify] [--json]
    rag-gates index count DIR PHRASE [--json]
    rag-gates index cooc DIR A B [--window N] [--json]
    rag-gates index serve DIR --port P [--host 127.0.0.1] [--name NAME]

Every expected failure (missing or corrupt index, bad phrase, existing target) prints one
line saying what to do and exits with status 1; no traceback.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Console
from rich.table import Table

from rag_gates._console import clean_errors
from rag_gates.corpus.errors import CorpusError

__all__ = ["index_app"]

index_app = typer.Typer(
    rich_markup_mode="rich",  # help texts escape brackets as \[
    help="Build and query local infini-gram indexes (phrase counts, co-occurrence).",
    no_args_is_help=True, add_completion=False)
console = Console()


def _clean_errors() -> AbstractContextManager[None]:
    """Expected errors (corpus errors among them) become one red line and exit status 1."""
    return clean_errors((CorpusError,))


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TB"


@index_app.command()
def build(
    corpus: Annotated[list[Path], typer.Argument(
        help="JSONL files (text, optional id/title), .txt files, or directories of them.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Index directory to create.")],
    tokenizer: Annotated[str, typer.Option(
        help="'default' (the embedded model's), a tokenizer.json, or a local model folder.")
    ] = "default",
    force: Annotated[bool, typer.Option(help="Replace an existing index at --out.")] = False,
    text_unit: Annotated[str, typer.Option(
        help="Plain text files: one document per 'file', 'paragraph' or 'line'.")] = "file",
    lowercase: Annotated[bool, typer.Option(
        help="Lower-case all text (a case-insensitive index).")] = False,
    cpus: Annotated[int, typer.Option(min=1, help="Parallel suffix-array parts "
                                                  "(large corpora only).")] = os.cpu_count() or 1,
    mem: Annotated[float, typer.Option(help="Memory budget in GiB for the suffix array.")
                   ] = 4.0,
    ulimit: Annotated[int | None, typer.Option(
        help="Open-file limit for the indexer (capped at the hard limit).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the build report as JSON.")
                       ] = False,
) -> None:
    """Tokenize a corpus offline and build an infini-gram index of it."""
    from rag_gates.corpus.build import BuildOptions, build_index

    with _clean_errors():
        if text_unit not in ("file", "paragraph", "line"):
            raise ValueError("--text-unit must be 'file', 'paragraph' or 'line'")
        unit: Literal["file", "paragraph", "line"] = text_unit  # type: ignore[assignment]
        options = BuildOptions(text_unit=unit, lowercase=lowercase, cpus=cpus, mem_gb=mem,
                               ulimit=ulimit, force=force, progress=not quiet and not as_json)
        report = build_index([str(p) for p in corpus], out, tokenizer=tokenizer,
                             options=options)
    if as_json:
        _print_json(report.model_dump())
        return
    table = Table(title=f"index built: {report.out}", show_header=False)
    table.add_row("documents", f"{report.documents:,}")
    table.add_row("tokens", f"{report.tokens:,} ({report.text_tokens:,} text tokens)")
    table.add_row("size", _human_bytes(report.size_bytes))
    table.add_row("time", f"{report.index_seconds:.1f} s indexing "
                          f"({report.tokens_per_second:,.0f} tokens/s)")
    table.add_row("tokenizer load", f"{report.setup_seconds:.1f} s" + (
        " (converted the embedded model: its first use on this machine, later builds reuse "
        "the copy)" if report.converted_model else ""))
    skipped = ", ".join(f"{k}: {v:,}" for k, v in report.skipped.items()) or "none"
    table.add_row("skipped", skipped)
    for example in report.skipped_examples[:5]:
        table.add_row("", example)
    table.add_row("tokenizer", report.tokenizer)
    console.print(table)


def _open(index: Path, **options: Any) -> Any:
    from rag_gates.corpus.local import LocalInfiniGram

    return LocalInfiniGram(index, **options)


@index_app.command()
def stats(
    index: Annotated[Path, typer.Argument(help="Index directory.")],
    verify: Annotated[bool, typer.Option(help="Also check every suffix array in full.")
                      ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
) -> None:
    """Documents, tokens, size, tokenizer and build report of an index."""
    with _clean_errors():
        backend = _open(index)
        info = backend.stats()
        if verify:
            backend.verify()
    if as_json:
        _print_json({**info.model_dump(), **({"verified": True} if verify else {})})
        return
    _print_stats(info, verified=verify)


def _print_stats(info: Any, verified: bool = False, title: str | None = None) -> None:
    table = Table(title=title or f"index {info.name}", show_header=False)
    table.add_row("path", info.path)
    table.add_row("documents", f"{info.documents:,}")
    table.add_row("tokens", f"{info.tokens:,}")
    table.add_row("shards", str(info.shards))
    table.add_row("size", _human_bytes(info.size_bytes))
    table.add_row("token ids", f"{info.token_dtype}, lower-cased text: {info.lowercase}")
    table.add_row("tokenizer", info.tokenizer)
    if info.created_at:
        table.add_row("built", info.created_at)
    if info.skipped:
        table.add_row("skipped at build", ", ".join(f"{k}: {v:,}" for k, v in
                                                    info.skipped.items()))
    if verified:
        table.add_row("suffix array", "[green]verified[/]")
    console.print(table)


def _query(index: Path, case: str, run: Callable[[Any], Any]) -> Any:
    with _clean_errors():
        if case not in ("sensitive", "insensitive"):
            raise ValueError("--case must be 'sensitive' or 'insensitive'")
        return run(_open(index, case=case))


@index_app.command()
def count(
    index: Annotated[Path, typer.Argument(help="Index directory.")],
    phrase: Annotated[str, typer.Argument(help="Phrase, matched literally.")],
    case: Annotated[str, typer.Option(help="'sensitive' or 'insensitive'.")] = "sensitive",
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
) -> None:
    """How often PHRASE occurs (in its leading-space and no-space forms)."""
    answer = _query(index, case, lambda b: b.count(phrase))
    if as_json:
        _print_json(answer.model_dump())
        return
    approx = " (approximate)" if answer.approximate else ""
    console.print(f"[bold]{answer.value:,}[/] occurrences of {answer.phrase!r}{approx} "
                  f"[dim]({answer.latency_ms:.2f} ms; forms {list(answer.variants)})[/]",
                  highlight=False, soft_wrap=True)


@index_app.command()
def cooc(
    index: Annotated[Path, typer.Argument(help="Index directory.")],
    a: Annotated[str, typer.Argument(help="First phrase, matched literally.")],
    b: Annotated[str, typer.Argument(help="Second phrase, matched literally.")],
    window: Annotated[int | None, typer.Option(
        min=1, help="Within N tokens in one document (default: anywhere in one document).")
    ] = None,
    case: Annotated[str, typer.Option(help="'sensitive' or 'insensitive'.")] = "sensitive",
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
) -> None:
    """In how many documents A and B occur together."""
    answer = _query(index, case, lambda s: s.cooccurrence(
        a, b, scope="document" if window is None else window))
    if as_json:
        _print_json(answer.model_dump())
        return
    where = "the same document" if window is None else f"{window} tokens of each other"
    console.print(
        f"[bold]{answer.value:,}[/] documents with {answer.a!r} and {answer.b!r} within {where} "
        f"[dim]({answer.a!r}: {answer.a_count:,}, {answer.b!r}: {answer.b_count:,} occurrences; "
        f"{answer.latency_ms:.2f} ms)[/]", highlight=False, soft_wrap=True)


@index_app.command()
def serve(
    index: Annotated[Path, typer.Argument(help="Index directory (fixed for the server's life).")],
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: a free one).")] = 8765,
    host: Annotated[str, typer.Option(help="Address to listen on; 127.0.0.1 keeps it to this "
                                           "machine.")] = "127.0.0.1",
    name: Annotated[str | None, typer.Option(
        help="Index name clients send (default: the index's own name).")] = None,
    workers: Annotated[int, typer.Option(min=1, max=256, help="Lookups computed at once.")
                       ] = 4,
    request_timeout: Annotated[float, typer.Option(min=0.001, help="Seconds per lookup before "
                                                                   "a 503.")] = 10.0,
    max_body_bytes: Annotated[int, typer.Option(min=256, help="Larger bodies get a 413.")
                              ] = 64 * 1024,
) -> None:
    """Serve a local index over HTTP in the hosted infini-gram API's protocol, so many
    processes share it: HostedInfiniGram(NAME, tokenizer=DIR/tokenizer.json, url=URL).
    Ctrl-C or SIGTERM stops it cleanly."""
    import signal
    import threading

    from rag_gates.corpus.serve import IndexServer

    with _clean_errors():
        try:
            server = IndexServer(index, host=host, port=port, index_name=name, workers=workers,
                                 request_timeout=request_timeout,
                                 max_body_bytes=max_body_bytes)
        except OSError as exc:  # port in use, address not available
            raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.start()
        typer.echo(f"serving {server.index_name!r} ({index}) at {server.url}", err=True)
        typer.echo(f"  HostedInfiniGram({server.index_name!r}, "
                   f"tokenizer={str(index / 'tokenizer.json')!r}, url={server.url!r})", err=True)
        while not stop.wait(0.5):
            pass
    finally:
        server.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        typer.echo("stopped", err=True)
