"""Help pages that read as written: one ``typer.Typer(cls=TidyGroup)`` at the root tidies
every command under it.

typer (0.29, rich markup mode) keeps the single line breaks of a docstring, so a command's
summary wrapped in the source wraps mid-sentence again in the command list, and it shows
``<bool>`` after every flag (``--help <bool>``), which takes no value. The group fixes both
on each command as it is looked up, so commands added later by other modules are covered.

Example:
    >>> app = typer.Typer(cls=TidyGroup)  # doctest: +SKIP
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import typer
import typer.core

from rag_gates._console import clean_errors

__all__ = ["ThreadsOption", "TidyGroup", "clean_errors", "tidy_command", "unwrap"]

#: torch threads, for every command that loads a model.
ThreadsOption = Annotated[int | None, typer.Option(
    min=1, help="torch threads (default: torch's choice).")]


_SINGLE_BREAK = re.compile(r"(?<!\n)[ \t]*\n[ \t]*(?!\n)")


def unwrap(text: str | None) -> str | None:
    """Join the lines inside each paragraph; blank lines (paragraph breaks) stay."""
    if text is None:
        return None
    return _SINGLE_BREAK.sub(" ", text.strip())


def _tidy_params(command: Any) -> None:
    ctx = command.context_class(command)
    help_option = command.get_help_option(ctx)  # created once, then cached on the command
    for param in [*command.params, *([help_option] if help_option is not None else [])]:
        if getattr(param, "is_flag", False):
            param.metavar = ""  # a flag takes no value: no '<bool>' after it


def tidy_command(command: Any) -> Any:
    """Unwrap ``command``'s help texts and drop the value hint of its flags, and so for every
    command under it (once per command object)."""
    if getattr(command, "_rag_gates_tidy", False):
        return command
    command.help = unwrap(command.help)
    command.short_help = unwrap(command.short_help)
    _tidy_params(command)
    command._rag_gates_tidy = True
    for sub in getattr(command, "commands", {}).values():
        tidy_command(sub)
    return command


class TidyGroup(typer.core.TyperGroup):
    """A ``TyperGroup`` whose own help and every subcommand's are tidied (see the module)."""

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        return tidy_command(command) if command is not None else None

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option

    def format_help(self, ctx: Any, formatter: Any) -> None:
        tidy_command(self)
        super().format_help(ctx, formatter)
