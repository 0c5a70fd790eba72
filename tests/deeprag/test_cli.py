"""``rag-gates deeprag synthesize`` and ``export`` end to end on a saved tiny model and the
HotpotQA slice shipped in examples/data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rag_gates.deeprag.synthesis import read_rows
from rag_gates_lab.commands.deeprag import deeprag_app

SLICE = Path(__file__).resolve().parents[2] / "examples" / "data" / "hotpotqa_dev_sample.jsonl"
runner = CliRunner()


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    from rag_gates.testing import tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer(0, max_context=4096)
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny"


def test_synthesize_resumes_and_export_writes_trl_records(
        tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path / "home"))
    rows = tmp_path / "rows.jsonl"
    args = ["synthesize", "--model", str(model_dir), "--dataset", "hotpotqa", "--data",
            str(SLICE), "--n", "2", "--offset", "0", "--max-expansions", "2", "--out",
            str(rows)]
    first = runner.invoke(deeprag_app, args)
    assert first.exit_code == 0, first.output
    assert "hotpotqa: 0/2 found" in first.output and "2 searched now" in first.output
    written = read_rows(rows)
    assert len(written) == 2 and all(r.max_expansions == 2 for r in written)
    assert all(r.status in ("exhausted", "expansion_cap") and r.llm_calls >= 2
               for r in written)
    again = runner.invoke(deeprag_app, args)
    assert again.exit_code == 0 and "0 searched now, 2 resumed" in again.output
    other = runner.invoke(deeprag_app, [*args[:-2], "--k", "2", "--out", str(rows)])
    assert other.exit_code == 1 and "other settings" in other.output
    given = runner.invoke(deeprag_app, [*args, "--decomposition", "given"])
    assert given.exit_code == 1 and "other settings" in given.output  # never mixed
    typo = runner.invoke(deeprag_app, [*args[:-2], "--decomposition", "gold", "--out",
                                       str(tmp_path / "typo.jsonl")])
    assert typo.exit_code == 1 and "model or given" in typo.output
    # HotpotQA rows carry no subqueries: each question is its one subquery, in both
    # branches (root, direct, retrieved: 3 pops, 2 answer calls, random weights miss both).
    own = tmp_path / "given.jsonl"
    wide = [("3" if a == "2" and args[i - 1] == "--max-expansions" else a)
            for i, a in enumerate(args[:-2])]
    fresh = runner.invoke(deeprag_app, [*wide, "--decomposition", "given", "--out", str(own)])
    assert fresh.exit_code == 0, fresh.output
    assert all(r.status == "exhausted" and r.expansions == 3 and r.retrievals == 1
               and r.llm_calls == 2 for r in read_rows(own))

    sft, dpo = tmp_path / "sft.jsonl", tmp_path / "dpo.jsonl"
    export = runner.invoke(deeprag_app, ["export", "--rows", str(rows), "--sft", str(sft),
                                         "--dpo", str(dpo), "--model", str(model_dir)])
    assert export.exit_code == 0, export.output
    assert "SFT: 0 records" in export.output and sft.read_text() == ""
    nothing = runner.invoke(deeprag_app, ["export", "--rows", str(rows)])
    assert nothing.exit_code == 1 and "--sft" in nothing.output
    missing = runner.invoke(deeprag_app, ["export", "--rows", str(tmp_path / "no.jsonl"),
                                          "--sft", str(sft)])
    assert missing.exit_code == 1 and "deeprag synthesize" in missing.output
    assert json.loads(rows.read_text().splitlines()[0])["header"]["max_expansions"] == 2
