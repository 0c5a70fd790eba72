"""``train_sft`` / ``train_dpo`` (TRL) for a few steps on the tiny random-weight Llama: the
records of the exporters train, and the result is a model directory the bench loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rag_gates.deeprag import Trajectory
from rag_gates.deeprag.export import export_dpo, export_sft

SLICE = Path(__file__).resolve().parents[2] / "examples" / "data" / "hotpotqa_dev_sample.jsonl"

pytest.importorskip("trl", reason='needs the trl extra: pip install "rag-gates[trl]"')

TEXT = """Question: Who was the father of the director of Jaws?
Follow up: Who directed Jaws?
Intermediate answer: Steven Spielberg
Follow up: Who was the father of Steven Spielberg?
Let's search the question in Wikipedia.
Context:
[1] Arnold Spielberg: Arnold Meyer Spielberg was an engineer.
Intermediate answer: Arnold Spielberg
So the final answer is: Arnold Spielberg"""


class Row:
    trajectory = Trajectory.parse(TEXT)


def fresh() -> Any:
    from rag_gates.lm.hf import HFWhiteBoxLM
    from rag_gates.testing import tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer(0, max_context=4096)
    return HFWhiteBoxLM(model, tok, model_id="tiny-llama-seed0")


def test_sft_then_dpo_make_loadable_models(tmp_path: Path) -> None:
    import torch

    from rag_gates.deeprag.train import train_dpo, train_sft
    from rag_gates.lm.hf import HFWhiteBoxLM
    from rag_gates_lab.plugins.deeprag import bench_prompt

    lm = fresh()
    export_sft([Row(), Row()], tmp_path / "sft.jsonl", lm)
    export_dpo([Row()], tmp_path / "dpo.jsonl", lm)
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    sft = train_sft(lm, tmp_path / "sft.jsonl", tmp_path / "sft", max_steps=2, lr=1e-3)
    assert sft.steps == 2 and [s for s, _ in sft.losses] == [1, 2] and sft.records == 2
    trained = HFWhiteBoxLM.from_pretrained(tmp_path / "sft")
    changed = [k for k, v in trained.model.state_dict().items()
               if not torch.equal(v, before[k])]
    assert changed, "SFT changed no weight"
    saved = json.loads((tmp_path / "sft" / "training.json").read_text())
    assert saved["stage"] == "sft" and saved["settings"]["lr"] == 1e-3
    assert bench_prompt(trained).demonstration is None  # deeprag.json: run without example
    dpo = train_dpo(trained, tmp_path / "dpo.jsonl", tmp_path / "dpo", max_steps=1)
    assert dpo.steps == 1 and dpo.records == 2 and len(dpo.losses) == 1
    assert HFWhiteBoxLM.from_pretrained(tmp_path / "dpo").generate("hi", max_new_tokens=2)
    with pytest.raises(FileNotFoundError, match="deeprag export"):
        train_sft(fresh(), tmp_path / "missing.jsonl", tmp_path / "x")
    with pytest.raises(ValueError, match="lacks"):
        train_sft(fresh(), tmp_path / "dpo.jsonl", tmp_path / "x")


def test_train_command(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rag_gates.cli import app
    from rag_gates_lab.commands.deeprag import deeprag_app

    lm = fresh()
    lm.model.save_pretrained(tmp_path / "tiny")
    lm.tokenizer.save_pretrained(tmp_path / "tiny")
    export_sft([Row()], tmp_path / "sft.jsonl", lm)
    result = CliRunner().invoke(deeprag_app, [
        "train", "--stage", "sft", "--data", str(tmp_path / "sft.jsonl"), "--model",
        str(tmp_path / "tiny"), "--out", str(tmp_path / "out"), "--max-steps", "1"])
    assert result.exit_code == 0, result.output
    assert "sft: 1 steps" in result.output
    assert (tmp_path / "out" / "loss.png").stat().st_size > 0
    # Then DPO from the SFT model, and the result answers in the bench by its path.
    export_dpo([Row()], tmp_path / "dpo.jsonl", lm)
    dpo = CliRunner().invoke(deeprag_app, [
        "train", "--stage", "dpo", "--data", str(tmp_path / "dpo.jsonl"), "--model",
        str(tmp_path / "out"), "--out", str(tmp_path / "dpo"), "--max-steps", "1"])
    assert dpo.exit_code == 0, dpo.output
    assert "dpo: 1 steps" in dpo.output
    record = json.loads((tmp_path / "dpo" / "training.json").read_text())
    assert record["stage"] == "dpo"
    run = tmp_path / "run"
    bench = CliRunner().invoke(app, [
        "bench", "--dataset", "hotpotqa", "--data", str(SLICE), "--n", "1", "--methods",
        "deeprag-never", "--model", str(tmp_path / "dpo"), "--max-new-tokens", "4",
        "--threads", "1", "--out", str(run)])
    assert bench.exit_code == 0, bench.output
    (line,) = (run / "results.jsonl").read_text().splitlines()
    answered = json.loads(line)
    assert answered["method"] == "deeprag-never" and answered["retrievals"] == 0
    assert any(e["name"] == "trajectory" for e in answered["trace"]["events"])
    assert json.loads((run / "config.json").read_text())["config"]["model"] == str(tmp_path / "dpo")
    bad = CliRunner().invoke(deeprag_app, [
        "train", "--stage", "ppo", "--data", str(tmp_path / "sft.jsonl"), "--out",
        str(tmp_path / "x")])
    assert bad.exit_code == 1 and "sft or dpo" in bad.output


def test_train_from_synthesis_rows_in_one_command_per_stage(tmp_path: Path, bm25: Any) -> None:
    """``--rows``: the synthesis file goes straight to training; the records exported on
    the way equal what ``deeprag export`` writes, and stay in the model directory."""
    from typer.testing import CliRunner

    from rag_gates.deeprag.search import TrajectorySearch
    from rag_gates.deeprag.synthesis import read_rows, synthesize
    from rag_gates_lab.commands.deeprag import deeprag_app
    from tests.deeprag.conftest import ScriptedLM
    from tests.deeprag.test_search import examples, three_hops

    rows = tmp_path / "synth.jsonl"
    synthesize(TrajectorySearch(ScriptedLM(three_hops), bm25), examples(), rows)
    lm = fresh()
    lm.model.save_pretrained(tmp_path / "tiny")
    lm.tokenizer.save_pretrained(tmp_path / "tiny")
    export_sft(read_rows(rows), tmp_path / "sft.jsonl", lm)
    export_dpo(read_rows(rows), tmp_path / "dpo.jsonl", lm)
    sft = CliRunner().invoke(deeprag_app, [
        "train", "--stage", "sft", "--rows", str(rows), "--model", str(tmp_path / "tiny"),
        "--out", str(tmp_path / "sft"), "--max-steps", "1"])
    assert sft.exit_code == 0, sft.output
    assert "SFT: 2 records from 2 trajectories (3 rows)" in sft.output
    assert (tmp_path / "sft" / "sft-records.jsonl").read_text() == \
        (tmp_path / "sft.jsonl").read_text()
    dpo = CliRunner().invoke(deeprag_app, [
        "train", "--stage", "dpo", "--rows", str(rows), "--model", str(tmp_path / "sft"),
        "--out", str(tmp_path / "dpo"), "--max-steps", "1"])
    assert dpo.exit_code == 0, dpo.output
    assert (tmp_path / "dpo" / "dpo-records.jsonl").read_text() == \
        (tmp_path / "dpo.jsonl").read_text()
    both = CliRunner().invoke(deeprag_app, [
        "train", "--stage", "sft", "--rows", str(rows), "--data", str(tmp_path / "sft.jsonl"),
        "--out", str(tmp_path / "x")])
    assert both.exit_code == 1 and "one of the two" in both.output
    empty = tmp_path / "none-found.jsonl"
    synthesize(TrajectorySearch(ScriptedLM(three_hops), bm25), examples()[1:2], empty)
    nothing = CliRunner().invoke(deeprag_app, [
        "train", "--stage", "sft", "--rows", str(empty), "--model", str(tmp_path / "tiny"),
        "--out", str(tmp_path / "y")])
    assert nothing.exit_code == 1 and "holds no trajectory" in nothing.output
    assert not (tmp_path / "y").exists()


@pytest.mark.parametrize(("lines", "where", "what"), [
    (["not json"], ":1", "not JSON"),
    (['{"input_ids": [1], "labels": [1]}', '{"input_ids": [1], "labels": '], ":2", "not JSON"),
    (['["a list"]'], ":1", "not a JSON object"),
])
def test_a_records_file_that_is_not_json_lines_is_named_before_the_model_loads(
        tmp_path: Path, lines: list[str], where: str, what: str) -> None:
    """Issue 32, item 9d: invalid JSON said "Expecting value: line 1 column 1" without the
    file, after the model had loaded. The file and line are named, before any model loads."""
    from typer.testing import CliRunner

    from rag_gates.deeprag.train import train_sft
    from rag_gates_lab.commands.deeprag import deeprag_app

    data = tmp_path / "records.jsonl"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = CliRunner().invoke(deeprag_app, [
        "train", "--stage", "sft", "--data", str(data), "--model",
        str(tmp_path / "no-such-model"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1
    output = " ".join(result.output.split())  # the console wraps long lines
    assert f"{data}{where}" in output and what in output
    assert "no-such-model" not in output  # the data was refused first
    with pytest.raises(ValueError, match=f"{data}{where}"):
        train_sft(fresh(), data, tmp_path / "out")
    undecodable = tmp_path / "latin1.jsonl"
    undecodable.write_bytes(b'{"input_ids": [1], "labels": [1], "x": "\xe9"}\n')
    with pytest.raises(ValueError, match=f"{undecodable}:1 .*UTF-8"):
        train_sft(fresh(), undecodable, tmp_path / "out")


def test_prompt_view_runs_a_model_with_the_papers_prompt(tmp_path: Path) -> None:
    from rag_gates.deeprag import DEMONSTRATION, DeepRAGPrompt
    from rag_gates.deeprag.train import PROMPT_FILE, prompt_view
    from rag_gates.lm.hf import HFWhiteBoxLM
    from rag_gates.testing import save_tiny_lm
    from rag_gates_lab.plugins.deeprag import bench_prompt

    model = save_tiny_lm(tmp_path / "model")
    untrained = HFWhiteBoxLM.from_pretrained(model)
    assert bench_prompt(untrained).demonstration == DEMONSTRATION  # no deeprag.json
    view = prompt_view(model, tmp_path / "view")
    files = {f.name for f in view.iterdir()}
    assert files == {f.name for f in model.iterdir()} | {PROMPT_FILE}
    assert all((view / f).is_symlink() for f in files - {PROMPT_FILE})
    seen = HFWhiteBoxLM.from_pretrained(view)
    assert bench_prompt(seen) == DeepRAGPrompt()  # the paper's, no demonstration
    assert seen.generate("hi", max_new_tokens=2).text == \
        untrained.generate("hi", max_new_tokens=2).text  # the same weights
    # Run again with another prompt: rewritten in place; the model directory untouched.
    other = DeepRAGPrompt(demonstration="Example: ...")
    prompt_view(model, view, other)
    assert bench_prompt(HFWhiteBoxLM.from_pretrained(view)) == other
    assert not (model / PROMPT_FILE).exists()
    # A view of a trained model replaces its own prompt, not adds a second.
    (model / PROMPT_FILE).write_text('{"prompt": {"demonstration": "own"}}')
    prompt_view(model, view)
    assert bench_prompt(HFWhiteBoxLM.from_pretrained(view)) == DeepRAGPrompt()
    with pytest.raises(ValueError, match="files of its own"):
        prompt_view(model, _real(tmp_path))
    with pytest.raises(ValueError, match="model directory itself"):
        prompt_view(model, model)
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        prompt_view(tmp_path / "nothing", tmp_path / "v2")


def _real(tmp_path: Path) -> Path:
    """A directory holding a real file (not a view)."""
    target = tmp_path / "real"
    target.mkdir()
    (target / "model.safetensors").write_bytes(b"weights")
    return target
