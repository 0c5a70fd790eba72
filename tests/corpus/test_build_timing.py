"""``index build`` reports the indexing time apart from the tokenizer's load, so a first
build's one-off model conversion does not read as indexing speed (issue 31, item 5)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rag_gates.corpus import build_index
from rag_gates.corpus.cli import index_app

from .conftest import USER_RAG_GATES_HOME, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
SIX = [{"id": str(i), "title": t, "text": text} for i, (t, text) in enumerate([
    ("Ed Wood", "Ed Wood was an American filmmaker."),
    ("Scott Derrickson", "Scott Derrickson is an American director."),
    ("Steven Spielberg", "Steven Spielberg directed Jaws."),
    ("Washington", "Washington is the capital of the United States."),
    ("Hamlet", "Hamlet is a tragedy by William Shakespeare."),
    ("Paris", "Paris is the capital of France."),
])]


def test_the_rate_is_over_the_indexing_alone(tmp_path: Path, tokenizer_path: Path) -> None:
    report = build_index(write_jsonl(tmp_path / "six.jsonl", SIX), tmp_path / "idx",
                         tokenizer=str(tokenizer_path), cpus=1)
    assert report.index_seconds > 0 and not report.converted_model
    assert report.setup_seconds + report.index_seconds == pytest.approx(report.seconds)
    assert report.tokens_per_second == pytest.approx(report.tokens / report.index_seconds)


def test_the_cli_shows_indexing_and_tokenizer_load_apart(tmp_path: Path,
                                                          tokenizer_path: Path) -> None:
    src = write_jsonl(tmp_path / "six.jsonl", SIX)
    result = CliRunner().invoke(index_app, ["build", str(src), "--out", str(tmp_path / "idx"),
                                            "--tokenizer", str(tokenizer_path), "--cpus", "1",
                                            "--quiet"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert re.search(r"time\s+│?\s*\d+\.\d s indexing \([\d,]+ tokens/s\)", result.output), \
        result.output
    assert re.search(r"tokenizer load\s+│?\s*\d+\.\d s", result.output)
    assert "converted the embedded model" not in result.output


@pytest.mark.integration
def test_a_first_build_says_it_converted_the_model(tmp_path: Path) -> None:
    """A fresh cache: the default tokenizer converts the embedded model first (tens of
    seconds); the report says so and keeps it out of the indexing time and rate."""
    from rag_gates.lm import defaults
    from rag_gates.lm.model_files import find_model_file

    # A fresh home holding only what `rag-gates models install` leaves there: the GGUF (a
    # link to this machine's copy), not yet converted.
    with pytest.MonkeyPatch.context() as user_home:  # where the models were installed
        if USER_RAG_GATES_HOME is None:
            user_home.delenv("RAG_GATES_HOME")
        else:
            user_home.setenv("RAG_GATES_HOME", USER_RAG_GATES_HOME)
        gguf = find_model_file(defaults._LM_MODULE, defaults._LM_GGUF)
    if gguf is None:
        pytest.skip("embedded model not installed: rag-gates models install")
    link = tmp_path / "home" / "model-files" / defaults._LM_MODULE / defaults._LM_GGUF
    link.parent.mkdir(parents=True)
    link.symlink_to(gguf)
    src = write_jsonl(tmp_path / "six.jsonl", SIX)
    env = {**os.environ, "RAG_GATES_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1",
           "COLUMNS": "200"}
    first, second = (subprocess.run(
        [sys.executable, "-m", "rag_gates.cli", "index", "build", str(src), "--out",
         str(tmp_path / out), "--cpus", "1", "--json"], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=900, check=True) for out in ("a", "b"))
    import json

    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a["converted_model"] and not b["converted_model"]
    assert a["setup_seconds"] > a["index_seconds"]  # the conversion dominates a first build
    assert a["tokens_per_second"] == pytest.approx(a["tokens"] / a["index_seconds"])
