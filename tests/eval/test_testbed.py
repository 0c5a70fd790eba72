"""The knowledge-controlled testbed: fact planning and rendering on the shipped PopQA slice,
and end-to-end builds on a tiny random-weight model (plumbing only: seconds, no quality)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from rag_gates_lab.testbed.facts import (
    FRAMES,
    SPLITS,
    TEMPLATES,
    load_popqa_facts,
    plan_facts,
    render_fact,
)

LADDER = (0, 2, 8, 32)


@pytest.fixture(scope="module")
def pool():
    return load_popqa_facts()


def test_shipped_slice_has_every_templated_relation(pool):
    relations = Counter(f.prop for f in pool)
    assert set(relations) == set(TEMPLATES)
    assert len(pool) > 1500
    # One answer per (subject, relation): otherwise a question would be ambiguous.
    assert len({(f.subj, f.prop) for f in pool}) == len(pool)


def test_plan_balances_relations_rungs_and_splits(pool):
    facts = plan_facts(pool, n_facts=300, ladder=LADDER, seed=0)
    assert len(facts) == 300
    assert len({f.id for f in facts}) == 300
    per_relation = Counter(f.prop for f in facts)
    available = Counter(f.prop for f in pool)
    # Relations take turns: equal shares, except a relation that ran out gives all it has.
    short = {p for p in per_relation if per_relation[p] == available[p]}
    full = [n for p, n in per_relation.items() if p not in short]
    assert short == {"mother"} and max(full) - min(full) <= 1
    per_rung = Counter(f.repetitions for f in facts)
    assert sorted(per_rung) == sorted(LADDER)
    assert max(per_rung.values()) - min(per_rung.values()) <= 1
    for rung in LADDER:
        splits = Counter(f.split for f in facts if f.repetitions == rung)
        assert set(splits) == set(SPLITS)
        # 0.3 / 0.2 / 0.5 of each rung, up to rounding.
        assert abs(splits["evaluation"] - 0.5 * per_rung[rung]) <= 1
    # Popularity is balanced too: every rung has facts from every popularity bin.
    assert all({f.popularity_bin for f in facts if f.repetitions == r} == {0, 1, 2}
               for r in LADDER)


def test_splits_never_share_a_fact_or_a_question(pool):
    facts = plan_facts(pool, n_facts=400, ladder=LADDER, seed=3)
    by_split = {s: [f for f in facts if f.split == s] for s in SPLITS}
    for a in SPLITS:
        for b in SPLITS:
            if a < b:
                assert not {f.id for f in by_split[a]} & {f.id for f in by_split[b]}
                assert not ({(f.subj, f.prop) for f in by_split[a]}
                            & {(f.subj, f.prop) for f in by_split[b]})
                assert not ({f.question for f in by_split[a]}
                            & {f.question for f in by_split[b]})


def test_plan_is_deterministic_and_seed_dependent(pool):
    a = plan_facts(pool, n_facts=120, ladder=LADDER, seed=7)
    b = plan_facts(pool, n_facts=120, ladder=LADDER, seed=7)
    c = plan_facts(pool, n_facts=120, ladder=LADDER, seed=8)
    assert [f.model_dump() for f in a] == [f.model_dump() for f in b]
    assert [f.id for f in a] != [f.id for f in c]


def test_renderings_never_use_the_question_wording(pool):
    for fact in pool:
        question = fact.question.rstrip("?").strip().casefold()
        for text in render_fact(fact, 12, seed=0):
            assert question not in text.casefold(), (fact.question, text)
            assert "?" not in text.replace("Did you know?", "") or fact.gold_paragraph


def test_renderings_are_worded_differently_and_state_the_object(pool):
    fact = next(f for f in pool if f.prop == "director")
    budget = len(TEMPLATES["director"]) * len(FRAMES)
    texts = render_fact(fact, budget, seed=0)
    assert len(texts) == len(set(texts)) == budget
    assert all(fact.subj in t and fact.obj in t for t in texts)
    # The first statements use different templates, not only different frames.
    firsts = render_fact(fact, len(TEMPLATES["director"]), seed=0)
    assert len({t.split(": ")[-1].removeprefix("Note that ") for t in firsts}) == len(firsts)


def test_gold_paragraph_is_one_rendering_when_it_names_the_answer(pool):
    fact = next(f for f in pool if f.gold_paragraph
                and f.obj.casefold() in f.gold_paragraph["text"].casefold())
    first = render_fact(fact, 3, seed=0)[0]
    assert first in fact.gold_paragraph["text"]
    assert fact.obj.casefold() in first.casefold()


def test_counterfactual_is_a_wrong_object_of_the_same_relation(pool):
    facts = plan_facts(pool, n_facts=120, ladder=LADDER, seed=0)
    objects = {p: {f.obj for f in pool if f.prop == p} for p in TEMPLATES}
    for f in facts:
        assert f.counterfactual.casefold() not in {a.casefold() for a in f.answers}
        assert f.counterfactual in objects[f.prop]
        text = render_fact(f, 1, seed=0, obj=f.counterfactual)[0]
        assert f.counterfactual in text and f.subj in text


def test_plan_rejects_bad_ladders(pool):
    with pytest.raises(ValueError, match="distinct"):
        plan_facts(pool, n_facts=10, ladder=(0, 4, 4), seed=0)
    with pytest.raises(ValueError, match="templates"):
        plan_facts(pool, n_facts=10, ladder=(0, 4), seed=0, relations=["nickname"])



@pytest.mark.parametrize("splits", [(0.5, 0.5, 0.5), (0.2, 0.2, 0.2), (0.5, -0.1, 0.6),
                                    (0.0, 0.0, 0.0)])
def test_splits_that_do_not_sum_to_one_are_refused(pool, splits, tmp_path):
    """Issue 32, item 9e: 0.5,0.5,0.5 was normalised to thirds without a word."""
    with pytest.raises(ValueError, match=r"sum to 1 \(within 1e-06\)"):
        plan_facts(pool, n_facts=12, ladder=LADDER, seed=0, split_fractions=splits)
    from typer.testing import CliRunner

    from rag_gates.cli import app

    result = CliRunner().invoke(app, ["testbed", "build", "--out", str(tmp_path / "tb"),
                                      "--splits", ",".join(map(str, splits)), "--plan-only"])
    assert result.exit_code != 0 and "sum to 1" in result.output
    assert not (tmp_path / "tb").exists()


def test_splits_that_sum_to_one_up_to_rounding_are_accepted(pool):
    facts = plan_facts(pool, n_facts=30, ladder=LADDER, seed=0,
                       split_fractions=(0.1, 0.2, 0.7))  # 1.0000000000000002 in floats
    assert {f.split for f in facts} == set(SPLITS)


# ---------------------------------------------------------------- builds on a tiny model
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rag_gates_lab.testbed.build import TestbedConfig, build_testbed  # noqa: E402


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    from rag_gates.testing import save_tiny_lm

    return save_tiny_lm(tmp_path_factory.mktemp("tiny-base"))


def _config(base: Path, **overrides) -> TestbedConfig:
    settings = {"base_model": str(base), "n_facts": 24, "ladder": [0, 1, 3],
                "general_paragraphs": 6, "epochs": 1.0, "batch_size": 4, "block_size": 64,
                "save_steps": 4, "threads": 1, "reading_examples": 6, **overrides}
    return TestbedConfig(**settings)


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(directory / "model" / "model.safetensors"))


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open(encoding="utf-8")]


def test_tiny_build_end_to_end(tiny_base, tmp_path):
    from rag_gates.lm import load_lm

    out = tmp_path / "tb"
    record = build_testbed(_config(tiny_base), out, progress=False)
    manifest = _read(out / "manifest.jsonl")
    corpus = _read(out / "corpus.jsonl")
    assert len(manifest) == 24
    # Every fact is stated exactly its repetition count of times in the training corpus.
    stated = Counter(d["fact"] for d in corpus if d["kind"] == "fact")
    assert {f["id"]: f["repetitions"] for f in manifest} == {
        f["id"]: stated.get(f["id"], 0) for f in manifest}
    assert sum(d["kind"] == "general" for d in corpus) == 6
    # The retrieval corpus has one passage per fact and per bridge, plus the paragraphs.
    assert len(_read(out / "passages.jsonl")) == 24 + len(_read(out / "bridges.jsonl")) + 6
    assert record["steps"] > 0 and record["tokens_per_epoch"] > 0
    assert (out / "training.json").is_file() and not (out / "checkpoints").exists()
    assert not (out / "model" / "training_args.bin").exists()  # no pickle in the output
    lm = load_lm(out / "model")
    assert lm.generate("The capital of", max_new_tokens=3).completion_tokens == 3
    # The weights moved away from the base model's.
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_base).state_dict()
    trained = _weights(out)
    assert any(not torch.equal(base[k], trained[k]) for k in trained if k in base)
    # A second run finds the build complete and returns its record.
    assert build_testbed(_config(tiny_base), out, progress=False)["steps"] == record["steps"]


def test_build_is_deterministic(tiny_base, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    build_testbed(_config(tiny_base), a, progress=False)
    build_testbed(_config(tiny_base), b, progress=False)
    for name in ("manifest.jsonl", "corpus.jsonl", "passages.jsonl", "counterfactual.jsonl"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    wa, wb = _weights(a), _weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_bf16_build_trains_in_bfloat16_autocast_and_saves_fp32_weights(tiny_base, tmp_path):
    fp32, bf16 = tmp_path / "fp32", tmp_path / "bf16"
    build_testbed(_config(tiny_base), fp32, progress=False)
    record = build_testbed(_config(tiny_base, precision="bf16"), bf16, progress=False)
    assert record["config"]["precision"] == "bf16"
    assert json.loads((bf16 / "config.json").read_text())["precision"] == "bf16"
    wa, wb = _weights(fp32), _weights(bf16)
    assert all(w.dtype == torch.float32 for w in wb.values())  # master weights stay fp32
    # The same data and seed: only the autocast differs, and it moves the weights.
    assert any(not torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)
    with pytest.raises(ValueError, match="another configuration"):
        build_testbed(_config(tiny_base), bf16, progress=False)


# Flags lines as /proc/cpuinfo prints them: an AVX2-only AMD EPYC (this project's second
# machine, where a bf16 step took 22 times an fp32 one) and a Sapphire Rapids Xeon with AMX.
AVX2_ONLY = ("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu vme sse sse2 ssse3 fma "
             "sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni vaes vpclmulqdq rdpid fsrm\n")
WITH_AMX = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8488C\nflags\t\t: fpu "
            "avx avx2 avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16 avx512_fp16 amx_tile "
            "amx_int8\n")
ARM = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 bf16\n"


def test_cpu_bfloat16_units_read_the_x86_flags(tmp_path):
    from rag_gates_lab.testbed.build import cpu_bfloat16_units

    for name, text in {"avx2": AVX2_ONLY, "amx": WITH_AMX, "arm": ARM}.items():
        (tmp_path / name).write_text(text)
    assert cpu_bfloat16_units(tmp_path / "avx2") == []
    assert cpu_bfloat16_units(tmp_path / "amx") == ["amx_bf16", "amx_tile", "avx512_bf16"]
    assert cpu_bfloat16_units(tmp_path / "arm") is None  # no x86 flags line: unknown
    assert cpu_bfloat16_units(tmp_path / "missing") is None


def test_a_bf16_build_warns_where_bfloat16_is_emulated(tiny_base, tmp_path, monkeypatch):
    import warnings

    from rag_gates_lab.testbed import build

    (tmp_path / "avx2").write_text(AVX2_ONLY)
    (tmp_path / "amx").write_text(WITH_AMX)
    monkeypatch.setattr(build, "CPUINFO", tmp_path / "avx2")
    with pytest.warns(RuntimeWarning, match="--precision fp32"):
        build_testbed(_config(tiny_base, precision="bf16"), tmp_path / "bf16", progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        build_testbed(_config(tiny_base), tmp_path / "fp32", progress=False)  # fp32: silent
        monkeypatch.setattr(build, "CPUINFO", tmp_path / "amx")
        build_testbed(_config(tiny_base, precision="bf16"), tmp_path / "bf16-amx",
                      progress=False)


def test_a_compiled_build_trains_the_same_testbed(tiny_base, tmp_path):
    """torch.compile changes how the steps run, not what they train: the same directory
    resumes either way (not part of the identity) and the weights agree to float rounding."""
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    build_testbed(_config(tiny_base), eager, progress=False)
    record = build_testbed(_config(tiny_base, compile=True), compiled, progress=False)
    assert record["torch_compile"] is True and "compile" not in record["config"]
    wa, wb = _weights(eager), _weights(compiled)
    assert all(torch.allclose(wa[k], wb[k], atol=1e-4) for k in wa)
    # ... and not bit for bit, as two eager builds are (test_build_is_deterministic): the
    # compiled kernels ran.
    assert any(not torch.equal(wa[k], wb[k]) for k in wa)
    assert build_testbed(_config(tiny_base), compiled, progress=False)["steps"] == \
        record["steps"]  # complete: the eager configuration finds it so


def test_cli_precision_and_recall_questions_reach_the_config(tiny_base, tmp_path):
    from typer.testing import CliRunner

    from rag_gates.cli import app

    flags = ["testbed", "build", "--base-model", str(tiny_base), "--n-facts", "24",
             "--ladder", "0,1,3", "--general-paragraphs", "6", "--reading-examples", "6",
             "--plan-only"]
    result = CliRunner().invoke(app, [*flags, "--out", str(tmp_path / "a"),
                                      "--precision", "bf16"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "a" / "config.json").read_text())["precision"] == "bf16"
    result = CliRunner().invoke(app, [*flags, "--out", str(tmp_path / "b"),
                                      "--precision", "fp16"])
    assert result.exit_code != 0 and "'fp16' is not one of" in result.output
    assert not (tmp_path / "b").exists()
    result = CliRunner().invoke(app, [*flags, "--out", str(tmp_path / "c"),
                                      "--recall-examples", "4",
                                      "--recall-question-repetitions", "3"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "c" / "config.json").read_text()
                      )["recall_question_repetitions"] == 3
    asked = [line for line in (tmp_path / "c" / "corpus.jsonl").read_text().splitlines()
             if '"kind": "recall"' in line]
    assert len(asked) == 12


def test_precision_is_fp32_or_bf16_and_an_old_config_reads_as_fp32(tiny_base, tmp_path):
    from pydantic import ValidationError

    from rag_gates_lab.testbed.build import write_plan

    with pytest.raises(ValidationError, match="fp32"):
        _config(tiny_base, precision="fp16")
    write_plan(_config(tiny_base), tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    del written["precision"]  # a testbed planned before the option existed
    (tmp_path / "config.json").write_text(json.dumps(written))
    write_plan(_config(tiny_base), tmp_path)  # the same configuration: no refusal


class _Interrupt(transformers.TrainerCallback):
    """Stops the process mid-training, after a checkpoint was written."""

    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.at_step:
            raise KeyboardInterrupt


def test_build_resumes_from_its_last_checkpoint(tiny_base, tmp_path):
    config = _config(tiny_base)
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    build_testbed(config, whole, progress=False)
    with pytest.raises(KeyboardInterrupt):
        build_testbed(config, cut, callbacks=[_Interrupt(6)], progress=False)
    assert (cut / "checkpoints" / "checkpoint-4").is_dir()
    assert not (cut / "model").exists()
    record = build_testbed(config, cut, progress=False)
    assert record["resumed_from"] == "checkpoint-4"
    assert record["steps_this_run"] == record["steps"] - 4
    wa, wb = _weights(whole), _weights(cut)
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)


def test_build_refuses_a_directory_of_another_configuration(tiny_base, tmp_path):
    from rag_gates_lab.testbed.build import write_plan

    write_plan(_config(tiny_base), tmp_path)
    with pytest.raises(ValueError, match="another configuration"):
        build_testbed(_config(tiny_base, seed=1), tmp_path, progress=False)


def test_reading_examples_keep_the_manifest_exact(pool):
    """Reading documents ask about facts outside the manifest, answer from one of their
    passages, and never name a manifest subject: the manifest's counts stay what they say."""
    from rag_gates_lab.testbed.build import TestbedConfig, testbed_documents

    config = TestbedConfig(n_facts=96, reading_examples=40)
    docs = testbed_documents(config)
    manifest_rows = {f["row"] for f in docs["manifest"]}
    subjects = [f["subj"] for f in docs["manifest"]]
    reading = [d for d in docs["corpus"] if d["kind"] == "reading"]
    assert len(reading) == 40
    by_row = {f.row: f for f in pool}
    for doc in reading:
        assert doc["row"] not in manifest_rows
        fact = by_row[doc["row"]]
        assert doc["answer"] == fact.obj and fact.question in doc["prompt"]
        context = doc["prompt"].split("Context:\n", 1)[1].split("\nQuestion:", 1)[0]
        assert context.count("\n- ") + 1 == config.reading_passages
        assert f"- {fact.subj}: " in doc["prompt"]  # the passage that states the answer
        for subject in subjects:
            assert f"- {subject}: " not in doc["prompt"]
    # The manifest's statements are unchanged by the reading documents.
    plain = testbed_documents(TestbedConfig(n_facts=96, reading_examples=0))
    assert docs["manifest"] == plain["manifest"]
    statements = sorted(d["text"] for d in docs["corpus"] if d["kind"] == "fact")
    assert statements == sorted(d["text"] for d in plain["corpus"] if d["kind"] == "fact")


def test_recall_examples_ask_closed_book_about_facts_outside_the_manifest(pool):
    """Recall documents state facts outside the manifest and the reading examples, ask each
    once with no context, and leave the manifest, its statements and the reading examples
    as they were without them."""
    from rag_gates_lab.testbed.build import TestbedConfig, testbed_documents

    config = TestbedConfig(n_facts=96, reading_examples=40, recall_examples=30,
                           recall_repetitions=5)
    docs = testbed_documents(config)
    manifest_rows = {f["row"] for f in docs["manifest"]}
    subjects = {f["subj"].casefold() for f in docs["manifest"]}
    by_row = {f.row: f for f in pool}
    asked = [d for d in docs["corpus"] if d["kind"] == "recall"]
    stated = [d for d in docs["corpus"] if d["kind"] == "recall-statement"]
    reading_rows = {d["row"] for d in docs["corpus"] if d["kind"] == "reading"}
    assert len(asked) == 30 and len(stated) == 30 * 5
    for doc in asked:
        fact = by_row[doc["row"]]
        assert doc["row"] not in manifest_rows | reading_rows
        assert fact.subj.casefold() not in subjects and fact.obj.casefold() not in subjects
        assert doc["prompt"].endswith(f"Question: {fact.question}")
        assert "Context:" not in doc["prompt"] and doc["answer"] == fact.obj
        statements = [d["text"] for d in stated if d["row"] == doc["row"]]
        assert len(statements) == 5 and len(set(statements)) == 5  # worded differently
        assert all(any(a in t for a in [fact.obj, *fact.answers]) for t in statements)
    without = testbed_documents(TestbedConfig(n_facts=96, reading_examples=40))
    assert docs["manifest"] == without["manifest"]
    for kind in ("fact", "reading"):
        assert sorted(d["text"] for d in docs["corpus"] if d["kind"] == kind) == \
            sorted(d["text"] for d in without["corpus"] if d["kind"] == kind)
    with pytest.raises(ValueError, match="recall examples; ask for fewer"):
        testbed_documents(TestbedConfig(n_facts=96, recall_examples=100_000))


def test_recall_questions_repeat_without_more_recall_facts():
    """``recall_question_repetitions`` asks each recall fact's question that many times and
    changes nothing else: the same facts, statements and every other document."""
    from collections import Counter

    from rag_gates_lab.testbed.build import TestbedConfig, testbed_documents

    once = testbed_documents(TestbedConfig(n_facts=96, reading_examples=40, recall_examples=30,
                                           recall_repetitions=5))
    thrice = testbed_documents(TestbedConfig(n_facts=96, reading_examples=40,
                                             recall_examples=30, recall_repetitions=5,
                                             recall_question_repetitions=3))
    asked = [d for d in thrice["corpus"] if d["kind"] == "recall"]
    assert len(asked) == 90 and len({d["id"] for d in thrice["corpus"]}) == len(thrice["corpus"])
    once_asked = {d["row"]: d for d in once["corpus"] if d["kind"] == "recall"}
    assert Counter(d["row"] for d in asked) == {row: 3 for row in once_asked}
    assert all({k: d[k] for k in ("prompt", "answer", "text")}
               == {k: once_asked[d["row"]][k] for k in ("prompt", "answer", "text")}
               for d in asked)
    assert once["manifest"] == thrice["manifest"]
    rest = sorted((d["kind"], d.get("text", "")) for d in once["corpus"] if d["kind"] != "recall")
    assert rest == sorted((d["kind"], d.get("text", "")) for d in thrice["corpus"]
                          if d["kind"] != "recall")


def test_reading_examples_train_in_the_chat_format(tiny_base):
    from transformers import AutoTokenizer

    from rag_gates_lab.testbed.build import training_text

    tok = AutoTokenizer.from_pretrained(tiny_base)
    doc = {"kind": "reading", "prompt": "Answer.\nQuestion: Who?", "answer": "Ada",
           "text": "unused"}
    text = training_text(doc, tok)
    assert "<|im_start|>user" in text and "<|im_start|>assistant" in text
    assert text.index("Question: Who?") < text.index("Ada")
    assert training_text({**doc, "kind": "recall"}, tok) == text  # recall: the same format
    assert training_text({"kind": "fact", "text": "Ada wrote."}, tok) == "Ada wrote."
    assert training_text({"kind": "recall-statement", "text": "Ada wrote."}, tok) == \
        "Ada wrote."


@pytest.fixture(scope="module")
def planned(tiny_base, tmp_path_factory):
    """A planned testbed (manifest and corpora, no training): 200 facts."""
    from rag_gates_lab.testbed.build import write_plan

    out = tmp_path_factory.mktemp("planned")
    write_plan(_config(tiny_base, n_facts=200, ladder=[0, 2, 8], general_paragraphs=20), out)
    return out


def test_testbed_datasets_hold_each_split(planned):
    from rag_gates_lab.datasets import load_dataset

    manifest = _read(planned / "manifest.jsonl")
    data = load_dataset(f"testbed:{planned}")
    evaluation = [f for f in manifest if f["split"] == "evaluation"]
    assert [e.id for e in data.examples] == [f["id"] for f in evaluation]
    first = data.examples[0]
    fact = evaluation[0]
    assert first.question == fact["question"] and first.answers == fact["answers"]
    assert first.meta["repetitions"] == fact["repetitions"]
    assert fact["subj"] in first.meta["counterfactual"]
    assert fact["counterfactual"] in first.meta["counterfactual"]
    assert len(load_dataset(f"testbed-all:{planned}").examples) == 200
    assert len(load_dataset(f"testbed:{planned}", n=5, offset=2).examples) == 5
    calibration = load_dataset(f"testbed-calibration:{planned}").examples
    assert {e.meta["split"] for e in calibration} == {"calibration"}
    with pytest.raises(FileNotFoundError, match="testbed build"):
        load_dataset(f"testbed:{planned / 'missing'}")


def test_twohop_questions_chain_two_facts(planned):
    from rag_gates_lab.datasets import load_dataset

    facts = {f["id"]: f for f in _read(planned / "manifest.jsonl")}
    facts |= {b["id"]: b for b in _read(planned / "bridges.jsonl")}
    twohop = load_dataset(f"testbed-twohop:{planned}").examples
    calibration = load_dataset(f"testbed-twohop-calibration:{planned}").examples
    assert twohop and calibration
    assert {q.meta["splits"][0] for q in twohop} == {"evaluation"}
    assert {q.meta["splits"][0] for q in calibration} == {"calibration"}
    for q in twohop + calibration:
        first, second = (facts[i] for i in q.meta["hops"])
        assert first["obj"].casefold() == second["subj"].casefold()
        assert q.answers == second["answers"]
        assert q.meta["repetitions"] == [first["repetitions"], second["repetitions"]]
        assert first["subj"] in q.question


def test_bridges_are_taught_as_often_as_their_rung_and_cover_every_pair(planned):
    """The purpose-written second hops: stated exactly `repetitions` times in the corpus,
    never about a manifest subject, asked about at every pair of hop counts."""
    manifest = _read(planned / "manifest.jsonl")
    bridges = _read(planned / "bridges.jsonl")
    corpus = _read(planned / "corpus.jsonl")
    subjects = {f["subj"].casefold() for f in manifest}
    stated = Counter(d["fact"] for d in corpus if d["kind"] == "bridge")
    for b in bridges:
        assert stated[b["id"]] == b["repetitions"]
        assert b["subj"].casefold() not in subjects
        for d in corpus:
            if d.get("fact") == b["id"]:
                assert b["subj"] in d["text"] and b["obj"] in d["text"]
    rows = _read(planned / "twohop.jsonl")
    pairs = {tuple(r["repetitions"]) for r in rows if "subqueries" in r
             and r["splits"][0] == "evaluation"}
    assert pairs == {(a, b) for a in (0, 2, 8) for b in (0, 2, 8)}
    texts = "\n".join(d["text"] for d in corpus)
    facts = {f["id"]: f for f in manifest}
    for r in rows:
        assert r["question"] not in texts  # the two-hop wording is never trained
        if "subqueries" not in r:  # facts chained in PopQA itself carry no bridge
            continue
        first, second = r["subqueries"]
        assert first["answers"] == facts[r["hops"][0]]["answers"]
        assert second["answers"] == r["answers"]
    passages = {p["id"] for p in _read(planned / "passages.jsonl")}
    assert {b["id"] for b in bridges} <= passages  # retrievable, one passage each


def test_a_testbed_built_before_bridges_still_opens(tiny_base, tmp_path):
    from rag_gates_lab.testbed.build import write_plan

    config = _config(tiny_base, n_facts=40, bridges=False)
    write_plan(config, tmp_path)
    stored = json.loads((tmp_path / "config.json").read_text())
    for field in ("bridges", "recall_examples", "recall_repetitions", "skill_reading",
                  "skill_decomposition", "skill_hop_repetitions", "skill_verbalization",
                  "skill_twohop_reading", "skill_unknown", "recall_question_repetitions"):
        del stored[field]  # as written before the fields existed
    (tmp_path / "config.json").write_text(json.dumps(stored))
    write_plan(config, tmp_path)  # the same testbed: accepted
    with pytest.raises(ValueError, match="another configuration"):
        write_plan(_config(tiny_base, n_facts=40), tmp_path)  # bridges=True is another one


def test_bench_runs_on_the_testbed_with_its_retrieval_corpus(planned, tmp_path):
    from rag_gates.testing import tiny_lm
    from rag_gates_lab.corpus import load_retriever
    from rag_gates_lab.runner import BenchConfig, run_bench
    from rag_gates_lab.testbed.report import ladder_table

    name = f"testbed:{planned}"
    fact = next(f for f in _read(planned / "manifest.jsonl") if f["split"] == "evaluation")
    hits = load_retriever(name, "bm25").retrieve(fact["question"], k=3)
    assert fact["id"] in [p.id for p in hits]
    assert (planned / "indexes").is_dir()  # the testbed keeps its own indexes
    run = tmp_path / "run"
    run_bench(BenchConfig(dataset=name, methods=["no-rag", "single"], n=6, max_new_tokens=4),
              run, lm=tiny_lm(max_context=4096))
    rows = ladder_table([run])
    assert {r["method"] for r in rows} == {"no-rag", "single"}
    assert all(r["all"]["n"] == 6 for r in rows)
    assert all(sum(c["n"] for c in r["by_repetitions"].values()) == 6 for r in rows)
    # A run on another dataset (the HotpotQA language check) gets its overall cell only.
    other = tmp_path / "hotpot"
    run_bench(BenchConfig(dataset="hotpotqa", methods=["no-rag"], n=2, max_new_tokens=4),
              other, lm=tiny_lm(max_context=4096))
    (row,) = ladder_table([other])
    assert row["by_repetitions"] == {} and row["all"]["n"] == 2


def test_hops_dataset_asks_each_hop_alone_once(planned):
    from rag_gates_lab.datasets import load_dataset

    hops = load_dataset(f"testbed-hops:{planned}").examples
    rows = [r for r in _read(planned / "twohop.jsonl") if "subqueries" in r]
    expected = {h: sub for r in rows for h, sub in zip(r["hops"], r["subqueries"], strict=True)}
    assert sorted(e.id for e in hops) == sorted(expected)  # each hop once
    for e in hops:
        assert e.question == expected[e.id]["question"] and e.answers == expected[e.id]["answers"]
    assert not {e.question for e in hops} & {r["question"] for r in rows}  # hops, not two-hop


def test_subquery_boundary_on_real_runs_and_on_steps_that_name_the_hops(planned, tmp_path):
    """End to end with the tiny model (its subqueries are noise: counted, unmatched), then
    the same function on DeepRAG steps that name each hop's subject."""
    from rag_gates.testing import tiny_lm
    from rag_gates_lab.boundary import hop_of, subquery_boundary
    from rag_gates_lab.report import collect
    from rag_gates_lab.runner import BenchConfig, RunRecord, read_records, run_bench
    from rag_gates_lab.testbed.dataset import twohop_hops

    lm = tiny_lm(max_context=4096)
    twohop, truth = tmp_path / "twohop", tmp_path / "hops"
    run_bench(BenchConfig(dataset=f"testbed-twohop:{planned}", methods=["deeprag-always"],
                          n=3, max_new_tokens=6), twohop, lm=lm)
    run_bench(BenchConfig(dataset=f"testbed-hops:{planned}", methods=["no-rag"], n=1000,
                          max_new_tokens=4), truth, lm=lm)
    text = "\n".join(collect([twohop, truth]).markdown)
    assert "### per-subquery knowledge boundary on testbed-twohop:" in text
    records = read_records(twohop)
    wrong = {r.id: r.accuracy < 1 for r in read_records(truth)}
    hops = twohop_hops(planned)
    [real] = subquery_boundary(records, hops, wrong).values()
    steps = sum(len(e["data"]["steps"]) for r in records for e in r.trace["events"]
                if e["kind"] == "note" and e["name"] == "trajectory")
    assert real.steps == steps and real.agreement.questions == steps - real.unmatched

    # Steps that name the hops: the first asks about the fact's subject, the second about
    # the bridge's person; one retrieves, one does not.
    rid, [(h1, s1), (h2, s2)] = next(iter(hops.items()))
    assert hop_of(f"Who composed {s1}?", [s1, s2]) == 0
    assert hop_of(f"Where was {s2} born, the composer of {s1}?", [s1, s2]) == 1
    record = RunRecord(id=rid, method="deeprag", question="q", answers=["a"], prediction="",
                       em=0, f1=0, accuracy=0, retrievals=1, llm_calls=3, generated_tokens=9,
                       wall_s=1.0, trace={"events": [{"kind": "note", "name": "trajectory",
                                                      "data": {"steps": [
                           {"subquery": f"Who is behind {s1}?", "retrieve": False},
                           {"subquery": f"Where was {s2} born?", "retrieve": True},
                           {"subquery": "Anything else?", "retrieve": True}]}}]})
    [made] = subquery_boundary([record], hops, {h1: False, h2: True}).values()
    assert (made.steps, made.unmatched) == (3, 1)
    a = made.agreement
    assert (a.true_positive, a.true_negative, a.false_positive, a.false_negative) == (1, 1, 0, 0)
    # The same question answered in two pooled runs counts once (the later record).
    [pooled] = subquery_boundary([record, record], hops, {h1: False, h2: True}).values()
    assert (pooled.steps, pooled.agreement.questions) == (3, 2)


def test_a_short_subject_names_a_hop_only_as_whole_words():
    from rag_gates_lab.boundary import hop_of

    # PopQA titles as short as "Ex" or "10" sit inside unrelated words.
    assert hop_of("What is the next step?", ["Ex", "Fred Smith"]) is None
    assert hop_of("Who composed the 2010 score?", ["10", "Fred Smith"]) is None
    assert hop_of("Who directed Ex?", ["Ex", "Fred Smith"]) == 0
    assert hop_of("Who wrote \"10\" (the film)?", ["10", "Fred Smith"]) == 0
    assert hop_of("Where was Fred Smith born?", ["Ex", "Fred Smith"]) == 1


def test_corpus_stats_count_exactly_the_training_corpus(planned, tiny_base):
    from rag_gates_lab.corpus import load_corpus_stats

    stats = load_corpus_stats(testbed=planned, tokenizer=tiny_base, cache=False)
    texts = [d["text"].casefold() for d in _read(planned / "corpus.jsonl")]
    for fact in _read(planned / "manifest.jsonl")[:40]:
        count = stats.count(fact["subj"]).value
        stated = sum(fact["subj"].casefold() in t for t in texts)
        # Statements name the subject as written; a gold paragraph may name it otherwise
        # ("Alexandre Krieps" for "Alex Krieps").
        assert (count >= 1) == (stated >= 1), fact
        if not fact["gold_paragraph"]:  # every statement names the subject as written
            assert count >= fact["repetitions"], fact


def test_quco_on_a_testbed_counts_in_its_training_corpus(planned):
    from rag_gates.methods import MethodContext
    from rag_gates.registry import make_gate
    from rag_gates.testing import tiny_lm
    from rag_gates_lab.plugins.quco import bench_gate_settings

    # As the lab's runner and eval-gate build it: the core quco gate, the testbed's corpus.
    dataset = f"testbed:{planned}"
    gate = make_gate("quco", MethodContext(lm=tiny_lm(), dataset=dataset,
                                           **bench_gate_settings(dataset)))
    assert list((planned / "indexes").glob("corpus-stats-*"))  # the testbed's own index
    facts = [f for f in _read(planned / "manifest.jsonl") if not f["gold_paragraph"]]
    seen = next(f for f in facts if f["repetitions"] == 8 and f["subj"] in f["question"])
    decision = gate.decide(seen["question"])
    counts = decision.evidence["counts"]
    assert counts[seen["subj"]] >= 8, counts  # stated 8 times in the corpus


def test_quco_method_takes_tau_entity_calibrated_for_the_testbed_corpus(planned):
    from rag_gates.methods import MethodContext, make_method
    from rag_gates.retrieval.bm25 import BM25Retriever
    from rag_gates.testing import tiny_lm
    from rag_gates.types import Passage
    from rag_gates_lab.plugins.quco import BENCH_TAU_ENTITY

    ctx = MethodContext(lm=tiny_lm(), dataset=f"testbed:{planned}",
                        retriever=BM25Retriever.from_passages([Passage(id="p", text="a passage")]))
    default, tuned = make_method("quco", ctx), make_method("quco-no-runtime@3", ctx)
    assert default.gate.tau_entity == BENCH_TAU_ENTITY
    assert tuned.gate.tau_entity == 3.0 and tuned.name == "quco-no-runtime@3"
    facts = [f for f in _read(planned / "manifest.jsonl")
             if not f["gold_paragraph"] and f["subj"] in f["question"]]
    seen = next(f for f in facts if f["repetitions"] == 8)
    # Stated 8 times: rare at the Wikipedia index's tau (82), known at tau 3.
    assert default.gate.decide(seen["question"]).retrieve
    assert not tuned.gate.decide(seen["question"]).retrieve
