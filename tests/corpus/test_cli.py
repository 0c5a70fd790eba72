"""``rag-gates index build|stats|count|cooc`` through typer's CliRunner on ``index_app``."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from rag_gates.corpus import LocalInfiniGram
from rag_gates.corpus.cli import index_app

from .conftest import write_jsonl

runner = CliRunner()


def test_build_then_query(tmp_path: Path, tokenizer_path: Path, wiki_index: Path) -> None:
    src = write_jsonl(tmp_path / "c.jsonl", [
        {"id": "1", "title": "A", "text": "Paris is the capital of France."},
        {"id": "2", "title": "B", "text": "Tom AND Jerry live in Paris."},
        {"text": ""}])
    out = tmp_path / "idx"
    result = runner.invoke(index_app, ["build", str(src), "--out", str(out), "--tokenizer",
                                       str(tokenizer_path), "--cpus", "1", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "index built" in result.output and "empty_text: 1" in result.output

    result = runner.invoke(index_app, ["build", str(src), "--out", str(out), "--tokenizer",
                                       str(tokenizer_path)])
    assert result.exit_code == 1 and "--force" in result.output
    assert "Traceback" not in result.output

    result = runner.invoke(index_app, ["build", str(src), "--out", str(out), "--tokenizer",
                                       str(tokenizer_path), "--force", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["documents"] == 2

    result = runner.invoke(index_app, ["stats", str(out), "--verify"])
    assert result.exit_code == 0 and "verified" in result.output
    stats = json.loads(runner.invoke(index_app, ["stats", str(out), "--json"]).output)
    assert stats["documents"] == 2 and stats["name"] == "idx"

    result = runner.invoke(index_app, ["count", str(out), "Paris"])
    assert result.exit_code == 0 and "2 occurrences of 'Paris'" in result.output
    answer = json.loads(runner.invoke(index_app, ["count", str(out), "Tom AND Jerry",
                                                  "--json"]).output)
    assert answer["value"] == LocalInfiniGram(out).count("Tom AND Jerry").value == 1

    result = runner.invoke(index_app, ["cooc", str(out), "Paris", "France"])
    assert result.exit_code == 0 and "1 documents with 'Paris' and 'France'" in result.output
    answer = json.loads(runner.invoke(index_app, ["cooc", str(out), "Paris", "Jerry",
                                                  "--window", "10", "--json"]).output)
    assert answer["scope"] == "window:10" and answer["value"] == 1
    answer = json.loads(runner.invoke(index_app, ["cooc", str(out), "Paris", "Jerry",
                                                  "--window", "1", "--json"]).output)
    assert answer["value"] == 0
    insensitive = json.loads(runner.invoke(index_app, ["count", str(out), "paris", "--case",
                                                       "insensitive", "--json"]).output)
    assert insensitive["value"] == 2 and insensitive["approximate"] is True


def test_errors_are_one_line_with_exit_status_1(tmp_path: Path, wiki_index: Path) -> None:
    cases = [
        (["count", str(tmp_path / "missing"), "Paris"], "no index at"),
        (["stats", str(tmp_path)], "not a complete infini-gram index"),
        (["count", str(wiki_index), "   "], "empty"),
        (["count", str(wiki_index), "x" * 1001], "characters"),
        (["cooc", str(wiki_index), "a", "b", "--case", "upper"], "--case"),
        (["build", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "o")],
         "does not exist"),
        (["build", str(wiki_index.parent / "wiki.jsonl"), "--out", str(tmp_path / "o"),
          "--tokenizer", str(tmp_path / "nope")], "tokenizer"),
    ]
    for args, message in cases:
        result = runner.invoke(index_app, args)
        assert result.exit_code != 0, args
        assert message in result.output, (args, result.output)
        assert "Traceback" not in result.output
