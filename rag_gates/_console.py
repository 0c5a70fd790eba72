"""What every command-line app prints the same way."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rag_gates.errors import RagGatesError

__all__ = ["clean_errors", "error_line", "quiet_transformers"]


def error_line(exc: BaseException) -> str:
    """The one red line an expected error becomes, its text escaped so rich prints it as
    written: unescaped, ``pip install "rag-gates[corpus]"`` would print without its
    ``[corpus]`` (rich reads it as a style tag).
    """
    from rich.markup import escape

    return f"[red]error:[/] {escape(str(exc))}"


@contextmanager
def clean_errors(expected: tuple[type[Exception], ...] = (RagGatesError,)) -> Iterator[None]:
    """Expected errors (``expected``, and a missing file, a missing extra or a bad value)
    become one red line on stderr and exit status 1: no traceback."""
    caught: tuple[type[Exception], ...] = (*expected, FileNotFoundError, ImportError, ValueError)
    try:
        yield
    except caught as exc:
        import typer
        from rich.console import Console

        Console(stderr=True).print(error_line(exc), highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


def quiet_transformers() -> None:
    """transformers' per-load progress bars would interleave with a command's own output."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()
