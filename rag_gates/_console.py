"""What every command-line app prints the same way."""

from __future__ import annotations

__all__ = ["error_line", "quiet_transformers"]


def error_line(exc: BaseException) -> str:
    """The one red line an expected error becomes, its text escaped so rich prints it as
    written: unescaped, ``pip install "rag-gates[corpus]"`` would print without its
    ``[corpus]`` (rich reads it as a style tag).
    """
    from rich.markup import escape

    return f"[red]error:[/] {escape(str(exc))}"


def quiet_transformers() -> None:
    """transformers' per-load progress bars would interleave with a command's own output."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()
