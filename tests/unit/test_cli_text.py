"""The CLI's help text reaches the terminal as written: typer renders it through rich
markup, where an unescaped ``[trl]`` or ``[#model-name]`` is a style tag and vanishes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import typer

from rag_gates.cli import app

# rich's markup tag: '[' then a letter, '#', '/' or '@' (rich.markup.RE_TAGS), not escaped.
TAG = re.compile(r"(?<!\\)\[[a-z#/@][^\[\]]*\]")


def texts(command: Any, path: str) -> Iterator[tuple[str, str]]:
    """(where, text) of a command's help, its options' help and its subcommands' (typer
    vendors its own click, so the tree is walked by attribute)."""
    yield path, command.help or ""
    for param in command.params:
        yield f"{path} {param.name}", getattr(param, "help", None) or ""
    for name, sub in (getattr(command, "commands", None) or {}).items():
        yield from texts(sub, f"{path} {name}")


def test_no_help_text_holds_an_unescaped_markup_tag() -> None:
    found = [(where, m.group()) for where, text in texts(typer.main.get_command(app),
                                                         "rag-gates")
             for m in TAG.finditer(text)]
    assert found == [], f"escape as \\[...] (rich markup would drop it): {found}"


def test_the_walk_reaches_subcommands_and_options() -> None:
    where = {w for w, _ in texts(typer.main.get_command(app), "rag-gates")}
    assert {"rag-gates deeprag train", "rag-gates bench model"} <= where


def test_the_checker_sees_a_tag() -> None:
    assert TAG.search('pip install "rag-gates[trl]"')
    assert not TAG.search('pip install "rag-gates\\[trl]"') and not TAG.search("in [0, 1]")
