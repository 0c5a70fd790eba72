"""The testbed's skill practice (``skill_reading``, ``skill_decomposition``,
``skill_verbalization``): each prompt is the method's own rendering, DeepRAG's parser reads
every trajectory back, no manifest fact reaches a practice document, and configurations
without the options (tb1..tb11) keep their corpus."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rag_gates.types import Passage
from rag_gates_lab.testbed.build import (
    SKILL_FORMS,
    TestbedConfig,
    _prepare,
    training_text,
)
from rag_gates_lab.testbed.build import testbed_documents as documents_of

ROOT = Path(__file__).resolve().parents[2]
TB11 = ROOT / "benchmarks" / "results" / "testbed" / "tb11-config.json"
# sha256 of json.dumps(documents_of(tb11), sort_keys=True) computed with main's code
# before the skill options existed (commit 1dbe852): the options off change nothing.
TB11_DOCUMENTS_SHA256 = "ffe569d0f19327734eab9f7a2104f60d1bcb08238a70a5c871d9d39fcc77f8af"
# The same for tb12 (skill practice on), computed with the code before skill_twohop_reading
# existed (commit 324bf3c): the option off changes nothing.
TB12 = ROOT / "benchmarks" / "results" / "testbed" / "tb12-config.json"
TB12_DOCUMENTS_SHA256 = "116ee1a3af194ed2b86bc6abff11a1cdfb09b2abbd93a596223280563600f54a"

SMALL = TestbedConfig(n_facts=60, ladder=[0, 2, 8], general_paragraphs=4, reading_examples=10,
                      recall_examples=20, recall_repetitions=4, skill_reading=4,
                      skill_decomposition=12, skill_hop_repetitions=3, skill_verbalization=6,
                      skill_twohop_reading=6)


@pytest.fixture(scope="module")
def docs() -> dict[str, list[dict[str, Any]]]:
    return documents_of(SMALL)


def _practice(docs: dict[str, list[dict[str, Any]]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs["corpus"] if d["kind"] == kind]


def _passages(doc: dict[str, Any]) -> list[Passage]:
    return [Passage(**p) for p in doc["passages"]]


def _turns(doc: dict[str, Any]) -> tuple[str, str]:
    user, assistant = doc["messages"]
    assert (user["role"], assistant["role"]) == ("user", "assistant")
    return user["content"], assistant["content"]


@pytest.fixture(scope="module")
def tiny() -> Any:
    from rag_gates.testing import tiny_lm

    return tiny_lm()


# ------------------------------------------------------------------ older testbeds unchanged
def test_tb11_config_loads_and_its_documents_are_unchanged(tmp_path: Path) -> None:
    raw = json.loads(TB11.read_text())
    config = TestbedConfig.model_validate(raw)
    assert (config.skill_reading, config.skill_decomposition, config.skill_verbalization) \
        == (0, 0, 0)
    digest = hashlib.sha256(json.dumps(documents_of(config), sort_keys=True).encode())
    assert digest.hexdigest() == TB11_DOCUMENTS_SHA256
    # A built tb11 directory (its config.json lacks the new fields) still accepts tb11.
    (tmp_path / "config.json").write_text(json.dumps(raw))
    _prepare(tmp_path, config)
    with pytest.raises(ValueError, match="skill_reading"):
        _prepare(tmp_path, config.model_copy(update={"skill_reading": 1}))


# ------------------------------------------------------------------ no manifest fact
def test_no_manifest_fact_in_any_practice_document(docs: dict[str, list[dict[str, Any]]]
                                                    ) -> None:
    from rag_gates_lab.testbed.facts import load_popqa_facts

    manifest = docs["manifest"]
    practice = [d for d in docs["corpus"] if d["kind"].startswith("skill")]
    assert {d["kind"] for d in practice} == {"skill-reading", "skill-decomposition",
                                             "skill-hop-statement", "skill-verbalization",
                                             "skill-twohop-reading"}
    texts = [json.dumps(d.get("messages") or d["text"], ensure_ascii=False) for d in practice]
    # No manifest question is asked, and no statement of a manifest fact (as the corpus,
    # the retrieval passages or the counterfactual passages word it) appears.
    ids = {f["id"] for f in manifest}
    stated = {d["text"] for d in docs["corpus"] if d.get("fact") in ids}
    stated |= {p["text"] for p in docs["passages"] + docs["counterfactual"]
               if p.get("fact") in ids}
    for needle in [f["question"] for f in manifest] + sorted(stated):
        assert not any(json.dumps(needle, ensure_ascii=False)[1:-1] in t for t in texts), needle
    # Every practice fact (and passage) is outside the manifest: no manifest row, and no
    # subject or object that is a manifest subject.
    subjects = {f["subj"].casefold() for f in manifest}
    by_row = {p.row: p for p in load_popqa_facts()}
    assert not {f["row"] for f in manifest} & {d["row"] for d in practice}
    for d in practice:
        names = [by_row[d["row"]].subj, by_row[d["row"]].obj] if d["row"] >= 0 else []
        names += [p["title"] for p in d.get("passages", []) if p["title"]]
        names += d.get("hop_answers", [])
        assert not {n.casefold() for n in names} & subjects, (d["id"], names)
    # No manifest object is a decomposition person: a manifest bridge may give them a
    # birthplace of its own.
    objects = {f["obj"].casefold() for f in manifest}
    for d in _practice(docs, "skill-decomposition") + _practice(docs, "skill-twohop-reading"):
        assert d["hop_answers"][0].casefold() not in objects


# ------------------------------------------------------------------ each form's renderer
def test_every_form_has_its_examples(docs: dict[str, list[dict[str, Any]]]) -> None:
    reading = _practice(docs, "skill-reading")
    assert Counter(d["form"] for d in reading) == {f: 4 for f in SKILL_FORMS}
    assert len({d["row"] for d in reading}) == len(reading)  # a new fact per example


def test_deeprag_form_is_the_bench_prompt_and_the_engines_context_step(
        docs: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    from rag_gates.deeprag.engine import subquery_line
    from rag_gates.deeprag.trajectory import FINAL, INTERMEDIATE, Trajectory, retrieval_block
    from rag_gates_lab.plugins.deeprag import bench_prompt

    # The benchmark's prompt for a model without deeprag.json (the testbed model).
    fmt = bench_prompt(SimpleNamespace(model_id=str(tmp_path)))
    for d in (d for d in _practice(docs, "skill-reading") if d["form"] == "deeprag"):
        user, assistant = _turns(d)
        [expected] = fmt.build(d["question"], "")
        assert user == expected.content
        # The engine's prompt when the model answers from the retrieved Context: block.
        reading = f"{subquery_line(d['question'])}{retrieval_block(_passages(d))}{INTERMEDIATE}"
        assert assistant == f"{reading} {d['answer']}\n{FINAL} {d['answer']}"
        parsed = Trajectory.parse(f"{user.rsplit(chr(10), 1)[1]}\n{assistant}")
        assert parsed.retrievals == 1 and parsed.final_answer == d["answer"]


def test_tokrag_reference_form_is_the_decoders_rag_prompt(
        docs: dict[str, list[dict[str, Any]]], tiny: Any) -> None:
    from rag_gates.tokrag.decoder import TokRAGConfig, TokRAGDecoder

    decoder = TokRAGDecoder(tiny, TokRAGConfig(passage_prefix=True))
    for d in (d for d in _practice(docs, "skill-reading") if d["form"] == "tokrag-reference"):
        user, assistant = _turns(d)
        assert "[Reference]: " in user
        assert user == decoder.prompts(d["question"], _passages(d))[0]
        assert assistant == d["answer"]


def test_srrag_form_is_the_answer_prompt_after_a_verbalization(
        docs: dict[str, list[dict[str, Any]]], tiny: Any) -> None:
    from rag_gates.srrag.pipeline import answer_prompt
    from rag_gates.srrag.verbalizer import Verbalizer
    from rag_gates.types import Generation

    verbalizer = Verbalizer(tiny)
    for d in (d for d in _practice(docs, "skill-reading") if d["form"] == "srrag"):
        user, assistant = _turns(d)
        [passage] = _passages(d)
        written = verbalizer.passage(d["question"], Generation(text=passage.text,
                                                               finish_reason="eos"))
        assert user == answer_prompt(d["question"], [written])
        assert assistant == d["answer"]


def test_cbdr_paper_form_is_the_probes_rag_prompt(docs: dict[str, list[dict[str, Any]]]
                                                  ) -> None:
    from rag_gates.cbdr.prompts import ProbePrompts

    for d in (d for d in _practice(docs, "skill-reading") if d["form"] == "cbdr-paper"):
        user, assistant = _turns(d)
        assert user == ProbePrompts(style="paper").rag(d["question"], _passages(d))
        assert assistant == d["answer"]


def test_the_benchmark_form_is_shared_by_quco_cbdr_rag_gates_and_tokrag_default(
        docs: dict[str, list[dict[str, Any]]], tiny: Any) -> None:
    """Why SKILL_FORMS leaves the benchmark's prompt to reading_examples."""
    from rag_gates.cbdr.prompts import ProbePrompts
    from rag_gates.prompts import continue_prompt, qa_prompt
    from rag_gates.tokrag.decoder import TokRAGDecoder

    d = next(d for d in _practice(docs, "skill-reading") if d["form"] == "cbdr-paper")
    q, passages = d["question"], _passages(d)
    bench = qa_prompt(q, passages)
    assert continue_prompt(q, passages, "") == bench
    assert ProbePrompts(style="rag-gates").rag(q, passages) == bench
    assert TokRAGDecoder(tiny).prompts(q, passages)[0] == bench


# ------------------------------------------------------------------ decomposition
def test_decomposition_trajectories_parse_back(docs: dict[str, list[dict[str, Any]]]) -> None:
    from rag_gates.deeprag.trajectory import DeepRAGPrompt, Trajectory

    trajectories = _practice(docs, "skill-decomposition")
    assert len(trajectories) == SMALL.skill_decomposition
    statements = [d["text"] for d in _practice(docs, "skill-hop-statement")]
    stated_rows = Counter(d["row"] for d in _practice(docs, "skill-hop-statement"))
    patterns = []
    for d in trajectories:
        user, assistant = _turns(d)
        assert user == DeepRAGPrompt().user_text(d["question"])  # the paper's prompt
        t = Trajectory.parse(f"{user.rsplit(chr(10), 1)[1]}\n{assistant}")
        assert t.question == d["question"] and t.final_answer == d["answer"]
        assert [s.subquery for s in t.steps] == d["subqueries"]
        assert [s.answer for s in t.steps] == d["hop_answers"]
        assert [s.retrieved for s in t.steps] == d["retrieved"]
        assert [s.decision.retrieve for s in t.steps] == d["retrieved"]
        # A hop from memory is stated skill_hop_repetitions times, a retrieved one only in
        # its Context: block (the bridge's row is -1,000,000 - the first hop's).
        hop_rows = (d["row"], -1_000_000 - d["row"])
        assert [stated_rows[r] for r in hop_rows] == [
            0 if r else SMALL.skill_hop_repetitions for r in d["retrieved"]]
        for step, retrieved in zip(t.steps, d["retrieved"], strict=True):
            said = sum(step.answer in s for s in statements)
            if retrieved:  # read from its Context: block
                assert any(step.answer in p.text for p in step.passages or ())
            else:  # known: stated in the corpus (at least) skill_hop_repetitions times
                assert said >= SMALL.skill_hop_repetitions
        patterns.append(tuple(d["retrieved"]))
    # Half from memory, half with at least one retrieval step.
    assert patterns.count((False, False)) == SMALL.skill_decomposition // 2
    assert len(set(patterns)) >= 3


def test_decomposition_people_are_distinct_and_stated_once_each(
        docs: dict[str, list[dict[str, Any]]]) -> None:
    people = [d["hop_answers"][0] for d in _practice(docs, "skill-decomposition")]
    assert len(set(people)) == len(people)


# ------------------------------------------------------------------ two-hop reading
def test_twohop_reading_is_the_benchmark_prompt_over_both_hops(
        docs: dict[str, list[dict[str, Any]]]) -> None:
    from rag_gates.prompts import qa_prompt
    from rag_gates_lab.testbed.facts import BRIDGE_QUESTIONS

    examples = _practice(docs, "skill-twohop-reading")
    assert len(examples) == SMALL.skill_twohop_reading
    decomposition_people = {d["hop_answers"][0] for d in _practice(docs, "skill-decomposition")}
    people = [d["hop_answers"][0] for d in examples]
    assert len(set(people)) == len(people) and not set(people) & decomposition_people
    others = [json.dumps(d.get("messages") or d.get("text"), ensure_ascii=False)
              for d in docs["corpus"] if d["kind"] != "skill-twohop-reading"]
    for d in examples:
        user, assistant = _turns(d)
        person, city = d["hop_answers"]
        assert assistant == d["answer"] == city
        assert user == qa_prompt(d["question"], _passages(d))  # the form `single` reads
        assert d["question"] in {q.format(s=t["title"]) for q in BRIDGE_QUESTIONS.values()
                                 for t in d["passages"]}
        # Both hops are in the prompt: one passage names the person, a passage about the
        # person names the city; the question names neither.
        assert any(person in p.text for p in _passages(d) if p.title != person)
        assert any(city in p.text for p in _passages(d) if p.title == person)
        assert person not in d["question"] and city not in d["question"]
        # Read, not recalled: no other document says the person was born there.
        assert not any(person in t and city in t for t in others), d["id"]


def test_twohop_reading_off_keeps_tb12_and_on_adds_only_its_examples() -> None:
    config = TestbedConfig.model_validate(json.loads(TB12.read_text()))
    assert config.skill_twohop_reading == 0
    digest = hashlib.sha256(json.dumps(documents_of(config), sort_keys=True).encode())
    assert digest.hexdigest() == TB12_DOCUMENTS_SHA256
    # On (in the small configuration): every other document is the same, by id (the corpus
    # order is shuffled as a whole), so a build with it is the build without it plus it.
    off = documents_of(SMALL.model_copy(update={"skill_twohop_reading": 0}))
    on = documents_of(SMALL)
    # The evaluation facts and questions are the same (tb13's validate step reads the base
    # model's closed-book run from tb12's, gates-tb13/COMMANDS.sh).
    for part in ("manifest", "passages", "counterfactual", "bridges", "twohop"):
        assert on[part] == off[part], part
    without, with_it = off["corpus"], on["corpus"]
    assert not any(d["kind"] == "skill-twohop-reading" for d in without)
    added = [d for d in with_it if d["kind"] == "skill-twohop-reading"]
    assert len(added) == SMALL.skill_twohop_reading
    assert {d["id"]: d for d in with_it if d["kind"] != "skill-twohop-reading"} == \
        {d["id"]: d for d in without}


# ------------------------------------------------------------------ verbalization
def test_verbalization_is_genread_answered_with_taught_statements(
        docs: dict[str, list[dict[str, Any]]], tiny: Any) -> None:
    from rag_gates.srrag.verbalizer import Verbalizer

    verbalizer = Verbalizer(tiny)
    taught: dict[int, set[str]] = {}
    for d in _practice(docs, "recall-statement"):
        taught.setdefault(d["row"], set()).add(d["text"])
    verbal = _practice(docs, "skill-verbalization")
    assert len(verbal) == SMALL.skill_verbalization
    for d in verbal:
        user, assistant = _turns(d)
        assert user == verbalizer.prompt(d["question"])
        assert d["answer"] in assistant
        assert any(assistant.startswith(s) for s in taught[d["row"]])
        assert assistant.removeprefix(next(s for s in taught[d["row"]]
                                           if assistant.startswith(s))).strip() \
            in taught[d["row"]]


def test_verbalization_needs_recall_facts() -> None:
    with pytest.raises(ValueError, match="recall_examples"):
        documents_of(SMALL.model_copy(update={"skill_verbalization": 21}))


# ------------------------------------------------------------------ untaught subjects
# tb13's corpus, computed with the code before skill_unknown existed (commit 00fd72c).
TB13 = ROOT / "benchmarks" / "results" / "testbed" / "tb13-config.json"
TB13_DOCUMENTS_SHA256 = "10b6927570071874ea679b32ccca4e7082082bc8c383edc9e2d08b0ea9c45610"


def test_unknown_practice_off_keeps_tb13() -> None:
    config = TestbedConfig.model_validate(json.loads(TB13.read_text()))
    assert config.skill_unknown == 0
    digest = hashlib.sha256(json.dumps(documents_of(config), sort_keys=True).encode())
    assert digest.hexdigest() == TB13_DOCUMENTS_SHA256


def test_unknown_practice_answers_no_information_about_subjects_taught_nowhere(
        docs: dict[str, list[dict[str, Any]]], tiny: Any) -> None:
    from rag_gates.srrag.verbalizer import Verbalizer
    from rag_gates_lab.testbed.build import UNKNOWN_VERBALIZATION, document_words

    n = 1500  # nearly all the small configuration has (1547): the filters are what choose
    on = documents_of(SMALL.model_copy(update={"skill_unknown": n}))
    for part in ("manifest", "passages", "counterfactual", "bridges", "twohop"):
        assert on[part] == docs[part], part
    unknown = [d for d in on["corpus"] if d["kind"] == "skill-unknown"]
    assert len(unknown) == n
    # Every other document is the build without the option's, by id.
    assert {d["id"]: d for d in on["corpus"] if d["kind"] != "skill-unknown"} == \
        {d["id"]: d for d in docs["corpus"]}
    verbalizer = Verbalizer(tiny)
    taught = "\n".join(document_words(d) for d in docs["corpus"]).casefold()
    named = {e[k].casefold() for e in [*on["manifest"], *on["bridges"]] for k in ("subj", "obj")}
    name_words = {" ".join(re.findall(r"\w+", name)) for name in named} - {""}
    longest = max(len(name.split()) for name in name_words)
    subjects = [d["subject"] for d in unknown]
    assert len({s.casefold() for s in subjects}) == n
    for d in unknown:
        user, assistant = _turns(d)
        assert user == verbalizer.prompt(d["question"])  # SR-RAG's GenRead prompt
        assert assistant == UNKNOWN_VERBALIZATION.format(subject=d["subject"])
        assert d["subject"] in d["question"]
        subject = d["subject"].casefold()
        # Untaught as an r = 0 manifest subject is: named by no other training document
        # and no manifest fact or bridge, stated or not.
        assert subject not in taught and subject not in named, d["subject"]
        assert not any(subject in o["question"].casefold() for o in unknown if o is not d)
        # No manifest or bridge name is a run of words of the question or the reply (the
        # first wording, "Nothing is known about ...", named an r = 0 subject, "Nothing").
        said = _word_runs(f"{d['question']}\n{assistant}", longest)
        assert not said & name_words, (d["subject"], said & name_words)


def test_tb14s_unknown_practice_names_no_manifest_entity() -> None:
    # At tb14's size (benchmarks/results/testbed/gates-tb14/COMMANDS.sh): the evaluation
    # fact "What genre is Nothing?" (r = 0) stays untaught, in counts as in training.
    config = TestbedConfig.model_validate({**json.loads(TB13.read_text()), "skill_unknown": 70})
    docs = documents_of(config)
    unknown = [d for d in docs["corpus"] if d["kind"] == "skill-unknown"]
    assert len(unknown) == 70
    names = {" ".join(re.findall(r"\w+", e[k].casefold()))
             for e in [*docs["manifest"], *docs["bridges"]] for k in ("subj", "obj")} - {""}
    assert "nothing" in names
    longest = max(len(name.split()) for name in names)
    for d in unknown:
        said = _word_runs("\n".join(m["content"] for m in d["messages"][1:]) + "\n" +
                          d["question"], longest)
        assert not said & names, (d["subject"], said & names)


def _word_runs(text: str, longest: int) -> set[str]:
    """Every run of 1..longest consecutive words of ``text``, casefolded."""
    words = re.findall(r"\w+", text.casefold())
    return {" ".join(words[i:i + k]) for k in range(1, longest + 1)
            for i in range(len(words) - k + 1)}


def test_unknown_practice_says_when_the_pool_runs_out() -> None:
    with pytest.raises(ValueError, match="ask for at most"):
        documents_of(SMALL.model_copy(update={"skill_unknown": 5000}))


# ------------------------------------------------------------------ training text
def test_practice_is_trained_as_the_methods_chat_turns(
        docs: dict[str, list[dict[str, Any]]], tiny: Any) -> None:
    tok = tiny.tokenizer
    unknown = documents_of(SMALL.model_copy(update={"skill_unknown": 2}))
    for kind in ("skill-reading", "skill-decomposition", "skill-verbalization",
                 "skill-unknown"):
        d = _practice(unknown, kind)[0]
        text = training_text(d, tok)
        assert text == tok.apply_chat_template(d["messages"], tokenize=False)
        assert d["messages"][-1]["content"] in text and d["messages"][0]["content"] in text


def test_plan_figures_count_what_training_packs(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from rag_gates.testing import save_tiny_lm
    from rag_gates_lab.testbed.build import pack_blocks, plan_figures

    config = SMALL.model_copy(update={"base_model": str(save_tiny_lm(tmp_path / "base")),
                                      "block_size": 128, "epochs": 1.5})
    figures = plan_figures(config)
    corpus = documents_of(config)["corpus"]
    tok = AutoTokenizer.from_pretrained(tmp_path / "base")
    blocks = pack_blocks([training_text(d, tok) for d in corpus], tok, 128,
                         [d["kind"] == "general" for d in corpus])
    assert figures["documents"] == len(corpus) == sum(figures["by_kind"].values())
    assert figures["by_kind"]["skill-decomposition"] == SMALL.skill_decomposition
    assert figures["blocks"] == len(blocks)
    assert figures["tokens_per_epoch"] == sum(len(b) for b in blocks)
    assert figures["steps"] == round(-(-len(blocks) // config.batch_size) * 1.5)
    # Every DeepRAG trajectory is longer than 128 tokens: reported, not silently split.
    assert figures["longer_than_block"]["skill-decomposition"] == SMALL.skill_decomposition


# ------------------------------------------------------------------ corpus statistics
def test_quco_counts_the_practice_documents_words(tmp_path: Path) -> None:
    # tb12's gates step failed on the practice documents (no "text"): the corpus statistics
    # must index them, in their turns' words, so QuCo counts what the model was taught.
    from rag_gates.testing import save_tiny_lm
    from rag_gates_lab.corpus import load_corpus_stats
    from rag_gates_lab.testbed.build import document_words, write_plan

    base = save_tiny_lm(tmp_path / "base")
    out = tmp_path / "planned"
    write_plan(SMALL.model_copy(update={"base_model": str(base)}), out)
    corpus = [json.loads(line) for line in (out / "corpus.jsonl").open()]
    stats = load_corpus_stats(testbed=out, tokenizer=str(base), cache=False)
    verbalized = next(d for d in corpus if d["kind"] == "skill-verbalization")
    assert "text" not in verbalized and verbalized["messages"]
    answer = verbalized["messages"][-1]["content"]
    assert document_words(verbalized).endswith(answer)
    assert "<|im_start|>" not in document_words(verbalized)
    # Every practice document's question is counted at least once in its own words.
    for kind in ("skill-reading", "skill-decomposition", "skill-verbalization"):
        for d in (d for d in corpus if d["kind"] == kind):
            assert stats.count(d["question"]).value >= 1, (kind, d["question"])
    with pytest.raises(ValueError, match="neither 'text' nor 'messages'"):
        document_words({"id": "x", "kind": "fact"})
