"""The validation shape's measurement (``rag_gates_lab.testbed.skills``,
``benchmarks/testbed_skills.py``): every form sends the prompt the builder's practice renders,
answers resume without repeats, and each criterion's pass/fail follows its threshold. Plumbing
on a planned testbed with the tiny random-weight model (accuracy values mean nothing here)."""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rag_gates.types import Passage
from rag_gates_lab.runner import read_records
from rag_gates_lab.testbed import skills
from rag_gates_lab.testbed.build import TestbedConfig, practice_messages, write_plan

ROOT = Path(__file__).resolve().parents[2]
FACT_FORMS = (*skills.FORMS, "no-rag", "genread")


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A planned testbed (manifest, passages, two-hop questions; no training)."""
    out = tmp_path_factory.mktemp("planned")
    write_plan(TestbedConfig(n_facts=60, ladder=[0, 2, 8], general_paragraphs=4,
                             reading_examples=6), out)
    return out


@pytest.fixture(scope="module")
def tiny() -> Any:
    from rag_gates.testing import tiny_lm

    return tiny_lm(max_context=4096)  # DeepRAG's demonstration is long in a byte-level BPE


class Prompts:
    """The model, passing every call through, keeping the prompts ``generate`` was given."""

    def __init__(self, lm: Any) -> None:
        self._lm = lm
        self.prompts: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lm, name)

    def generate(self, prompt: Any, **kwargs: Any) -> Any:
        self.prompts.append(prompt)
        return self._lm.generate(prompt, **kwargs)


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()[1:]]


def _fact(planned: Path) -> tuple[str, list[str], Passage]:
    from rag_gates_lab.testbed.dataset import load_testbed_dataset, testbed_passages

    example = load_testbed_dataset(f"testbed:{planned}", n=1).examples[0]
    own = {p.id: p for p in testbed_passages(f"testbed:{planned}")}[example.id]
    return example.question, example.answers, own


def _text(prompt: Any) -> list[tuple[str, str]]:
    if isinstance(prompt, str):
        return [("user", prompt)]
    return [(m.role, m.content) for m in prompt]


# ------------------------------------------------------------------ the practised prompts
def test_each_form_sends_the_prompt_its_practice_renders(planned: Path, tiny: Any) -> None:
    from rag_gates.deeprag.trajectory import INTERMEDIATE
    from rag_gates.prompts import qa_prompt

    question, answers, own = _fact(planned)
    seen = Prompts(tiny)
    answer = skills.form_answerers(seen, max_new_tokens=4)
    practised = {f: practice_messages(f, question, [own], answers[0])
                 for f in ("deeprag", "cbdr-paper")}
    # SR-RAG's practice reads a verbalization: one untitled passage (the passage's text).
    practised["srrag"] = practice_messages("srrag", question,
                                           [Passage(id="v", text=own.text)], answers[0])
    expected = {
        "qa": [("user", qa_prompt(question, [own]))],  # reading_examples' form
        "srrag": [("user", practised["srrag"][0]["content"])],
        "cbdr-paper": [("user", practised["cbdr-paper"][0]["content"])],
        "no-rag": [("user", qa_prompt(question))],
    }
    for form, prompt in expected.items():
        seen.prompts.clear()
        answer[form](question, [own])
        assert [_text(p) for p in seen.prompts] == [prompt], form
    # DeepRAG: the practice's user turn, and its assistant turn up to the hop answer.
    seen.prompts.clear()
    answer["deeprag"](question, [own])
    [(user, text), (role, so_far)] = _text(seen.prompts[0])
    assert len(seen.prompts) == 1 and (user, role) == ("user", "assistant")
    assert text == practised["deeprag"][0]["content"]
    assert so_far.endswith(INTERMEDIATE)
    assert practised["deeprag"][1]["content"].startswith(f"{so_far} {answers[0]}\n")
    # The paper's prompt (a DeepRAG-trained model's) has no demonstration.
    seen.prompts.clear()
    answer["deeprag-paper"](question, [own])
    assert len(_text(seen.prompts[0])[0][1]) < len(text)
    # GenRead: SR-RAG's verbalization prompt, then its answer prompt over what it wrote.
    from rag_gates.srrag.verbalizer import Verbalizer

    seen.prompts.clear()
    answer["genread"](question, [own])
    assert _text(seen.prompts[0]) == [("user", Verbalizer(tiny).prompt(question))]
    assert "Context:" in seen.prompts[1] and len(seen.prompts) == 2


def test_tokrag_forms_are_the_real_decoder(planned: Path, tiny: Any) -> None:
    from rag_gates.tokrag.decoder import TokRAGConfig, TokRAGDecoder

    question, _, own = _fact(planned)
    answer = skills.form_answerers(tiny, max_new_tokens=6)
    for form, config in (("tokrag", TokRAGConfig()),
                         ("tokrag-reference", TokRAGConfig(passage_prefix=True))):
        direct = TokRAGDecoder(tiny, config, dataset="testbed").generate(
            question, passages=[own], max_new_tokens=6).text
        assert answer[form](question, [own]) == direct, form


def test_tokrag_stream_form_is_the_decoders_rag_prompt_read_alone(planned: Path,
                                                                   tiny: Any) -> None:
    from rag_gates.prompts import qa_prompt
    from rag_gates.tokrag.decoder import TokRAGConfig, TokRAGDecoder

    question, _, own = _fact(planned)
    seen = Prompts(tiny)
    skills.form_answerers(seen, max_new_tokens=4)["tokrag-reference-stream"](question, [own])
    reference = TokRAGDecoder(tiny, TokRAGConfig(passage_prefix=True), dataset="testbed")
    assert [_text(p) for p in seen.prompts] == [[("user", reference.prompts(question,
                                                                             [own])[0])]]
    assert "[Reference]: " in seen.prompts[0]
    # The default decoder's RAG stream is the `qa` form's prompt: no form of its own.
    default = TokRAGDecoder(tiny, TokRAGConfig(), dataset="testbed")
    assert default.prompts(question, [own])[0] == qa_prompt(question, [own])


# ------------------------------------------------------------------ resumable rows
def test_rows_resume_and_a_larger_n_adds_only_what_is_missing(planned: Path, tiny: Any,
                                                               tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    first = skills.measure_skills(planned, rows, lm=tiny, model="tiny", n=2, twohop_n=1,
                                  max_new_tokens=3)
    assert first["facts_complete"] == 2
    assert first["table"]["twohop-single"]["n"] == 1
    assert all(first["table"][f]["seconds_median"] is not None for f in FACT_FORMS)
    before = rows.read_text()
    assert len(_rows(rows)) == 2 * len(FACT_FORMS) + 1
    skills.measure_skills(planned, rows, lm=tiny, model="tiny", n=3, twohop_n=1,
                          max_new_tokens=3)
    after = rows.read_text()
    assert after.startswith(before)  # appended, nothing redone
    keys = [(r["form"], r["id"]) for r in _rows(rows)]
    assert len(keys) == len(set(keys)) == 3 * len(FACT_FORMS) + 1
    # A line cut by an interruption is dropped and answered again.
    rows.write_text(after[: after.rstrip("\n").rfind("\n") + 1] + after.splitlines()[-1][:9])
    skills.measure_skills(planned, rows, lm=tiny, model="tiny", n=3, twohop_n=1,
                          max_new_tokens=3)
    assert len(_rows(rows)) == 3 * len(FACT_FORMS) + 1
    # Done: no model is loaded (the name "tiny" is no model anywhere), the table is the same.
    again = skills.measure_skills(planned, rows, model="tiny", n=3, twohop_n=1,
                                  max_new_tokens=3)
    assert again["facts_complete"] == 3
    # Other settings never mix into these rows.
    from rag_gates.errors import ArtifactError

    with pytest.raises(ArtifactError):
        skills.measure_skills(planned, rows, lm=tiny, model="tiny", n=3, max_new_tokens=5)


def test_rows_from_before_a_form_was_added_resume_with_only_the_new_form(
        planned: Path, tiny: Any, tmp_path: Path) -> None:
    from rag_gates.errors import ArtifactError

    rows = tmp_path / "rows.jsonl"
    skills.measure_skills(planned, rows, lm=tiny, model="tiny", n=1, twohop_n=1,
                          max_new_tokens=3)
    # As written before "tokrag-reference-stream" existed: its rows and form gone.
    lines = rows.read_text().splitlines()
    header = json.loads(lines[0])
    header["header"]["forms"].remove("tokrag-reference-stream")
    kept = [ln for ln in lines[1:] if json.loads(ln)["form"] != "tokrag-reference-stream"]
    assert len(kept) == len(lines) - 2
    rows.write_text("\n".join([json.dumps(header), *kept]) + "\n")
    summary = skills.measure_skills(planned, rows, lm=tiny, model="tiny", n=1, twohop_n=1,
                                    max_new_tokens=3)
    after = _rows(rows)
    assert after[: len(kept)] == [json.loads(ln) for ln in kept]  # the old answers kept
    assert [r["form"] for r in after[len(kept):]] == ["tokrag-reference-stream"]
    assert summary["facts_complete"] == 1
    assert json.loads(rows.read_text().splitlines()[0])["header"]["forms"] == list(skills.FORMS)
    # Another setting still refuses to mix.
    with pytest.raises(ArtifactError):
        skills.measure_skills(planned, rows, lm=tiny, model="tiny", n=1, max_new_tokens=4)


def test_shards_split_the_plan_and_the_plain_run_gathers_them(planned: Path, tiny: Any,
                                                              tmp_path: Path) -> None:
    from rag_gates._io import append_locked
    from rag_gates.errors import FileInUseError

    whole = skills.measure_skills(planned, tmp_path / "whole.jsonl", lm=tiny, model="tiny",
                                  n=2, twohop_n=1, max_new_tokens=3)
    rows = tmp_path / "rows.jsonl"
    for index in (0, 1):
        own = skills.measure_skills(planned, rows, lm=tiny, model="tiny", n=2, twohop_n=1,
                                    max_new_tokens=3, shard=(index, 2))
        assert own["facts_complete"] == 1  # its own share's table
    shards = [_rows(skills.shard_rows_path(rows, i, 2)) for i in (0, 1)]
    keys = [{(r["form"], r["id"]) for r in rows_of} for rows_of in shards]
    assert keys[0] and keys[1] and not keys[0] & keys[1]
    # Whole facts per shard, every form alike: each shard's own table is complete.
    for rows_of in shards:
        facts = {r["id"] for r in rows_of if r["form"] != "twohop-single"}
        assert len(facts) == 1
        assert {r["form"] for r in rows_of if r["form"] != "twohop-single"} == set(FACT_FORMS)
    assert keys[0] | keys[1] == {(r["form"], r["id"]) for r in _rows(tmp_path / "whole.jsonl")}
    assert not rows.exists()
    # A shard still writing holds its lock: gathering refuses instead of missing its rows.
    with append_locked(skills.shard_rows_path(rows, 1, 2)), pytest.raises(FileInUseError):
        skills.measure_skills(planned, rows, model="tiny", n=2, twohop_n=1, max_new_tokens=3)
    # Gathered: no model loads (the name "tiny" is no model anywhere), the table is the whole
    # run's, answer for answer (greedy, the same model).
    gathered = skills.measure_skills(planned, rows, model="tiny", n=2, twohop_n=1,
                                     max_new_tokens=3)
    drop = ("seconds_median",)
    assert {f: {k: v for k, v in c.items() if k not in drop}
            for f, c in gathered["table"].items()} == \
        {f: {k: v for k, v in c.items() if k not in drop} for f, c in whole["table"].items()}
    answers = {(r["form"], r["id"]): r["answer"] for r in _rows(rows)}
    assert answers == {(r["form"], r["id"]): r["answer"]
                       for r in _rows(tmp_path / "whole.jsonl")}
    with pytest.raises(ValueError, match="index < count"):
        skills.measure_skills(planned, rows, lm=tiny, n=2, shard=(2, 2))


# ------------------------------------------------------------------ criteria
def _synthetic(acc: dict[str, dict[int, float]], per_rung: int = 10) -> list[dict[str, Any]]:
    """Rows with the given accuracy (percent) per form and rung: real inputs of summarise."""
    rows = []
    for form, by_rung in acc.items():
        for rung, pct in by_rung.items():
            for i in range(per_rung):
                rows.append({"form": form, "id": f"f{rung}-{i}", "rung": rung,
                             "accuracy": float(i < pct * per_rung / 100)})
    return rows


def test_each_criterion_follows_its_threshold() -> None:
    good = {f: {0: 90.0, 64: 90.0} for f in FACT_FORMS}
    good["no-rag"] = {0: 10.0, 64: 70.0}
    good["genread"] = {0: 10.0, 64: 80.0}
    rows = _synthetic(good) + [{"form": "twohop-single", "id": f"t{i}", "rung": [0, 64],
                                "accuracy": float(i < 6)} for i in range(10)]
    summary = skills.summarise(rows, base_closed_book_r0=5.0)
    verdicts = {c["criterion"]: c["pass"] for c in summary["criteria"]}
    assert all(verdicts.values()), verdicts
    assert summary["table"]["twohop-single"]["by_rungs"]["0/64"] == {"n": 10, "accuracy": 60.0}
    # Each shortfall fails its own line and no other.
    bad = {**good, "srrag": {0: 90.0, 64: 60.0}, "deeprag-paper": {0: 60.0, 64: 60.0},
           "genread": {0: 20.0, 64: 60.0}, "no-rag": {0: 20.0, 64: 70.0}}
    summary = skills.summarise(_synthetic(bad), base_closed_book_r0=5.0)
    failed = {c["criterion"] for c in summary["criteria"] if c["pass"] is False}
    assert failed == {"single in the srrag form", "DeepRAG's hop answer from Context: "
                      "(deeprag-paper)", "genread minus closed book at r = 64",
                      "closed book at r = 0 near the base model's (points above it)"}
    # Nothing measured: no verdict (the two-hop line, the base model's without its row).
    # Tok-RAG's own answers are reported, never a criterion: a method's output cannot be the
    # precondition for judging it.
    decoder_low = {**good, "tokrag": {0: 10.0, 64: 10.0}, "tokrag-reference": {0: 0.0, 64: 0.0}}
    summary = skills.summarise(_synthetic(decoder_low), base_closed_book_r0=5.0)
    assert all(c["pass"] for c in summary["criteria"] if c["pass"] is not None)
    assert summary["table"]["tokrag"]["accuracy"] == 10.0
    assert not any("tokrag form" in c["criterion"] for c in summary["criteria"])
    stream_low = {**good, "tokrag-reference-stream": {0: 70.0, 64: 70.0}}
    summary = skills.summarise(_synthetic(stream_low), base_closed_book_r0=5.0)
    assert {c["criterion"] for c in summary["criteria"] if c["pass"] is False} == {
        "single in the tokrag-reference-stream form"}
    lines = {c["criterion"]: c for c in skills.summarise(_synthetic(good))["criteria"]}
    assert lines["two-hop single with both hops' passages"]["pass"] is None
    assert lines["closed book at r = 0 near the base model's (points above it)"]["pass"] is None


def test_a_fact_counts_only_once_answered_in_every_form() -> None:
    rows = _synthetic({f: {0: 100.0} for f in FACT_FORMS}, per_rung=2)
    rows = [r for r in rows if not (r["id"] == "f0-1" and r["form"] == "genread")]
    summary = skills.summarise(rows)
    assert summary["facts_complete"] == 1
    assert all(summary["table"][f]["n"] == 1 for f in FACT_FORMS)


def test_genread_against_closed_book_counts_the_committed_builds_lost_and_gained_facts(
) -> None:
    """The r = 0 figures the testbed log (benchmarks/results/testbed/LOG.md) reports for
    tb13, tb14 and tb15 (4 lost and 1
    gained, p = 0.375; 6 and 3, p = 0.51; 3 and 5, p = 0.73), from the committed answer
    rows."""
    results = ROOT / "benchmarks" / "results" / "testbed"
    want = {"tb13": (4, 1, 0.375), "tb14": (6, 3, 0.5078), "tb15": (3, 5, 0.7266)}
    for build, (lost, gained, p) in want.items():
        lines = (results / f"skills-{build}-rows.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines[1:]]  # the first line: the header
        paired = skills.summarise(rows)["genread_against_closed_book"]
        assert paired["0"] == {"facts": 75, "lost": lost, "gained": gained, "sign_test_p": p}
        assert set(paired) == {"0", "2", "8", "64"}
        table = skills.summarise(rows)["table"]
        for rung, cell in paired.items():  # the gap in facts is the table's gap in points
            gap = (table["genread"]["by_rung"][rung]["accuracy"]
                   - table["no-rag"]["by_rung"][rung]["accuracy"])
            assert round(gap * cell["facts"] / 100) == cell["gained"] - cell["lost"]


def _load_script(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_shape_table_is_the_committed_reports_whose_lines_the_rows_give_again(
        capsys: pytest.CaptureFixture[str]) -> None:
    """docs/testbed.md's side-by-side table is the script's rendering of the reports its
    marker names, and each report's lines are what its committed answer rows give."""
    text = (ROOT / "docs" / "testbed.md").read_text()
    m = re.search(r"<!-- BEGIN shape table: \.venv/bin/python benchmarks/testbed_shape_table\.py "
                  r"([^>]+) -->\n(.*?)\n<!-- END shape table -->", text, re.S)
    assert m, "docs/testbed.md's shape table lost its markers"
    reports = [ROOT / path for path in m[1].split()]
    assert _load_script("testbed_shape_table").main([str(p) for p in reports]) == m[2]
    assert capsys.readouterr().out == m[2] + "\n"
    for report in reports:
        committed = json.loads(report.read_text())
        lines = report.with_name(report.stem + "-rows.jsonl").read_text().splitlines()
        summary = skills.summarise([json.loads(line) for line in lines[1:]])
        summary["base_closed_book_r0"] = committed["base_closed_book_r0"]
        assert skills.criteria(summary) == committed["criteria"], report.name


def test_shape_table_names_a_changed_rung_and_refuses_builds_judged_differently() -> None:
    results = ROOT / "benchmarks" / "results" / "testbed"
    tb13 = json.loads((results / "skills-tb13.json").read_text())
    taller = copy.deepcopy(tb13)  # the same lines with the top rung at 128 exposures
    for line in taller["criteria"]:
        line["criterion"] = line["criterion"].replace("r = 64", "r = 128")
    table = skills.shape_table({"tb13": tb13, "tall": taller}).splitlines()
    assert "| genread minus closed book at r = 64 / 128 | >= 0 | 34.7 pass | 34.7 pass |" \
        in table
    assert table[-1] == "| lines met | | 12 of 13 | 12 of 13 |"
    stricter = copy.deepcopy(tb13)
    stricter["criteria"][0]["rule"] = ">= 65.0"
    with pytest.raises(ValueError, match="different rules"):
        skills.shape_table({"tb13": tb13, "stricter": stricter})
    shorter = copy.deepcopy(tb13)
    shorter["criteria"].pop()
    with pytest.raises(ValueError, match="different numbers of criteria"):
        skills.shape_table({"tb13": tb13, "shorter": shorter})
    renamed = copy.deepcopy(tb13)
    renamed["criteria"][2]["criterion"] = "single in another form"
    with pytest.raises(ValueError, match="more than a rung's count"):
        skills.shape_table({"tb13": tb13, "renamed": renamed})


def test_sign_test_p_is_the_exact_binomial_tail() -> None:
    assert skills.sign_test_p(0, 0) == 1.0
    assert skills.sign_test_p(5, 0) == skills.sign_test_p(0, 5) == 2 / 32
    assert skills.sign_test_p(3, 3) == 1.0  # capped: an even split is no evidence
    assert abs(skills.sign_test_p(1, 9) - 2 * 11 / 1024) < 1e-12


# ------------------------------------------------------------------ the script and the step
def test_the_script_writes_the_table_and_reads_the_base_model_from_validation(
        planned: Path, tmp_path: Path) -> None:
    from rag_gates.testing import tiny_model_and_tokenizer

    testbed = tmp_path / "tb"
    testbed.mkdir()
    for name in ("config.json", "manifest.jsonl", "passages.jsonl", "counterfactual.jsonl",
                 "twohop.jsonl", "bridges.jsonl"):
        (testbed / name).write_bytes((planned / name).read_bytes())
    model, tok = tiny_model_and_tokenizer(max_context=4096)
    model.save_pretrained(testbed / "model")
    tok.save_pretrained(testbed / "model")
    validation = tmp_path / "validation.json"
    validation.write_text(json.dumps([
        {"model": "default", "method": "no-rag", "by_repetitions": {"0": {"accuracy": 8.0}}},
        {"model": "x", "method": "no-rag", "by_repetitions": {"0": {"accuracy": 30.0}}}]))
    spec = importlib.util.spec_from_file_location("testbed_skills",
                                                  ROOT / "benchmarks" / "testbed_skills.py")
    assert spec and spec.loader
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "skills.json"
    payload = script.main(["--testbed", str(testbed), "--n", "1", "--twohop-n", "1",
                           "--max-new-tokens", "3", "--validation", str(validation),
                           "--out", str(out)])
    assert json.loads(out.read_text()) == payload
    assert payload["base_closed_book_r0"] == 8.0
    assert "--n 1 --twohop-n 1" in payload["command"]
    assert (tmp_path / "skills-rows.jsonl").is_file()
    names = [c["criterion"] for c in payload["criteria"]]
    assert len(names) == len(set(names)) and all("rule" in c for c in payload["criteria"])
    assert script.parse_shard("1/2") == (1, 2)
    for bad in ("2/2", "1", "a/b"):
        with pytest.raises(argparse.ArgumentTypeError):
            script.parse_shard(bad)


def test_the_unknown_verbalization_script_answers_after_no_information(
        planned: Path, tmp_path: Path) -> None:
    from rag_gates.testing import tiny_model_and_tokenizer
    from rag_gates_lab.testbed.build import UNKNOWN_VERBALIZATION, read_manifest

    testbed = tmp_path / "tb"
    testbed.mkdir()
    for name in ("config.json", "manifest.jsonl", "passages.jsonl", "counterfactual.jsonl"):
        (testbed / name).write_bytes((planned / name).read_bytes())
    model, tok = tiny_model_and_tokenizer(max_context=4096)
    model.save_pretrained(testbed / "model")
    tok.save_pretrained(testbed / "model")
    spec = importlib.util.spec_from_file_location(
        "testbed_unknown_verbalization", ROOT / "benchmarks" / "testbed_unknown_verbalization.py")
    assert spec and spec.loader
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "unknown.json"
    payload = script.main(["--testbed", str(testbed), "--n", "3", "--max-new-tokens", "2",
                           "--verbalize", "--out", str(out)])
    assert json.loads(out.read_text()) == payload
    assert payload["verbalization"] == UNKNOWN_VERBALIZATION and payload["facts"] == 3
    assert [r["method"] for r in payload["rows"]] == \
        ["no-rag", "after-no-information", "verbalizes-no-information"] * 3
    # The random tiny model never writes the sentence; the rows say what it wrote.
    said = [r for r in payload["rows"] if r["method"] == "verbalizes-no-information"]
    assert all(r["accuracy"] == 0.0 and r["answer"] for r in said)
    first = read_manifest(testbed)[0]
    assert payload["rows"][0]["id"] == first.id
    # Each cell is the mean of its rows (recomputed here), over the rungs answered.
    for method, cells in payload["accuracy_by_rung"].items():
        mine = [r for r in payload["rows"] if r["method"] == method]
        assert set(cells) == {str(r["rung"]) for r in mine}
        for rung, cell in cells.items():
            scores = [r["accuracy"] for r in mine if str(r["rung"]) == rung]
            assert cell == {"n": len(scores),
                            "accuracy": round(100 * sum(scores) / len(scores), 1)}
    assert set(payload["accuracy_by_rung"]) == {"no-rag", "after-no-information",
                                                 "verbalizes-no-information"}
    with pytest.raises(SystemExit):
        script.main(["--testbed", str(testbed), "--n", "0", "--out", str(out)])


def test_the_steps_script_knows_the_skills_step(tmp_path: Path) -> None:
    steps = ROOT / "benchmarks" / "testbed_steps.sh"
    text = steps.read_text()
    assert "skills)" in text and "benchmarks/testbed_skills.py" in text
    assert "expectations)" in text and "benchmarks/testbed_expectations.py" in text
    # The STEPS check (before any step runs) accepts both and refuses a misspelling.
    env = {"TB": "tbX", "STEPS": "skills expectations skils", "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path)}
    wrong = subprocess.run(["bash", str(steps)], env=env, capture_output=True, text=True)
    assert wrong.returncode == 2
    assert wrong.stdout.strip().splitlines()[-1] == "unknown step skils"


# ------------------------------------------------------------------ expectations' figures
def _expectation_figures(tb: str, tmp_path: Path) -> dict[str, Any]:
    """benchmarks/testbed_expectations.py on a build's committed outputs, its plan rebuilt
    from its committed config (a pure function of it)."""
    config = json.loads((ROOT / f"benchmarks/results/testbed/{tb}-config.json").read_text())
    write_plan(TestbedConfig.model_validate(config), tmp_path / tb)
    spec = importlib.util.spec_from_file_location(
        "testbed_expectations", ROOT / "benchmarks" / "testbed_expectations.py")
    assert spec and spec.loader
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    result: dict[str, Any] = script.main(["--tb", tb, "--testbed", str(tmp_path / tb),
                                          "--out", str(tmp_path / "x.json")])
    return result


def test_expectation_figures_reproduce_tb11s_committed_tables(tmp_path: Path) -> None:
    """On tb11's committed step outputs (its plan rebuilt: a pure function of its config),
    the per-rung figures add up to what eval-gate, the bench and the DeepRAG report said."""
    got = _expectation_figures("tb11", tmp_path)
    assert got["missing"] == ["srrag-tb11/e2e", "srrag-tb11/labels-eval"]
    # At the calibrated thresholds, eval-gate's retrieval rates (the testbed log,
    # tb11's
    # gate table: 0.95 / 0.82 / 0.97 / 0.92), 75 facts per rung.
    for gate, rate in (("first-token-prob", 94.7), ("answer-logprob", 82.0), ("quco", 97.3),
                       ("cbdr", 92.0)):
        by_rung = got["gates"][gate]["retrieval_by_rung"]
        assert set(by_rung) == {"0", "2", "8", "64"}
        assert abs(sum(by_rung.values()) / 4 - rate) < 0.1, gate
    # QuCo's counts track the ladder (its corpus states a top-rung subject 64 times).
    assert got["gates"]["quco"]["rung_auroc"] > 0.9
    e2e = got["runs"]["e2e-tb11"]
    assert e2e["no-rag"]["accuracy_by_rung"] == {"0": 18.7, "2": 20.0, "8": 38.7, "64": 65.3}
    assert set(e2e["single"]["retrieval_by_rung"].values()) == {100.0}
    # The DeepRAG report's steps: 266 with 168 unmatched (untrained), 142 never retrieving
    # (after SFT).
    untrained = got["deeprag"]["deeprag-tb11/twohop"]["deeprag"]
    assert untrained["unmatched_steps"] == 168
    assert sum(untrained["steps_by_hop_rung"].values()) == 266 - 168
    sft = got["deeprag"]["deeprag-tb11/twohop-sft"]["deeprag"]
    assert sum(sft["steps_by_hop_rung"].values()) == 142
    assert set(sft["retrieval_by_hop_rung"].values()) == {0.0}


def test_srrag_label_figures_add_up_to_the_routing_report(tmp_path: Path) -> None:
    """tb10's SR-RAG labels by rung average to the routing report's share (75 facts a rung),
    its gates' AUROCs are the report's, and the labels follow tb10's ladder (a low rung
    means retrieval better) where the router's own score does not (the testbed
    log)."""
    got = _expectation_figures("tb10", tmp_path)["srrag"]
    report = json.loads(
        (ROOT / "benchmarks/results/testbed/srrag-tb10/routing-auroc.json").read_text())
    by_rung = got["retrieval_preferred_by_rung"]
    assert got["questions"] == report["questions"] == 300
    assert set(by_rung) == {"0", "2", "8", "32"}  # tb10's ladder
    assert abs(sum(by_rung.values()) / 4 - 100 * report["retrieval_better_share"]) < 0.1
    assert by_rung["0"] > by_rung["32"]
    assert {g: v["auroc"] for g, v in got["gates"].items()} == {
        g: round(v["auroc"], 3) for g, v in report["gates"].items()}
    assert 0.0 <= got["gates"]["srrag"]["rung_auroc"] <= 1.0


# ------------------------------------------------------------------ the relation prior at r = 0
def test_relation_prior_counts_are_the_bench_scores_and_never_read_evaluation_facts(
        tmp_path: Path) -> None:
    """benchmarks/testbed_relation_prior.py on tb13's and tb14's committed labels runs (tb14's
    plan rebuilt from its committed config): each run's right answers per rung are the ones
    the bench scored right, and the prior's guess comes from taught facts only."""
    config = json.loads((ROOT / "benchmarks/results/testbed/tb14-config.json").read_text())
    write_plan(TestbedConfig.model_validate(config), tmp_path / "tb14")
    spec = importlib.util.spec_from_file_location(
        "testbed_relation_prior", ROOT / "benchmarks" / "testbed_relation_prior.py")
    assert spec and spec.loader
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    runs = {tb: ROOT / f"benchmarks/results/testbed/gates-{tb}/labels" for tb in ("tb13", "tb14")}
    got = script.main(["--testbed", str(tmp_path / "tb14"), "--out", str(tmp_path / "x.json"),
                       *[f"--run={tb}={path}" for tb, path in runs.items()]])
    for tb, path in runs.items():
        scored: dict[str, float] = {}
        for record in read_records(path):
            if record.method == "no-rag":
                rung = str(record.meta["repetitions"])
                scored[rung] = scored.get(rung, 0.0) + record.accuracy
        assert {r: cell[tb]["right"] for r, cell in got["by_rung"].items()} == scored
    pair = got["overlap_at_r0"]["tb13/tb14"]
    assert pair["both"] + pair["only tb13"] == got["by_rung"]["0"]["tb13"]["right"]
    # Moving every evaluation fact's object leaves the prior's guesses as they were.
    manifest = tmp_path / "tb14" / "manifest.jsonl"
    facts = [json.loads(line) for line in manifest.read_text().splitlines()]
    for fact in facts:
        if fact["split"] == "evaluation":
            fact["obj"] = "nowhere at all"
    manifest.write_text("".join(json.dumps(f) + "\n" for f in facts))
    again = script.main(["--testbed", str(tmp_path / "tb14"), "--out", str(tmp_path / "y.json")])
    assert again["relation_prior"] == got["relation_prior"]
